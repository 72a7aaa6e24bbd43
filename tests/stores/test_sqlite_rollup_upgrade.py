"""A SQLite store whose rollups were kept by an earlier version's triggers
is upgraded: version 13's (the window's ring mod 50, its statistics
recomputed at every end) and version 16's (a ring of 51, the statistics
updated in and out, the durations in fixed cells). The window survives the
renumbering, and the ends written after the upgrade keep every statistic of
an end equal to the fold of the ledger, across the ring's turn."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cronwarden.clock import FakeClock
from cronwarden.stores.sqlite import SqliteStore

from .rollup_upgrade import assert_end_fields_fold, assert_ends_carry_on, old_history
from .test_sqlite_schema import at_version


def written_by_old_triggers(path: Path, job: str, ends: int, t0: float) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        old_history(db.execute, job, ends, t0)
    finally:
        db.close()


@pytest.mark.parametrize("version", [13, 16])
def test_rollups_kept_by_an_earlier_version_are_carried_on_by_the_upgraded_ends(
    tmp_path: Path, version: int
) -> None:
    path = at_version(tmp_path / f"v{version}.db", version)
    t0 = 1_760_000_000.0
    written_by_old_triggers(path, "nightly", 73, t0)  # the old ring has turned once, 22-23 places in
    written_by_old_triggers(path, "young", 7, t0)
    written_by_old_triggers(path, "full", 51, t0)  # v16: its 51st place just taken

    store = SqliteStore(path, clock=FakeClock())
    try:
        assert_end_fields_fold(store, "nightly")
        assert_end_fields_fold(store, "young")
        assert_end_fields_fold(store, "full")
        assert_ends_carry_on(store, "nightly", t0 + 10_000)
        assert_ends_carry_on(store, "full", t0 + 10_000)
    finally:
        store.close()
