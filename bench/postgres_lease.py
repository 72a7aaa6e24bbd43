"""The PostgreSQL store's full guarded cycle against a bare lease row on a kept
connection.

Issue 3's target: a full guarded cycle (``store.acquire``: lease + run row +
``started``; ``store.finish``: terminal record + run row + release) at most
1.1x the floor, a bare lease row in two autocommit statements:

    INSERT INTO leases AS l … ON CONFLICT (key) DO UPDATE … WHERE l.owner IS NULL
        OR l.expires <= clock_timestamp() RETURNING token
    UPDATE leases SET owner = NULL, expires = NULL WHERE key = … AND owner = …

Both sides make two commits per cycle, so both pay two WAL flushes; what
differs is the work and the WAL each commit carries. To show where the gap
is, a reference row writes the store's own ledger rows (run row, ``started``,
terminal record, in tables and indexes the store itself created) in plain SQL
with the bare lease row: still two statements, two commits, no plpgsql.

Three more reference rows ask what the least is that a cycle which records
its run durably can cost: the ledger cut to one run row, whose insert is the
``started`` record and whose outcome is the terminal record (no events), in
tables of their own, still two statements and two commits:

    (a) WITH g AS (<the floor's upsert> RETURNING token)
            INSERT INTO runs (run_id, key, token, job, host, pid, started_at)
            SELECT … FROM g RETURNING token
        WITH r AS (UPDATE runs SET outcome = …, ended_at = clock_timestamp()
                   WHERE run_id = … AND outcome IS NULL)
            UPDATE leases SET owner = NULL, expires = NULL WHERE key = … AND owner = …
    (b) the same with ``runs (job, started_at)``, the one index reads need:
        what an index costs;
    (c) one table, the key's newest run row is the lease: an INSERT … SELECT
        of token + 1 WHERE NOT EXISTS a newest row unfinished and unexpired,
        and an UPDATE of the outcome. A cost bound, not a design (see
        ``minimal_sql``).

They bound, roughly from below, what a design that records each run in the
cycle's two commits can reach against 1.1x.

The default mode also repeats the comparison with ``synchronous_commit =
off`` (no flush at commit: the CPU and WAL-insert work alone), and reads
each statement's server execution time and WAL records/bytes with
``EXPLAIN (ANALYZE, WAL)``.

Every table lives in fresh schemas, dropped at the end. The server is
``$CRONWARDEN_TEST_POSTGRES`` (default
``postgresql://postgres@127.0.0.1:5432/test``).

    python bench/postgres_lease.py              # about 60 s
    python bench/postgres_lease.py --quick      # a few seconds
    python bench/postgres_lease.py --profile    # cProfile of the store's cycle
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from comparison import Candidate, interleave, print_footer, print_header, print_table, rows

POSTGRES_URL = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
TTL = 60.0
TARGET = 1.1


def floor_sql(s: str) -> tuple[str, str, str]:
    table = f"CREATE TABLE {s}.leases (key text PRIMARY KEY, owner text, token bigint NOT NULL, "
    table += "expires timestamptz)"
    acquire = (
        f"INSERT INTO {s}.leases AS l (key, owner, token, expires) "
        "VALUES (%s, %s, 1, clock_timestamp() + make_interval(secs => %s)) "
        "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = l.token + 1, "
        "expires = excluded.expires "
        "WHERE l.owner IS NULL OR l.expires <= clock_timestamp() RETURNING token"
    )
    release = f"UPDATE {s}.leases SET owner = NULL, expires = NULL WHERE key = %s AND owner = %s"
    return table, acquire, release


def ledger_sql(s: str) -> tuple[str, str]:
    """The bare lease row plus the same ledger rows the store writes, in plain
    SQL against the store's own tables: one statement (one commit) each way."""
    acquire = f"""
        WITH g AS (
            INSERT INTO {s}.leases AS l (key, job, owner, token, expires)
            VALUES (%(key)s, %(job)s, %(run)s, 1, clock_timestamp() + make_interval(secs => %(ttl)s))
            ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = l.token + 1,
                expires = excluded.expires, revoked_by = NULL
            WHERE l.owner IS NULL OR l.expires <= clock_timestamp()
            RETURNING token
        ), r AS (
            INSERT INTO {s}.runs (run_id, job, key, host, pid, token, slot, started_at)
            SELECT %(run)s, %(job)s, %(key)s, %(host)s, %(pid)s, g.token, NULL, %(at)s FROM g
        ), e AS (
            INSERT INTO {s}.events (kind, job, run_id, at, data)
            SELECT 'started', %(job)s, %(run)s, %(at)s, jsonb_build_object('host', %(host)s::text,
                'pid', %(pid)s::integer, 'token', g.token, 'key', %(key)s::text, 'slot', NULL::float8,
                'ttl', %(ttl)s::float8)
            FROM g
        )
        SELECT token FROM g"""
    release = f"""
        WITH u AS (
            UPDATE {s}.runs SET outcome = 'succeeded', ended_at = %(at)s, exit_code = 0, detail = ''
            WHERE run_id = %(run)s AND outcome IS NULL
            RETURNING started_at
        ), e AS (
            INSERT INTO {s}.events (kind, job, run_id, at, data)
            SELECT 'succeeded', %(job)s, %(run)s, %(at)s, jsonb_build_object('exit_code', 0,
                'token', %(token)s::bigint, 'duration', round((%(at)s::float8 - u.started_at)::numeric, 6))
            FROM u
        ), l AS (
            UPDATE {s}.leases SET owner = NULL, expires = NULL, revoked_by = NULL
            WHERE key = %(key)s AND owner = %(run)s
            RETURNING 1
        )
        SELECT EXISTS (SELECT FROM u), EXISTS (SELECT FROM l)"""
    return acquire, release


