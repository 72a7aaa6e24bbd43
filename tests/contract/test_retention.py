"""Retention (``Store.prune``) on every store: old finished runs and their
events go, oldest first and in bounded steps; open runs, their events, the
findings and operators' decisions stay whatever their age; dead letters of
the events that go go too; a dry run deletes nothing."""

from __future__ import annotations

import pytest

from cronwarden.events import Event, EventKind
from cronwarden.stores.base import EventQuery, Retention, Store

from . import ALL_EVENTS, end, granted, start

DAY = 86_400.0
NOW = 1_780_000_000.0


def _run(store: Store, job: str, at: float) -> str:
    lease = granted(store.acquire(start(job, at=at))).lease
    store.finish(lease, end(at=at + 5))
    return lease.run_id


def _events(store: Store, job: str) -> list[Event]:
    return store.events(EventQuery(job=job, limit=ALL_EVENTS))


def test_old_finished_runs_and_their_events_go_and_the_rest_stay(store: Store) -> None:
    old = [_run(store, "nightly", NOW - (40 - i) * DAY) for i in range(5)]  # 36-40 days old
    recent = [_run(store, "nightly", NOW - i * DAY) for i in (3, 2, 1)]
    still_open = granted(store.acquire(start("long", at=NOW - 50 * DAY))).lease
    finding = Event(kind=EventKind.STUCK, job="long", run_id=still_open.run_id, at=NOW - 45 * DAY,
                    data={"state": "raised", "severity": "critical", "summary": "stuck"})  # fmt: skip
    store.record(finding)
    paused = Event(kind=EventKind.JOB_PAUSED, job="nightly", at=NOW - 60 * DAY, data={"by": "ops"})
    store.record(paused)

    due = store.prune(Retention(max_age=30 * DAY), NOW, dry_run=True)
    assert (due.runs, due.events) == (5, 10)  # started and succeeded of each
    assert len(store.runs("nightly")) == 8  # a dry run deletes nothing

    pruned = store.prune(Retention(max_age=30 * DAY), NOW)

    assert (pruned.runs, pruned.events, pruned.done) == (5, 10, True)
    assert [r.run_id for r in store.runs("nightly")] == recent[::-1]
    assert all(store.run(r) is None for r in old)
    kinds = [(e.kind, e.run_id) for e in _events(store, "nightly")]
    assert (EventKind.JOB_PAUSED, None) in kinds  # an operator's decision stays
    assert not {r for _, r in kinds} & set(old)
    # The open run, 50 days old, its `started` and its finding stay.
    assert [r.run_id for r in store.open_runs("long")] == [still_open.run_id]
    assert {e.kind for e in _events(store, "long")} == {EventKind.STARTED, EventKind.STUCK}
    assert store.prune(Retention(max_age=30 * DAY), NOW) == (0, 0, True)


def test_keep_runs_keeps_each_jobs_newest(store: Store) -> None:
    a = [_run(store, "a", NOW - (10 - i) * DAY) for i in range(6)]
    b = [_run(store, "b", NOW - (10 - i) * DAY) for i in range(2)]

    pruned = store.prune(Retention(keep_runs=3), NOW)

    assert (pruned.runs, pruned.events) == (3, 6)
    assert [r.run_id for r in store.runs("a")] == a[:2:-1]
    assert [r.run_id for r in store.runs("b")] == b[::-1]
    # Only the jobs named, when named.
    store.prune(Retention(keep_runs=1), NOW, jobs=["b"])
    assert len(store.runs("a")) == 3 and len(store.runs("b")) == 1


def test_a_step_stops_at_its_budget_and_the_next_goes_on(store: Store) -> None:
    for i in range(10):
        _run(store, "often", NOW - 100 * DAY + i)
    _run(store, "often", NOW)  # the newest event is never due

    first = store.prune(Retention(max_age=DAY), NOW, budget=8)
    assert first.events <= 8 and not first.done
    total = first
    while not total.done:
        step = store.prune(Retention(max_age=DAY), NOW, budget=8)
        assert step.events <= 8
        total = type(total)(total.runs + step.runs, total.events + step.events, step.done)
    assert (total.runs, total.events) == (10, 20)
    assert len(store.runs("often")) == 1


