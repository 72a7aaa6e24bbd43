"""The ``cronwarden`` command. Thin: finds the subcommand, lets its module
define its flags, calls the library, prints.

Each subcommand lives in a module listed in ``COMMANDS`` with two functions:
``configure(parser)`` adds its arguments and ``main(args) -> int`` runs it.
Only the module of the command being run is imported: the per-tick cost of
``cronwarden run`` is its import graph. A module may also write its flags as
a ``FLAGS`` table, which ``configure`` hands to argparse and ``parse_plain``
reads without it, so a plain ``cronwarden run`` line never imports argparse.
Every bad input ends as one line ``cronwarden: …`` and exit status 2 (or the
error's documented status), never a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from cronwarden.cli.args import parse_plain
from cronwarden.errors import CronwardenError, UsageError

if TYPE_CHECKING:
    import argparse

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("cronwarden.cli.run", "run a command under the job's lease (drop-in for flock -n)"),
    "scheduler": (
        "cronwarden.cli.scheduler",
        "run the config file's jobs on schedule, once per slot across hosts",
    ),
    "backfill": ("cronwarden.cli.backfill", "run a job's past slots now, each once, recorded as backfill"),
    "status": ("cronwarden.cli.status", "the runs open now, on every host"),
    "history": ("cronwarden.cli.status", "a job's recent runs and the skips between them"),
    "config": ("cronwarden.cli.config", "check the config file, or show each job's resolved settings"),
    "demo": ("cronwarden.cli.demo", "an overlap incident replayed in compressed time: plain cron vs guarded"),
    "audit": ("cronwarden.cli.audit", "every job's durations against its period, policy and verdict"),
    "check": ("cronwarden.cli.audit", "one monitoring pass; exit 0 ok, 1 warning, 2 critical"),
    "monitor": ("cronwarden.cli.monitor", "evaluate in a loop: record findings, deliver the outbox"),
    "flush": ("cronwarden.cli.flush", "deliver the events the sinks have not acknowledged yet, now"),
    "dashboard": ("cronwarden.cli.dashboard", "serve a read-only web dashboard, JSON API and /metrics"),
    "metrics": ("cronwarden.cli.audit", "Prometheus text exposition of the ledger's job statistics"),
    "report": ("cronwarden.cli.report", "report start/success/fail of a job cronwarden cannot wrap"),
    "fence": (
        "cronwarden.cli.fence",
        "fence check: is this run's fencing token still the newest? (best effort)",
    ),
    "prune": ("cronwarden.cli.prune", "delete the runs and events the ledger's retention no longer keeps"),
    "ack": ("cronwarden.cli.monitor", "resolve a raised finding by hand, e.g. an abandoned stuck run"),
    "rollup": ("cronwarden.cli.rollup", "each job's statistics the store keeps as runs end; --rebuild"),
    "snooze": (
        "cronwarden.cli.snooze",
        "keep a job's findings from alerting sinks for a while, with a reason",
    ),
    "unsnooze": ("cronwarden.cli.snooze", "end a job's snooze now"),
    "trigger": ("cronwarden.cli.control", "run a job now, by hand, through its lease and policy"),
    "pause": ("cronwarden.cli.control", "pause a job on every host until resume, with a reason"),
    "resume": ("cronwarden.cli.control", "resume a paused job"),
    "stop": ("cronwarden.cli.control", "stop an open run on whatever host it runs, with a reason"),
}
"""name -> (module, one-line help). The module defines ``configure_<name>``
and ``main_<name>`` when it holds several commands, else ``configure``/``main``."""


def _entry(name: str, what: str) -> Callable[..., Any]:
    module = importlib.import_module(COMMANDS[name][0])
    fn = getattr(module, f"{what}_{name}", None) or getattr(module, what)
    return fn  # type: ignore[no-any-return]


def command_parser(name: str) -> argparse.ArgumentParser:
    """The command's argparse parser: its ``--help``, and a one-line error
    (exit 2) for a bad flag. Imported here only: ``run``'s plain command
    lines never need it (``parse_plain``)."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            hint = _did_you_mean(message, self.format_help())
            raise UsageError(f"{self.prog.removeprefix('cronwarden').strip() or 'usage'}: {message}{hint} "
                             f"(see {self.prog} --help)")  # fmt: skip

    def formatter(prog: str) -> argparse.HelpFormatter:
        # Told the terminal width: left to itself argparse imports shutil
        # (and with it bz2, lzma) for every parser.
        try:
            width = os.get_terminal_size().columns - 2
        except OSError:
            width = 78
        return argparse.RawDescriptionHelpFormatter(prog, width=max(40, width))

    p = Parser(prog=f"cronwarden {name}", description=COMMANDS[name][1], formatter_class=formatter)
    _entry(name, "configure")(p)
    return p


def _did_you_mean(message: str, help_text: str) -> str:
    """ "; did you mean --ttl?" for the first misspelt flag argparse names in
    ``message``, among the flags its ``help_text`` lists; else ""."""
    import re

    if "unrecognized arguments:" not in message:
        return ""
    known = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text))
    for word in message.split("unrecognized arguments:", 1)[1].split():
        if word.startswith("--"):
            close = _closest(word.partition("=")[0], known)
            if close:
                return f"; did you mean {close}?"
    return ""


def _closest(word: str, choices: Iterable[str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return found[0] if found else None


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
        "cron line:  */10 * * * *  /usr/local/bin/cronwarden run --job reconcile --every 10m -- /opt/bin/job",
        "            (cron's PATH is /usr/bin:/bin: give the path `command -v cronwarden` prints)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None and any("@" in a or "assword" in a for a in args):
        # Before anything else, for as long as this process and its keeper
        # live: a store URL's password off the world-readable command line.
        from cronwarden.cli.cmdline import hide_passwords

        hide_passwords()
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
            close = _closest(name, COMMANDS)
            hint = f"; did you mean {close}?" if close else f"; expected one of {', '.join(COMMANDS)}"
            raise UsageError(f"unknown command {name!r}{hint} (see cronwarden --help)")
        flags = getattr(importlib.import_module(COMMANDS[name][0]), "FLAGS", None)
        parsed: Any = None if flags is None else parse_plain(flags, args[1:])
        if parsed is None:
            parsed = command_parser(name).parse_args(args[1:])
        return int(_entry(name, "main")(parsed))
    except CronwardenError as e:
        print(f"cronwarden: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def console() -> NoReturn:
    """The ``cronwarden`` console script and ``python -m cronwarden``:
    ``main`` on ``sys.argv``, then exit with its status, as any Python
    program does: exit hooks run, output is flushed, modules are torn down."""
    code = main()
    # The objects left at exit are garbage all at once: the interpreter's
    # final collections over them cost a cron tick ~16M instructions (8% of
    # ``cronwarden run --job x -- true``, bench/run_instructions.py). Frozen
    # objects are skipped by those collections: exit hooks still run and the
    # modules are still torn down, but an object kept alive only by a
    # reference cycle is not finalized (nothing of cronwarden's relies on it).
    import gc

    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    console()
