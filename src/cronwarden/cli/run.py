"""``cronwarden run``: the cron-line wrapper. This is the per-tick hot path:
import only what one guarded run of one child needs."""

from __future__ import annotations

import math
import os
import sys
from typing import TYPE_CHECKING, Any

from cronwarden.cli.args import STORE_FLAG, add_flags, duration
from cronwarden.config import ENV_SCHEDULER_STORE, ENV_STORE, WITHHELD_FROM_COMMAND, JobSettings
from cronwarden.durations import format_duration
from cronwarden.errors import StoreError, StoreUnavailable, UsageError
from cronwarden.events import Event, Outcome
from cronwarden.guard import Guard, Options, Run, Warden, describe_refusal
from cronwarden.policy import Policy
from cronwarden.preflight import MIN_TTL, job_options
from cronwarden.stores.base import Refused

if TYPE_CHECKING:
    import argparse

    from cronwarden.schedule import Schedule
    from cronwarden.stores.base import Store
    from cronwarden.supervisor import SignalRelay


def resolve_command(command: str) -> None:
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


def _schedule(settings: JobSettings) -> Schedule | None:
    """The job's schedule, if it has one. cronsim is imported only for a cron
    expression: ``--every`` and no schedule cost nothing extra."""
    if settings.every is None and settings.schedule is None:
        return None
    from cronwarden.schedule import Schedule

    if settings.every is not None:
        return Schedule(text=f"every {format_duration(settings.every)}", every=settings.every)
    assert settings.schedule is not None
    return Schedule.cron_(settings.schedule, settings.timezone)


def _flags(args: Any) -> dict[str, Any]:
    """The flags given on the command line, as settings (None: not given)."""
    every = None
    if args.every is not None:
        from cronwarden.durations import parse_positive_duration

        every = parse_positive_duration(args.every, what="--every")
    reason = args.reason
    if reason is not None and (not reason.strip() or "\n" in reason.strip()):
        raise UsageError(f"--reason must be one sentence on one line saying why this policy, got {reason!r}")
    return {
        "ttl": args.ttl, "every": every, "schedule": args.schedule, "timezone": args.timezone,
        "policy": None if args.policy is None else Policy(args.policy),
        "reason": None if reason is None else reason.strip(), "grace": args.grace,
        "max_runtime": args.max_runtime, "max_pending": args.max_pending,
        "replace_grace": args.replace_grace, "allow_unpartitioned": args.allow_unpartitioned,
        "renew_every": args.renew_every,
    }  # fmt: skip


def _check_partition(settings: JobSettings, shard: str | None, config_path: str | None) -> None:
    """Policy allow needs a shard from the job's list, or an explained
    unpartitioned overlap."""
    if settings.shards and shard is not None and shard not in settings.shards:
        raise UsageError(f"--shard {shard!r} is not one of job {settings.name}'s shards in {config_path}: "
                         f"{', '.join(settings.shards)}")  # fmt: skip
    if settings.policy is not Policy.ALLOW or shard is not None:
        return
    if settings.shards and not settings.allow_unpartitioned:
        raise UsageError(
            f"policy allow for job {settings.name}: give --shard, one of {', '.join(settings.shards)}"
        )
    if settings.allow_unpartitioned and not settings.reason:
        raise UsageError("--allow-unpartitioned needs --reason 'one sentence on why overlapping runs are "
                         "safe' (or reason = \"…\" in the job's config)")  # fmt: skip


EXIT_LEASE_LOST = 3
EXIT_REPLACED = 4
EXIT_PAUSED = 5
EXIT_TIMED_OUT = 124
EXIT_STORE = 75

