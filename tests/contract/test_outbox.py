"""G9, the store's half: each sink's outbox is the ledger minus what that sink
acknowledged (``Store.undelivered`` / ``Store.mark_delivered``), at least
once, idempotent by event id, starting a new sink at a bounded backfill, and
never missing an event that commits after later ones were acknowledged."""

from __future__ import annotations

import time
from collections import Counter
from urllib.parse import parse_qs, urlsplit

import pytest

from cronwarden.events import Event, EventKind, Outcome, new_id
from cronwarden.stores import open_store
from cronwarden.stores.base import EventQuery, Store

from . import end, granted, ledger, refused, start

SINK = "hook"


@pytest.fixture
def outbox(store: Store) -> Store:
    """The store under test (every store implements the outbox)."""
    return store


def record(store: Store, job: str = "nightly", *, at: float | None = None) -> Event:
    event = Event(kind=EventKind.SUCCEEDED, job=job, run_id=new_id(), at=time.time() if at is None else at)
    store.record(event)
    return event


def ids(events: list[Event]) -> list[str]:
    return [e.event_id for e in events]


def registered(store: Store, sink: str = SINK) -> None:
    """Register ``sink`` with no backfill: its outbox starts now."""
    assert store.undelivered(sink, 100, backfill=0) == []


def test_new_sink_starts_with_the_events_within_its_backfill(outbox: Store) -> None:
    record(outbox, at=time.time() - 7200)
    recent = record(outbox, at=time.time() - 60)

    assert ids(outbox.undelivered(SINK, 100, backfill=3600)) == [recent.event_id]


def test_new_sink_with_no_backfill_starts_from_now(outbox: Store) -> None:
    record(outbox, at=time.time() - 5)
    registered(outbox)

    later = record(outbox)

    assert ids(outbox.undelivered(SINK, 100)) == [later.event_id]


def test_backfill_counts_only_at_registration(outbox: Store) -> None:
    registered(outbox)
    old = record(outbox, at=time.time() - 7200)  # recorded after registration, dated long ago

    assert ids(outbox.undelivered(SINK, 100, backfill=0)) == [old.event_id]


def test_undelivered_is_oldest_first_across_jobs_with_seq_set(outbox: Store) -> None:
    registered(outbox)
    recorded = [record(outbox, job) for job in ("a", "b", "a", "c")]

    got = outbox.undelivered(SINK, 100)

    assert ids(got) == ids(recorded)
    assert [e.job for e in got] == ["a", "b", "a", "c"]
    seqs = [e.seq for e in got]
    assert all(s is not None for s in seqs)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_undelivered_returns_at_most_limit_events(outbox: Store) -> None:
    registered(outbox)
    recorded = [record(outbox) for _ in range(5)]

    assert ids(outbox.undelivered(SINK, 2)) == ids(recorded[:2])


def test_acknowledged_events_are_not_returned_again(outbox: Store) -> None:
    registered(outbox)
    first, second, third = (record(outbox) for _ in range(3))

    outbox.mark_delivered(SINK, [first.event_id, second.event_id])

    assert ids(outbox.undelivered(SINK, 100)) == [third.event_id]


def test_acknowledging_twice_or_unknown_ids_changes_nothing(outbox: Store) -> None:
    registered(outbox)
    first, second = record(outbox), record(outbox)
    outbox.mark_delivered(SINK, [first.event_id])

    outbox.mark_delivered(SINK, [first.event_id, new_id()])
    outbox.mark_delivered(SINK, [])

    assert ids(outbox.undelivered(SINK, 100)) == [second.event_id]


def test_recording_an_event_id_again_changes_nothing(outbox: Store) -> None:
    """A ``record`` retried after its reply was lost: one event in the
    ledger and in the outbox, and no error (the first call did commit)."""
    registered(outbox)
    first = record(outbox)
    retried = first._replace(data={"different": "payload"})
    outbox.record(retried)
    outbox.record(first)

    stored = outbox.events(EventQuery(job=first.job, limit=100))
    assert ids(stored) == [first.event_id]
    assert stored[0].data == first.data
    assert ids(outbox.undelivered(SINK, 100)) == [first.event_id]


def test_acknowledging_a_later_event_first_keeps_the_earlier_ones(outbox: Store) -> None:
    registered(outbox)
    e1, e2, e3, e4 = (record(outbox) for _ in range(4))

    outbox.mark_delivered(SINK, [e3.event_id])
    assert ids(outbox.undelivered(SINK, 100)) == [e1.event_id, e2.event_id, e4.event_id]
    outbox.mark_delivered(SINK, [e1.event_id])
    assert ids(outbox.undelivered(SINK, 100)) == [e2.event_id, e4.event_id]
    outbox.mark_delivered(SINK, [e4.event_id, e2.event_id])
    assert outbox.undelivered(SINK, 100) == []


