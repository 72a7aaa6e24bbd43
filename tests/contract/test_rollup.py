"""Each job's rollup, kept by the store as runs start and end, equals the
fold of its ledger read back (``stores.rollup.fold``, what a rebuild
writes), on random histories written through the store's own API, on every
store. A rebuild changes nothing on a ledger the store kept itself, and
brings back a row that was lost."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronwarden.clock import FakeClock
from cronwarden.events import Event, EventKind, JobInfo, Outcome
from cronwarden.lease import Lease
from cronwarden.monitor import Monitor, Thresholds
from cronwarden.policy import Policy
from cronwarden.stores.base import End, EventQuery, Store
from cronwarden.stores.rollup import ROLLUP_EVENT_KINDS, ROLLUP_RUNS, Rollup, fold

from . import end, granted, refused, start

OUTCOMES = [o for o in Outcome if o is not Outcome.ABANDONED]

step = st.one_of(
    st.tuples(st.just("run"), st.sampled_from(OUTCOMES), st.floats(0.001, 900.0)),
    st.tuples(st.just("skip"), st.sampled_from(OUTCOMES), st.integers(1, 3)),
    st.tuples(st.just("allow"), st.sampled_from(OUTCOMES), st.floats(0.5, 30.0)),
    st.tuples(st.just("shard"), st.sampled_from(OUTCOMES), st.floats(0.5, 30.0)),
    st.tuples(st.just("abandon"), st.just(Outcome.ABANDONED), st.floats(1.0, 60.0)),
    st.tuples(st.just("overlap_event"), st.just(Outcome.SUCCEEDED), st.just(0.0)),
    st.tuples(st.just("late_skip"), st.just(Outcome.SUCCEEDED), st.floats(0.0001, 0.01)),
)


def play(store: Store, job: str, steps: list[tuple[str, Outcome, float]], t0: float) -> None:
    """Write the history through the store: every start at its time, every
    end after it, time always moving on."""
    t = t0
    for kind, outcome, x in steps:
        t += 1.25
        if kind == "run":
            g = granted(store.acquire(start(job, at=t)))
            store.finish(g.lease, end(outcome, at=t + x))
            t += x
        elif kind == "skip":
            g = granted(store.acquire(start(job, at=t)))
            for i in range(int(x)):
                refused(store.acquire(start(job, at=t + 0.5 + i)))
            t += 0.5 + x
            store.finish(g.lease, end(outcome, at=t))
        elif kind == "allow":
            a = granted(store.acquire(start(job, at=t)))
            b = granted(store.acquire(start(job, at=t + 0.25, policy=Policy.ALLOW)))
            store.finish(b.lease, end(outcome, at=t + 0.5))
            # Not at b's end: runs that end at the same instant are folded in start order.
            store.finish(a.lease, end(Outcome.SUCCEEDED, at=t + 0.5 + x))
            t += 0.5 + x
        elif kind == "shard":
            g = granted(store.acquire(start(job, key=f"{job}:1", at=t)))
            store.finish(g.lease, end(outcome, at=t + x))
            t += x
        elif kind == "abandon":
            g = granted(store.acquire(start(job, at=t)))
            lease = Lease(key=g.lease.key, job=job, run_id=g.lease.run_id, token=g.lease.token, ttl=0.0)
            store.finish(lease, End(outcome=Outcome.ABANDONED, at=t + x, detail="found by the test"))
            t += x
        elif kind == "overlap_event":
            store.record(Event(kind=EventKind.OVERLAP, job=job, at=t, data={"state": "raised"}))
        else:  # a skip stamped just before its holder's start (clocks a hair apart)
            g = granted(store.acquire(start(job, at=t)))
            refused(store.acquire(start(job, at=t - x)))
            store.finish(g.lease, end(Outcome.SUCCEEDED, at=t + 1))
            t += 1


def from_ledger(store: Store, job: str) -> Rollup:
    runs = store.runs(job, 10**9)
    ended = sorted((r for r in runs if r.outcome is not None), key=lambda r: (r.ended_at, r.started_at))
    refusals = store.events(EventQuery(job=job, kinds=ROLLUP_EVENT_KINDS, newest_first=False, limit=10**9))
    return fold(job, runs, ended, refusals)[0]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return bool(a == b)


def assert_same(got: Rollup, want: Rollup) -> None:
    for name in Rollup._fields:
        g, w = getattr(got, name), getattr(want, name)
        if name in ("w_durations", "attempts"):
            g, w = json.loads(g), json.loads(w)
        if isinstance(g, dict):
            g, w = dict(g), dict(w)
        assert same(g, w), f"{name}: the store kept {g!r}, the ledger folds to {w!r}"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=ROLLUP_RUNS + 15))
def test_rollup_equals_the_fold_of_the_ledger(store: Store, steps: list[tuple[str, Outcome, float]]) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    play(store, job, steps, t0=1_760_000_000.123456)

    kept = store.rollups()
    assert kept is not None, "every cronwarden store keeps rollups"
    assert_same(kept[job], from_ledger(store, job))
    assert not kept[job].stale


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.lists(step, min_size=1, max_size=ROLLUP_RUNS + 5),
    after=st.lists(step, min_size=1, max_size=ROLLUP_RUNS + 5),
)
def test_ends_after_a_rebuild_carry_on_from_the_rebuilt_window(
    store: Store, before: list[tuple[str, Outcome, float]], after: list[tuple[str, Outcome, float]]
) -> None:
    # An end takes the leaving entry out of what the rebuild wrote (each
    # store's own form of the window and its sorted durations), not of what
    # its own ends wrote.
    job = f"job-{uuid.uuid4().hex[:8]}"
    play(store, job, before, t0=1_760_000_000.5)
    store.rebuild_rollups([job])
    play(store, job, after, t0=1_760_000_000.5 + 10**6)

    kept = store.rollups()
    assert kept is not None
    assert_same(kept[job], from_ledger(store, job))


def test_rebuild_changes_nothing_and_restores_a_lost_row(store: Store) -> None:
    job = "nightly"
    steps = [("run", Outcome.SUCCEEDED, 3.0), ("skip", Outcome.FAILED, 2), ("run", Outcome.TIMED_OUT, 5.0)]
    play(store, job, steps * 20, t0=1_760_000_000.5)  # type: ignore[arg-type]
    kept = store.rollups()
    assert kept is not None
    before = kept[job]
    assert before.ended == 60 and before.w_runs == ROLLUP_RUNS and before.skips == 40

    assert store.rebuild_rollups() >= 1
    after = store.rollups()
    assert after is not None
    assert_same(after[job], before)


def test_window_statistics_of_a_known_history(store: Store) -> None:
    durations = [1.0, 2.0, 3.0, 4.0, 100.0]
    t = 1_760_000_000.0
    for d in durations:
        g = granted(store.acquire(start("batch", at=t)))
        store.finish(g.lease, end(Outcome.SUCCEEDED, at=t + d))
        t += 200
    g = granted(store.acquire(start("batch", at=t)))
    store.finish(g.lease, end(Outcome.FAILED, at=t + 0.5))
    kept = store.rollups()
    assert kept is not None
    r = kept["batch"]
    assert r.w_completed == 6 and r.w_runs == 6 and r.w_flagged == 0
    assert r.p50 == 2.5 and r.w_max == 100.0
    assert math.isclose(r.p95 or 0, 4 + (100 - 4) * 0.75)
    assert r.bad_in_a_row == 1 and r.good_in_a_row == 0
    assert dict(r.w_outcomes) == {"succeeded": 5, "failed": 1}
    assert r.durations() == (0.5, 1.0, 2.0, 3.0, 4.0, 100.0)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(step, min_size=0, max_size=ROLLUP_RUNS + 10),
    leave_open=st.booleans(),
    days=st.sampled_from([0.05, 0.5, 7.0]),
    later=st.floats(0.0, 3600.0),
)
def test_monitor_reads_from_rollups_what_it_reads_from_the_ledger(
    store: Store, steps: list[tuple[str, Outcome, float]], leave_open: bool, days: float, later: float
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    t0 = 1_760_000_000.25
    store.save_job(JobInfo(name=job, period=600.0, updated_at=t0))
    play(store, job, steps, t0=t0)
    last = max([t0, *(r.ended_at or r.started_at for r in store.runs(job, 10**9))])
    if leave_open:
        granted(store.acquire(start(job, at=last + 1)))
    clock = FakeClock(start=last + 2 + later)
    thresholds = Thresholds(days=days)

    def audit(use_rollups: bool) -> dict[str, Any]:
        found = Monitor(store, clock=clock, thresholds=thresholds, use_rollups=use_rollups).audit()
        stats = next(s for s in found if s.job == job)
        return {**stats.as_dict(thresholds), "crowded": stats.crowded}

    fast, ledger = audit(True), audit(False)
    for name, want in ledger.items():
        assert same(fast[name], want), f"{name}: from the rollup {fast[name]!r}, from the ledger {want!r}"


def test_a_plain_history_is_answered_by_the_rollup_alone(store: Store) -> None:
    steps = [("run", Outcome.SUCCEEDED, 3.0), ("skip", Outcome.SUCCEEDED, 1), ("run", Outcome.FAILED, 5.0)]
    # The last run succeeds: with a recovery threshold of 1 the job is not failing.
    play(store, "plain", [*steps * 10, ("run", Outcome.SUCCEEDED, 2.0)], t0=1_760_000_000.0)  # type: ignore[arg-type]
    kept = store.rollups()
    assert kept is not None
    monitor = Monitor(store, clock=FakeClock(start=1_760_000_000.0 + 3600))
    found = monitor._from_rollup("plain", None, monitor.clock.wall(), kept["plain"])
    assert found is not None, "a history without overlaps, abandons or shards needs no ledger read"
    stats, _ = found
    assert stats.runs == 31 and stats.skips == 10 and stats.failures == 10
