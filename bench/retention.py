"""Retention over a long life: JOBS jobs running every EVERY seconds for
DAYS days, on a fast-forwarded clock (each run's start and end are given
their simulated times; the store's own clock only judges the leases, which
are released at once), with ``retention = 30d``. After each simulated day,
pruning runs as the monitor runs it (bounded steps until done), and each
run's end runs the small step ``cronwarden run`` takes.

Prints, per store: the ledger's size at the end against its documented
ceiling (``BYTES_PER_RUN`` x the runs the retention keeps), whether the open run
and the raised finding written on day 0 survived, the longest prune step
(the time pruning adds to the call that makes it) against the tail of the
plain cycles (acquire + finish, every one timed) of the same run, and a
run's cycle with its end-of-run prune step against the cycle alone (the
floor). On SQLite both tails are mostly WAL checkpoints: the commit that
crosses the checkpoint threshold copies the WAL into the file, whichever
call it is.

    python bench/retention.py [--quick] [--store sqlite|postgres|redis|all] [--days N]
        [--every SECONDS] [--jobs N] [--workers N]

``--workers N``: the jobs split over N processes writing at once (the
servers' stores are bound by each call's round trip, not the client's
CPU); after each simulated day every writer waits while this process runs
the monitor's prune passes, so pruning meets the same ledger as with one.

``--quick``: 35 days of a run every 15 minutes (about 3,400 runs per job).
The default: 365 days of a run every minute for 10 jobs is 5.3 million
runs through the store's API: on a quiet 2-core machine about 26 minutes
on SQLite (3,400 runs/s), 40 on Redis (2,200) and 47 on PostgreSQL with
``--workers 4`` (1,850), more on a busy one; the docs quote what was
measured and with which settings.

PostgreSQL: run it against a server with autovacuum on, and, since the
clock is fast-forwarded (a simulated day passes in 5 to 20 seconds),
``autovacuum_naptime = 1s``, so that autovacuum visits the tables about as
often per run as its default of a minute does on a real clock; otherwise
the dead versions of the rollup rows, rewritten at every start and end,
pile up between visits and the size measures that instead of the ledger.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from cronwarden.events import Event, EventKind, Outcome, new_id
from cronwarden.stores import open_store
from cronwarden.stores.base import PRUNE_BUDGET, End, EventQuery, Granted, Retention, Start, Store
from namespaces import POSTGRES, REDIS, cleanup, url_for

DAY = 86_400.0
RETENTION = Retention(max_age=30 * DAY)
RUN_BUDGET = 50  # cli/run.py's RUN_PRUNE_BUDGET
BYTES_PER_RUN = {"sqlite": 720, "postgres": 1_500, "redis": 1_800}
"""What one kept run (its row, its two events, their indexes) costs each
store, as docs/stores/<store>.md state it: the documented ceiling of a
ledger is this times the runs its retention keeps (each job's 30 days of
runs, plus the bench's one measured pair a day)."""


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


def _writer(url: str, names: list[str], t0: float, days: int, every: float, gate: Any, stop: Any,
            out: Any) -> None:  # fmt: skip
    """One writing process: each simulated day, a run every ``every``
    seconds for each of its jobs, then the day's gate twice (the monitor
    prunes in between, with no write running; ``stop`` set by then ends the
    run there). The process holding the first job (``job0``) also takes the
    measured pairs. Puts its timings (``array('d')`` bytes) and its run
    count on ``out``."""
    store = open_store(url)
    per_day = int(DAY // every)
    plain, with_prune, every_cycle = array("d"), array("d"), array("d")
    written = 0
    try:
        for day in range(days):
            base = t0 + day * DAY
            for k in range(per_day):
                at = base + k * every
                for job in names:
                    if k == per_day // 2 and job == "job0":
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
            gate.wait()  # the day written by every process ...
            gate.wait()  # ... and pruned
            if stop.value:
                break
        out.put((plain.tobytes(), with_prune.tobytes(), every_cycle.tobytes(), written))
    except BaseException:
        gate.abort()  # the others stop at the gate instead of waiting for ever
        raise
    finally:
        store.close()


def bench(name: str, days: int, every: float, jobs: int, workers: int = 1,
          stop_after: float | None = None) -> dict[str, object]:  # fmt: skip
    """The jobs are split over ``workers`` processes writing to the store at
    once (``workers=1``: one process writing, the same path); this process
    sets up, runs the monitor's prune passes after each day while the
    writers wait, and measures the end. ``stop_after`` (seconds): end at
    the first day's end past it (the days run are in the result)."""
    work = tempfile.mkdtemp(prefix="cw-bench-retention-")
    url, tag = _url(name, work)
    store = open_store(url)
    t0 = time.time() - days * DAY
    names = [f"job{i}" for i in range(jobs)]
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    try:
        # Day 0: a run that never ends and a finding that stays raised.
        still_open = store.acquire(Start(job="forever", key="forever", run_id=new_id(), host="bench", pid=1,
                                         ttl=10 * 365 * DAY, at=t0))  # fmt: skip
        assert isinstance(still_open, Granted)
        store.record(Event(kind=EventKind.STUCK, job="forever", run_id=still_open.lease.run_id, at=t0,
                           data={"state": "raised", "severity": "critical", "summary": "bench"}))  # fmt: skip
        gate, stop, out = ctx.Barrier(workers + 1), ctx.Value("b", 0), ctx.Queue()
        procs = [ctx.Process(target=_writer, args=(url, names[i::workers], t0, days, every, gate, stop, out))
                 for i in range(workers)]  # fmt: skip
        for proc in procs:
            proc.start()
        steps: list[float] = []
        steps_cpu: list[float] = []  # this process's CPU in each step: the wall time less the waits
        began_all = time.perf_counter()
        per_day = int(DAY // every) * jobs + 1  # the pair writes one run more
        days_run = 0
        for day in range(days):
            gate.wait(timeout=3_600)
            now = t0 + (day + 1) * DAY
            while True:  # the monitor's passes
                began, cpu = time.perf_counter(), time.thread_time()
                step = store.prune(RETENTION, now, budget=PRUNE_BUDGET)
                steps.append(time.perf_counter() - began)
                steps_cpu.append(time.thread_time() - cpu)
                if step.done or not (step.events or step.runs):
                    break
            days_run = day + 1
            if stop_after is not None and time.perf_counter() - began_all > stop_after:
                stop.value = 1
            gate.wait(timeout=3_600)
            if day % 10 == 9 or stop.value:
                done = (day + 1) * per_day
                rate = done / (time.perf_counter() - began_all)
                print(f"  {name}: day {day + 1}/{days}, {done:,} runs written, {rate:,.0f} runs/s",
                      file=sys.stderr, flush=True)  # fmt: skip
            if stop.value:
                print(f"  {name}: stopped after day {days_run} (--stop-after)", file=sys.stderr, flush=True)
                break
        plain, with_prune, every_cycle = array("d"), array("d"), array("d")
        written = 0
        for _ in procs:  # read before join: a process exits once its result is taken
            p_plain, p_pair, p_every, p_written = out.get(timeout=600)
            plain.frombytes(p_plain)
            with_prune.frombytes(p_pair)
            every_cycle.frombytes(p_every)
            written += p_written
        for proc in procs:
            proc.join()
        elapsed = time.perf_counter() - began_all
        size = _size(name, store, url, tag)
        kept_runs = _kept_runs(name, store, names, tag)
        found = store.events(EventQuery(job="forever", kinds=[EventKind.STUCK], limit=10))
        survived = bool(store.open_runs("forever")) and bool(found)
        return {
            "store": name, "days": days_run, "every": every, "jobs": jobs, "written": written,
            "kept_runs": kept_runs, "size": size, "bytes_per_run": size / max(1, kept_runs),
            "survived": survived, "max_step_ms": 1000 * max(steps), "p99_step_ms": 1000 * _p99(steps),
            "median_step_ms": 1000 * statistics.median(steps), "steps": len(steps),
            "cpu_step_ms": [1000 * f(steps_cpu) for f in (statistics.median, _p99, max)],
            "cycle_ms": 1000 * statistics.median(plain),
            "cycle_prune_ms": 1000 * statistics.median(with_prune),
            "max_cycle_prune_ms": 1000 * max(with_prune), "max_cycle_ms": 1000 * max(plain),
            "p99_every_cycle_ms": 1000 * _p99(every_cycle), "max_every_cycle_ms": 1000 * max(every_cycle),
            "rate": written / elapsed, "minutes": elapsed / 60,
        }  # fmt: skip
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
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
    p.add_argument("--workers", type=int, default=1, help="processes writing at once (jobs split over them)")
    p.add_argument("--stop-after", type=float, metavar="MINUTES",
                   help="end at the first day's end past MINUTES (the table gives the days run)")  # fmt: skip
    a = p.parse_args()
    days = a.days or (35 if a.quick else 365)
    every = a.every or (900.0 if a.quick else 60.0)
    stores = ["sqlite", "postgres", "redis"] if a.store == "all" else [a.store]
    rows = []
    for name in stores:
        try:
            stop = None if a.stop_after is None else 60 * a.stop_after
            rows.append(bench(name, days, every, a.jobs, a.workers, stop))
        except Exception as e:  # a server that is not there: say so, go on
            print(f"{name}: skipped ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    kept = 30 * int(DAY // every) * a.jobs
    retained = 30 * (int(DAY // every) * a.jobs + 1)
    upto = f"up to {days} days (--stop-after {a.stop_after:g} min)" if a.stop_after else f"{days} days"
    print(f"\n{a.jobs} jobs, a run every {every:g}s for {upto}, retention 30d "
          f"(retained: 30 days x {int(DAY // every)} runs x {a.jobs} jobs = {kept:,}), "
          f"{a.workers} writing process{'es' if a.workers > 1 else ''}")  # fmt: skip
    head = ("store", "days", "written", "kept", "size MB", "B/run", "open+finding", "steps", "median step ms",
            "max step ms", "p99 step",
            "cycle ms", "cycle+prune", "ratio", "max cycle+prune", "plain cycles p99", "max",
            "met (<=50ms)?", "step CPU median/p99/max", "ceiling MB", "under?", "runs/s", "min")  # fmt: skip
    print("  ".join(head))
    for r in rows:
        added = float(r["max_step_ms"])  # type: ignore[arg-type]
        ceiling = BYTES_PER_RUN[str(r["store"])] * retained
        print("  ".join(str(x) for x in (
            r["store"], r["days"], f"{r['written']:,}", f"{r['kept_runs']:,}", f"{int(r['size']) / 1e6:.1f}",  # type: ignore[call-overload]
            f"{r['bytes_per_run']:.0f}", "yes" if r["survived"] else "NO", r["steps"],
            f"{r['median_step_ms']:.1f}",
            f"{added:.1f}",
            f"{r['p99_step_ms']:.1f}", f"{r['cycle_ms']:.2f}", f"{r['cycle_prune_ms']:.2f}",
            f"{float(r['cycle_prune_ms']) / float(r['cycle_ms']):.2f}x",  # type: ignore[arg-type]
            f"{r['max_cycle_prune_ms']:.1f}",
            f"{r['p99_every_cycle_ms']:.1f}", f"{r['max_every_cycle_ms']:.1f}",
            "yes" if added <= 50 else "NO", "/".join(f"{x:.1f}" for x in r["cpu_step_ms"]),  # type: ignore[attr-defined]
            f"{ceiling / 1e6:.1f}", "yes" if int(r["size"]) <= ceiling else "NO",  # type: ignore[call-overload]
            f"{r['rate']:,.0f}", f"{r['minutes']:.1f}",
        )))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