def test_each_sink_has_its_own_outbox(outbox: Store) -> None:
    registered(outbox, "a")
    registered(outbox, "b")
    event = record(outbox)

    outbox.mark_delivered("a", [event.event_id])

    assert outbox.undelivered("a", 100) == []
    assert ids(outbox.undelivered("b", 100)) == [event.event_id]


def test_the_outbox_survives_reopening_the_store(outbox: Store, store_url: str, clock: object) -> None:
    registered(outbox)
    first, second = record(outbox), record(outbox)
    outbox.mark_delivered(SINK, [first.event_id])

    again = open_store(store_url, clock=clock)  # type: ignore[arg-type]
    try:
        assert ids(again.undelivered(SINK, 100, backfill=10**9)) == [second.event_id]
    finally:
        again.close()


def test_a_long_backlog_drains_in_batches_with_every_event_once(outbox: Store) -> None:
    registered(outbox)
    recorded = [record(outbox, f"job{i % 7}") for i in range(230)]
    seen: list[str] = []

    while batch := outbox.undelivered(SINK, 50):
        seen += ids(batch)
        outbox.mark_delivered(SINK, ids(batch))
        assert len(seen) <= len(recorded), "the outbox returned acknowledged events again"

    assert seen == ids(recorded)


def test_events_written_by_acquire_and_finish_are_in_the_outbox(outbox: Store) -> None:
    registered(outbox)
    lease = granted(outbox.acquire(start())).lease
    refused(outbox.acquire(start()))
    outbox.finish(lease, end(Outcome.FAILED, exit_code=3))

    got = outbox.undelivered(SINK, 100)

    assert [e.kind for e in got] == [EventKind.STARTED, EventKind.SKIPPED, EventKind.FAILED]
    assert ids(got) == ids(ledger(outbox))


def test_sink_delivery_events_round_trip_through_the_ledger(store: Store) -> None:
    failed = Event(kind=EventKind.SINK_FAILED, job="sink:hook", at=time.time(),
                   data={"sink": "hook", "attempt": 2, "error": "refused", "retry_at": 1.5})  # fmt: skip
    store.record(failed)

    [back] = ledger(store, job="sink:hook")

    assert (back.kind, back.event_id, back.data["attempt"]) == (EventKind.SINK_FAILED, failed.event_id, 2)


def test_an_event_committed_after_a_later_one_was_acknowledged_is_still_delivered(
    backend: str, store_url: str, outbox: Store
) -> None:
    """PostgreSQL hands out sequence values at insert and makes rows visible
    at commit: a slow transaction's event can appear below events already
    acknowledged. A plain ``seq > cursor`` would skip it forever."""
    if backend not in ("postgres", "pgbouncer"):
        pytest.skip(f"{backend} writes one transaction at a time: seq order is commit order")
    import psycopg
    from psycopg import sql

    schema = parse_qs(urlsplit(store_url).query)["schema"][0]
    registered(outbox)
    late_id = new_id()
    with psycopg.connect(store_url.split("?")[0], autocommit=False) as slow:
        slow.execute(
            sql.SQL(
                "INSERT INTO {}.events (event_id, kind, job, at, data) VALUES (%s, 'succeeded', 'slow', %s, "
                "'{{}}') RETURNING seq"
            ).format(sql.Identifier(schema)),
            (late_id, time.time()),
        )
        early = record(outbox, "quick")  # drew a later seq, committed first
        assert ids(outbox.undelivered(SINK, 100)) == [early.event_id]
        outbox.mark_delivered(SINK, [early.event_id])
        slow.commit()

    got = outbox.undelivered(SINK, 100)

    assert ids(got) == [late_id]
    assert got[0].seq is not None and early.event_id not in ids(got)
    [early_back] = [e for e in ledger(outbox) if e.event_id == early.event_id]
    assert early_back.seq is not None and got[0].seq < early_back.seq, "the scenario did not happen"


def test_concurrent_acknowledgements_of_overlapping_batches_lose_nothing(outbox: Store) -> None:
    """Two flushers that fetched the same batch both acknowledge it."""
    registered(outbox)
    recorded = [record(outbox) for _ in range(6)]
    a = outbox.undelivered(SINK, 4)
    b = outbox.undelivered(SINK, 4)

    outbox.mark_delivered(SINK, ids(b)[2:])
    outbox.mark_delivered(SINK, ids(a))

    assert ids(outbox.undelivered(SINK, 100)) == ids(recorded[4:])
    assert Counter(ids(a)) == Counter(ids(b))
