"""The rollup at fleet size: ``audit`` over 2,000 jobs on every store, and
what keeping the rollup costs a run's end.

Targets (each printed against its measurement in the same run):

- ``Monitor.audit()`` over 2,000 jobs x 500 runs: at most 0.25 s on
  SQLite, PostgreSQL and Redis; twice the jobs at most 2.1x; twice the runs
  per job at most 1.1x.
- Recording a run's end (``Store.finish``) with the rollup kept costs at
  most 1.15x the same end without it, on every store.

The ledger. SQLite and PostgreSQL: ``bench/audit.py``'s bulk SQL into the
tables the store created (1 run in 50 failed, 1 slot in 40 with a
``skipped`` event, durations from 1% to 90% of a 10-minute period), with the
rollup triggers off during the fill, then ``Store.rebuild_rollups()``
(timed: what ``cronwarden rollup --rebuild`` costs). Redis: the same
history written through ``acquire``/``finish`` (the store's scripts keep the
rollup as they go), at ``--redis-runs`` runs per job (default 60, then
120): 2,000 x 500 runs through a shared Redis would hold about a gigabyte.
The rollup's window is 50 runs whatever the history, so ``audit``'s reads
are the same size either way; the ratio for twice the runs is printed.

The end's cost: ``--ends`` acquire/finish pairs per round on a fresh job,
``finish`` alone timed, with and without the rollup in interleaved rounds
(SQLite: its triggers dropped; PostgreSQL: ``ALTER TABLE … DISABLE
TRIGGER``; Redis: the same scripts with the rollup's upkeep switched off);
ratio = median of the rounds' medians. Beside them, the least any rollup
costs an end: the same store with the rollup off and, in its place, one
counter of the job's row incremented (a trigger; on Redis, one HINCRBY in
the finish script): what the end pays for writing a third row at all. The
machine may be busy: numbers are as measured.

    python bench/rollup.py                 # every store, full size (several minutes)
    python bench/rollup.py --quick         # a tenth of the jobs, few ends
    python bench/rollup.py --backend sqlite
    python bench/rollup.py --only ends     # the end's cost alone, every store (no ledger filled)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import audit

AUDIT_FLOOR = 0.25
JOBS_RATIO = 2.1
RUNS_RATIO = 1.1
END_RATIO = 1.15
REDIS_URL = os.environ.get("CRONWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")


def _sqlite_triggers(path: str) -> list[str]:
    import sqlite3

    db = sqlite3.connect(path)
    try:
        return [sql for (sql,) in db.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' "
                                            "AND name LIKE 'rollup_%'")]  # fmt: skip
    finally:
        db.close()


def _sqlite_set_triggers(path: str, on: bool, triggers: list[str]) -> None:
    import sqlite3

    db = sqlite3.connect(path, isolation_level=None)
    try:
        for sql in triggers:
            name = sql.split()[2]
            db.execute(f"DROP TRIGGER IF EXISTS {name}")
            if on:
                db.execute(sql)
    finally:
        db.close()


def _pg_set_triggers(schema: str, on: bool) -> None:
    import psycopg

    with psycopg.connect(audit.POSTGRES_URL, autocommit=True) as conn:
        for table, trigger in (
            ("runs", "rollup_end"),
            ("runs", "rollup_start"),
            ("events", "rollup_refusal"),
        ):
            conn.execute(f'ALTER TABLE "{schema}".{table} {"ENABLE" if on else "DISABLE"} TRIGGER {trigger}')


def _redis_cleanup(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


def _redis_fill(url: str, jobs: int, runs: int, now: float) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dashboard import contract_fill

    contract_fill(url, jobs, runs, now)


class Ledger:
    def __init__(self, backend: str, workdir: str, jobs: int, runs: int) -> None:
        self.backend, self.jobs, self.runs = backend, jobs, runs
        self.cleanup: Callable[[], None] = lambda: None
        now = time.time()
        began = time.perf_counter()
        if backend == "sqlite":
            path = os.path.join(workdir, f"rollup-{jobs}x{runs}.db")
            self.url = f"sqlite:///{path}"
            from cronwarden.stores import open_store

            open_store(self.url).close()
            triggers = _sqlite_triggers(path)
            _sqlite_set_triggers(path, False, triggers)
            audit._sqlite_fill(self.url, jobs, runs, now)
            _sqlite_set_triggers(path, True, triggers)
            self.cleanup = lambda: [
                os.remove(path + s) for s in ("", "-wal", "-shm") if os.path.exists(path + s)
            ]
        elif backend == "postgres":
            schema = f"cw_bench_{uuid.uuid4().hex[:12]}"
            self.url = f"{audit.POSTGRES_URL}?schema={schema}"
            from cronwarden.stores import open_store

            open_store(self.url).close()
            _pg_set_triggers(schema, False)
            audit._postgres_fill(self.url, schema, jobs, runs, now)
            _pg_set_triggers(schema, True)
            self.cleanup = lambda: audit._drop_schema(schema)
        else:
            prefix = f"cw-bench-{uuid.uuid4().hex[:12]}:"
            self.url = f"{REDIS_URL}?prefix={prefix}"
            _redis_fill(self.url, jobs, runs, now)
            self.cleanup = lambda: _redis_cleanup(prefix)
        self.fill = time.perf_counter() - began
        self.rebuild = 0.0
        if backend != "redis":
            from cronwarden.stores import open_store

            store = open_store(self.url)
            try:
                began = time.perf_counter()
                store.rebuild_rollups()
                self.rebuild = time.perf_counter() - began
            finally:
                store.close()


def time_audit(url: str, repeat: int) -> tuple[float, int, int]:
    """(median seconds of Monitor.audit(), jobs seen, jobs read from the ledger)."""
    from cronwarden.monitor import Monitor
    from cronwarden.stores import open_store

    store = open_store(url)
    try:
        monitor = Monitor(store)
        times = []
        seen = []
        for _ in range(repeat):
            began = time.perf_counter()
            seen = monitor.audit()
            times.append(time.perf_counter() - began)
        rollups = store.rollups() or {}
        now = time.time()
        slow = sum(
            1 for s in seen
            if s.job not in rollups or monitor._from_rollup(s.job, s.info, now, rollups[s.job]) is None
        )  # fmt: skip
        return statistics.median(times), len(seen), slow
    finally:
        store.close()


def _end_store(backend: str, workdir: str, mode: str) -> tuple[Any, Callable[[], Any]]:
    """A fresh store with its rollup kept (``mode`` "on"), not kept ("off"),
    or in its place the least any rollup costs ("counter": a trigger, or the
    finish script, adding one to one counter of the job's row), and how to
    remove it."""
    from cronwarden.stores import open_store

    if backend == "sqlite":
        path = os.path.join(workdir, f"ends-{mode}.db")
        store = open_store(f"sqlite:///{path}")
        if mode != "on":
            _sqlite_set_triggers(path, False, _sqlite_triggers(path))
        if mode == "counter":
            import sqlite3

            db = sqlite3.connect(path, isolation_level=None)
            db.execute("INSERT INTO rollups (job) VALUES ('bench')")
            db.execute("CREATE TRIGGER rollup_floor AFTER UPDATE OF outcome ON runs "
                       "WHEN old.outcome IS NULL AND new.outcome IS NOT NULL "
                       "BEGIN UPDATE rollups SET ended = ended + 1 WHERE job = new.job; END")  # fmt: skip
            db.close()
        return store, lambda: None
    if backend == "postgres":
        schema = f"cw_bench_{uuid.uuid4().hex[:12]}"
        store = open_store(f"{audit.POSTGRES_URL}?schema={schema}")
        if mode != "on":
            _pg_set_triggers(schema, False)
        if mode == "counter":
            import psycopg

            s = f'"{schema}"'
            with psycopg.connect(audit.POSTGRES_URL, autocommit=True) as conn:
                conn.execute(f"INSERT INTO {s}.rollups (job) VALUES ('bench')")
                conn.execute(f"CREATE FUNCTION {s}.rollup_floor() RETURNS trigger LANGUAGE plpgsql AS $$ "
                             f"BEGIN UPDATE {s}.rollups SET ended = ended + 1 WHERE job = NEW.job; "
                             f"RETURN NULL; END $$")  # fmt: skip
                conn.execute(f"CREATE TRIGGER rollup_floor AFTER UPDATE OF outcome ON {s}.runs FOR EACH ROW "
                             f"WHEN (OLD.outcome IS NULL AND NEW.outcome IS NOT NULL) "
                             f"EXECUTE FUNCTION {s}.rollup_floor()")  # fmt: skip
        return store, lambda: audit._drop_schema(schema)
    prefix = f"cw-bench-{uuid.uuid4().hex[:12]}:"
    store = open_store(f"{REDIS_URL}?prefix={prefix}")
    if mode != "on":  # the same scripts with the rollup's upkeep switched off
        scripts, client = store._scripts, store._client
        upkeep = "ROLLUPS = {KEYS[9], KEYS[10], KEYS[11]}"
        counter = "; redis.call('HINCRBY', KEYS[9], 'bench', 1)"
        off = "ROLLUPS = false" + (counter if mode == "counter" else "")
        scripts.finish = client.register_script(scripts.finish.script.replace(upkeep, off))
        scripts.acquire = client.register_script(scripts.acquire.script.replace(upkeep, "ROLLUPS = false"))
    return store, lambda: _redis_cleanup(prefix)


MODES = ("on", "counter", "off")


def time_ends(backend: str, workdir: str, ends: int, rounds: int) -> dict[str, float]:
    """Median ms of finish per mode of ``_end_store``: a store of each,
    one end on each in turn (the order rotating), after a full window each."""
    from cronwarden.events import Outcome, new_id
    from cronwarden.policy import Policy
    from cronwarden.stores.base import End, Granted, Start

    stores = [_end_store(backend, workdir, mode) for mode in MODES]
    took: list[list[float]] = [[] for _ in MODES]
    t = time.time() - 86400
    try:
        for n in range(60 + ends * rounds):
            for i in range(len(MODES)):
                k = (n + i) % len(MODES)
                store = stores[k][0]
                g = store.acquire(Start("bench", "bench", new_id(), "bench", 1, 60, t + n * 10, Policy.SKIP))
                assert isinstance(g, Granted), g
                end = End(Outcome.SUCCEEDED if n % 7 else Outcome.FAILED, t + n * 10 + 1.5 + n % 5, 0)
                began = time.perf_counter()
                store.finish(g.lease, end)
                if n >= 60:  # the window is full: the rollup's steady state
                    took[k].append(time.perf_counter() - began)
        return {mode: statistics.median(x) * 1000 for mode, x in zip(MODES, took, strict=True)}
    finally:
        for store, cleanup in stores:
            store.close()
            cleanup()


def audit_checks(
    backend: str, workdir: str, jobs: int, args: argparse.Namespace
) -> list[tuple[str, bool, str]]:
    """audit's time at ``jobs``, then twice the jobs, then twice the runs
    per job (a row printed for each), as (what, within, target)."""
    runs = args.redis_runs if backend == "redis" else args.runs
    results = []
    for j, r in ((jobs, runs), (2 * jobs, runs), (jobs, 2 * runs)):
        ledger = Ledger(backend, workdir, j, r)
        try:
            took, seen, slow = time_audit(ledger.url, args.repeat)
            assert seen == j, f"audit saw {seen} jobs, expected {j}"
        finally:
            ledger.cleanup()
        results.append(took)
        print(f"{backend:<9} {j:>6} {r:>8} {ledger.fill:>7.1f} {ledger.rebuild:>9.2f} {took:>8.3f} "
              f"{slow:>12}", flush=True)  # fmt: skip
    base, more_jobs, more_runs = results
    return [
        (f"audit {base:.3f} s", base <= AUDIT_FLOOR, f"<= {AUDIT_FLOOR} s"),
        (f"2x jobs x{more_jobs / base:.2f}", more_jobs / base <= JOBS_RATIO, f"<= {JOBS_RATIO}"),
        (f"2x runs x{more_runs / base:.2f}", more_runs / base <= RUNS_RATIO, f"<= {RUNS_RATIO}"),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "redis", "all"], default="all")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--redis-runs", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=5, help="audits per ledger (median)")
    ap.add_argument("--ends", type=int, default=120, help="ends timed per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a tenth of the jobs, fewer ends")
    ap.add_argument("--only", choices=["audit", "ends"], help="measure only audit, or only the end's cost")
    args = ap.parse_args()
    jobs = args.jobs // 10 if args.quick else args.jobs
    ends, rounds = (60, 3) if args.quick else (args.ends, args.rounds)
    backends = ["sqlite", "postgres", "redis"] if args.backend == "all" else [args.backend]
    if "postgres" in backends and (why := audit.postgres_unavailable()):
        print(f"skipping PostgreSQL: {why}")
        backends.remove("postgres")
    print(f"rollup bench: audit at {jobs} jobs, then 2x jobs, then 2x runs per job; finish with and "
          f"without the rollup ({ends} ends x {rounds} rounds); load {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    header = (f"{'backend':<9} {'jobs':>6} {'runs/job':>8} {'fill s':>7} {'rebuild s':>9} {'audit s':>8} "
              f"{'ledger reads':>12}")  # fmt: skip
    print(header)
    print("-" * len(header))
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cw-bench-") as workdir:
        for backend in backends:
            checks = []
            if args.only != "ends":
                checks += audit_checks(backend, workdir, jobs, args)
            if args.only != "audit":
                ms = time_ends(backend, workdir, ends, rounds)
                on, counter, off = ms["on"], ms["counter"], ms["off"]
                checks.append((f"finish {on:.3f} ms / {off:.3f} ms = x{on / off:.2f} (one counter's "
                               f"upkeep alone: {counter:.3f} ms = x{counter / off:.2f})",
                               on / off <= END_RATIO, f"<= {END_RATIO}"))  # fmt: skip
            for what, ok, target in checks:
                line = f"{backend:<9} {what}  ({'within' if ok else 'OVER'} {target})"
                verdicts.append(line)
            print()
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
