"""``cronwarden trigger``, ``pause``, ``resume`` and ``stop``: an operator's
controls, through the store, so they hold on every host (``cronwarden.control``)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.errors import StoreUnavailable, UsageError

if TYPE_CHECKING:
    import argparse

    from cronwarden.stores.base import Store

EXIT_REFUSED = 1
"""``trigger``: the start was refused by the job's policy (skipped, queued)."""

TRIGGER_EPILOG = """The run starts here, in this process, whether or not a scheduler is running
(a scheduler does not pick it up): the job's configured command, under the job's lease and
policy, recorded like any run and marked manual in the ledger (a triggered event with who and
why). It serves no slot: the scheduler still fires the next scheduled one.

exit status: the command's; 1 when the policy refused the start (skip: another run holds the
lease, printed with its run id, host and pid; queue: it waits for that run); 5 when the job is
paused; otherwise as cronwarden run (2 bad usage, 3 lease lost, 75 store unreachable, ...)."""

PAUSE_EPILOG = """While a job is paused, nothing starts it on any host: each slot the scheduler
reaches is recorded paused instead of fired, and cronwarden run records its start paused and
exits 5. The monitor does not report those slots missed. Runs already going are left alone
(cronwarden stop ends one). cronwarden status lists paused jobs."""

STOP_EPILOG = """The run is asked to stop through the store, on whatever host it runs: its
heartbeat sees the request at its next renewal (every ttl/3 by default), then its command gets
SIGTERM and, if still running after the grace, SIGKILL. The grace is at most what is left of
the run's lease. The run records stopped, naming who asked and why; until then cronwarden
status shows "stop requested by ... at ...". stop returns once the request is recorded; with
--wait it waits for the run's end (up to the grace plus the run's ttl) and prints it."""


def _store(args: Any, clock: Clock) -> Store:
    from cronwarden.cli.window import open_store_of

    return open_store_of(args, clock)


def _job_name(job: str) -> str:
    from cronwarden.config.settings import check_name

    return check_name(job, "job name")


# -- trigger ------------------------------------------------------------------