EPILOG = """settings: flags > CRONWARDEN_* environment > the job's [jobs.NAME] table in the config file
  (--config, $CRONWARDEN_CONFIG or ./cronwarden.toml) > its [defaults] > built-in defaults.

exit status: the command's own (128+N if killed by signal N; with policy queue, the first
  non-zero status of the runs it made);
  --skip-exit-code (default 0) when skipped or queued (the ledger records it either way);
  128+N when cronwarden itself got signal N (SIGTERM 143, SIGINT 130, SIGHUP 129): the command
  was given the signal, SIGKILLed if still running after the kill grace, and the run recorded
  interrupted; a run stopped by cronwarden stop: the command's (143 after SIGTERM, 137 after
  SIGKILL), recorded stopped; 2 bad usage; 3 lease lost; 4 replaced; 5 the job is paused (cronwarden pause:
  not run, recorded paused); 124 max_runtime exceeded;
  75 store unreachable or locked (fail closed), or the run's end could not be recorded (a full
  disk, say: whatever the command's status, said on stderr); 126 not executable; 127 command not found.

environment given to COMMAND: cronwarden's own, with CRONWARDEN_RUN_ID, CRONWARDEN_JOB,
  CRONWARDEN_FENCING_TOKEN, CRONWARDEN_LEASE_KEY, CRONWARDEN_SLOT (with a slot) and
  CRONWARDEN_SHARD (with --shard); without CRONWARDEN_STORE (it may hold a password: --pass-store
  gives it) or CRONWARDEN_DASHBOARD_TOKEN.

processes: COMMAND runs in a process group of its own and dies with cronwarden (kill -9
  included). When it exits, what it left running, in its group or out of it (setsid, a
  daemon), is killed before the run's end is recorded: no work outlives its lease.
  After kill -9 of cronwarden, the next start on this host finds none of the run's processes
  left (a marker file they hold locked, in $CRONWARDEN_RUNTIME_DIR, else $XDG_RUNTIME_DIR or
  /dev/shm), records the run abandoned and runs at once; a start on another host waits out the ttl.

example (crontab; cron's PATH is /usr/bin:/bin, so give cronwarden's absolute path):
  */10 * * * *  /usr/local/bin/cronwarden run --job reconcile --every 10m --ttl 2m -- /opt/bin/reconcile"""


