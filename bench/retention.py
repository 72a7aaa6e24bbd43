"""Retention over a long life: JOBS jobs running every EVERY seconds for
DAYS days, on a fast-forwarded clock (each run's start and end are given
their simulated times; the store's own clock only judges the leases, which
are released at once), with ``retention = 30d``. After each simulated day,
pruning runs as the monitor runs it (bounded steps until done), and each
run's end runs the small step ``cronwarden run`` takes.

Prints, per store: the ledger's size at the end and its ceiling
(``retained runs x bytes per run`` as measured here), whether the open run
and the raised finding written on day 0 survived, the longest prune step
(the time pruning adds to the call that makes it) against the tail of the
plain cycles (acquire + finish, every one timed) of the same run, and a
run's cycle with its end-of-run prune step against the cycle alone (the
floor). On SQLite both tails are mostly WAL checkpoints: the commit that
crosses the checkpoint threshold copies the WAL into the file, whichever
call it is.

    python bench/retention.py [--quick] [--store sqlite|postgres|redis|all] [--days N]
        [--every SECONDS] [--jobs N]

``--quick``: 35 days of a run every 15 minutes (about 3,400 runs per job).
The default: 365 days of a run every minute for 10 jobs is 5.3 million
runs through the store's API, hours on a busy machine; the docs quote what
was measured and with which settings.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from cronwarden.events import Event, EventKind, Outcome, new_id
from cronwarden.stores import open_store
from cronwarden.stores.base import PRUNE_BUDGET, End, EventQuery, Granted, Retention, Start, Store
from namespaces import POSTGRES, REDIS, cleanup, url_for

DAY = 86_400.0
RETENTION = Retention(max_age=30 * DAY)
RUN_BUDGET = 50  # cli/run.py's RUN_PRUNE_BUDGET


def _url(store: str, work: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:10]
    if store == "sqlite":
        return f"sqlite:///{work}/ledger.db?synchronous=normal", tag
    if store == "postgres":
        return url_for(store, tag), tag
    # Caps far above what 30 days hold: retention, not the caps, bounds the ledger.
    return url_for(store, tag) + "&runs_per_job=1000000&events_per_job=10000000", tag


def _size(name: str, store: Store, url: str, tag: str) -> int:
    if name == "sqlite":
        import sqlite3

        path = url.split("://", 1)[1].partition("?")[0]
        with sqlite3.connect(path) as db:  # the WAL folded in: the file's own size
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
    if name == "postgres":
        import psycopg

        with psycopg.connect(POSTGRES, autocommit=True) as c:
            row = c.execute("SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n "
                            "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                            (f"cw_bench_{tag}",)).fetchone()  # fmt: skip
            return int(row[0] or 0)
    import redis

    r = redis.Redis.from_url(REDIS)
    total = 0
    for key in r.scan_iter(match=f"cw_bench_{tag}:*", count=1000):
        total += int(r.memory_usage(key, samples=0) or 0)
    r.close()
    return total


def _kept_runs(name: str, store: Store, jobs: list[str], tag: str) -> int:
    """Finished runs kept. On Redis counted in each job's index: reading
    43,200 run records in one call outlasts the client's socket timeout."""
    if name != "redis":
        return sum(len(store.runs(job, limit=10**7)) for job in jobs)
    import redis

    r = redis.Redis.from_url(REDIS)
    try:
        return sum(int(r.zlexcount(f"cw_bench_{tag}:job:{job}", "[#|", "(#}")) for job in jobs)
    finally:
        r.close()


def _cycle(store: Store, job: str, at: float) -> float:
    started = time.perf_counter()
    start = Start(job=job, key=job, run_id=new_id(), host="bench", pid=1, ttl=60.0, at=at)
    granted = store.acquire(start)
    assert isinstance(granted, Granted), granted
    store.finish(granted.lease, End(Outcome.SUCCEEDED, at=at + 5, exit_code=0))
    return time.perf_counter() - started


