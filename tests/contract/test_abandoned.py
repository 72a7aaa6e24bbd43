"""G6: every ``started`` run ends in exactly one terminal record. A holder
that never finishes is found ``abandoned`` by the next start once its lease
has expired; a late finish then records nothing more."""

from __future__ import annotations

from cronwarden.events import TERMINAL_KINDS, EventKind, Outcome
from cronwarden.stores.base import Store

from . import LONG_TTL, assert_one_terminal_per_start, end, granted, ledger, start


def test_next_grant_names_the_expired_unfinished_run_abandoned(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, old)

    taker = granted(store.acquire(start(ttl=LONG_TTL)))

    assert taker.abandoned == (old.run_id,)
    store.finish(taker.lease, end())
    assert_one_terminal_per_start(store)


def test_abandoned_run_record_has_outcome_abandoned(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, old)
    taker = granted(store.acquire(start(ttl=LONG_TTL)))

    record = store.run(old.run_id)

    assert record is not None
    assert record.outcome is Outcome.ABANDONED
    assert record.ended_at is not None
    assert old.run_id not in {r.run_id for r in store.open_runs()}
    store.finish(taker.lease, end())
    assert_one_terminal_per_start(store)


def test_abandoned_run_has_exactly_one_terminal_event(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, old)
    taker = granted(store.acquire(start(ttl=LONG_TTL)))

    terminal = ledger(store, run_id=old.run_id, kinds=sorted(TERMINAL_KINDS))

    assert [e.kind for e in terminal] == [EventKind.ABANDONED]
    assert terminal[0].job == "nightly"
    store.finish(taker.lease, end())
    assert_one_terminal_per_start(store)


def test_finishing_an_abandoned_run_records_nothing_more(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, old)
    taker = granted(store.acquire(start(ttl=LONG_TTL)))
    before = ledger(store)

    late = store.finish(old, end(Outcome.SUCCEEDED))

    assert (late.owned, late.recorded, late.next) == (False, False, None)
    assert ledger(store) == before
    record = store.run(old.run_id)
    assert record is not None and record.outcome is Outcome.ABANDONED
    store.finish(taker.lease, end())
    assert_one_terminal_per_start(store)


def test_a_finished_run_is_never_found_abandoned(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    store.finish(old, end())
    lapse.expire(store, old)

    nxt = granted(store.acquire(start(ttl=LONG_TTL)))

    assert nxt.abandoned == ()
    record = store.run(old.run_id)
    assert record is not None and record.outcome is Outcome.SUCCEEDED
    store.finish(nxt.lease, end())
    assert_one_terminal_per_start(store)


def test_a_run_finished_after_its_lease_expired_is_not_found_abandoned(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, old)

    late = store.finish(old, end(Outcome.LEASE_LOST))
    nxt = granted(store.acquire(start(ttl=LONG_TTL)))

    assert late.recorded is True
    assert nxt.abandoned == ()
    record = store.run(old.run_id)
    assert record is not None and record.outcome is Outcome.LEASE_LOST
    store.finish(nxt.lease, end())
    assert_one_terminal_per_start(store)


def test_each_outcome_is_recorded_once_as_its_terminal_event(store: Store) -> None:
    outcomes = [o for o in Outcome if o is not Outcome.ABANDONED]
    for outcome in outcomes:
        lease = granted(store.acquire(start())).lease
        assert store.finish(lease, end(outcome, exit_code=1)).recorded is True
        assert store.finish(lease, end(Outcome.SUCCEEDED)).recorded is False  # a second finish

        [terminal] = ledger(store, run_id=lease.run_id, kinds=sorted(TERMINAL_KINDS))
        assert terminal.kind is outcome.event
    assert_one_terminal_per_start(store)
