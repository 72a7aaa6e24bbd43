"""A guarded acquire+release through the library on SQLite, against a bare
two-statement SQLite lease row on the same file settings.

Issue 2's floor: ``Warden(store).guard("x")`` enter/exit at most 1.2x

    INSERT INTO leases … ON CONFLICT (key) DO UPDATE … WHERE expired RETURNING token
    UPDATE leases SET owner = NULL … WHERE key = ? AND owner = ?

each statement its own autocommit transaction (two commits, like the store's
``acquire`` and ``finish``), on a WAL file with the same ``synchronous``.
Also shown: the store's ``acquire`` + ``finish`` alone (no heartbeat thread,
no ``Guard``), to tell the library's share from the store's; and the *ledger
bound*: the least any design that records the run can write, to tell what
the target asks of a ledger at all. There the run row is the lease (one
``WITHOUT ROWID`` table keyed ``(key, token)``: a grant inserts the next
token's row unless the newest row of the key is open; the end updates that
row), in plain SQL, with no events: first with no index at all, then with the
two indexes the reads need (runs of a job by start for ``history``, open
runs for ``status``). Stale-owner abandonment and the event stream are left
out, so it is a bound, not a store.

Candidates run in interleaved blocks (see ``comparison.py``); each has its
own key, the floor its own file, the store and the guard one store file, all
in one directory (``--dir``; it must be on a real disk, since fsync is the
cost: a tmpfs makes FULL free and the ratio meaningless).

    python bench/sqlite_guard.py              # FULL and NORMAL, about 40 s
    python bench/sqlite_guard.py --quick      # a few seconds
    python bench/sqlite_guard.py --profile    # cProfile of the guarded cycle
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import time

from comparison import Candidate, interleave, print_footer, print_header, print_table, rows

TARGET = 1.2
TTL = 60.0

FLOOR_TABLE = "CREATE TABLE IF NOT EXISTS leases (key TEXT PRIMARY KEY, owner TEXT, token INTEGER NOT NULL, "
FLOOR_TABLE += "expires REAL)"
FLOOR_ACQUIRE = (
    "INSERT INTO leases (key, owner, token, expires) VALUES (?1, ?2, 1, ?3 + ?4) "
    "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = token + 1, expires = excluded.expires "
    "WHERE owner IS NULL OR expires <= ?3 RETURNING token"
)
FLOOR_RELEASE = "UPDATE leases SET owner = NULL, expires = NULL WHERE key = ? AND owner = ?"

BOUND_TABLE = (
    "CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL, token INTEGER NOT NULL, run_id TEXT NOT NULL, "
    "job TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL, started_at REAL NOT NULL, expires REAL, "
    "ended_at REAL, outcome TEXT, exit_code INTEGER, PRIMARY KEY (key, token)) WITHOUT ROWID"
)
BOUND_INDEXES = (
    "CREATE INDEX IF NOT EXISTS runs_job_started ON runs (job, started_at)",
    "CREATE INDEX IF NOT EXISTS runs_open ON runs (started_at) WHERE outcome IS NULL",
)
# The newest row of the key decides: open means held (expiry is left out of
# the bound: judging it adds no write).
BOUND_ACQUIRE = (
    "INSERT INTO runs (key, token, run_id, job, host, pid, started_at, expires) "
    "SELECT ?1, coalesce((SELECT max(token) FROM runs WHERE key = ?1), 0) + 1, ?2, ?1, ?3, ?4, ?5, ?6 + ?7 "
    "WHERE NOT EXISTS (SELECT 1 FROM (SELECT outcome FROM runs WHERE key = ?1 ORDER BY token DESC LIMIT 1) "
    "WHERE outcome IS NULL) RETURNING token"
)
BOUND_FINISH = (
    "UPDATE runs SET outcome = 'succeeded', ended_at = ?3, exit_code = 0, expires = NULL "
    "WHERE key = ?1 AND token = ?2 AND outcome IS NULL"
)


def open_floor(path: str, synchronous: str) -> sqlite3.Connection:
    """The bare lease row's connection, with the store's settings: WAL, the
    same ``synchronous``, the same busy timeout."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
    db.execute("PRAGMA busy_timeout = 5000")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(f"PRAGMA synchronous = {synchronous}")
    db.execute(FLOOR_TABLE)
    return db


def open_bound(path: str, synchronous: str, indexes: bool) -> sqlite3.Connection:
    """The ledger bound's connection: the floor's settings, its own file."""
    db = open_floor(path, synchronous)
    db.execute(BOUND_TABLE)
    for statement in BOUND_INDEXES if indexes else ():
        db.execute(statement)
    return db


def bound_cycle(db: sqlite3.Connection, key: str, host: str, pid: int) -> None:
    run_id = os.urandom(16).hex()
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    row = db.execute(BOUND_ACQUIRE, (key, run_id, host, pid, time.time(), now, TTL)).fetchone()
    assert row is not None, "ledger bound refused: another holder?"
    db.execute(BOUND_FINISH, (key, row[0], time.time()))


def floor_cycle(db: sqlite3.Connection, key: str) -> None:
    owner = os.urandom(16).hex()  # a run id, as every lease needs an owner
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    row = db.execute(FLOOR_ACQUIRE, (key, owner, now, TTL)).fetchone()
    assert row is not None, "floor lease refused: another holder?"
    db.execute(FLOOR_RELEASE, (key, owner))


