"""The SQLite store's schema upgrades: on a database written by v2, runs,
events, leases and the outbox come through the upgrade intact, and no sink
is sent an event twice or misses one because of it; a database written by
v3 gains the slot claims (v4) and keeps its locks."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from cronwarden.clock import FakeClock
from cronwarden.events import Event, EventKind, Outcome
from cronwarden.stores.base import End, EventQuery, Granted, Start
from cronwarden.stores.sql import migrations, read_sql
from cronwarden.stores.sqlite import MIGRATIONS_DIR, SCHEMA_VERSION, SqliteStore, statements

T0 = 1_700_000_000.0
BOOT = "boot-1"


def migration(version: int) -> str:
    """The SQL of one migration file, as the store applies it."""
    return read_sql(migrations(MIGRATIONS_DIR)[version])


def _v2_file(path: Path) -> None:
    """A v2 database as the v2 code left it: two finished runs and one open
    (holding its lease), their events and a skip, a sink that acknowledged
    some events out of order, and a sink whose mark is past events deleted by
    hand (AUTOINCREMENT kept their seq numbers from being reused)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    for v in (1, 2):
        for statement in statements(migration(v)):
            db.execute(statement)
    runs = [
        ("run-a", T0, T0 + 5, "succeeded", 0, 1),
        ("run-b", T0 + 60, T0 + 70, "failed", 3, 2),
        ("run-c", T0 + 120, None, None, None, 3),
    ]
    for run_id, started, ended, outcome, code, token in runs:
        db.execute(
            "INSERT INTO runs (run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome, "
            "exit_code, detail) VALUES (?, 'nightly', 'nightly', 'h1', 42, ?, NULL, ?, ?, ?, ?, ?)",
            (run_id, token, started, ended, outcome, code, "exit status 3" if code == 3 else ""),
        )
    db.execute(
        "INSERT INTO leases (key, job, owner, token, expires, boot_id) VALUES ('nightly', 'nightly', "
        "'run-c', 3, ?, ?)",
        (T0 + 10_000, BOOT),
    )
    events = [
        ("e1", "started", "run-a", T0, {"token": 1}),
        ("e2", "succeeded", "run-a", T0 + 5, {"exit_code": 0, "duration": 5.0}),
        ("e3", "started", "run-b", T0 + 60, {"token": 2}),
        ("e4", "skipped", "run-x", T0 + 65, {"holder_run_id": "run-b"}),
        ("e5", "failed", "run-b", T0 + 70, {"exit_code": 3}),
        ("e6", "started", "run-c", T0 + 120, {"token": 3}),
        ("e7", "slow", None, T0 + 130, {"state": "raised"}),
        ("e8", "slow", None, T0 + 131, {"state": "resolved"}),
    ]
    for event_id, kind, run_id, at, data in events:
        db.execute(
            "INSERT INTO events (event_id, kind, job, run_id, at, data) VALUES (?, ?, 'nightly', ?, ?, ?)",
            (event_id, kind, run_id, at, json.dumps(data)),
        )
    # "hook" acknowledged e1, e2 (its mark), then e4 and e6 out of order.
    db.execute("INSERT INTO outbox_marks (sink, mark, registered_at) VALUES ('hook', 2, ?)", (T0,))
    db.executemany("INSERT INTO outbox_acks (sink, seq) VALUES ('hook', ?)", [(4,), (6,)])
    # "late" acknowledged everything; then e7 and e8 were deleted by hand.
    db.execute("INSERT INTO outbox_marks (sink, mark, registered_at) VALUES ('late', 8, ?)", (T0,))
    db.execute("DELETE FROM events WHERE seq > 6")
    db.execute("PRAGMA user_version = 2")
    db.close()


@pytest.fixture
def v2_path(tmp_path: Path) -> Path:
    path = tmp_path / "v2.db"
    _v2_file(path)
    return path


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=T0 + 200, boot=BOOT)


def _ids(events: list[Event]) -> list[str]:
    return [e.event_id for e in events]


def test_a_version_2_database_is_upgraded_with_its_runs_events_and_leases(
    v2_path: Path, clock: FakeClock
) -> None:
    with SqliteStore(v2_path, clock=clock) as store:
        runs = store.runs("nightly")
        opened = store.open_runs()
        events = store.events(EventQuery(limit=100, newest_first=False))
        lease = store.lease("nightly")
        b = store.run("run-b")

    assert [r.run_id for r in runs] == ["run-c", "run-b", "run-a"]
    assert [r.outcome for r in runs] == [None, Outcome.FAILED, Outcome.SUCCEEDED]
    assert b is not None and (b.token, b.exit_code, b.detail, b.ended_at) == (2, 3, "exit status 3", T0 + 70)
    assert [r.run_id for r in opened] == ["run-c"] and opened[0].expires_in == pytest.approx(10_000 - 200)
    assert [(e.seq, e.event_id) for e in events] == [(i, f"e{i}") for i in range(1, 7)]
    assert events[3].data == {"holder_run_id": "run-b"} and events[3].kind is EventKind.SKIPPED
    assert lease is not None and (lease.owner, lease.token) == ("run-c", 3)
    with sqlite3.connect(v2_path) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 4
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_the_upgraded_store_keeps_counting_tokens_and_seqs(v2_path: Path, clock: FakeClock) -> None:
    with SqliteStore(v2_path, clock=clock) as store:
        clock.advance(20_000)  # run-c's lease expires: the next start abandons it
        granted = store.acquire(
            Start(job="nightly", key="nightly", run_id="run-d", host="h1", pid=43, ttl=60, at=clock.wall())
        )
        assert isinstance(granted, Granted)
        store.finish(granted.lease, End(outcome=Outcome.SUCCEEDED, at=clock.wall(), exit_code=0))
        new = store.events(EventQuery(limit=100, newest_first=False))[6:]
        c = store.run("run-c")

    assert granted.lease.token == 4 and granted.abandoned == ("run-c",)
    assert c is not None and c.outcome is Outcome.ABANDONED
    assert [(e.seq, e.kind) for e in new] == [
        (7, EventKind.ABANDONED),
        (8, EventKind.STARTED),
        (9, EventKind.SUCCEEDED),
    ]


