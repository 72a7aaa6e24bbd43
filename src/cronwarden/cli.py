"""The ``cronwarden`` command. Thin: finds the subcommand, lets its module
define its flags, calls the library, prints.

Each subcommand lives in a module listed in ``COMMANDS`` with two functions:
``configure(parser)`` adds its arguments and ``main(args) -> int`` runs it.
Only the module of the command being run is imported: the per-tick cost of
``cronwarden run`` is its import graph. Every bad input ends as one line
``cronwarden: …`` and exit status 2 (or the error's documented status),
never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from cronwarden.errors import CronwardenError, UsageError

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("cronwarden.commands.run", "run a command under the job's lease (drop-in for flock -n)"),
    "status": ("cronwarden.commands.views", "the runs open now, on every host"),
    "history": ("cronwarden.commands.views", "a job's recent runs and the skips between them"),
    "config": ("cronwarden.commands.config", "check the config file, or show each job's resolved settings"),
    "demo": ("cronwarden.demo", "the seed incident in compressed time: naive cron vs guarded"),
    "audit": ("cronwarden.commands.monitor", "every job's durations against its period, policy and verdict"),
    "check": ("cronwarden.commands.monitor", "one monitoring pass; exit 0 ok, 1 warning, 2 critical"),
    "monitor": ("cronwarden.commands.monitor", "evaluate in a loop: record findings, deliver the outbox"),
    "flush": ("cronwarden.commands.flush", "deliver the events the sinks have not acknowledged yet, now"),
    "metrics": ("cronwarden.commands.monitor", "Prometheus text exposition of the ledger's job statistics"),
    "report": ("cronwarden.commands.monitor", "report start/success/fail of a job cronwarden cannot wrap"),
    "ack": ("cronwarden.commands.monitor", "resolve a raised finding by hand, e.g. an abandoned stuck run"),
}
"""name -> (module, one-line help). The module defines ``configure_<name>``
and ``main_<name>`` when it holds several commands, else ``configure``/``main``."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog.removeprefix('cronwarden').strip() or 'usage'}: {message} "
                         f"(see {self.prog} --help)")  # fmt: skip


def _formatter(prog: str) -> argparse.HelpFormatter:
    """argparse's formatter, told the terminal width: left to itself it imports
    shutil (and with it bz2, lzma) on every parser, on the wrapper's hot path."""
    try:
        width = os.get_terminal_size().columns - 2
    except OSError:
        width = 78
    return argparse.RawDescriptionHelpFormatter(prog, width=max(40, width))


def duration(what: str) -> Callable[[str], float]:
    """An argparse ``type`` for a positive duration flag."""

    def parse(text: str) -> float:
        from cronwarden.durations import parse_positive_duration

        return parse_positive_duration(text, what=what)

    parse.__name__ = what
    return parse


def add_store_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", metavar="URL", help="sqlite:///PATH (default: $CRONWARDEN_STORE or "
                   "~/.local/state/cronwarden/cronwarden.db), postgresql://…, redis://…")  # fmt: skip


def store_url(args: Any, configured: str | None = None) -> str:
    """``--store`` > ``$CRONWARDEN_STORE`` > the config file's ``store``
    (``--config``, ``$CRONWARDEN_CONFIG`` or ``./cronwarden.toml``) > default."""
    from cronwarden.stores import resolve_url

    flag = getattr(args, "store", None)
    if configured is None and not flag and not os.environ.get("CRONWARDEN_STORE"):
        from cronwarden.config import find, read

        path = find(getattr(args, "config", None))
        if path is not None:
            configured = read(path).store
    return resolve_url(flag, configured)


def _entry(name: str, what: str) -> Callable[..., Any]:
    module = importlib.import_module(COMMANDS[name][0])
    fn = getattr(module, f"{what}_{name}", None) or getattr(module, what)
    return fn  # type: ignore[no-any-return]


def command_parser(name: str) -> Parser:
    p = Parser(prog=f"cronwarden {name}", description=COMMANDS[name][1],
               formatter_class=_formatter)  # fmt: skip
    _entry(name, "configure")(p)
    return p


def _overview() -> str:
    from cronwarden import __version__

    width = max(len(n) for n in COMMANDS)
    lines = [
        f"cronwarden {__version__}: make scheduled jobs safe — one run at a time (or a written",
        "policy), fencing tokens, and no silent skips.",
        "",
        "usage: cronwarden COMMAND [options]   (cronwarden COMMAND --help for its options)",
        "",
        "commands:",
        *(f"  {n.ljust(width)}  {h}" for n, (_, h) in COMMANDS.items()),
        "",
        "first run:  cronwarden demo",
        "cron line:  */10 * * * *  cronwarden run --job reconcile --every 10m -- /opt/bin/reconcile",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if not args or args[0] in ("-h", "--help", "help"):
            print(_overview())
            return 0 if args else 2
        if args[0] == "--version":
            from cronwarden import __version__

            print(f"cronwarden {__version__}")
            return 0
        name = args[0]
        if name not in COMMANDS:
            raise UsageError(f"unknown command {name!r}; expected one of {', '.join(COMMANDS)}")
        return int(_entry(name, "main")(command_parser(name).parse_args(args[1:])))
    except CronwardenError as e:
        print(f"cronwarden: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
