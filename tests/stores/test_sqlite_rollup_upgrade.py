"""A SQLite store whose rollups were kept by version 13's triggers (the
window's ring mod 50, its statistics recomputed at every end) is upgraded to
the ends that update them in and out: the window survives the renumbering,
and the ends written after the upgrade keep every statistic of an end equal
to the fold of the ledger, across the ring's turn."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from cronwarden.clock import FakeClock
from cronwarden.stores.sqlite import SqliteStore

from .rollup_upgrade import assert_end_fields_fold, assert_ends_carry_on, old_history
from .test_sqlite_schema import at_version


def written_at_version_13(path: Path, job: str, ends: int, t0: float) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        old_history(db.execute, job, ends, t0)
    finally:
        db.close()


def test_rollups_kept_by_version_13_are_carried_on_by_the_upgraded_ends(tmp_path: Path) -> None:
    path = at_version(tmp_path / "v13.db", 13)
    t0 = 1_760_000_000.0
    written_at_version_13(path, "nightly", 73, t0)  # the v13 ring has turned once, 23 places in
    written_at_version_13(path, "young", 7, t0)

    store = SqliteStore(path, clock=FakeClock())
    try:
        assert_end_fields_fold(store, "nightly")
        assert_end_fields_fold(store, "young")
        assert_ends_carry_on(store, "nightly", t0 + 10_000)
    finally:
        store.close()