def test_a_sink_gets_exactly_what_it_had_not_acknowledged_across_the_upgrade(
    v2_path: Path, clock: FakeClock
) -> None:
    with SqliteStore(v2_path, clock=clock) as store:
        pending = store.undelivered("hook", 100)
        store.mark_delivered("hook", _ids(pending))
        store.record(Event(kind=EventKind.MISSED, job="nightly", at=clock.wall(), event_id="after"))
        after = store.undelivered("hook", 100)
        store.mark_delivered("hook", _ids(after))
        again = store.undelivered("hook", 100)

    assert _ids(pending) == ["e3", "e5"], "e1, e2, e4, e6 were acknowledged before the upgrade"
    assert _ids(after) == ["after"] and again == []


def test_a_sink_past_deleted_events_still_gets_the_events_written_after_the_upgrade(
    v2_path: Path, clock: FakeClock
) -> None:
    # Without AUTOINCREMENT the next event takes seq 7, which "late"'s v2
    # mark (8) had passed; the upgrade lowers that mark to the newest event.
    with SqliteStore(v2_path, clock=clock) as store:
        assert store.undelivered("late", 100) == []
        store.record(Event(kind=EventKind.MISSED, job="nightly", at=clock.wall(), event_id="new-7"))
        store.record(Event(kind=EventKind.MISSED, job="nightly", at=clock.wall(), event_id="new-8"))
        got = store.undelivered("late", 100)

    assert [(e.seq, e.event_id) for e in got] == [(7, "new-7"), (8, "new-8")]


def test_the_newest_event_cannot_be_deleted(v2_path: Path, clock: FakeClock) -> None:
    SqliteStore(v2_path, clock=clock).close()
    db = sqlite3.connect(v2_path, isolation_level=None)
    try:
        db.execute("DELETE FROM events WHERE seq < 3")  # older events may go (retention)
        with pytest.raises(sqlite3.IntegrityError, match="newest event"):
            db.execute("DELETE FROM events")
        assert db.execute("SELECT min(seq), max(seq) FROM events").fetchone() == (3, 6)
    finally:
        db.close()


def test_a_version_3_database_is_upgraded_and_claims_slots(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "v3.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    for v in (1, 2, 3):
        for statement in statements(migration(v)):
            db.execute(statement)
    db.execute(
        "INSERT INTO locks (key, owner, token, expires, boot_id) VALUES ('leader', 'old', 7, ?, ?)",
        (clock.store_time() + 60, BOOT),
    )
    db.execute("PRAGMA user_version = 3")
    db.close()

    with SqliteStore(path, clock=clock) as store:
        assert store.claim_slot("nightly", T0 + 300, "a", 60.0) == "a"
        assert store.claim_slot("nightly", T0 + 300, "b", 60.0) == "a"
        assert store.lock("leader", "new", 60.0) is None, "v3's lock is still held"
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 4


def test_a_new_database_has_the_v4_schema(tmp_path: Path, clock: FakeClock) -> None:
    SqliteStore(tmp_path / "new.db", clock=clock).close()
    with sqlite3.connect(tmp_path / "new.db") as db:
        sql = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}

    assert "WITHOUT ROWID" in sql["runs"] and "AUTOINCREMENT" not in sql["events"]
    assert "locks" in sql
    assert "WITHOUT ROWID" in sql["slot_claims"]
    assert {"runs_job_started", "runs_open", "events_job_at", "events_event_id"} <= indexes
    assert "events_run" not in indexes


OPEN_WHEN_TOLD = """
import random, sys, time
from cronwarden.stores import open_store
print("ready", flush=True)
sys.stdin.readline()
for path in sys.argv[1:]:
    time.sleep(random.random() / 100)  # some arrive while another creates the schema
    try:
        open_store("sqlite:///" + path).close()
        print("opened", flush=True)
    except Exception as e:
        print(f"{type(e).__name__}: {e}", flush=True)
"""


def test_processes_opening_new_files_together_all_open_them(tmp_path: Path) -> None:
    """Two cron lines in the same minute on a fresh install: one creates the
    schema while the others look. None may take the half-made schema for
    another program's tables, or fail on a busy answer SQLite gives without
    waiting. Eight processes, released together, open the same 30 new files
    in turn, each after a random pause of up to 10 ms."""
    import subprocess
    import sys

    paths = [str(tmp_path / f"new-{n}.db") for n in range(30)]
    argv = [sys.executable, "-c", OPEN_WHEN_TOLD, *paths]
    procs = [
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(8)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    answers = [line for p in procs for line in p.communicate(timeout=120)[0].splitlines()]
    assert [a for a in answers if a != "opened"] == []
    assert len(answers) == 8 * len(paths)
    for path in paths:
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
