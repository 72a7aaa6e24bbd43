"""Operators' controls through the store: ``request_stop`` marks a run's live
lease revoked so its renewals raise ``StopRequested`` (one renewal and a
heartbeat's batch alike), records the request, and leaves alone a run that
is not the lease's live owner or is being replaced; ``pause_state`` is the
job's latest pause or resume."""

from __future__ import annotations

import time

import pytest

from cronwarden.control import pause, resume
from cronwarden.errors import LeaseRevoked, StopRequested
from cronwarden.events import Event, EventKind, Outcome
from cronwarden.policy import Policy
from cronwarden.stores.base import Store, stop_mark

from . import assert_one_terminal_per_start, end, granted, ledger, refused, start


def _request(job: str, run_id: str, by: str = "alice@ops-1") -> Event:
    return Event(EventKind.STOP_REQUESTED, job, time.time(), run_id=run_id,
                 data={"by": by, "reason": "hung on a lock", "grace": 5.0})  # fmt: skip


def test_request_stop_marks_the_lease_and_the_run_renewals_raise_stop_requested(store: Store) -> None:
    lease = granted(store.acquire(start())).lease

    assert store.request_stop(lease.key, lease.run_id, 5.0, _request("nightly", lease.run_id)) is True

    with pytest.raises(StopRequested) as raised:
        store.renew(lease)
    assert raised.value.grace == 5.0
    [batched] = store.renew_many([lease])
    assert isinstance(batched, StopRequested) and batched.grace == 5.0
    info = store.lease(lease.key)
    assert info is not None and info.revoked_by == stop_mark(5.0)
    [asked] = ledger(store, kinds=[EventKind.STOP_REQUESTED])
    assert (asked.run_id, asked.data["by"], asked.data["reason"]) == (
        lease.run_id,
        "alice@ops-1",
        "hung on a lock",
    )
    store.finish(lease, end(Outcome.STOPPED, detail="stopped by alice@ops-1: hung on a lock"))
    assert_one_terminal_per_start(store)


def test_only_the_stopped_lease_is_refused_in_a_heartbeat_batch(store: Store) -> None:
    stopped = granted(store.acquire(start("a"))).lease
    other = granted(store.acquire(start("b"))).lease
    assert store.request_stop(stopped.key, stopped.run_id, 1.0, _request("a", stopped.run_id))

    first, second = store.renew_many([stopped, other])

    assert isinstance(first, StopRequested) and second is None


def test_request_stop_of_a_run_not_holding_the_lease_changes_nothing(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    store.finish(lease, end())
    nxt = granted(store.acquire(start())).lease

    assert store.request_stop(lease.key, lease.run_id, 5.0, _request("nightly", lease.run_id)) is False

    store.renew(nxt)  # the newer run is not asked
    assert ledger(store, kinds=[EventKind.STOP_REQUESTED]) == []
    assert store.request_stop("never-granted", lease.run_id, 5.0, _request("x", lease.run_id)) is False


def test_request_stop_of_an_expired_lease_changes_nothing(store: Store, lapse) -> None:
    lease = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, lease)

    assert store.request_stop(lease.key, lease.run_id, 5.0, _request("nightly", lease.run_id)) is False
    assert ledger(store, kinds=[EventKind.STOP_REQUESTED]) == []


def test_a_run_being_replaced_keeps_the_replacers_mark(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    replacer = start(policy=Policy.REPLACE)
    refused(store.acquire(replacer))

    assert store.request_stop(lease.key, lease.run_id, 5.0, _request("nightly", lease.run_id)) is False

    with pytest.raises(LeaseRevoked) as raised:
        store.renew(lease)
    assert not isinstance(raised.value, StopRequested)
    assert raised.value.by_run_id == replacer.run_id


def test_asking_again_records_the_second_request_and_keeps_the_first_grace(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    assert store.request_stop(lease.key, lease.run_id, 5.0, _request("nightly", lease.run_id))

    assert store.request_stop(
        lease.key, lease.run_id, 60.0, _request("nightly", lease.run_id, by="bob@ops-2")
    )

    with pytest.raises(StopRequested) as raised:
        store.renew(lease)
    assert raised.value.grace == 5.0
    assert [e.data["by"] for e in ledger(store, kinds=[EventKind.STOP_REQUESTED])] == [
        "alice@ops-1",
        "bob@ops-2",
    ]


def test_a_retried_request_is_recorded_once(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    request = _request("nightly", lease.run_id)

    assert store.request_stop(lease.key, lease.run_id, 5.0, request)
    assert store.request_stop(lease.key, lease.run_id, 5.0, request)

    assert len(ledger(store, kinds=[EventKind.STOP_REQUESTED])) == 1


def test_the_next_grant_of_a_stopped_key_is_not_revoked(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    store.request_stop(lease.key, lease.run_id, 5.0, _request("nightly", lease.run_id))
    store.finish(lease, end(Outcome.STOPPED))

    nxt = granted(store.acquire(start())).lease

    store.renew(nxt)
    [ok] = store.renew_many([nxt])
    assert ok is None


def test_pause_state_is_the_latest_pause_or_resume(store: Store) -> None:
    now = time.time()
    assert store.pause_state("nightly") is None

    paused = pause(store, "nightly", by="alice@ops-1", reason="the warehouse is migrating", at=now)
    held = store.pause_state("nightly")
    assert held is not None and held.event_id == paused.event_id
    assert held.data["reason"] == "the warehouse is migrating"
    assert store.pause_state("other") is None

    resume(store, "nightly", by="bob@ops-2", reason="", at=now)  # the same second: written order decides
    assert store.pause_state("nightly") is None

    again = pause(store, "nightly", by="carol@ops-3", reason="again", at=now + 1)
    held = store.pause_state("nightly")
    assert held is not None and held.event_id == again.event_id