def test_findings_older_than_every_run_do_not_stall_the_steps(store: Store) -> None:
    """A job's oldest events are 30 findings (kept whatever their age), then
    20 old runs: each step still deletes up to its budget of the runs'
    events, and the steps end. (Walking the job's events oldest first,
    every step would see only findings and delete nothing, for ever.)"""
    for i in range(30):
        store.record(Event(kind=EventKind.STUCK, job="j", at=NOW - 200 * DAY + i,
                           data={"state": "raised", "severity": "warning", "summary": "stuck"}))  # fmt: skip
    for i in range(20):
        _run(store, "j", NOW - 100 * DAY + 10 * i)
    _run(store, "j", NOW)

    events = runs = steps = 0
    while True:
        step = store.prune(Retention(max_age=DAY), NOW, budget=8)
        steps += 1
        assert step.events <= 8 and step.runs <= 8
        events, runs = events + step.events, runs + step.runs
        if step.done:
            break
        assert step.events or step.runs, "a step that is not done deleted nothing"
        assert steps < 20
    assert (runs, events) == (20, 40)
    kinds = [e.kind for e in _events(store, "j")]
    assert kinds.count(EventKind.STUCK) == 30 and len(store.runs("j")) == 1


def test_age_and_keep_runs_together_prune_whichever_prunes_more(store: Store) -> None:
    runs = [_run(store, "both", NOW - (10 - i) * DAY) for i in range(6)]  # 10 to 5 days old
    # The age keeps all six; keep_runs=2 keeps two: two stay.
    while not store.prune(Retention(max_age=30 * DAY, keep_runs=2), NOW).done:
        pass
    assert [r.run_id for r in store.runs("both")] == runs[:3:-1]
    # keep_runs=5 keeps both; the age (5.5 days) keeps one (5 days old).
    while not store.prune(Retention(max_age=5.5 * DAY, keep_runs=5), NOW).done:
        pass
    assert [r.run_id for r in store.runs("both")] == runs[5:]


def test_dead_letters_of_pruned_events_go(store: Store) -> None:
    old = _run(store, "sent", NOW - 40 * DAY)
    _run(store, "sent", NOW)
    [started] = store.events(EventQuery(job="sent", run_id=old, kinds=[EventKind.STARTED]))
    store.undelivered("hook", 10, backfill=3650 * DAY)
    store.reject("hook", started.event_id, None)
    assert store.rejected_counts() == {"hook": 1}

    store.prune(Retention(max_age=30 * DAY), NOW)

    assert store.rejected("hook", 10) == []
    assert store.rejected_counts().get("hook", 0) == 0


def test_no_retention_prunes_nothing(store: Store) -> None:
    _run(store, "kept", NOW - 1000 * DAY)
    assert store.prune(Retention(), NOW) == (0, 0, True)
    assert len(store.runs("kept")) == 1


@pytest.mark.parametrize("query", ["retention=30d", "keep_runs=10", "retention=30d&keep_runs=10"])
def test_the_url_says_what_to_keep(store_url: str, query: str) -> None:
    from cronwarden.stores import open_store

    with open_store(f"{store_url}{'&' if '?' in store_url else '?'}{query}") as store:
        assert store.retention.max_age == (30 * DAY if "retention" in query else None)
        assert store.retention.keep_runs == (10 if "keep_runs" in query else None)


def test_a_sink_that_stopped_acknowledging_keeps_nothing_of_the_events_that_go(store: Store) -> None:
    """A sink acknowledged out of order (a gap below), then stopped (its
    receiver down for good): once retention deletes those events, its outbox
    is the events that are left, and on Redis its mark has passed the deleted
    records and its acknowledged set is empty (they would grow for ever, and
    every read of the outbox would walk the deleted records)."""
    for at in (NOW - 40 * DAY, NOW - 35 * DAY):
        _run(store, "sent", at)
    old = store.undelivered("hook", 10, backfill=3650 * DAY)
    assert len(old) == 4
    store.mark_delivered("hook", [old[1].event_id, old[3].event_id])  # the first never acknowledged
    fresh = _run(store, "sent", NOW)

    while not store.prune(Retention(max_age=30 * DAY), NOW).done:
        pass

    left = store.undelivered("hook", 10)
    assert [e.run_id for e in left] == [fresh, fresh]
    from cronwarden.stores.redis import RedisStore

    if isinstance(store, RedisStore):
        import redis
        from tests.conftest import REDIS_URL

        with redis.Redis.from_url(REDIS_URL, decode_responses=True) as admin:
            assert admin.zcard(f"{store.prefix}outbox:hook:acks") == 0
            seqs = [int(f) for f in admin.hkeys(f"{store.prefix}ev") if f.isdigit()]
            assert int(admin.get(f"{store.prefix}outbox:hook:mark") or 0) == min(seqs) - 1
