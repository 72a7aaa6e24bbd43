"""``cronwarden backfill``: run a job's past slots now, through the same slot
claims, lease and ledger as the scheduler, recorded as backfill."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.errors import UsageError

MOST_SLOTS = 10_000
"""Slots one backfill runs at most (a week of one-minute slots)."""
BACKFILL_CLAIMS = "/backfill"
"""Appended to the job's name for the claims backfills take among
themselves: no job name has a '/', so these never meet a scheduler's."""

EPILOG = """which slots: every fire time of the job's schedule from --from to --to (both included), oldest
  first, one after the other. A slot is left alone when the ledger has a run for it already,
  when a scheduler claimed it (it fired it, or is about to) and did not record it misfired, or
  when another backfill claimed it: so a second identical backfill runs none, and a backfill
  running beside the schedulers never doubles a fire.

each run: the job's command with its lease, policy, ttl and max_runtime, as the scheduler runs
  it; CRONWARDEN_SLOT names the slot. history shows it as a backfill of its slot, and
  history --slots gives the slot the decision backfilled.

times: 2026-12-01T08:00Z, 2026-12-01T09:00:00+01:00, 2026-12-01 08:00 (UTC when no offset is
  given), or epoch seconds.

exit status: 0 every run succeeded (or none was needed); 1 a run failed or did not start;
  2 bad usage or configuration; 75 store unreachable.

example:
  cronwarden backfill nightly-report --from 2026-12-01T00:00Z --to 2026-12-03T00:00Z --dry-run"""


