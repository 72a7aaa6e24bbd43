"""``cronwarden run``: the cron-line wrapper. This is the per-tick hot path:
import only what one guarded run of one child needs."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from cronwarden.errors import LeaseRevoked, StoreUnavailable, TimedOut, UsageError
from cronwarden.guard import Guard, Options, Warden
from cronwarden.policy import Policy


def _resolve(command: str) -> None:
    """Fail before touching the store when the command cannot run, like a
    shell: 127 not found, 126 not executable."""
    from cronwarden.supervisor import CommandNotExecutable, CommandNotFound

    if "/" in command:
        candidates = [command]
    else:
        candidates = [os.path.join(d or ".", command) for d in os.environ.get("PATH", os.defpath).split(":")]
    found = [c for c in candidates if os.path.isfile(c)]
    if not found:
        raise CommandNotFound(f"command not found: {command!r}")
    if not any(os.access(c, os.X_OK) for c in found):
        raise CommandNotExecutable(f"command not executable: {command!r}")


def _slot(args: Any, now: float) -> tuple[float | None, Any]:
    if args.every is None and args.schedule is None:
        if args.tz:
            raise UsageError("--tz applies to --schedule; give --schedule 'CRON' too")
        return None, None
    from cronwarden.schedule import Schedule

    sched = Schedule.every_(args.every) if args.every else Schedule.cron_(args.schedule, args.tz)
    return sched.slot(now), sched


EXIT_LEASE_LOST = 3
EXIT_REPLACED = 4
EXIT_TIMED_OUT = 124
EXIT_STORE = 75

EPILOG = """exit status: the command's own (128+N if killed by signal N);
  --skip-exit-code (default 0) when skipped or queued (the ledger records it either way);
  2 bad usage; 3 lease lost; 4 replaced; 124 max_runtime exceeded;
  75 store unreachable or locked (fail closed); 126 not executable; 127 command not found.

environment given to COMMAND: CRONWARDEN_RUN_ID, CRONWARDEN_JOB, CRONWARDEN_FENCING_TOKEN,
  CRONWARDEN_LEASE_KEY (and CRONWARDEN_SHARD with --shard).

