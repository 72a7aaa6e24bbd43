"""The ``cronwarden`` command. Thin: parses, calls the library, prints.

Every bad input ends as one line ``cronwarden: …`` and exit status 2 (or the
error's documented status), never a traceback. Imports are lazy: the
per-tick cost of ``cronwarden run`` is its import graph.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from cronwarden.errors import CronwardenError, UsageError

EXIT_LEASE_LOST = 3
EXIT_REPLACED = 4
EXIT_TIMED_OUT = 124
EXIT_STORE = 75

EPILOG = """exit status of `cronwarden run`: the command's own status (128+N if killed by signal N);
  --skip-exit-code (default 0) when skipped or queued (the ledger records it either way);
  2 bad usage; 3 lease lost; 4 replaced; 124 max_runtime exceeded;
  75 store unreachable or locked (fail closed); 126 not executable; 127 command not found."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog.removeprefix('cronwarden ').strip() or 'usage'}: {message} "
                         f"(see {self.prog} --help)")  # fmt: skip


def _duration(what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        from cronwarden.durations import parse_positive_duration

        return parse_positive_duration(text, what=what)

    parse.__name__ = what
    return parse


def _exit_code(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 255:
        raise UsageError(f"--skip-exit-code must be a number from 0 to 255, got {text!r}")
    return int(text)


def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", metavar="URL", help="sqlite:///PATH (default: $CRONWARDEN_STORE or "
                   "~/.local/state/cronwarden/cronwarden.db), postgresql://…, redis://…")  # fmt: skip


def build_parser() -> Parser:
    parser = Parser(prog="cronwarden", description="Make scheduled jobs safe: one run at a time "
                    "(or a written policy), fencing tokens, and no silent skips.", epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    run = sub.add_parser("run", help="run a command under the job's lease (drop-in for flock -n)",
                         description="Run COMMAND under the job's lease. A start while another run "
                         "holds it follows the policy (default: skip, recorded with the holder).",
                         epilog=EPILOG + "\n\nexample:\n  cronwarden run --job reconcile --every 10m "
                         "--ttl 2m -- ./reconcile.sh --full",
                         formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    run.add_argument("--job", required=True, help="job name (letters, digits, _ . @ -)")
    run.add_argument("--ttl", type=_duration("--ttl"), default=60.0, metavar="DURATION",
                     help="lease time-to-live, renewed every ttl/3 (default 60s)")  # fmt: skip
    when = run.add_mutually_exclusive_group()
    when.add_argument(
        "--every", metavar="DURATION", help="the job's period, e.g. 10m (for slots and the monitor)"
    )
    when.add_argument("--schedule", metavar="CRON", help="the job's cron expression, e.g. '*/10 * * * *'")
    run.add_argument("--tz", metavar="ZONE", help="time zone of --schedule (default: local)")
    run.add_argument("--policy", default="skip", choices=["skip", "allow", "replace", "queue"],
                     help="what a start does while another run holds the lease (default skip)")  # fmt: skip
    run.add_argument("--shard", metavar="KEY", help="partition for policy allow: the lease key is JOB:KEY")
    run.add_argument("--allow-unpartitioned", action="store_true",
                     help="policy allow without --shard (overlaps are still recorded)")  # fmt: skip
    run.add_argument("--renew-every", type=_duration("--renew-every"), metavar="DURATION",
                     help="heartbeat interval (default ttl/3; must be less than the ttl)")  # fmt: skip
    run.add_argument("--max-runtime", type=_duration("--max-runtime"), metavar="DURATION",
                     help="stop the run after this long and record timed_out")  # fmt: skip
    run.add_argument("--max-pending", type=int, default=1, metavar="N",
                     help="policy queue: most starts kept pending (default 1: coalesce)")  # fmt: skip
    run.add_argument("--replace-grace", type=_duration("--replace-grace"), default=10.0, metavar="DURATION",
                     help="policy replace: SIGTERM-to-SIGKILL time for the old run")  # fmt: skip
    run.add_argument("--skip-exit-code", type=_exit_code, default=0, metavar="N",
                     help="exit status when the start is skipped or queued (default 0)")  # fmt: skip
    run.add_argument("--on-store-error", choices=["fail", "run"], default="fail",
                     help="store unreachable: fail closed (default, exit 75) or run unguarded")  # fmt: skip
    run.add_argument("--quiet", action="store_true", help="no line on stderr for a skip")
    _store_arg(run)

    status = sub.add_parser("status", help="the runs open now, on every host",
                            description="The runs open now: job, run id, host, pid, age, lease "
                            "expiry, fencing token. Expired ones will be recorded abandoned.")  # fmt: skip
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument("--job", help="only this job")
    _store_arg(status)

    history = sub.add_parser("history", help="a job's recent runs and the skips between them")
    history.add_argument("job", help="job name")
    history.add_argument("--limit", type=int, default=20, help="how many runs (default 20)")
    history.add_argument("--json", action="store_true", help="print JSON")
    _store_arg(history)

    demo = sub.add_parser("demo", help="the seed incident in compressed time: naive cron vs guarded",
                          description="Replays a job whose runtime creeps up until one slow night "
                          "overlaps the next start, first as plain cron, then under cronwarden. "
                          "Uses real processes and a temporary SQLite store; about 20 seconds.")  # fmt: skip
    demo.add_argument("--keep", action="store_true", help="keep the temporary store and print its path")
    return parser


def _version() -> str:
    from cronwarden import __version__

    return f"cronwarden {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(args_list)
    except CronwardenError as e:
        print(f"cronwarden: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def _dispatch(argv: list[str]) -> int:
    command: list[str] = []
    if argv[:1] == ["run"]:
        if "--" not in argv:
            if any(a in ("-h", "--help") for a in argv):
                build_parser().parse_args(argv)
            raise UsageError("run: put the command after --, e.g. cronwarden run --job NAME -- ./job.sh")
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
        if not command:
            raise UsageError("run: no command after --; expected e.g. cronwarden run --job NAME -- ./job.sh")
    args = build_parser().parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return 2
    if args.command == "run":
        from cronwarden.commands.run import run_command

        return run_command(args, command)
    import importlib

    module, _, name = COMMANDS[args.command].partition(":")
    handler: Callable[[Any], int] = getattr(importlib.import_module(module), name)
    return handler(args)


COMMANDS = {
    "status": "cronwarden.commands.views:status",
    "history": "cronwarden.commands.views:history",
    "demo": "cronwarden.demo:main",
}
"""Subcommand -> "module:function", imported only when that command runs."""


def store_url(args: Any) -> str:
    from cronwarden.stores import default_store_url

    return getattr(args, "store", None) or os.environ.get("CRONWARDEN_STORE") or default_store_url()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