def configure(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag

    p.description = (
        "Run a job's past slots now, each once, through the same slot claims and lease as the "
        "scheduler; each run is recorded as a backfill of its slot."
    )
    p.epilog = EPILOG
    p.add_argument("job", help="job name (a [jobs.NAME] table with a command and a schedule)")
    p.add_argument("--from", dest="start", required=True, type=_time("--from"), metavar="TIME",
                   help="the first slot's time or earlier")  # fmt: skip
    p.add_argument("--to", dest="end", required=True, type=_time("--to"), metavar="TIME",
                   help="the last slot's time or later; not in the future")  # fmt: skip
    p.add_argument("--dry-run", action="store_true",
                   help="list the slots and what the ledger says of each; claim and run nothing")  # fmt: skip
    p.add_argument("--by", metavar="NAME", help="who asks, for the record (default: your login name)")
    p.add_argument("--config", metavar="PATH", help="config file (default: $CRONWARDEN_CONFIG or "
                   "./cronwarden.toml)")  # fmt: skip
    add_store_flag(p)


def _time(flag: str) -> Any:
    def parse(text: str) -> float:
        from datetime import UTC, datetime

        raw = text.strip()
        try:
            return float(raw)
        except ValueError:
            pass
        try:
            t = datetime.fromisoformat(raw.replace("z", "Z"))
        except ValueError:
            raise UsageError(
                f"{flag} must be a time like 2026-12-01T08:00Z or epoch seconds, got {text!r}"
            ) from None
        return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()

    parse.__name__ = flag
    return parse


def _who(given: str | None) -> str:
    if given is not None:
        if not given.strip() or len(given) > 200 or "\n" in given:
            raise UsageError(f"--by must be a name of at most 200 characters on one line, got {given!r}")
        return given.strip()
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no login name (a container with an unnamed uid)
        return "unknown"


def main(args: Any, *, clock: Clock = SYSTEM_CLOCK) -> int:
    from cronwarden.cli.args import store_url
    from cronwarden.config import find, load
    from cronwarden.config.settings import check_name
    from cronwarden.monitor.slots import expected_slots
    from cronwarden.scheduler import DEFAULT_KEEP, DEFAULT_MISFIRE_GRACE, ScheduledJob
    from cronwarden.stores import open_store

    check_name(args.job, "job name")
    now = clock.wall()
    if args.end < args.start:
        raise UsageError("backfill: --to is before --from; expected --from TIME --to LATER_TIME")
    if args.end > now:
        raise UsageError("backfill: --to is in the future; a backfill runs past slots only (the scheduler "
                         "runs the coming ones)")  # fmt: skip
    path = find(args.config)
    if path is None:
        raise UsageError("backfill: no config file (--config PATH, $CRONWARDEN_CONFIG or "
                         f"./cronwarden.toml); expected one with a [jobs.{args.job}] table that has a "
                         "command and a schedule")  # fmt: skip
    config = load(path)
    settings = config.job(args.job)
    if settings is None or not settings.command or settings.schedule_text() is None:
        raise UsageError(f"backfill: {path} has no [jobs.{args.job}] table with a command and a schedule "
                         "or every")  # fmt: skip
    job = ScheduledJob.from_settings(settings)
    slots = expected_slots(job.schedule.text, args.start - 1e-6, args.end, most=MOST_SLOTS + 1)
    if len(slots) > MOST_SLOTS:
        raise UsageError(f"backfill: more than {MOST_SLOTS} slots from --from to --to; backfill a shorter "
                         "span at a time")  # fmt: skip
    who = _who(args.by)
    store = open_store(store_url(args, config.store))
    try:
        pause = None if args.dry_run else store.pause_state(args.job)
        if pause is not None:  # cronwarden pause: nothing starts the job, past slots included
            from cronwarden.cli.run import EXIT_PAUSED
            from cronwarden.control import describe_pause

            print(f"cronwarden: backfill: {args.job} is {describe_pause(pause)}; nothing run (cronwarden "
                  f"resume {args.job} first)", file=sys.stderr)  # fmt: skip
            return EXIT_PAUSED
        return _backfill(store, job, slots, who, args.dry_run, clock, DEFAULT_MISFIRE_GRACE, DEFAULT_KEEP)
    finally:
        store.close()


def _backfill(store: Any, job: Any, slots: list[float], who: str, dry_run: bool, clock: Clock,
              grace: float, keep: float) -> int:  # fmt: skip
    import secrets
    import socket

    from cronwarden.events import EventKind
    from cronwarden.guard import Warden
    from cronwarden.monitor.views import when
    from cronwarden.scheduler import InProcess
    from cronwarden.stores.base import EventQuery

    def say(line: str) -> None:
        print(line, flush=True)

    name = job.name
    first = slots[0] if slots else 0.0
    # What the ledger says of the span: runs started for a slot (their
    # started events name it; a start may come a little before its slot
    # on a host whose clock is ahead), and slots a scheduler gave up on.
    seen = store.events(EventQuery(job=name, kinds=[EventKind.STARTED, EventKind.MISFIRED],
                                   since=first - 3600, limit=10 * MOST_SLOTS + 1000))  # fmt: skip
    ran = {e.data.get("slot"): e.run_id for e in seen if e.kind is EventKind.STARTED}
    misfired = {e.data.get("slot") for e in seen if e.kind is EventKind.MISFIRED}
    if dry_run:
        for t in slots:
            what = f"ran already (run {ran[t]})" if t in ran else "would run (unless claimed meanwhile)"
            say(f"{name}: slot {when(t)} {what}")
        todo = sum(t not in ran for t in slots)
        say(f"backfill {name}: {len(slots)} slot(s), {todo} without a run; dry run: nothing claimed or run")
        return 0

    owner = f"backfill:{who}@{socket.gethostname()}#{secrets.token_hex(4)}"
    warden = Warden(store, quiet=True, clock=clock)
    runner = InProcess(warden, concurrency=1, misfire_grace=grace, instance=owner, say=say)
    current: list[Any] = []
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)
        for fire in current:
            fire.send_signal(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    counts = {"ran": 0, "failed": 0, "already": 0, "claimed": 0}
    try:
        for t in slots:
            if stopping:
                break
            if t in ran:
                say(f"{name}: slot {when(t)} ran already (run {ran[t]})")
                counts["already"] += 1
                continue
            # The scheduler's claim first: won, no scheduler fires the slot
            # now; held, the slot is its own unless it recorded it misfired
            # (a final "not started"). Then the backfills' own claim, so two
            # backfills of one span run each slot once.
            holder = store.claim_slot(name, t, owner, keep)
            if holder != owner and t not in misfired:
                say(f"{name}: slot {when(t)} left alone: claimed by {holder}")
                counts["claimed"] += 1
                continue
            other = store.claim_slot(name + BACKFILL_CLAIMS, t, owner, keep)
            if other != owner:
                say(f"{name}: slot {when(t)} left alone: backfilled by {other}")
                counts["claimed"] += 1
                continue
            for shard in job.settings.shards or (None,):
                fire = runner(job, t, shard, backfill=who)
                current[:] = [fire]
                code = fire.wait()
                current.clear()
                counts["ran" if code == 0 else "failed"] += 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        runner.close()
        warden.close()
    stopped = f"; stopped by signal {stopping[0]}" if stopping else ""
    say(f"backfill {name}: {len(slots)} slot(s): {counts['ran']} run, {counts['failed']} failed or not "
        f"started, {counts['already']} ran already, {counts['claimed']} claimed elsewhere"
        f"{stopped}")  # fmt: skip
    return 1 if counts["failed"] or stopping else 0
