"""``cronwarden run``: the cron-line wrapper. This is the per-tick hot path:
import only what one guarded run of one child needs."""

from __future__ import annotations

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


def run_command(args: Any, command: list[str]) -> int:
    from cronwarden.cli import EXIT_LEASE_LOST, EXIT_REPLACED, EXIT_STORE, EXIT_TIMED_OUT, store_url
    from cronwarden.clock import SYSTEM_CLOCK

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
