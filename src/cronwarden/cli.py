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
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NoReturn

from cronwarden.errors import CronwardenError, UsageError

if TYPE_CHECKING:
    import argparse

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("cronwarden.commands.run", "run a command under the job's lease (drop-in for flock -n)"),
    "scheduler": (
        "cronwarden.commands.scheduler",
        "run the config file's jobs on schedule, once per slot across hosts",
    ),
    "status": ("cronwarden.commands.views", "the runs open now, on every host"),
    "history": ("cronwarden.commands.views", "a job's recent runs and the skips between them"),
    "config": ("cronwarden.commands.config", "check the config file, or show each job's resolved settings"),
    "demo": ("cronwarden.demo", "an overlap incident in compressed time: naive cron vs guarded"),
    "audit": ("cronwarden.commands.monitor", "every job's durations against its period, policy and verdict"),
    "check": ("cronwarden.commands.monitor", "one monitoring pass; exit 0 ok, 1 warning, 2 critical"),
    "monitor": ("cronwarden.commands.monitor", "evaluate in a loop: record findings, deliver the outbox"),
    "flush": ("cronwarden.commands.flush", "deliver the events the sinks have not acknowledged yet, now"),
    "dashboard": ("cronwarden.commands.dashboard", "serve a read-only web dashboard, JSON API and /metrics"),
    "metrics": ("cronwarden.commands.monitor", "Prometheus text exposition of the ledger's job statistics"),
    "report": ("cronwarden.commands.monitor", "report start/success/fail of a job cronwarden cannot wrap"),
    "ack": ("cronwarden.commands.monitor", "resolve a raised finding by hand, e.g. an abandoned stuck run"),
}
"""name -> (module, one-line help). The module defines ``configure_<name>``
and ``main_<name>`` when it holds several commands, else ``configure``/``main``."""


def duration(what: str, *, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a positive duration flag (or zero, also
    written ``0``, with ``allow_zero``)."""

    def parse(text: str) -> float:
        from cronwarden.durations import parse_duration, parse_positive_duration

        if allow_zero:
            return 0.0 if text.strip() == "0" else parse_duration(text, what=what)
        return parse_positive_duration(text, what=what)

    parse.__name__ = what
    return parse


STORE_FLAG: dict[str, Any] = {
    "metavar": "URL",
    "help": "sqlite:///PATH (default: $CRONWARDEN_STORE or ~/.local/state/cronwarden/cronwarden.db), "
    "postgresql://…, redis://…",
}


def add_store_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", **STORE_FLAG)


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


def command_parser(name: str) -> argparse.ArgumentParser:
    """The command's argparse parser: its ``--help``, and a one-line error
    (exit 2) for a bad flag. Imported here only: ``run``'s plain command
    lines never need it (``parse_plain``)."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError(f"{self.prog.removeprefix('cronwarden').strip() or 'usage'}: {message} "
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


def add_flags(p: argparse.ArgumentParser, flags: Mapping[str, Mapping[str, Any]]) -> None:
    """Give argparse a command's ``FLAGS`` table (see ``parse_plain``)."""
    groups: dict[str, Any] = {}
    for name, spec in flags.items():
        kwargs = dict(spec)
        group = kwargs.pop("group", None)
        target = p if group is None else groups.setdefault(group, p.add_mutually_exclusive_group())
        target.add_argument(name, **kwargs)


def parse_plain(flags: Mapping[str, Mapping[str, Any]], argv: Sequence[str]) -> SimpleNamespace | None:
    """``argv`` read with a command's ``FLAGS`` table (argparse keywords by
    option) without argparse, when it is plain: each option spelled in full,
    given at most once, as ``--flag VALUE`` or ``--flag=VALUE``, then ``--``
    and the command, kept in ``command`` with its ``--``. Anything else (help,
    an abbreviation, a value that starts with ``-``, a missing, unknown or
    conflicting flag, a bad choice) returns None, and argparse parses it and
    words the error: the result is always what argparse would give.

    Why: importing argparse and building ``run``'s parser is ~16M
    instructions, ~7% of a ``cronwarden run`` on every cron tick."""
    if "--" not in argv:
        return None
    end = list(argv).index("--")
    given: dict[str, str | bool] = {}
    words = iter(argv[:end])
    for arg in words:
        name, eq, value = arg.partition("=")
        spec = flags.get(name)
        if spec is None or name in given:
            return None
        if spec.get("action") == "store_true":
            if eq:
                return None
            given[name] = True
            continue
        if not eq:
            value = next(words, "-")  # no value: argparse says so
        if value.startswith("-") or value not in spec.get("choices", (value,)):
            return None
        given[name] = value
    groups = [flags[n]["group"] for n in given if "group" in flags[n]]
    if len(groups) != len(set(groups)) or any(s.get("required") and n not in given for n, s in flags.items()):
        return None
    ns = SimpleNamespace(command=list(argv[end:]))
    for name, spec in flags.items():
        convert = spec.get("type")
        result: Any
        if name not in given:
            result = spec.get("default", False if spec.get("action") == "store_true" else None)
        elif convert is not None:
            try:
                result = convert(given[name])
            except (ValueError, TypeError):
                return None  # argparse's "invalid int value: …"
        else:
            result = given[name]
        setattr(ns, spec.get("dest", name[2:].replace("-", "_")), result)
    return ns


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
    ``main`` on ``sys.argv``, then exit with its status."""
    code = main()
    if sys.argv[1:2] == ["run"]:
        _end_run_process(code)
    sys.exit(code)


def _end_run_process(code: int) -> None:
    """Exit a finished ``cronwarden run`` at once, without the interpreter's
    teardown (freeing every module, collecting their cycles): ~20M
    instructions, a tenth of what the wrapper costs on each cron tick, for
    nothing. When ``run`` returns, its ledger writes are committed and the
    store is closed, its heartbeat has stopped (its daemon thread, like the
    PostgreSQL store's watchdog, may linger idle: daemon threads never hold
    up an exit) and its command has ended. Only when no non-daemon thread is
    running and no sink was loaded (a sink's library may keep events to send
    in an atexit hook), and after stdout and stderr are flushed; otherwise
    this returns and the caller exits normally."""
    threading = sys.modules.get("threading")
    if threading is not None and any(
        not t.daemon for t in threading.enumerate() if t is not threading.current_thread()
    ):
        return
    if "cronwarden.outbox" in sys.modules:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed pipe or stream: what was written is all there is
    os._exit(code & 0xFF)


if __name__ == "__main__":  # pragma: no cover
    console()