def configure_trigger(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag

    p.description = "Run a job now, by hand, through its lease and policy (its configured command)."
    p.epilog = TRIGGER_EPILOG
    p.add_argument("job", help="job name, with a command in the config file")
    p.add_argument("--reason", default="", help="why, in one sentence (recorded)")
    p.add_argument("--config", metavar="PATH", help="config file (default: $CRONWARDEN_CONFIG, else "
                   "./cronwarden.toml)")  # fmt: skip
    add_store_flag(p)


def main_trigger(args: Any) -> int:
    from cronwarden.cli.args import store_url
    from cronwarden.cli.run import _command_env, _paused, _supervise, resolve_command
    from cronwarden.config import find, load, resolve
    from cronwarden.control import operator, triggered
    from cronwarden.events import new_id
    from cronwarden.guard import Guard, Options, Warden
    from cronwarden.supervisor import SignalRelay

    job = _job_name(args.job)
    reason = args.reason.strip()
    if "\n" in reason:
        raise UsageError(f"trigger: --reason must be one sentence on one line, got {args.reason!r}")
    config_path = find(args.config)
    config = load(config_path, job=job)
    settings = resolve(job, config, {})
    command = list(settings.command)
    if not command:
        where = config_path or "the config file"
        raise UsageError(f"trigger: job {job} has no command in {where}; give [jobs.{job}] a command "
                         "= [...] (or start it with cronwarden run --job NAME -- COMMAND)")  # fmt: skip
    resolve_command(command[0])
    # No schedule in the options: a manual run serves no slot and claims none.
    options = Options(
        ttl=settings.ttl, policy=settings.policy, renew_every=settings.renew_every,
        max_runtime=settings.max_runtime, max_pending=settings.max_pending,
        replace_grace=settings.replace_grace, allow_unpartitioned=settings.allow_unpartitioned,
    )  # fmt: skip
    url = store_url(args, config.store)
    by = operator()
    run_args = _RunArgs(job=job)
    with SignalRelay() as relay:
        warden = Warden(url)
        try:
            try:
                pause = warden.store.pause_state(job)
                if pause is not None:
                    return _paused(warden, job, None, pause)
                guard = Guard(warden, job, options)
                run_id = new_id()
                started = guard.acquire(run_id)
                warden.store.record(triggered(job, run_id, by=by, reason=reason, at=warden.clock.wall()))
            except StoreUnavailable as e:
                print(f"cronwarden: {e}; not running {job} (fail closed)", file=sys.stderr)
                from cronwarden.cli.run import EXIT_STORE

                return EXIT_STORE
            from cronwarden.guard import describe_refusal
            from cronwarden.stores.base import Refused

            if isinstance(started, Refused):
                print(describe_refusal(job, started, warden.clock.wall(), manual=True), file=sys.stderr)
                return EXIT_REFUSED
            print(f"cronwarden: {job} run {started.run_id} started by hand ({by})", file=sys.stderr)
            return _supervise(run_args, command, options, guard, started, relay, _command_env(run_args, url))
        finally:
            warden.close()


class _RunArgs:
    """What ``cronwarden run``'s supervision reads of its flags, for a
    manual run that started (a refusal is said by ``main_trigger``): an
    overlap said, no shard, the store withheld."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.quiet = False
        self.shard = None
        self.pass_store = False


# -- pause and resume ---------------------------------------------------------


def configure_pause(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag

    p.description = "Pause a job on every host: no scheduled or cronwarden run start runs it until resume."
    p.epilog = PAUSE_EPILOG
    p.add_argument("job", help="job name")
    p.add_argument("--reason", required=True, help="why, in one sentence (recorded and shown)")
    add_store_flag(p)


def configure_resume(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag

    p.description = "Resume a paused job: its next slot runs as scheduled (paused slots are not replayed)."
    p.add_argument("job", help="job name")
    p.add_argument("--reason", default="", help="why (recorded)")
    add_store_flag(p)


def main_pause(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.control import describe_pause, one_sentence, operator, pause

    out = out or sys.stdout
    job = _job_name(args.job)
    reason = one_sentence(args.reason, "pause: --reason")
    store = _store(args, clock)
    try:
        standing = store.pause_state(job)
        if standing is not None:
            print(f"{job} is already {describe_pause(standing)}", file=out)
            return 0
        event = pause(store, job, by=operator(), reason=reason, at=clock.wall())
    finally:
        store.close()
    print(f"{job} {describe_pause(event)}", file=out)
    return 0


def main_resume(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.control import operator, resume

    out = out or sys.stdout
    job = _job_name(args.job)
    if "\n" in args.reason.strip():
        raise UsageError(f"resume: --reason must be one line, got {args.reason!r}")
    store = _store(args, clock)
    try:
        if store.pause_state(job) is None:
            raise UsageError(f"resume: {job} is not paused")
        by = operator()
        resume(store, job, by=by, reason=args.reason.strip(), at=clock.wall())
    finally:
        store.close()
    print(f"{job} resumed by {by}", file=out)
    return 0


# -- stop ---------------------------------------------------------------------


def configure_stop(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag, duration

    p.usage = "cronwarden stop RUN_ID|JOB [--reason SENTENCE] [--grace 30s] [--wait]"
    p.description = "Stop an open run on whatever host it runs (its command: SIGTERM, then SIGKILL)."
    p.epilog = STOP_EPILOG
    p.add_argument("target", metavar="RUN_ID|JOB", help="the run's id, or a job with one open run")
    p.add_argument("--reason", default="", help="why, in one sentence (recorded)")
    p.add_argument("--grace", type=duration("--grace", allow_zero=True), default=30.0, metavar="DURATION",
                   help="SIGTERM to SIGKILL (default 30s)")  # fmt: skip
    p.add_argument("--wait", action="store_true", help="wait for the run's recorded end and print it")
    add_store_flag(p)


def main_stop(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.control import open_run, operator, request_stop
    from cronwarden.durations import format_duration

    out = out or sys.stdout
    if "\n" in args.reason.strip():
        raise UsageError(f"stop: --reason must be one line, got {args.reason!r}")
    store = _store(args, clock)
    try:
        run = open_run(store, args.target)
        by = operator()
        if not request_stop(store, run, by=by, reason=args.reason.strip(), grace=args.grace, at=clock.wall()):
            raise UsageError(f"stop: run {run.run_id} of {run.job} is no longer running, or is being "
                             "replaced by a newer start (see cronwarden status)")  # fmt: skip
        print(f"stop requested for {run.job} run {run.run_id} on host {run.host} (pid {run.pid}) by {by}; "
              f"SIGKILL {format_duration(args.grace)} after SIGTERM", file=out)  # fmt: skip
        if args.wait:
            # Renewals are refused from now on: the run ends by its lease's expiry.
            left = run.expires_in if run.expires_in is not None and run.expires_in > 0 else 60.0
            return _wait_for_end(store, run.run_id, left + 10.0, clock, out)
    finally:
        store.close()
    return 0


def _wait_for_end(store: Store, run_id: str, timeout: float, clock: Clock, out: TextIO) -> int:
    """Poll the run's record until it ends (0) or ``timeout`` passes (1)."""
    deadline = clock.monotonic() + timeout
    while True:
        ended = store.run(run_id)
        if ended is not None and ended.outcome is not None:
            said = f": {ended.detail}" if ended.detail else ""
            print(f"run {run_id} {ended.outcome.value}{said}", file=out)
            return 0
        if clock.monotonic() >= deadline:
            print(f"run {run_id} has not recorded its end yet", file=out)
            return 1
        clock.sleep(0.25)
