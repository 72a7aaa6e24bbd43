"""``cronwarden scheduler``: run the config file's jobs at their scheduled
times, on one host or several (see ``cronwarden.scheduler``)."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from cronwarden.errors import UsageError
from cronwarden.supervisor import CommandNotExecutable, CommandNotFound

EPILOG = """jobs: every [jobs.NAME] table with a command and a schedule (or every). Each fire runs
  in the scheduler's process as `cronwarden run --job NAME --slot T -- COMMAND` would: the
  job's lease, ttl, policy and max_runtime, the command in its own process group, the end
  recorded. At most --concurrency runs at once; more wait in a start queue, and one that
  reaches its start later than --misfire-grace is recorded misfired, not started. A job
  with shards starts one run per shard. detach = true: the fire is a `cronwarden run`
  child in a session of its own, which a restart of the scheduler leaves running.

several hosts: start the same config on each, with a store they share (postgresql://…,
  redis://…). Each fire is claimed in the store by job and time: one instance runs it,
  the others print who did. An instance that stops loses nothing but its own fires.

reload: SIGHUP reads the config file again: added jobs fire from their next slot, removed
  ones never again, changed ones with their new settings from their next slot; runs already
  going keep theirs. A file with a problem changes nothing (one line says what). The store
  and the flags are read at start only.

stopping: SIGTERM or Ctrl-C stops firing, sends SIGTERM to
  the runs still going (each stops its command and records how it ended) and waits up to
  --stop-timeout for them, then SIGKILLs the rest; a second signal SIGKILLs them at once.
  --for first waits up to --stop-timeout for the runs still going to end on their own.
  Detached runs are left running either way.

exit status: 0 stopped; 2 bad usage or configuration; 75 store unreachable at start.

example:
  cronwarden scheduler --config /etc/cronwarden.toml --store postgresql://cw@db/cronwarden"""


def configure(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag, duration
    from cronwarden.scheduler import (
        DEFAULT_CONCURRENCY,
        DEFAULT_KEEP,
        DEFAULT_MISFIRE_GRACE,
        DEFAULT_STOP_TIMEOUT,
    )

    p.description = (
        "Run the config file's jobs at their scheduled times: a small cron daemon whose every "
        "fire is a guarded run, claimed once per slot across all the instances that share a store."
    )
    p.epilog = EPILOG
    p.add_argument("--config", metavar="PATH", help="config file (default: $CRONWARDEN_CONFIG or "
                   "./cronwarden.toml)")  # fmt: skip
    p.add_argument("--misfire-grace", type=duration("--misfire-grace"), default=DEFAULT_MISFIRE_GRACE,
                   metavar="DURATION",
                   help="fire a slot at most this late (default 60s); later ones are not started "
                   "late")  # fmt: skip
    p.add_argument("--keep", type=duration("--keep"), default=DEFAULT_KEEP, metavar="DURATION",
                   help="how long the store keeps a slot's claim (default 1d; must exceed the grace "
                   "plus the clock skew between hosts)")  # fmt: skip
    p.add_argument("--id", metavar="NAME", help="this instance's name in claims and messages "
                   "(default HOST:PID)")  # fmt: skip
    p.add_argument("--for", dest="for_", type=duration("--for"), metavar="DURATION",
                   help="stop after this long (default: until SIGTERM or Ctrl-C)")  # fmt: skip
    p.add_argument("--stop-timeout", type=duration("--stop-timeout"), default=DEFAULT_STOP_TIMEOUT,
                   metavar="DURATION",
                   help="when stopping, wait this long for runs still going, then SIGKILL them "
                   "(default 30s)")  # fmt: skip
    p.add_argument("--concurrency", type=_concurrency, default=DEFAULT_CONCURRENCY, metavar="N",
                   help=f"runs starting or running at once (default {DEFAULT_CONCURRENCY}); more wait "
                   "in the start queue")  # fmt: skip
    add_store_flag(p)


class _Flusher:
    """Delivers the ledger to the config's sinks after runs end, as each
    ``cronwarden run`` does after its own, from one thread: ends that come
    while a flush is going are delivered by the next one."""

    def __init__(self, store: Any, sinks: Any) -> None:
        import threading

        self._store = store
        self._doc = {"sinks": sinks}
        self._due = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="cronwarden-flush", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        self._due.set()

    def _loop(self) -> None:
        from cronwarden.outbox import flush_after_run

        while True:
            self._due.wait()
            self._due.clear()
            flush_after_run(self._store, self._doc)
            if self._closing:
                return

    def close(self, timeout: float) -> None:
        """One last flush (the last runs' ends), waited for at most ``timeout``."""
        self._closing = True
        self._due.set()
        self._thread.join(timeout)


def _reload(sched: Any, path: str, store_in_file: str | None, warden: Any,
            say: Any) -> None:  # fmt: skip
    """SIGHUP: read the config file again and fire its jobs from now on
    (``Scheduler.reload``). A file that does not load, or has no job with a
    command, changes nothing: one line says why and the old jobs go on."""
    from cronwarden.config import load
    from cronwarden.errors import CronwardenError
    from cronwarden.preflight import job_options
    from cronwarden.scheduler import ScheduledJob

    head = f"cronwarden scheduler {sched.instance}: SIGHUP: reload of {path}"
    try:
        config = load(path)
        jobs = [ScheduledJob.from_settings(j) for j in config.jobs if j.command]
        if not jobs:
            raise CronwardenError("no job has a command")
    except (CronwardenError, OSError, ValueError) as e:
        problems: tuple[Any, ...] = getattr(e, "problems", ())
        why = f"{problems[0]} (and {len(problems) - 1} more)" if len(problems) > 1 else str(e)
        say(f"{head} refused, the running config stays: {' '.join(why.split())}")
        return
    added, removed, changed = sched.reload(jobs)
    for job in jobs:
        if (job.name in added or job.name in changed) and not job.settings.detach:
            try:
                # Through the warden the fires guard with, as at start.
                warden.declare(job.name, job_options(job.settings))
            except CronwardenError as e:
                say(f"{head}: {job.name}: its settings not saved for the monitor: {e}")
    said = "; ".join(f"{what} {', '.join(names)}" for what, names in
                     (("added", added), ("removed", removed), ("changed", changed)) if names)  # fmt: skip
    kept = "" if config.store in (None, store_in_file) else "; its store is read at start only: not changed"
    say(f"{head}: {len(jobs)} job(s){': ' + said if said else ', no change'}{kept}")


def _concurrency(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 10_000:
        raise UsageError(f"--concurrency must be a whole number from 1 to 10000, got {text!r}")
    return int(text)


def main(args: Any) -> int:
    from cronwarden.cli.args import store_url
    from cronwarden.cli.run import resolve_command
    from cronwarden.config import find, load
    from cronwarden.errors import mask_password
    from cronwarden.guard import Warden
    from cronwarden.keeper import Launcher
    from cronwarden.preflight import job_options
    from cronwarden.scheduler import InProcess, Launchers, RunLauncher, ScheduledJob, Scheduler, Wakeup
    from cronwarden.stores import open_store

    path = find(args.config)
    if path is None:
        raise UsageError("scheduler: no config file (--config PATH, $CRONWARDEN_CONFIG or "
                         "./cronwarden.toml); expected one with [jobs.NAME] tables that have a command "
                         "and a schedule")  # fmt: skip
    config = load(path)
    jobs = [ScheduledJob.from_settings(j) for j in config.jobs if j.command]
    if not jobs:
        raise UsageError(f"scheduler: no job in {path} has a command; add e.g. command = [\"/opt/bin/job\"] "
                         "and a schedule or every to a [jobs.NAME] table")  # fmt: skip
    if args.keep <= args.misfire_grace:
        raise UsageError(f"--keep must be longer than --misfire-grace ({args.misfire_grace:g}s), "
                         f"got {args.keep:g}s")  # fmt: skip
    if args.id is not None and (not args.id.strip() or len(args.id) > 200):
        raise UsageError(f"--id must be a non-empty name of at most 200 characters, got {args.id!r}")
    for job in jobs:
        try:
            resolve_command(job.settings.command[0])
        except (CommandNotFound, CommandNotExecutable) as e:
            # Not fatal: one job's missing binary must not stop the others
            # (a deploy may bring it); each fire of it fails the same way.
            print(f"cronwarden scheduler: {job.name}: {e}; each fire will fail", file=sys.stderr)

    url = store_url(args, config.store)
    # What config check checks beyond the file, by the same functions: each
    # job's settings as its runs will check them, the host name, the store URL.
    from cronwarden.config import ConfigError
    from cronwarden.preflight import problems

    source = "--store" if args.store else config.store_source
    found = problems(config._replace(store=url, store_source=source))
    if found:
        raise ConfigError(found)
    store = open_store(url)
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    reloads: list[int] = []

    def on_hangup(signum: int, _frame: object) -> None:
        reloads.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    # A detached run ended: wake up and reap it now. The handler does
    # nothing; the wakeup fd (see Wakeup) is what ends the sleep.
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    wakeup = Wakeup()

    def say(line: str) -> None:
        print(line, flush=True)

    kwargs: dict[str, Any] = {} if args.id is None else {"instance": args.id}
    # Started by the main thread, before any other: the launcher's parent
    # death signal comes when the thread that started it ends.
    launcher = Launcher()
    warden = Warden(store, quiet=True)
    flusher = _Flusher(store, config.sinks) if config.sinks else None
    in_process = InProcess(warden, concurrency=args.concurrency, misfire_grace=args.misfire_grace, say=say,
                           ended=None if flusher is None else flusher.poke, launcher=launcher)  # fmt: skip
    launch = Launchers(in_process=in_process, detached=RunLauncher(url, path))
    sched = Scheduler(store, jobs, launch, misfire_grace=args.misfire_grace, keep=args.keep, say=say,
                      **kwargs)  # fmt: skip
    in_process.instance = sched.owner
    # In-process fires claim their slot as they start (see claim_at_start);
    # a detached one is claimed when due, as its child starts at once.
    in_process.claim = sched.claim_at_start
    sched.claims_at_start = lambda job: not job.settings.detach
    unscheduled = [j.name for j in config.jobs if not j.command]
    listed = ", ".join(f"{j.name} ({j.schedule.text})" for j in jobs)
    if unscheduled:
        listed += f"; without a command, not scheduled here: {', '.join(unscheduled)}"
    try:
        # A claim now, of a slot that is never a fire time: a store that is
        # unreachable (exit 75), refuses us or refuses writes (a replica, a
        # read-only user: exit 2) says so at start, not at the first fire,
        # maybe a day away. Forgotten like any claim.
        store.claim_slot(jobs[0].name, -1.0, sched.owner, args.keep)
        for job in jobs:
            # What each job declares (schedule, policy, …), saved for the
            # monitor once at start through the warden its fires guard with,
            # so a fire's own declaration finds it done. A detached job's
            # `cronwarden run` declares it itself.
            if not job.settings.detach:
                warden.declare(job.name, job_options(job.settings))
        say(
            f"cronwarden scheduler {sched.instance}: {len(jobs)} job(s) from {path} "
            f"on {mask_password(url)}: {listed}"
        )
        until = None if args.for_ is None else sched.clock.wall() + args.for_

        def between() -> None:
            if reloads:
                reloads.clear()
                _reload(sched, path, config.store, warden, say)

        sched.serve(wakeup.sleep, lambda: bool(stopping), until, between)
        if stopping:
            say(f"cronwarden scheduler {sched.instance}: signal {stopping[0]}: stopping "
                f"{len(sched.running)} run(s) still going")  # fmt: skip
            sched.stop_runs(args.stop_timeout, wakeup.sleep, lambda: len(stopping))
        else:
            sched.wait_runs(args.stop_timeout, wakeup.sleep, lambda: len(stopping))
    finally:
        in_process.close()
        if flusher is not None:
            flusher.close(timeout=10.0)
        wakeup.close()
        warden.close()
        store.close()
        launcher.close()
    say(f"cronwarden scheduler {sched.instance}: stopped; fired {sched.fired} slot(s)")
    return 0