MINIMAL = ("a", "b", "c")
"""The minimal ledger-keeping cycles (references): (a) a lease row and a run
row with its primary key only, (b) the same plus ``runs (job, started_at)``,
(c) one table whose newest row per key is the lease."""


def minimal_sql(s: str, variant: str) -> tuple[list[str], str, str]:
    """DDL, acquire and release of one minimal ledger-keeping cycle: the run
    row is the ``started`` record, its outcome the terminal record; no events
    table. Each is one statement, so two commits per cycle like the floor.
    ``runs`` has the store's fillfactor, so recording the outcome (no indexed
    column changes) stays a HOT update."""
    run_cols = (
        "key text NOT NULL, token bigint NOT NULL, job text NOT NULL, host text NOT NULL, "
        "pid integer NOT NULL, started_at timestamptz NOT NULL, ended_at timestamptz, outcome text"
    )
    if variant == "c":
        runs = f"{s}.runs_c"
        ddl = [
            f"CREATE TABLE {runs} ({run_cols}, run_id uuid NOT NULL, expires timestamptz NOT NULL, "
            "PRIMARY KEY (key, token)) WITH (fillfactor = 90)"
        ]
        # The lease is the key's newest row, held while it has no outcome and
        # has not expired. A cost bound only, not a design: under READ
        # COMMITTED two acquirers can both read the same finished newest row
        # and both insert token + 1; only the (key, token) primary key stops
        # a double grant (the loser waits, then fails with unique_violation).
        # Without that constraint, or a lock on the key, both would hold it.
        # Not exercised under concurrency here.
        acquire = f"""
            WITH last AS (
                SELECT token, outcome, expires FROM {runs} WHERE key = %(key)s ORDER BY token DESC LIMIT 1
            )
            INSERT INTO {runs} (key, token, run_id, job, host, pid, started_at, expires)
            SELECT %(key)s, coalesce((SELECT token FROM last), 0) + 1, %(run)s::uuid, %(job)s, %(host)s,
                %(pid)s, clock_timestamp(), clock_timestamp() + make_interval(secs => %(ttl)s)
            WHERE NOT EXISTS (SELECT FROM last WHERE outcome IS NULL AND expires > clock_timestamp())
            RETURNING token"""
        release = f"""
            UPDATE {runs} SET outcome = 'succeeded', ended_at = clock_timestamp()
            WHERE key = %(key)s AND token = %(token)s AND run_id = %(run)s::uuid AND outcome IS NULL"""
        return ddl, acquire, release
    leases, runs = f"{s}.leases_{variant}", f"{s}.runs_{variant}"
    ddl = [
        f"CREATE TABLE {leases} (key text PRIMARY KEY, owner text, token bigint NOT NULL, "
        "expires timestamptz)",
        f"CREATE TABLE {runs} (run_id uuid PRIMARY KEY, {run_cols}) WITH (fillfactor = 90)",
    ]
    if variant == "b":
        ddl.append(f"CREATE INDEX runs_b_job_started ON {runs} (job, started_at)")
    # The floor's upsert, its token feeding the run row.
    acquire = f"""
        WITH g AS (
            INSERT INTO {leases} AS l (key, owner, token, expires)
            VALUES (%(key)s, %(run)s::text, 1, clock_timestamp() + make_interval(secs => %(ttl)s))
            ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = l.token + 1,
                expires = excluded.expires
            WHERE l.owner IS NULL OR l.expires <= clock_timestamp()
            RETURNING token
        )
        INSERT INTO {runs} (run_id, key, token, job, host, pid, started_at)
        SELECT %(run)s::uuid, %(key)s, g.token, %(job)s, %(host)s, %(pid)s, clock_timestamp() FROM g
        RETURNING token"""
    # The floor's release, with the outcome recorded in the same statement.
    release = f"""
        WITH r AS (
            UPDATE {runs} SET outcome = 'succeeded', ended_at = clock_timestamp()
            WHERE run_id = %(run)s::uuid AND outcome IS NULL
        )
        UPDATE {leases} SET owner = NULL, expires = NULL WHERE key = %(key)s AND owner = %(run)s::text"""
    return ddl, acquire, release


