"""The SQLite store's schema v2 (the outbox) on a database written by v1."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from cronwarden.clock import FakeClock
from cronwarden.stores.sql import migrations, read_sql
from cronwarden.stores.sqlite import MIGRATIONS_DIR, SCHEMA_VERSION, SqliteStore, statements


def test_a_version_1_database_is_migrated_and_its_recent_events_reach_a_new_sink(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    for statement in statements(read_sql(migrations(MIGRATIONS_DIR)[1])):
        db.execute(statement)
    now = time.time()
    db.executemany(
        "INSERT INTO events (event_id, kind, job, run_id, at, data) "
        "VALUES (?, 'succeeded', 'nightly', NULL, ?, '{}')",
        [("old", now - 7200), ("recent", now - 60)],
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()

    store = SqliteStore(path, clock=FakeClock(start=now))
    try:
        got = store.undelivered("hook", 10, backfill=3600)
        store.mark_delivered("hook", [e.event_id for e in got])
        again = store.undelivered("hook", 10)
    finally:
        store.close()

    assert [e.event_id for e in got] == ["recent"] and again == []
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
