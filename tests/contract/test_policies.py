"""The policies at the store level: what ``acquire`` does while the key is
held (queue, replace, allow), and ``finish(..., then=...)`` draining the
queue."""

from __future__ import annotations

import pytest

from cronwarden.errors import LeaseLost, LeaseRevoked
from cronwarden.events import EventKind, Outcome
from cronwarden.policy import Policy
from cronwarden.stores.base import Refusal, Store

from . import LONG_TTL, assert_one_terminal_per_start, end, granted, ledger, refused, start

# -- queue -------------------------------------------------------------------


def test_queue_with_max_pending_1_queues_one_start_and_refuses_four_as_full(store: Store) -> None:
    lease = granted(store.acquire(start())).lease

    refusals = [refused(store.acquire(start(policy=Policy.QUEUE, max_pending=1))).refusal for _ in range(5)]

    assert refusals == [Refusal.QUEUED] + [Refusal.QUEUE_FULL] * 4
    kinds = [e.kind for e in ledger(store, kinds=[EventKind.QUEUED, EventKind.QUEUE_FULL])]
    assert kinds == [EventKind.QUEUED] + [EventKind.QUEUE_FULL] * 4
    info = store.lease(lease.key)
    assert info is not None and info.pending == 1
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


@pytest.mark.parametrize("max_pending", [2, 3])
def test_queue_pending_is_bounded_by_max_pending(store: Store, max_pending: int) -> None:
    lease = granted(store.acquire(start())).lease

    for _ in range(5):
        refused(store.acquire(start(policy=Policy.QUEUE, max_pending=max_pending)))

    assert len(ledger(store, kinds=[EventKind.QUEUED])) == max_pending
    assert len(ledger(store, kinds=[EventKind.QUEUE_FULL])) == 5 - max_pending
    info = store.lease(lease.key)
    assert info is not None and info.pending == max_pending
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_queued_refusal_names_the_holder(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    queued = start(policy=Policy.QUEUE)

    refusal = refused(store.acquire(queued))

    assert refusal.holder.run_id == lease.run_id
    [event] = ledger(store, kinds=[EventKind.QUEUED])
    assert (event.run_id, event.data["holder_run_id"]) == (queued.run_id, lease.run_id)
    assert store.run(queued.run_id) is None
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_finish_with_then_starts_the_next_run_on_the_same_key_with_a_larger_token(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    refused(store.acquire(start(policy=Policy.QUEUE)))
    then = start(policy=Policy.QUEUE)

    finished = store.finish(lease, end(), then=then)

    assert (finished.owned, finished.recorded) == (True, True)
    nxt = finished.next
    assert nxt is not None
    assert (nxt.key, nxt.run_id) == (lease.key, then.run_id)
    assert nxt.token > lease.token
    store.renew(nxt)
    store.finish(nxt, end())
    assert_one_terminal_per_start(store)


def test_finish_with_then_consumes_one_pending_start(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    refused(store.acquire(start(policy=Policy.QUEUE)))
    then = start(policy=Policy.QUEUE)

    nxt = store.finish(lease, end(), then=then).next

    assert nxt is not None
    info = store.lease(lease.key)
    assert info is not None
    assert (info.owner, info.token, info.pending) == (then.run_id, nxt.token, 0)
    [started] = ledger(store, run_id=then.run_id, kinds=[EventKind.STARTED])
    assert started.data["token"] == nxt.token
    assert store.finish(nxt, end(), then=start(policy=Policy.QUEUE)).next is None
    assert_one_terminal_per_start(store)


def test_a_retried_finish_reports_the_hand_over_again_instead_of_losing_the_queued_run(store: Store) -> None:
    # The first finish committed but its reply was lost; the caller retries.
    lease = granted(store.acquire(start())).lease
    refused(store.acquire(start(policy=Policy.QUEUE)))
    then = start(policy=Policy.QUEUE)
    first = store.finish(lease, end(), then=then)

    retried = store.finish(lease, end(), then=then)

    assert first.next is not None and retried.next == first.next
    assert (retried.owned, retried.recorded) == (True, False)
    store.finish(retried.next, end())
    assert_one_terminal_per_start(store)


def test_finish_with_then_and_nothing_pending_releases_and_starts_nothing(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    then = start(policy=Policy.QUEUE)

    finished = store.finish(lease, end(), then=then)

    assert (finished.owned, finished.recorded, finished.next) == (True, True, None)
    assert store.run(then.run_id) is None
    info = store.lease(lease.key)
    assert info is not None and info.owner is None
    assert_one_terminal_per_start(store)


def test_stale_finish_with_then_starts_nothing(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    refused(store.acquire(start(policy=Policy.QUEUE)))
    lapse.expire(store, old)
    taker = granted(store.acquire(start(ttl=LONG_TTL))).lease
    then = start(policy=Policy.QUEUE)

    finished = store.finish(old, end(), then=then)

    assert (finished.owned, finished.next) == (False, None)
    assert store.run(then.run_id) is None
    info = store.lease(taker.key)
    assert info is not None and (info.owner, info.token) == (taker.run_id, taker.token)
    store.finish(taker, end())
    assert_one_terminal_per_start(store)


# -- replace -----------------------------------------------------------------


def test_replace_while_held_is_refused_as_revoking(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    replacer = start(policy=Policy.REPLACE)

    refusal = refused(store.acquire(replacer))

    assert refusal.refusal is Refusal.REVOKING
    assert refusal.holder.run_id == lease.run_id
    info = store.lease(lease.key)
    assert info is not None and (info.owner, info.revoked_by) == (lease.run_id, replacer.run_id)
    store.finish(lease, end(Outcome.REPLACED, replaced_by=replacer.run_id))
    assert_one_terminal_per_start(store)


def test_revoked_holder_renew_raises_lease_revoked_naming_the_replacer(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    replacer = start(policy=Policy.REPLACE)
    refused(store.acquire(replacer))

    with pytest.raises(LeaseRevoked) as caught:
        store.renew(lease)

    assert caught.value.by_run_id == replacer.run_id
    assert caught.value.key == lease.key
    store.finish(lease, end(Outcome.REPLACED, replaced_by=replacer.run_id))
    assert_one_terminal_per_start(store)


def test_replacer_stays_refused_until_the_holder_finishes(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    replacer = start(policy=Policy.REPLACE)

    polls = [refused(store.acquire(replacer)).refusal for _ in range(3)]

    assert polls == [Refusal.REVOKING] * 3
    assert ledger(store, run_id=replacer.run_id) == []  # the holder records `replaced`, not the replacer
    store.finish(lease, end(Outcome.REPLACED, replaced_by=replacer.run_id))
    assert_one_terminal_per_start(store)


def test_replacer_is_granted_a_larger_token_after_the_holder_finishes_replaced(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    replacer = start(policy=Policy.REPLACE)
    refused(store.acquire(replacer))

    finished = store.finish(lease, end(Outcome.REPLACED, replaced_by=replacer.run_id))
    taken = granted(store.acquire(replacer))

    assert (finished.owned, finished.recorded) == (True, True)
    assert taken.lease.token > lease.token
    assert taken.abandoned == ()
    info = store.lease(lease.key)
    assert info is not None and (info.owner, info.revoked_by) == (replacer.run_id, None)
    store.renew(taken.lease)
    record = store.run(lease.run_id)
    assert record is not None and record.outcome is Outcome.REPLACED
    store.finish(taken.lease, end())
    assert_one_terminal_per_start(store)


def test_replacer_takes_over_when_the_revoked_holder_dies(store: Store, lapse) -> None:
    lease = granted(store.acquire(start(ttl=lapse.ttl))).lease
    replacer = start(policy=Policy.REPLACE, ttl=LONG_TTL)
    refused(store.acquire(replacer))
    lapse.expire(store, lease)

    taken = granted(store.acquire(replacer))

    assert taken.abandoned == (lease.run_id,)
    assert taken.lease.token > lease.token
    store.renew(taken.lease)  # the revocation was the old holder's, not the new one's
    store.finish(taken.lease, end())
    assert_one_terminal_per_start(store)


# -- allow -------------------------------------------------------------------


def test_allow_while_held_grants_a_side_lease(store: Store) -> None:
    main = granted(store.acquire(start())).lease
    side_start = start(policy=Policy.ALLOW)

    side = granted(store.acquire(side_start))

    assert side.lease.key == f"{main.key}+{side_start.run_id}"
    assert side.lease.run_id == side_start.run_id
    assert side.overlapped is not None and side.overlapped.run_id == main.run_id
    store.finish(side.lease, end())
    store.finish(main, end())
    assert_one_terminal_per_start(store)


def test_allow_while_held_records_overlap_naming_both_runs(store: Store) -> None:
    main = granted(store.acquire(start())).lease
    side_start = start(policy=Policy.ALLOW)

    side = granted(store.acquire(side_start)).lease

    [overlap] = ledger(store, kinds=[EventKind.OVERLAP])
    assert (overlap.job, overlap.run_id) == ("nightly", side_start.run_id)
    assert overlap.data["holder_run_id"] == main.run_id
    store.finish(side, end())
    store.finish(main, end())
    assert_one_terminal_per_start(store)


def test_side_lease_can_be_renewed_and_finished(store: Store) -> None:
    main = granted(store.acquire(start())).lease
    side = granted(store.acquire(start(policy=Policy.ALLOW))).lease

    store.renew(side)
    finished = store.finish(side, end())

    assert (finished.owned, finished.recorded) == (True, True)
    with pytest.raises(LeaseLost):
        store.renew(side)
    store.finish(main, end())
    assert_one_terminal_per_start(store)


def test_overlap_leaves_the_main_holder_unaffected(store: Store) -> None:
    main = granted(store.acquire(start())).lease
    side = granted(store.acquire(start(policy=Policy.ALLOW))).lease

    store.renew(main)
    info = store.lease(main.key)
    assert info is not None and (info.owner, info.token) == (main.run_id, main.token)
    store.finish(side, end())
    store.renew(main)
    assert store.finish(main, end()).owned is True
    assert_one_terminal_per_start(store)


def test_allow_on_a_free_key_is_a_plain_grant(store: Store) -> None:
    s = start(policy=Policy.ALLOW)

    got = granted(store.acquire(s))

    assert (got.lease.key, got.overlapped) == (s.key, None)
    assert ledger(store, kinds=[EventKind.OVERLAP]) == []
    store.finish(got.lease, end())
    assert_one_terminal_per_start(store)