class Setup:
    """The connections and schemas of one comparison. ``async_commit`` turns
    off the flush at commit on every connection (diagnostic)."""

    def __init__(self, tag: str, *, async_commit: bool = False) -> None:
        self.async_commit = async_commit
        self.schemas = [f"cw_bench_{tag}_floor", f"cw_bench_{tag}_ledger", f"cw_bench_{tag}_store",
                        f"cw_bench_{tag}_minimal"]  # fmt: skip
        try:
            self._open(async_commit)
        except BaseException:
            drop_schemas(self.schemas)
            raise

    def _open(self, async_commit: bool) -> None:
        import psycopg

        from cronwarden.guard import Warden, this_host
        from cronwarden.stores import open_store

        floor_s, ledger_s = (f'"{s}"' for s in self.schemas[:2])
        options = "-c synchronous_commit=off" if async_commit else ""
        self.floor = psycopg.connect(POSTGRES_URL, autocommit=True, options=options)
        table, self.floor_acquire, self.floor_release = floor_sql(floor_s)
        self.floor.execute(f"CREATE SCHEMA {floor_s}")
        self.floor.execute(table)
        # The reference writes into tables the store created (same columns,
        # indexes and defaults), through a plain connection.
        open_store(f"{POSTGRES_URL}?schema={self.schemas[1]}").close()
        self.ledger = psycopg.connect(POSTGRES_URL, autocommit=True, options=options)
        self.ledger_acquire, self.ledger_release = ledger_sql(ledger_s)
        minimal_s = f'"{self.schemas[3]}"'
        self.minimal = psycopg.connect(POSTGRES_URL, autocommit=True, options=options)
        self.minimal.execute(f"CREATE SCHEMA {minimal_s}")
        self.minimal_sql: dict[str, tuple[str, str]] = {}
        for variant in MINIMAL:
            ddl, acquire, release = minimal_sql(minimal_s, variant)
            for statement in ddl:
                self.minimal.execute(statement)
            self.minimal_sql[variant] = acquire, release
        if async_commit:
            # libpq options go through the constructor's conninfo: from_url
            # re-encodes its query with '+' for spaces, which libpq reads as '+'.
            from cronwarden.stores.postgres import PostgresStore

            sep = "&" if "?" in POSTGRES_URL else "?"
            conninfo = f"{POSTGRES_URL}{sep}options=-c%20synchronous_commit%3Doff"
            self.store: Any = PostgresStore(conninfo, schema=self.schemas[2])
            # The store sets synchronous_commit=on itself; ours comes later in
            # the options and wins today. Say so if that ever changes.
            got = self.store._call(lambda c: c.execute("SHOW synchronous_commit").fetchone()[0])
            if got != "off":
                print(f"note: the store's connection kept synchronous_commit={got}: its rows below flush")
        else:
            self.store = open_store(f"{POSTGRES_URL}?schema={self.schemas[2]}")
        self.warden = Warden(self.store, quiet=True)
        self.host, self.pid = this_host(), os.getpid()

    def floor_cycle(self) -> None:
        owner = os.urandom(16).hex()
        row = self.floor.execute(self.floor_acquire, ("bench", owner, TTL)).fetchone()
        assert row is not None, "floor lease refused: another holder?"
        self.floor.execute(self.floor_release, ("bench", owner))

    def ledger_cycle(self) -> None:
        from cronwarden.events import new_id

        p: dict[str, Any] = {"key": "bench", "job": "bench", "run": new_id(), "ttl": TTL, "host": self.host,
                             "pid": self.pid, "at": time.time()}  # fmt: skip
        row = self.ledger.execute(self.ledger_acquire, p).fetchone()
        assert row is not None, "ledger reference lease refused: another holder?"
        p["token"], p["at"] = row[0], time.time()
        self.ledger.execute(self.ledger_release, p)

    def minimal_cycle(self, variant: str) -> None:
        from cronwarden.events import new_id

        acquire, release = self.minimal_sql[variant]
        p: dict[str, Any] = {"key": "bench", "job": "bench", "run": new_id(), "ttl": TTL, "host": self.host,
                             "pid": self.pid}  # fmt: skip
        row = self.minimal.execute(acquire, p).fetchone()
        assert row is not None, f"minimal reference ({variant}) lease refused: another holder?"
        p["token"] = row[0]
        self.minimal.execute(release, p)

    def check_minimal(self) -> None:
        """Every run row of the minimal references has its outcome and every
        lease is free: their cycles recorded what they claim to."""
        s = f'"{self.schemas[3]}"'
        open_runs = " + ".join(f"(SELECT count(*) FROM {s}.runs_{v} WHERE outcome IS NULL)" for v in MINIMAL)
        held = " + ".join(f"(SELECT count(*) FROM {s}.leases_{v} WHERE owner IS NOT NULL)" for v in "ab")
        row = self.minimal.execute(f"SELECT {open_runs}, {held}").fetchone()
        assert row == (0, 0), f"minimal references left (runs without an outcome, held leases) = {row}"

    def store_cycle(self) -> None:
        from cronwarden.events import Outcome, new_id
        from cronwarden.stores.base import End, Granted, Start

        start = Start(job="bench", key="bench", run_id=new_id(), host=self.host, pid=self.pid, ttl=TTL,
                      at=time.time())  # fmt: skip
        granted = self.store.acquire(start)
        assert isinstance(granted, Granted), granted
        self.store.finish(granted.lease, End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0))

    def guard_cycle(self) -> None:
        with self.warden.guard("bench-guard", ttl=TTL):
            pass

    def candidates(self) -> tuple[Candidate, list[Candidate]]:
        target = None if self.async_commit else TARGET
        floor = Candidate("floor: bare lease row, 2 statements", self.floor_cycle)
        return floor, [
            Candidate(
                "ref: bare row + the same ledger writes, plain SQL",
                self.ledger_cycle,
                note="intermediate: same rows and commits, no plpgsql",
            ),
            Candidate(
                "ref (a): lease row + run row, no events",
                lambda: self.minimal_cycle("a"),
                note="reference: 2 statements; runs has its primary key only",
            ),
            Candidate(
                "ref (b): (a) + runs (job, started_at)",
                lambda: self.minimal_cycle("b"),
                note="reference: (a) with the one index reads need",
            ),
            Candidate(
                "ref (c): one table, the run row is the lease",
                lambda: self.minimal_cycle("c"),
                note="reference: a cost bound only, not safe without its primary key",
            ),
            Candidate("full guarded cycle: store.acquire + store.finish", self.store_cycle, target),
            Candidate("full guarded cycle: Warden.guard enter/exit", self.guard_cycle, target),
        ]

    def close(self) -> None:
        self.store.close()
        self.ledger.close()
        self.minimal.close()
        self.floor.close()
        drop_schemas(self.schemas)


