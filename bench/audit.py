"""``cronwarden audit`` over a large ledger, on SQLite and PostgreSQL.

The issue's floor: 2,000 jobs x 500 runs (1M runs, 2M+ events) audited in
under 2 s, with time that grows with the number of jobs, not the number of
runs. This prints the audit time for the base ledger, for twice the jobs and
for twice the runs per job, and the two ratios: about 2 for jobs, about 1
for runs.

The fixture is written in bulk, directly in SQL (a recursive CTE on SQLite,
``generate_series`` on PostgreSQL) into the tables the store itself created:
writing a million runs through ``acquire``/``finish`` would take an hour and
measure the wrong thing. Each run gets its ``started`` and terminal events;
about 1 run in 50 is a failure, 1 slot in 40 has a ``skipped`` event, and job
durations spread from 1% to 90% of their period so every verdict appears.

Timed: ``Monitor.audit()`` in process (median of ``--repeat``), and the
whole command ``cronwarden audit --json`` in a fresh process (interpreter
start included), once. Not a timed test: nothing fails, it prints.

    python bench/audit.py                 # SQLite and PostgreSQL, full size
    python bench/audit.py --quick         # a tenth of the jobs, for a smoke run
    python bench/audit.py --backend sqlite
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

PERIOD = 600.0
POSTGRES_URL = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
FLOOR = 2.0


@dataclass
class Result:
    backend: str
    jobs: int
    runs: int
    populate: float
    audit: float
    command: float


def _sqlite_fill(url: str, jobs: int, runs: int, now: float) -> None:
    import sqlite3

    from cronwarden.stores import open_store

    open_store(url).close()  # the store creates its schema
    db = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    db.execute("PRAGMA synchronous = OFF")
    indexes = db.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
    ).fetchall()
    for name, _ in indexes:  # built once at the end: far faster than row by row
        db.execute(f'DROP INDEX "{name}"')
    t0 = now - runs * PERIOD
    db.execute("BEGIN")
    series = (
        "WITH RECURSIVE j(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM j WHERE i < :jobs - 1), "
        "r(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM r WHERE n < :runs - 1), "
        "x AS (SELECT i, n, printf('%08x-%04x-4000-8000-000000000000', i, n) AS rid, 'job-' || i AS job, "
        ":t0 + n * :period + (i % 60) AS started, "
        "(6 + (i * 37) % 534) * (0.9 + ((n * 7 + i) % 20) / 100.0) AS dur, "
        "CASE WHEN (n * 13 + i) % 50 = 0 THEN 'failed' ELSE 'succeeded' END AS outcome FROM j, r) "
    )
    p = {"jobs": jobs, "runs": runs, "t0": t0, "period": PERIOD}
    db.execute(
        series + "INSERT INTO runs (run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome, "
        "exit_code, detail) SELECT rid, job, job, 'bench', 1000 + i, n + 1, started - (i % 60), started, "
        "started + dur, outcome, CASE outcome WHEN 'failed' THEN 1 ELSE 0 END, '' FROM x",
        p,
    )
    db.execute(
        series + "INSERT INTO events (event_id, kind, job, run_id, at, data) "
        "SELECT rid || '-s', 'started', job, rid, started, "
        'printf(\'{"host":"bench","pid":%d,"token":%d,"key":"%s","ttl":60}\', 1000 + i, n + 1, job) '
        "FROM x UNION ALL SELECT rid || '-e', outcome, job, rid, started + dur, "
        'printf(\'{"exit_code":%d,"token":%d,"duration":%f}\', outcome = \'failed\', n + 1, dur) FROM x '
        "UNION ALL SELECT rid || '-k', 'skipped', job, NULL, started + :period / 2, "
        "'{\"holder_run_id\":\"' || rid || '\"}' FROM x WHERE (n * 11 + i) % 40 = 0 "
        "ORDER BY 5",  # in time order (seq follows it), as a live ledger records them
        p,
    )
    db.execute(
        "WITH RECURSIVE j(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM j WHERE i < :jobs - 1) "
        "INSERT INTO jobs (name, schedule, period, policy, reason, ttl, grace, max_runtime, updated_at) "
        "SELECT 'job-' || i, CASE WHEN i % 10 = 0 THEN '*/10 * * * *' ELSE 'every 10m' END, "
        "CASE WHEN i % 10 = 0 THEN NULL ELSE :period END, 'skip', "
        "CASE WHEN i % 3 = 0 THEN 'one run per window' ELSE '' END, 60, 120, NULL, :t0 FROM j",
        p,
    )
    db.execute("COMMIT")
    for _, sql in indexes:
        db.execute(sql)
    db.execute("ANALYZE")
    db.close()


def _postgres_fill(url: str, schema: str, jobs: int, runs: int, now: float) -> None:
    import psycopg

    from cronwarden.stores import open_store

    open_store(url).close()
    s = f'"{schema}"'
    t0 = now - runs * PERIOD
    x = (
        "WITH x AS (SELECT i, n, lpad(to_hex(i), 8, '0') || '-' || lpad(to_hex(n), 4, '0') "
        "|| '-4000-8000-000000000000' AS rid, 'job-' || i AS job, "
        "%(t0)s + n * %(period)s + (i %% 60) AS started, "
        "(6 + (i * 37) %% 534) * (0.9 + ((n * 7 + i) %% 20) / 100.0) AS dur, "
        "CASE WHEN (n * 13 + i) %% 50 = 0 THEN 'failed' ELSE 'succeeded' END AS outcome "
        "FROM generate_series(0, %(jobs)s - 1) i, generate_series(0, %(runs)s - 1) n) "
    )
    p = {"jobs": jobs, "runs": runs, "t0": t0, "period": PERIOD}
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute(
            x + f"INSERT INTO {s}.runs (run_id, job, key, host, pid, token, slot, started_at, ended_at, "
            "outcome, exit_code, detail) SELECT rid, job, job, 'bench', 1000 + i, n + 1, "
            "started - (i %% 60), started, started + dur, outcome, "
            "CASE outcome WHEN 'failed' THEN 1 ELSE 0 END, '' FROM x",
            p,
        )
        conn.execute(
            x + f"INSERT INTO {s}.events (event_id, kind, job, run_id, at, data) "
            "SELECT rid || '-s', 'started', job, rid, started, jsonb_build_object('host', 'bench', "
            "'pid', 1000 + i, 'token', n + 1, 'key', job, 'ttl', 60) FROM x "
            "UNION ALL SELECT rid || '-e', outcome, job, rid, started + dur, jsonb_build_object('exit_code', "
            "CASE outcome WHEN 'failed' THEN 1 ELSE 0 END, 'token', n + 1, 'duration', dur) FROM x "
            "UNION ALL SELECT rid || '-k', 'skipped', job, NULL, started + %(period)s / 2, "
            "jsonb_build_object('holder_run_id', rid) FROM x WHERE (n * 11 + i) %% 40 = 0 "
            "ORDER BY 5",  # in time order (seq follows it), as a live ledger records them
            p,
        )
        conn.execute(
            f"INSERT INTO {s}.jobs (name, schedule, period, policy, reason, ttl, grace, max_runtime, "
            "updated_at) SELECT 'job-' || i, CASE WHEN i %% 10 = 0 THEN '*/10 * * * *' ELSE 'every 10m' END, "
            "CASE WHEN i %% 10 = 0 THEN NULL ELSE %(period)s END, 'skip', "
            "CASE WHEN i %% 3 = 0 THEN 'one run per window' ELSE '' END, 60, 120, NULL, %(t0)s "
            "FROM generate_series(0, %(jobs)s - 1) i",
            p,
        )
        for table in ("runs", "events", "jobs"):
            conn.execute(f"VACUUM ANALYZE {s}.{table}")


def _drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _time_audit(url: str, repeat: int) -> tuple[float, float, int]:
    """(median in-process audit seconds, whole-command seconds, jobs seen)."""
    from cronwarden.monitor import Monitor
    from cronwarden.stores import open_store

    times = []
    seen = 0
    for _ in range(repeat):
        store = open_store(url)
        try:
            began = time.perf_counter()
            seen = len(Monitor(store).audit())
            times.append(time.perf_counter() - began)
        finally:
            store.close()
    began = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "cronwarden", "audit", "--json", "--store", url],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # no ./cronwarden.toml joins in
    )
    command = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"cronwarden audit failed: {proc.stderr.strip()}")
    return statistics.median(times), command, seen


def measure(backend: str, jobs: int, runs: int, repeat: int, workdir: str) -> Result:
    now = time.time()
    began = time.perf_counter()
    if backend == "sqlite":
        url = f"sqlite:///{os.path.join(workdir, f'audit-{jobs}x{runs}.db')}"
        _sqlite_fill(url, jobs, runs, now)
        cleanup: Callable[[], None] = lambda: os.remove(url.removeprefix("sqlite:///"))  # noqa: E731
    else:
        schema = f"cw_bench_{uuid.uuid4().hex[:12]}"
        url = f"{POSTGRES_URL}?schema={schema}"
        _postgres_fill(url, schema, jobs, runs, now)
        cleanup = lambda: _drop_schema(schema)  # noqa: E731
    populate = time.perf_counter() - began
    try:
        audit, command, seen = _time_audit(url, repeat)
        assert seen == jobs, f"audit saw {seen} jobs, expected {jobs}"
    finally:
        cleanup()
    return Result(backend, jobs, runs, populate, audit, command)


def postgres_unavailable() -> str | None:
    try:
        import psycopg

        import cronwarden.stores.postgres  # noqa: F401
    except ImportError as e:
        return f"PostgreSQL store not importable yet ({e})"
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as e:
        return f"PostgreSQL not reachable at {POSTGRES_URL}: {str(e).strip().splitlines()[0]}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3, help="in-process audits per ledger (median)")
    ap.add_argument("--quick", action="store_true", help="a tenth of the jobs")
    args = ap.parse_args()
    jobs = args.jobs // 10 if args.quick else args.jobs
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    if "postgres" in backends:
        why = postgres_unavailable()
        if why:
            print(f"skipping PostgreSQL: {why}")
            backends.remove("postgres")

    print(f"cronwarden audit: {jobs} jobs x {args.runs} runs, then 2x jobs, then 2x runs "
          f"(floor: under {FLOOR:g} s at {jobs} x {args.runs})\n")  # fmt: skip
    columns = (("backend", "<9"), ("jobs", ">6"), ("runs/job", ">8"), ("runs", ">9"), ("fill s", ">7"),
               ("audit s", ">8"), ("command s", ">10"))  # fmt: skip
    header = " ".join(f"{name:{fmt}}" for name, fmt in columns)
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="cw-bench-") as workdir:
        for backend in backends:
            results = []
            for j, r in ((jobs, args.runs), (2 * jobs, args.runs), (jobs, 2 * args.runs)):
                res = measure(backend, j, r, args.repeat, workdir)
                results.append(res)
                print(f"{backend:<9} {j:>6} {r:>8} {j * r:>9} {res.populate:>7.1f} {res.audit:>8.3f} "
                      f"{res.command:>10.3f}", flush=True)  # fmt: skip
            base, more_jobs, more_runs = results
            verdict = "under" if base.command < FLOOR else "OVER"
            print(f"{backend:<9} 2x jobs: x{more_jobs.audit / base.audit:.2f}   2x runs: "
                  f"x{more_runs.audit / base.audit:.2f}   base command {base.command:.2f} s: {verdict} the "
                  f"{FLOOR:g} s floor\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