def candidates(workdir: str, synchronous: str) -> tuple[Candidate, list[Candidate], list[object], list[str]]:
    """The floor, the others, what to close, and each candidate's file (floor first)."""
    from cronwarden.events import Outcome, new_id
    from cronwarden.guard import Warden, this_host
    from cronwarden.stores import open_store
    from cronwarden.stores.base import End, Granted, Start

    tag = synchronous.lower()
    db = open_floor(os.path.join(workdir, f"floor-{tag}.db"), synchronous)
    store = open_store(f"sqlite:///{os.path.join(workdir, f'store-{tag}.db')}?synchronous={tag}")
    warden = Warden(store, quiet=True)
    host, pid = this_host(), os.getpid()

    def store_cycle() -> None:
        start = Start(job="bench-store", key="bench-store", run_id=new_id(), host=host, pid=pid, ttl=TTL,
                      at=time.time())  # fmt: skip
        granted = store.acquire(start)
        assert isinstance(granted, Granted), granted
        store.finish(granted.lease, End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0))

    def guard_cycle() -> None:
        with warden.guard("bench-guard", ttl=TTL):
            pass

    bare = open_bound(os.path.join(workdir, f"bound-{tag}.db"), synchronous, indexes=False)
    indexed = open_bound(os.path.join(workdir, f"bound-indexed-{tag}.db"), synchronous, indexes=True)
    floor = Candidate(f"floor: bare lease row, 2 statements ({tag})", lambda: floor_cycle(db, "bench"))
    others = [
        Candidate(
            f"ledger bound: run row = lease ({tag})",
            lambda: bound_cycle(bare, "bench", host, pid),
            note="reference: no index, no events",
        ),
        Candidate(
            f"ledger bound + 2 read indexes ({tag})",
            lambda: bound_cycle(indexed, "bench", host, pid),
            note="reference: history/status indexes",
        ),
        Candidate(f"store.acquire + store.finish ({tag})", store_cycle, note="reference: no Guard"),
        Candidate(f"Warden.guard enter/exit ({tag})", guard_cycle, TARGET),
    ]
    files = [f"floor-{tag}.db", f"bound-{tag}.db", f"bound-indexed-{tag}.db"] + [f"store-{tag}.db"] * 2
    return floor, others, [db, bare, indexed, store], files


def wal_frames(workdir: str, synchronous: str, cycles: int = 20) -> None:
    """Pages each cycle appends to the WAL (and so writes and fsyncs): the
    floor's one lease row against the store's lease, run and event rows with
    their indexes."""
    floor, others, closables, files = candidates(workdir, synchronous)
    print(f"WAL pages appended per cycle (synchronous={synchronous}, mean of {cycles} cycles each):")
    try:
        for c, name in zip([floor, *others], files, strict=True):
            path = os.path.join(workdir, name)
            probe = sqlite3.connect(path, isolation_level=None)
            size = probe.execute("PRAGMA page_size").fetchone()[0]
            # Empty the WAL, then let it grow: fewer pages than the automatic
            # checkpoint's 1000, so none resets it meanwhile.
            probe.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            for _ in range(cycles):
                c.op()
            probe.close()
            frames = max(0, os.path.getsize(path + "-wal") - 32) / (size + 24)
            per = frames / cycles
            print(f"  {c.name:<48} {per:>5.1f} pages ({per * size / 1024:.0f} KiB) in 2 commits")
    finally:
        for closable in closables:
            closable.close()  # type: ignore[attr-defined]


def profile(workdir: str, synchronous: str, cycles: int) -> None:
    import cProfile
    import pstats

    _, others, closables, _ = candidates(workdir, synchronous)
    guard = others[-1]
    for _ in range(10):
        guard.op()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(cycles):
        guard.op()
    prof.disable()
    print(f"\ncProfile of {cycles} guarded cycles ({synchronous}), top 25 by own time:")
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    for c in closables:
        c.close()  # type: ignore[attr-defined]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few seconds (CI smoke run)")
    ap.add_argument("--synchronous", choices=["full", "normal", "both"], default="both")
    ap.add_argument("--dir", help="directory for the database files (default: a new temporary one)")
    ap.add_argument("--budget", type=float, help="seconds of interleaved rounds per setting")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the guarded cycle instead")
    args = ap.parse_args()
    settings = ["FULL", "NORMAL"] if args.synchronous == "both" else [args.synchronous.upper()]
    budget = args.budget if args.budget is not None else (1.0 if args.quick else 20.0)
    workdir = tempfile.mkdtemp(prefix="cw-bench-sqlite-", dir=args.dir)
    try:
        from cronwarden.stores.sqlite import filesystem_type

        fstype = filesystem_type(workdir)
        if args.profile:
            for sync in settings:
                profile(workdir, sync, 200 if args.quick else 1000)
            return 0
        print_header(f"SQLite: guarded acquire+release vs a bare lease row (files in {workdir}, {fstype})")
        if fstype in ("tmpfs", "ramfs"):
            print(f"warning: {workdir} is on {fstype}: fsync is free there; use --dir on a real disk")
        for sync in settings:
            started = time.monotonic()
            floor, others, closables, _ = candidates(workdir, sync)
            try:
                n = interleave(floor, others, min_rounds=5, budget=budget)
            finally:
                for c in closables:
                    c.close()  # type: ignore[attr-defined]
            print_table(f"synchronous={sync}: one acquire+release cycle", rows(floor, others))
            print_footer(n, started)
            wal_frames(workdir, sync)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