def bench(name: str, days: int, every: float, jobs: int) -> dict[str, object]:
    work = tempfile.mkdtemp(prefix="cw-bench-retention-")
    url, tag = _url(name, work)
    store = open_store(url)
    t0 = time.time() - days * DAY
    names = [f"job{i}" for i in range(jobs)]
    try:
        # Day 0: a run that never ends and a finding that stays raised.
        still_open = store.acquire(Start(job="forever", key="forever", run_id=new_id(), host="bench", pid=1,
                                         ttl=10 * 365 * DAY, at=t0))  # fmt: skip
        assert isinstance(still_open, Granted)
        store.record(Event(kind=EventKind.STUCK, job="forever", run_id=still_open.lease.run_id, at=t0,
                           data={"state": "raised", "severity": "critical", "summary": "bench"}))  # fmt: skip
        per_day = int(DAY // every)
        steps: list[float] = []
        plain: list[float] = []
        every_cycle: list[float] = []
        with_prune: list[float] = []
        written = 0
        for day in range(days):
            base = t0 + day * DAY
            for k in range(per_day):
                at = base + k * every
                for job in names:
                    if k == per_day // 2 and job == names[0]:
                        # A measured pair: the cycle alone, then the cycle and
                        # the small step a run's end takes.
                        plain.append(_cycle(store, job, at))
                        began = time.perf_counter()
                        _cycle(store, job, at + 1)
                        store.prune(RETENTION, at + 10, jobs=[job], budget=RUN_BUDGET)
                        with_prune.append(time.perf_counter() - began)
                        written += 2
                        continue
                    every_cycle.append(_cycle(store, job, at))
                    written += 1
            now = base + DAY
            while True:  # the monitor's passes
                began = time.perf_counter()
                step = store.prune(RETENTION, now, budget=PRUNE_BUDGET)
                steps.append(time.perf_counter() - began)
                if step.done or not (step.events or step.runs):
                    break
            if day % 10 == 9:
                print(
                    f"  {name}: day {day + 1}/{days}, {written:,} runs written", file=sys.stderr, flush=True
                )
        size = _size(name, store, url, tag)
        kept_runs = _kept_runs(name, store, names, tag)
        found = store.events(EventQuery(job="forever", kinds=[EventKind.STUCK], limit=10))
        survived = bool(store.open_runs("forever")) and bool(found)
        return {
            "store": name, "days": days, "every": every, "jobs": jobs, "written": written,
            "kept_runs": kept_runs, "size": size, "bytes_per_run": size / max(1, kept_runs),
            "survived": survived, "max_step_ms": 1000 * max(steps), "p99_step_ms": 1000 * _p99(steps),
            "median_step_ms": 1000 * statistics.median(steps), "steps": len(steps),
            "cycle_ms": 1000 * statistics.median(plain),
            "cycle_prune_ms": 1000 * statistics.median(with_prune),
            "max_cycle_prune_ms": 1000 * max(with_prune), "max_cycle_ms": 1000 * max(plain),
            "p99_every_cycle_ms": 1000 * _p99(every_cycle), "max_every_cycle_ms": 1000 * max(every_cycle),
        }  # fmt: skip
    finally:
        store.close()
        cleanup(name, tag)


def _p99(xs: list[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--store", choices=["sqlite", "postgres", "redis", "all"], default="all")
    p.add_argument("--days", type=int)
    p.add_argument("--every", type=float)
    p.add_argument("--jobs", type=int, default=10)
    a = p.parse_args()
    days = a.days or (35 if a.quick else 365)
    every = a.every or (900.0 if a.quick else 60.0)
    stores = ["sqlite", "postgres", "redis"] if a.store == "all" else [a.store]
    rows = []
    for name in stores:
        try:
            rows.append(bench(name, days, every, a.jobs))
        except Exception as e:  # a server that is not there: say so, go on
            print(f"{name}: skipped ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    kept = 30 * int(DAY // every) * a.jobs
    print(f"\n{a.jobs} jobs, a run every {every:g}s for {days} days, retention 30d "
          f"(retained: 30 days x {int(DAY // every)} runs x {a.jobs} jobs = {kept:,})")  # fmt: skip
    head = ("store", "written", "kept", "size MB", "B/run", "open+finding", "steps", "median step ms",
            "max step ms", "p99 step",
            "cycle ms", "cycle+prune", "ratio", "max cycle+prune", "plain cycles p99", "max",
            "met (<=50ms)?")  # fmt: skip
    print("  ".join(head))
    for r in rows:
        added = float(r["max_step_ms"])  # type: ignore[arg-type]
        print("  ".join(str(x) for x in (
            r["store"], f"{r['written']:,}", f"{r['kept_runs']:,}", f"{int(r['size']) / 1e6:.1f}",  # type: ignore[call-overload]
            f"{r['bytes_per_run']:.0f}", "yes" if r["survived"] else "NO", r["steps"],
            f"{r['median_step_ms']:.1f}",
            f"{added:.1f}",
            f"{r['p99_step_ms']:.1f}", f"{r['cycle_ms']:.2f}", f"{r['cycle_prune_ms']:.2f}",
            f"{float(r['cycle_prune_ms']) / float(r['cycle_ms']):.2f}x",  # type: ignore[arg-type]
            f"{r['max_cycle_prune_ms']:.1f}",
            f"{r['p99_every_cycle_ms']:.1f}", f"{r['max_every_cycle_ms']:.1f}",
            "yes" if added <= 50 else "NO",
        )))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