def drop_schemas(schemas: list[str]) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        for s in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')


def explain(setup: Setup, cycles: int) -> None:
    """Per cycle, from ``EXPLAIN (ANALYZE, WAL)`` of each statement: server
    execution time (before the commit) and WAL records/bytes/full-page images."""
    from cronwarden.events import new_id
    from cronwarden.stores.postgres import QUERIES
    from cronwarden.stores.sql import queries

    store_s = f'"{setup.schemas[2]}"'
    store_queries = queries(QUERIES)  # the store's own calls of its functions
    stats: dict[str, list[tuple[float, int, int, int]]] = {
        k: [] for k in ("floor", "ledger", *MINIMAL, "store")
    }

    def measure(conn: Any, sql: str, params: Any) -> tuple[float, int, int, int, Any]:
        plan = conn.execute("EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + sql, params).fetchone()[0][0]
        # The top node's counters include whatever ran inside it (a CTE the
        # main query reads, a function's statements); a data-modifying CTE
        # that nothing reads runs after it, with counters of its own.
        nodes = [plan["Plan"], *_unread_modify_ctes(plan["Plan"])]
        wal = [sum(n.get(k, 0) for n in nodes) for k in ("WAL Records", "WAL Bytes", "WAL FPI")]
        return plan["Execution Time"] + plan["Planning Time"], wal[0], wal[1], wal[2], None

    def add(name: str, *parts: tuple[float, int, int, int, Any]) -> None:
        stats[name].append(tuple(sum(p[i] for p in parts) for i in range(4)))  # type: ignore[arg-type]

    for _ in range(cycles):
        owner = os.urandom(16).hex()
        a = measure(setup.floor, setup.floor_acquire, ("explain", owner, TTL))
        add("floor", a, measure(setup.floor, setup.floor_release, ("explain", owner)))
        p: dict[str, Any] = {"key": "explain", "job": "explain", "run": new_id(), "ttl": TTL,
                             "host": setup.host, "pid": setup.pid, "at": time.time(), "token": 0}  # fmt: skip
        a = measure(setup.ledger, setup.ledger_acquire, p)
        p["at"] = time.time()
        add("ledger", a, measure(setup.ledger, setup.ledger_release, p))
        for variant, (acquire, release) in setup.minimal_sql.items():
            p = {"key": "explain", "job": "explain", "run": new_id(), "ttl": TTL, "host": setup.host,
                 "pid": setup.pid}  # fmt: skip
            a = measure(setup.minimal, acquire, p)
            if variant == "c":  # EXPLAIN drops the RETURNING row; (c)'s release needs the token
                got = setup.minimal.execute(
                    f'SELECT max(token) FROM "{setup.schemas[3]}".runs_c WHERE key = %s', ("explain",)
                ).fetchone()
                assert got is not None
                p["token"] = got[0]
            add(variant, a, measure(setup.minimal, release, p))
        run = new_id()
        acq, fin = (store_queries[name].replace("{s}", store_s) for name in ("acquire", "finish"))
        conn = setup.ledger
        a = measure(
            conn, acq, ("explain", "explain", run, setup.host, setup.pid, TTL, time.time(), None, "skip", 1)
        )
        f = measure(conn, fin, ("explain", "explain", run, 0, "succeeded", time.time(), 0, "", None, False))
        add("store", a, f)
    print(f"\nserver side, per cycle (EXPLAIN (ANALYZE, WAL) of both statements, median of {cycles}; "
          "the commit's own flush is not included):")  # fmt: skip
    print(f"{'what':<42}  {'exec+plan µs':>12}  {'WAL records':>11}  {'WAL bytes':>9}  {'full pages':>10}")
    names = {"floor": "floor: bare lease row", "ledger": "ref: bare row + ledger, plain SQL",
             "a": "ref (a): lease row + run row, no events", "b": "ref (b): (a) + runs (job, started_at)",
             "c": "ref (c): one table, run row is the lease",
             "store": "store: acquire() + finish() functions"}  # fmt: skip
    for key, name in names.items():
        cols = list(zip(*stats[key], strict=True))
        ms, recs, size, fpi = (statistics.median(c) for c in cols)
        print(f"{name:<42}  {ms * 1000:>12.0f}  {recs:>11.0f}  {size:>9.0f}  {fpi:>10.1f}")


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in _nodes(child))]


