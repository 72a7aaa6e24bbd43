"""A SQLite store whose rollups were kept by version 13's triggers (the
window's ring mod 50, its statistics recomputed at every end) is upgraded to
the ends that update them in and out: the window survives the renumbering,
and the ends written after the upgrade keep every statistic of an end equal
to the fold of the ledger, across the ring's turn."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.contract import end, granted, start
from tests.contract.test_rollup import same

from cronwarden.clock import FakeClock
from cronwarden.events import Outcome
from cronwarden.stores.rollup import ROLLUP_RUNS, Rollup, fold
from cronwarden.stores.sqlite import SqliteStore

from .test_sqlite_schema import at_version

END_FIELDS = [
    f for f in Rollup._fields
    if f.startswith("w_") or f in ("ended", "outcomes", "completed", "duration_sum", "last_success",
                                   "bad_in_a_row", "good_in_a_row", "p50", "p95")
]  # fmt: skip
"""What a run's end changes in a rollup (starts and refusals keep the rest)."""

OUTCOMES = ["succeeded", "failed", "succeeded", "timed_out", "lease_lost", "succeeded", "stopped"]


def written_at_version_13(path: Path, job: str, ends: int, t0: float) -> None:
    """``ends`` runs started and ended by plain SQL, as version 13's
    triggers saw them (the store of that version wrote the same rows)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        for n in range(ends):
            at = t0 + n * 100
            db.execute(
                "INSERT INTO runs (run_id, job, key, host, pid, token, slot, started_at) "
                "VALUES (?, ?, ?, 'h', 1, ?, NULL, ?)",
                (f"{job}-{n}", job, job, n + 1, at),
            )
            db.execute(
                "UPDATE runs SET outcome = ?, ended_at = ? WHERE run_id = ?",
                (OUTCOMES[n % len(OUTCOMES)], at + 1.0 + (n * 7919 % 13) / 4, f"{job}-{n}"),
            )
    finally:
        db.close()


def assert_end_fields_fold(store: SqliteStore, job: str) -> None:
    runs = store.runs(job, 10**9)
    ended = sorted((r for r in runs if r.outcome is not None), key=lambda r: (r.ended_at, r.started_at))
    want = fold(job, runs, ended, [])[0]
    kept = store.rollups()
    assert kept is not None
    got = kept[job]
    for name in END_FIELDS:
        g, w = getattr(got, name), getattr(want, name)
        if name == "w_durations":
            g, w = json.loads(g), json.loads(w)
        if name in ("outcomes", "w_outcomes"):
            g, w = dict(g), dict(w)
        assert same(g, w), f"{name}: the store kept {g!r}, the ledger folds to {w!r}"


def test_rollups_kept_by_version_13_are_carried_on_by_the_upgraded_ends(tmp_path: Path) -> None:
    path = at_version(tmp_path / "v13.db", 13)
    t0 = 1_760_000_000.0
    written_at_version_13(path, "nightly", 73, t0)  # the v13 ring has turned once, 23 places in
    written_at_version_13(path, "young", 7, t0)

    store = SqliteStore(path, clock=FakeClock())
    try:
        assert_end_fields_fold(store, "nightly")
        assert_end_fields_fold(store, "young")
        t = t0 + 10_000
        for n in range(ROLLUP_RUNS + 9):  # past the upgraded ring's turn
            g = granted(store.acquire(start("nightly", at=t)))
            store.finish(g.lease, end(Outcome(OUTCOMES[n % len(OUTCOMES)]), at=t + 0.5 + (n * 31 % 17)))
            t += 100
            if n % 10 == 0:
                assert_end_fields_fold(store, "nightly")
        assert_end_fields_fold(store, "nightly")
    finally:
        store.close()
