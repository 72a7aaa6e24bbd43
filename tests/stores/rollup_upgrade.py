"""What the rollup upgrade tests share: a history written by plain SQL, as
an older version's triggers saw it, and the check that a store's rollup
agrees with the fold of its ledger in everything a run's end changes."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from tests.contract import end, granted, start
from tests.contract.test_rollup import same

from cronwarden.events import Outcome
from cronwarden.stores.base import Store
from cronwarden.stores.rollup import ROLLUP_RUNS, Rollup, fold

END_FIELDS = [
    f for f in Rollup._fields
    if f.startswith("w_") or f in ("ended", "outcomes", "completed", "duration_sum", "last_success",
                                   "bad_in_a_row", "good_in_a_row", "p50", "p95")
]  # fmt: skip
"""What a run's end changes in a rollup (starts and refusals keep the rest)."""

OUTCOMES = ["succeeded", "failed", "succeeded", "timed_out", "lease_lost", "succeeded", "stopped"]


def old_history(execute: Callable[[str, Sequence[Any]], Any], job: str, ends: int, t0: float) -> None:
    """``ends`` runs started and ended by plain SQL (``?`` placeholders), as
    an older version's triggers saw them: its store wrote the same rows."""
    for n in range(ends):
        at = t0 + n * 100
        execute(
            "INSERT INTO runs (run_id, job, key, host, pid, token, slot, started_at) "
            "VALUES (?, ?, ?, 'h', 1, ?, NULL, ?)",
            (f"{job}-{n}", job, job, n + 1, at),
        )
        execute(
            "UPDATE runs SET outcome = ?, ended_at = ? WHERE run_id = ?",
            (OUTCOMES[n % len(OUTCOMES)], at + 1.0 + (n * 7919 % 13) / 4, f"{job}-{n}"),
        )


def assert_end_fields_fold(store: Store, job: str) -> None:
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


def assert_ends_carry_on(store: Store, job: str, t: float) -> None:
    """Runs of ``job`` started and ended through the upgraded store, past the
    window's turn: its rollup still folds from the ledger, checked as it goes."""
    for n in range(ROLLUP_RUNS + 9):
        g = granted(store.acquire(start(job, at=t)))
        store.finish(g.lease, end(Outcome(OUTCOMES[n % len(OUTCOMES)]), at=t + 0.5 + (n * 31 % 17)))
        t += 100
        if n % 10 == 0:
            assert_end_fields_fold(store, job)
    assert_end_fields_fold(store, job)