def _unread_modify_ctes(top: dict[str, Any]) -> list[dict[str, Any]]:
    """The data-modifying CTEs of a plan that no CTE Scan reads (a CTE read
    only by such a CTE runs inside it, in its counters)."""
    nodes = _nodes(top)
    read = {n["CTE Name"] for n in nodes if n["Node Type"] == "CTE Scan"}
    return [
        n
        for n in nodes
        if n is not top
        and n["Node Type"] == "ModifyTable"
        and n.get("Subplan Name", "").startswith("CTE ")
        and n["Subplan Name"][4:] not in read
    ]


def compare(setup: Setup, title: str, quick: bool, budget: float) -> None:
    started = time.monotonic()
    floor, others = setup.candidates()
    n = interleave(floor, others, min_rounds=5, budget=budget)
    print_table(title, rows(floor, others))
    setup.check_minimal()
    print_footer(n, started)


def profile(cycles: int) -> None:
    import cProfile
    import pstats

    setup = Setup(uuid.uuid4().hex[:10])
    try:
        for _ in range(20):
            setup.store_cycle()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(cycles):
            setup.store_cycle()
        prof.disable()
    finally:
        setup.close()
    print(f"\ncProfile of {cycles} store.acquire + store.finish cycles, top 25 by own time:")
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)