def _exit_code(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 255:
        raise UsageError(f"--skip-exit-code must be a number from 0 to 255, got {text!r}")
    return int(text)


def _slot(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= LATEST_SLOT:
        raise UsageError(f"--slot must be a time in epoch seconds up to the year 9999, like 1764583800, "
                         f"got {text!r}")  # fmt: skip
    return value


LATEST_SLOT = 253_402_300_799.0
"""9999-12-31T23:59:59Z: a later slot is a mistake, and no date can show it."""


def _ttl(text: str) -> float:
    seconds = duration("--ttl")(text)
    if seconds < MIN_TTL:
        raise UsageError(f"--ttl must be at least 1s (it is renewed every ttl/3, each renewal a round "
                         f"trip to the store), got {text!r}")  # fmt: skip
    return seconds


FLAGS: dict[str, dict[str, Any]] = {
    "--job": {"required": True, "help": "job name (letters, digits, _ . @ -)"},
    "--config": {"metavar": "PATH", "help": "config file (default: $CRONWARDEN_CONFIG, else "
                 "./cronwarden.toml if present); the job's settings there are the defaults of these flags"},
    "--ttl": {"type": _ttl, "metavar": "DURATION",
              "help": "lease time-to-live, renewed every ttl/3 (default 60s)"},
    "--every": {"group": "when", "metavar": "DURATION",
                "help": "the job's period, e.g. 10m (slots, monitor)"},
    "--schedule": {"group": "when", "metavar": "CRON",
                   "help": "the job's cron expression, e.g. '*/10 * * * *' or @daily (five fields)"},
    "--timezone": {"group": "zone", "dest": "timezone", "metavar": "ZONE",
                   "help": "IANA time zone of --schedule, e.g. Europe/Berlin (default: local); the config "
                   "key is timezone"},
    "--tz": {"group": "zone", "dest": "timezone", "metavar": "ZONE", "help": "the same as --timezone"},
    "--policy": {"choices": [x.value for x in Policy],
                 "help": "what a start does while another run holds the lease (default skip)"},
    "--reason": {"metavar": "SENTENCE",
                 "help": "one sentence: why this policy (recorded for the monitor and on-call)"},
    "--grace": {"type": duration("--grace"), "metavar": "DURATION",
                "help": "how late a run may start before the monitor calls the slot missed"},
    "--shard": {"metavar": "KEY", "help": "partition for policy allow: the lease key is JOB:KEY"},
    "--allow-unpartitioned": {"action": "store_true", "default": None,
                              "help": "policy allow without --shard (needs --reason; overlaps are recorded)"},
    "--renew-every": {"type": duration("--renew-every"), "metavar": "DURATION",
                      "help": "heartbeat interval (default ttl/3; must be less than the ttl)"},
    "--max-runtime": {"type": duration("--max-runtime"), "metavar": "DURATION",
                      "help": "stop the run after this long and record timed_out"},
    "--max-pending": {"type": int, "metavar": "N",
                      "help": "policy queue: most starts kept pending (default 1: coalesce)"},
    "--replace-grace": {"type": duration("--replace-grace"), "metavar": "DURATION",
                        "help": "policy replace: SIGTERM-to-SIGKILL time for the old run (default 10s, "
                        "at most what is left of its lease)"},
    "--skip-exit-code": {"type": _exit_code, "default": 0, "metavar": "N",
                         "help": "exit status when the start is skipped or queued (default 0)"},
    "--on-store-error": {"choices": ["fail", "run"], "default": "fail",
                         "help": "store unreachable: fail closed (default, exit 75) or run unguarded"},
    "--slot": {"type": _slot, "metavar": "EPOCH",
               "help": "the scheduled time this run is for, in epoch seconds (the scheduler passes "
               "it; default: the schedule's latest fire time, none without --every or --schedule)"},
    "--quiet": {"action": "store_true", "help": "no line on stderr for a skip"},
    "--pass-store": {"action": "store_true",
                     "help": "give COMMAND the store URL in $CRONWARDEN_STORE (default: withheld, "
                     "since it may hold a password)"},
    "--store": STORE_FLAG,
}  # fmt: skip
"""``run``'s flags, written once: ``configure`` gives them to argparse (for
``--help`` and error messages); ``cli.parse_plain`` reads a plain cron line
with them, without importing argparse. Keys of each entry are argparse's;
``group`` names a mutually exclusive group."""


def configure(p: argparse.ArgumentParser) -> None:
    import argparse

    p.usage = "cronwarden run --job NAME [options] [-- COMMAND [ARG...]]"
    p.description = (
        "Run COMMAND under the job's lease (without one, the job's command from the config "
        "file). A start while another run holds it follows the "
        "policy (default skip: recorded with the holder's run id, host, pid and age)."
    )
    p.epilog = EPILOG
    add_flags(p, FLAGS)
    p.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def main(args: Any) -> int:
    from cronwarden.cli.args import store_url
    from cronwarden.clock import SYSTEM_CLOCK
    from cronwarden.config import find, load, resolve

    command = list(args.command)
    if command and command[0] != "--":
        raise UsageError("run: put the command after --, e.g. cronwarden run --job NAME -- ./job.sh")
    command = command[1:]

    # From the scheduler: its store, for this run only (never the command's).
    scheduler_store = _scheduler_store(os.environ.pop(ENV_SCHEDULER_STORE, None))
    if args.store is None:
        args.store = scheduler_store
    config_path = find(args.config)
    config = load(config_path, job=args.job)
    settings = resolve(args.job, config, _flags(args))
    if not command:
        # The job's configured command (the one the scheduler runs), by hand.
        command = list(settings.command)
        if not command:
            raise UsageError(f"run: no command; put it after --, e.g. cronwarden run --job {args.job} "
                             f"-- ./job.sh, or give [jobs.{args.job}] a command = [...] in the config "
                             "file")  # fmt: skip
    if args.timezone and settings.schedule is None:
        raise UsageError("--timezone applies to a cron schedule; give --schedule 'CRON' too")
    _check_partition(settings, args.shard, config_path)
    schedule = _schedule(settings)
    now = SYSTEM_CLOCK.wall()
    slot = args.slot if args.slot is not None else None if schedule is None else schedule.slot(now)
    options = job_options(settings, shard=args.shard, slot=slot)
    resolve_command(command[0])
    from cronwarden.supervisor import SignalRelay

    # From before the lease is taken until its end is recorded, a SIGTERM,
    # SIGINT or SIGHUP is passed to the command, never allowed to kill
    # cronwarden between ledger writes.
    url = store_url(args, config.store)
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not (args.store or os.environ.get("CRONWARDEN_STORE")
                                                          or config.store):  # fmt: skip
        print(f"cronwarden: warning: the default SQLite store {url.removeprefix('sqlite:///')} is in this "
              "pod's filesystem: it goes with the pod, so other pods see neither its leases nor its "
              "ledger; set CRONWARDEN_STORE to a shared PostgreSQL or Redis store",
              file=sys.stderr)  # fmt: skip
    with SignalRelay() as relay:
        try:
            warden = Warden(url, quiet=args.quiet)
            guard = Guard(warden, args.job, options)
            if settings.in_file and not options.declares():
                # A job of the config file is known to audit and the monitor
                # even when it says nothing beyond the defaults; otherwise
                # the guard declares what the options say as it acquires.
                warden.declare(args.job, options)
            # A paused job's start does not run (cronwarden pause): one read.
            pause = warden.store.pause_state(args.job)
            started: Run | Refused | Event = guard.acquire() if pause is None else pause
        except StoreUnavailable as e:
            if args.on_store_error != "run":
                print(f"cronwarden: {e}; not running {args.job} (fail closed; --on-store-error=run "
                      "to run unguarded)", file=sys.stderr)  # fmt: skip
                return EXIT_STORE
            print(f"cronwarden: {e}; running {args.job} UNGUARDED (--on-store-error=run)", file=sys.stderr)
            relay.close()  # the command gets the signals as they were, and so does cronwarden
            return _unguarded(command)
        try:
            if isinstance(started, Event):
                return _paused(warden, args.job, options.slot, started)
            return _supervise(args, command, options, guard, started, relay, _command_env(args, url))
        finally:
            _prune_a_little(warden.store, config, args.job)
            if config.sinks:
                # Deliver this run's events within [sinks] flush_timeout; never
                # raises, never changes the exit status. Imported only here.
                from cronwarden.outbox import flush_after_run

                flush_after_run(warden.store, {"sinks": config.sinks})
            warden.close()


def _paused(warden: Warden, job: str, slot: float | None, pause: Event) -> int:
    """The job is paused: not run, the start recorded ``paused`` (for its
    slot once, whoever starts it: the slot decision's event id)."""
    from cronwarden.control import describe_pause, paused_slot

    event_id = ""
    if slot is not None:
        from cronwarden.events import EventKind
        from cronwarden.scheduler import slot_event_id

        event_id = slot_event_id(EventKind.PAUSED, job, slot)
    at = warden.clock.wall()
    warden.store.record(paused_slot(job, slot, pause, decided_by=warden.host, at=at, event_id=event_id))
    print(f"cronwarden: {job} not run: {describe_pause(pause)} (cronwarden resume {job} to run it "
          f"again); recorded paused, exit {EXIT_PAUSED}", file=sys.stderr)  # fmt: skip
    return EXIT_PAUSED


EXIT_BY_OUTCOME = {Outcome.LEASE_LOST: EXIT_LEASE_LOST, Outcome.REPLACED: EXIT_REPLACED,
                   Outcome.TIMED_OUT: EXIT_TIMED_OUT}  # fmt: skip


RUN_PRUNE_BUDGET = 50
"""Events a run's end prunes at most: a few milliseconds (bench/retention.py),
so that a ledger with retention never grows between monitoring passes."""


def _prune_a_little(store: Store, config: Any, job: str) -> None:
    """One small retention step, if the store URL or the config says what to
    keep; never changes the run's exit status."""
    from cronwarden.cli.args import retention
    from cronwarden.clock import SYSTEM_CLOCK
    from cronwarden.errors import StoreError

    keep = retention(store, config)
    if keep.active:
        try:
            store.prune(keep, SYSTEM_CLOCK.wall(), jobs=[job], budget=RUN_PRUNE_BUDGET)
        except StoreError:
            pass  # the next run or the monitor will


def _scheduler_store(given: str | None) -> str | None:
    """The store ``cronwarden scheduler`` passed: ``fd:N``, a pipe to read
    the URL from (a plain URL from an earlier version is taken as it is)."""
    if given is None or not given.startswith("fd:"):
        return given
    try:
        fd = int(given[3:])
        with os.fdopen(fd, "rb") as f:
            return f.read().decode()
    except (ValueError, OSError) as e:
        raise UsageError(f"${ENV_SCHEDULER_STORE}={given!r}: cannot read the scheduler's store ({e}); "
                         "expected fd:N, a pipe cronwarden scheduler opened") from None  # fmt: skip


def _command_env(args: Any, url: str) -> dict[str, str]:
    """cronwarden's environment without what may hold a password."""
    env = {k: v for k, v in os.environ.items() if k not in WITHHELD_FROM_COMMAND}
    if args.pass_store:
        env[ENV_STORE] = url
    return env


def _supervise(args: Any, command: list[str], options: Options, guard: Guard, started: Run | Refused,
               relay: SignalRelay, base_env: dict[str, str]) -> int:  # fmt: skip
    """Run the command for the granted run (and, with policy queue, for each
    pending start after it); the exit status."""
    if isinstance(started, Refused):
        if not args.quiet:  # the command line's one line; the library logs instead
            print(describe_refusal(args.job, started, guard.clock.wall()), file=sys.stderr)
        return int(args.skip_exit_code)
    if started.overlapped is not None and not args.quiet:
        h = started.overlapped
        print(f"cronwarden: {args.job} run {started.run_id} overlaps run {h.run_id} (host {h.host}, "
              f"pid {h.pid}); both run (policy allow, unpartitioned); recorded as overlap",
              file=sys.stderr)  # fmt: skip
    from cronwarden.supervisor import Supervisor

    code = 0
    run: Run | None = started
    while run is not None:
        if relay.signalled is not None:
            # Asked to stop before this run's command started: it never runs.
            stop = relay.interrupted("before the command started")
            guard.end(run, stop)
            return stop.exit_code
        env = {
            **base_env,
            "CRONWARDEN_RUN_ID": run.run_id,
            "CRONWARDEN_JOB": run.job,
            "CRONWARDEN_FENCING_TOKEN": str(run.token),
            "CRONWARDEN_LEASE_KEY": run.lease.key,
        }
        if args.shard:
            env["CRONWARDEN_SHARD"] = args.shard
        if options.slot is not None:
            slot = options.slot
            env["CRONWARDEN_SLOT"] = str(int(slot)) if slot == int(slot) else repr(slot)
        sup = Supervisor(run, command, env, kill_grace=options.kill_grace,
                         replace_grace=options.replace_grace, relay=relay)  # fmt: skip
        try:
            exited = sup.execute()
        except BaseException as e:
            guard.end(run, e)
            raise
        code = code or exited.code
        # A signal to cronwarden asks the run to stop: pending starts stay
        # pending for the next holder rather than starting now.
        again = options.policy is Policy.QUEUE and relay.signalled is None
        try:
            ending = guard.end(run, exited.interrupted, exit_code=exited.code, stopped_by=exited.stopped_by,
                               again=again)  # fmt: skip
        except StoreError as e:  # not transient (read-only, damaged): no retry would do
            print(f"cronwarden: could not record the end of run {run.run_id}: {e}", file=sys.stderr)
            ending = None
        if ending is None or ending.finished is None:
            # Not a success, whatever the command did: the ledger still says
            # running until the lease expires and the monitor (or the next
            # start) records the run abandoned.
            print(f"cronwarden: {run.job} run {run.run_id}: the command exited {exited.code} but the "
                  f"store did not record it; exit {EXIT_STORE} (recorded abandoned once its lease "
                  "expires)", file=sys.stderr)  # fmt: skip
            return EXIT_STORE
        if ending.end.outcome in EXIT_BY_OUTCOME:
            return EXIT_BY_OUTCOME[ending.end.outcome]
        if ending.end.outcome is Outcome.INTERRUPTED and exited.interrupted is not None:
            return exited.interrupted.exit_code
        run = ending.next
    return code


def _unguarded(command: list[str]) -> int:
    import subprocess

    from cronwarden.keeper import exit_status

    return exit_status(subprocess.call(command))
