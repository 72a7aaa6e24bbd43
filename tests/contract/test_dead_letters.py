"""Dead letters, the store's half: an event a sink refused for good is set
aside in one step (acknowledged, kept among the sink's dead letters, its
``sink_rejected`` recorded), read back oldest first, forgotten after a
replay, and bounded per sink (``Store.reject``, ``rejected``,
``forget_rejected``, ``rejected_counts``)."""

from __future__ import annotations

import time

from cronwarden.events import Event, EventKind, new_id
from cronwarden.stores.base import DEAD_LETTERS_KEPT, Store

from . import ledger

SINK = "hook"


def record(store: Store, job: str = "nightly") -> Event:
    event = Event(kind=EventKind.SUCCEEDED, job=job, run_id=new_id(), at=time.time())
    store.record(event)
    return event


def rejection(event: Event, sink: str = SINK) -> Event:
    data = {"sink": sink, "event_id": event.event_id, "kind": event.kind.value, "job": event.job,
            "status": 400, "error": "answered HTTP 400 Bad Request"}  # fmt: skip
    return Event(kind=EventKind.SINK_REJECTED, job=f"sink:{sink}", at=time.time(), data=data)


def ids(events: list[Event]) -> list[str]:
    return [e.event_id for e in events]


def registered(store: Store, sink: str = SINK) -> None:
    assert store.undelivered(sink, 100, backfill=0) == []


def test_a_rejected_event_leaves_the_outbox_and_the_rest_stays(store: Store) -> None:
    registered(store)
    first, poison, last = record(store), record(store), record(store)

    store.reject(SINK, poison.event_id, rejection(poison))

    outbox = [e for e in store.undelivered(SINK, 100) if e.kind is not EventKind.SINK_REJECTED]
    assert ids(outbox) == [first.event_id, last.event_id]


def test_a_rejected_event_is_a_dead_letter_with_its_seq(store: Store) -> None:
    registered(store)
    record(store)
    poison = record(store)

    store.reject(SINK, poison.event_id, rejection(poison))

    [dead] = store.rejected(SINK, 100)
    assert (dead.event_id, dead.kind, dead.job, dead.run_id) == (poison.event_id, poison.kind, poison.job,
                                                                  poison.run_id)  # fmt: skip
    assert dead.seq is not None
    assert store.rejected_counts() == {SINK: 1}


def test_reject_records_the_rejection_once_even_when_sent_twice(store: Store) -> None:
    registered(store)
    poison = record(store)
    why = rejection(poison)

    store.reject(SINK, poison.event_id, why)
    store.reject(SINK, poison.event_id, why)

    recorded = ledger(store, job=f"sink:{SINK}")
    assert ids(recorded) == [why.event_id]
    assert recorded[0].kind is EventKind.SINK_REJECTED
    assert recorded[0].data["event_id"] == poison.event_id and recorded[0].data["status"] == 400
    assert ids(store.rejected(SINK, 100)) == [poison.event_id]


def test_reject_without_a_rejection_records_nothing(store: Store) -> None:
    registered(store)
    poison = record(store)

    store.reject(SINK, poison.event_id, None)

    assert ledger(store, job=f"sink:{SINK}") == []
    assert ids(store.rejected(SINK, 100)) == [poison.event_id]
    assert store.undelivered(SINK, 100) == []


def test_dead_letters_are_oldest_first_and_limited(store: Store) -> None:
    registered(store)
    poisons = [record(store, f"job{i}") for i in range(4)]
    for p in reversed(poisons):
        store.reject(SINK, p.event_id, None)

    assert ids(store.rejected(SINK, 100)) == ids(poisons)
    assert ids(store.rejected(SINK, 2)) == ids(poisons[:2])
    assert store.rejected(SINK, 0) == []


def test_each_sink_has_its_own_dead_letters(store: Store) -> None:
    registered(store, "a")
    registered(store, "b")
    event = record(store)

    store.reject("a", event.event_id, None)

    assert ids(store.rejected("a", 100)) == [event.event_id]
    assert store.rejected("b", 100) == []
    assert ids(store.undelivered("b", 100)) == [event.event_id]
    assert store.rejected_counts() == {"a": 1}


def test_forgetting_takes_events_out_of_the_dead_letters_only(store: Store) -> None:
    registered(store)
    kept, replayed = record(store), record(store)
    store.reject(SINK, kept.event_id, None)
    store.reject(SINK, replayed.event_id, None)

    store.forget_rejected(SINK, [replayed.event_id, new_id()])
    store.forget_rejected(SINK, [])

    assert ids(store.rejected(SINK, 100)) == [kept.event_id]
    assert store.undelivered(SINK, 100) == [], "a forgotten dead letter came back into the outbox"
    assert store.rejected_counts() == {SINK: 1}


def test_a_sink_with_no_dead_letters_left_is_not_counted(store: Store) -> None:
    registered(store)
    event = record(store)
    store.reject(SINK, event.event_id, None)

    store.forget_rejected(SINK, [event.event_id])

    assert store.rejected_counts() == {}
    assert store.rejected(SINK, 100) == []


def test_reject_of_an_unknown_id_still_records_the_rejection(store: Store) -> None:
    registered(store)
    ghost = Event(kind=EventKind.SUCCEEDED, job="nightly", at=time.time())  # never recorded
    why = rejection(ghost)

    store.reject(SINK, ghost.event_id, why)

    assert store.rejected(SINK, 100) == []
    assert ids(ledger(store, job=f"sink:{SINK}")) == [why.event_id]


def test_reject_registers_a_new_sink(store: Store) -> None:
    event = record(store)

    store.reject(SINK, event.event_id, None)

    assert ids(store.rejected(SINK, 100)) == [event.event_id]


def test_the_dead_letters_keep_only_the_newest(store: Store) -> None:
    """At most ``DEAD_LETTERS_KEPT`` per sink: the oldest are forgotten, and
    the events stay acknowledged (the ledger keeps their ``sink_rejected``)."""
    registered(store)
    events = [record(store, f"job{i % 3}") for i in range(DEAD_LETTERS_KEPT + 5)]

    for e in events:
        store.reject(SINK, e.event_id, None)

    assert store.rejected_counts() == {SINK: DEAD_LETTERS_KEPT}
    assert ids(store.rejected(SINK, 10 * DEAD_LETTERS_KEPT)) == ids(events[5:])
    assert store.undelivered(SINK, 100) == []


def test_dead_letters_survive_a_later_acknowledgement_moving_the_mark(store: Store) -> None:
    registered(store)
    first, poison, last = record(store), record(store), record(store)
    store.reject(SINK, poison.event_id, None)

    store.mark_delivered(SINK, [first.event_id, last.event_id])

    assert ids(store.rejected(SINK, 100)) == [poison.event_id]
    assert store.undelivered(SINK, 100) == []
    assert len(ledger(store, kinds=[EventKind.SUCCEEDED])) == 3