def unavailable() -> str | None:
    try:
        import psycopg
    except ImportError as e:
        return f"psycopg not installed ({e}): pip install 'cronwarden[postgres]'"
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as e:
        return f"PostgreSQL not reachable at {POSTGRES_URL}: {str(e).strip().splitlines()[0]}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few seconds (CI smoke run): no async table")
    ap.add_argument("--budget", type=float, help="seconds of interleaved rounds per table")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the store's cycle instead")
    args = ap.parse_args()
    why = unavailable()
    if why:
        print(f"skipping the PostgreSQL bench: {why}")
        return 0
    if args.profile:
        profile(300 if args.quick else 2000)
        return 0
    budget = args.budget if args.budget is not None else (1.5 if args.quick else 20.0)
    print_header(f"PostgreSQL ({POSTGRES_URL}): full guarded cycle vs a bare lease row, kept connections")
    steps: list[tuple[str, bool, Callable[[Setup], None]]] = [
        ("on", False, lambda s: explain(s, 20 if args.quick else 100))
    ]
    if not args.quick:
        steps.append(("off", True, lambda s: None))
    for label, async_commit, extra in steps:
        setup = Setup(uuid.uuid4().hex[:10], async_commit=async_commit)
        try:
            what = (
                "the target" if not async_commit else "diagnostic: no flush at commit, CPU and WAL work only"
            )
            compare(
                setup, f"synchronous_commit={label} ({what}): one acquire+release cycle", args.quick, budget
            )
            extra(setup)
        finally:
            setup.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