example (crontab):
  */10 * * * *  cronwarden run --job reconcile --every 10m --ttl 2m -- /opt/bin/reconcile --full"""


def _exit_code(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 255:
        raise UsageError(f"--skip-exit-code must be a number from 0 to 255, got {text!r}")
    return int(text)


def configure(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli import add_store_flag, duration

    p.usage = "cronwarden run --job NAME [options] -- COMMAND [ARG...]"
    p.description = (
        "Run COMMAND under the job's lease. A start while another run holds it follows the "
        "policy (default skip: recorded with the holder's run id, host, pid and age)."
    )
    p.epilog = EPILOG
    p.add_argument("--job", required=True, help="job name (letters, digits, _ . @ -)")
    p.add_argument("--ttl", type=duration("--ttl"), default=60.0, metavar="DURATION",
                   help="lease time-to-live, renewed every ttl/3 (default 60s)")  # fmt: skip
    when = p.add_mutually_exclusive_group()
    when.add_argument("--every", metavar="DURATION", help="the job's period, e.g. 10m (slots, monitor)")
    when.add_argument("--schedule", metavar="CRON", help="the job's cron expression, e.g. '*/10 * * * *'")
    p.add_argument("--tz", metavar="ZONE", help="time zone of --schedule (default: local)")
    p.add_argument("--policy", default="skip", choices=[x.value for x in Policy],
                   help="what a start does while another run holds the lease (default skip)")  # fmt: skip
    p.add_argument("--shard", metavar="KEY", help="partition for policy allow: the lease key is JOB:KEY")
    p.add_argument("--allow-unpartitioned", action="store_true",
                   help="policy allow without --shard (overlaps are still recorded)")  # fmt: skip
    p.add_argument("--renew-every", type=duration("--renew-every"), metavar="DURATION",
                   help="heartbeat interval (default ttl/3; must be less than the ttl)")  # fmt: skip
    p.add_argument("--max-runtime", type=duration("--max-runtime"), metavar="DURATION",
                   help="stop the run after this long and record timed_out")  # fmt: skip
    p.add_argument("--max-pending", type=int, default=1, metavar="N",
                   help="policy queue: most starts kept pending (default 1: coalesce)")  # fmt: skip
    p.add_argument("--replace-grace", type=duration("--replace-grace"), default=10.0, metavar="DURATION",
                   help="policy replace: SIGTERM-to-SIGKILL time for the old run")  # fmt: skip
    p.add_argument("--skip-exit-code", type=_exit_code, default=0, metavar="N",
                   help="exit status when the start is skipped or queued (default 0)")  # fmt: skip
    p.add_argument("--on-store-error", choices=["fail", "run"], default="fail",
                   help="store unreachable: fail closed (default, exit 75) or run unguarded")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no line on stderr for a skip")
    add_store_flag(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def main(args: Any) -> int:
    from cronwarden.cli import store_url
    from cronwarden.clock import SYSTEM_CLOCK

    command = list(args.command)
    if not command or command[0] != "--":
        raise UsageError("run: put the command after --, e.g. cronwarden run --job NAME -- ./job.sh")
    command = command[1:]
    if not command:
        raise UsageError("run: no command after --; expected e.g. cronwarden run --job NAME -- ./job.sh")

    slot, _schedule = _slot(args, SYSTEM_CLOCK.wall())
    options = Options(
        ttl=args.ttl, policy=Policy(args.policy), shard=args.shard, renew_every=args.renew_every,
        max_runtime=args.max_runtime, max_pending=args.max_pending, replace_grace=args.replace_grace,
        allow_unpartitioned=args.allow_unpartitioned, slot=slot,
    )  # fmt: skip
    _resolve(command[0])
    try:
        warden = Warden(store_url(args), quiet=args.quiet)
        guard = Guard(warden, args.job, options)
        run = guard.acquire()
    except StoreUnavailable as e:
        if args.on_store_error != "run":
            print(f"cronwarden: {e}; not running {args.job} (fail closed; --on-store-error=run "
                  "to run unguarded)", file=sys.stderr)  # fmt: skip
            return EXIT_STORE
        print(f"cronwarden: {e}; running {args.job} UNGUARDED (--on-store-error=run)", file=sys.stderr)
        return _unguarded(command)
    try:
        if run is None:
            assert guard.refused is not None
            warden.report_refusal(args.job, guard.refused)
            return int(args.skip_exit_code)
        from cronwarden.supervisor import Supervisor

        code = 0
        while run is not None:
            env = {
                **os.environ,
                "CRONWARDEN_RUN_ID": run.run_id,
                "CRONWARDEN_JOB": run.job,
                "CRONWARDEN_FENCING_TOKEN": str(run.token),
                "CRONWARDEN_LEASE_KEY": run.lease.key,
            }
            if args.shard:
                env["CRONWARDEN_SHARD"] = args.shard
            sup = Supervisor(run, command, env, kill_grace=options.kill_grace,
                             replace_grace=options.replace_grace)  # fmt: skip
            try:
                code = sup.execute()
            except BaseException as e:
                guard.end(run, e)
                raise
            stopped = run.stopped_by or run.lost_reason()
            run = guard.end(run, None, again=options.policy is Policy.QUEUE)
            if isinstance(stopped, LeaseRevoked):
                return EXIT_REPLACED
            if isinstance(stopped, TimedOut):
                return EXIT_TIMED_OUT
            if stopped is not None:
                return EXIT_LEASE_LOST
        return code
    finally:
        warden.close()


def _unguarded(command: list[str]) -> int:
    import subprocess

    from cronwarden.supervisor import exit_status

    return exit_status(subprocess.call(command))
