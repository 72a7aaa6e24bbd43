"""``Store.renew_many``: one heartbeat's renewals in one step, each lease
judged as ``renew`` would judge it, with one answer per lease."""

from __future__ import annotations

import pytest

from cronwarden.clock import Clock, FakeClock
from cronwarden.errors import LeaseLost, LeaseRevoked
from cronwarden.events import Outcome, new_id
from cronwarden.policy import Policy
from cronwarden.stores.base import Refusal, Store

from . import LONG_TTL, assert_one_terminal_per_start, end, granted, refused, start

SHORT_TTL = 5.0
"""Ttl a lease is granted with, well under ``LONG_TTL``: a renewal for
``LONG_TTL`` shows as an expiry beyond what the grant gave."""


def test_an_empty_batch_is_answered_with_no_entries(store: Store) -> None:
    assert store.renew_many([]) == []


def test_each_lease_is_renewed_for_its_own_ttl_by_the_stores_clock(store: Store) -> None:
    leases = [granted(store.acquire(start(f"job-{i}", ttl=SHORT_TTL))).lease for i in range(5)]
    # Renewed for LONG_TTL (odd ones) or kept at SHORT_TTL (even ones).
    asked = [x._replace(ttl=LONG_TTL) if i % 2 else x for i, x in enumerate(leases)]

    assert store.renew_many(asked) == [None] * 5

    for i, lease in enumerate(leases):
        info = store.lease(lease.key)
        assert info is not None and info.owner == lease.run_id and info.token == lease.token
        assert info.expires_in is not None
        if i % 2:
            assert SHORT_TTL + 1 < info.expires_in <= LONG_TTL, info
        else:
            assert 0 < info.expires_in <= SHORT_TTL, info
        store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_refused_leases_are_answered_in_place_and_the_others_renewed(store: Store, lapse) -> None:
    expired = granted(store.acquire(start("expired", ttl=lapse.ttl))).lease
    lapse.expire(store, expired)
    held = [granted(store.acquire(start(f"held-{i}", ttl=SHORT_TTL))).lease for i in range(3)]
    other = granted(store.acquire(start("other"))).lease
    forged = other._replace(run_id=new_id())
    revoked = granted(store.acquire(start("revoked"))).lease
    replacer = start("revoked", policy=Policy.REPLACE)
    assert refused(store.acquire(replacer)).refusal is Refusal.REVOKING

    batch = [held[0], forged, held[1], revoked, expired, held[2]]
    answers = store.renew_many([x._replace(ttl=LONG_TTL) for x in batch])

    assert len(answers) == len(batch)
    assert [answers[i] for i in (0, 2, 5)] == [None, None, None]
    lost = answers[1]
    assert isinstance(lost, LeaseLost) and not isinstance(lost, LeaseRevoked) and lost.key == "other"
    gone = answers[4]
    assert isinstance(gone, LeaseLost) and not isinstance(gone, LeaseRevoked) and gone.key == "expired"
    stop = answers[3]
    assert isinstance(stop, LeaseRevoked) and stop.by_run_id == replacer.run_id and stop.key == "revoked"
    for lease in held:
        info = store.lease(lease.key)
        assert info is not None and info.expires_in is not None and info.expires_in > SHORT_TTL + 1
    # A refusal changes nothing: the real holder keeps its lease, the
    # revocation stands, the expired lease is not brought back.
    info = store.lease("other")
    assert info is not None and info.owner == other.run_id and info.token == other.token
    info = store.lease("revoked")
    assert info is not None and (info.owner, info.revoked_by) == (revoked.run_id, replacer.run_id)
    info = store.lease("expired")
    assert info is not None and info.expires_in is not None and info.expires_in <= 0

    for lease in [*held, other]:
        store.finish(lease, end())
    store.finish(revoked, end(Outcome.REPLACED, replaced_by=replacer.run_id))
    store.finish(expired, end(Outcome.LEASE_LOST))
    assert_one_terminal_per_start(store)


def test_a_lease_taken_over_is_lost_for_its_old_owner_only(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, old)
    new = granted(store.acquire(start())).lease

    answers = store.renew_many([old, new])

    assert answers[0] is not None and not isinstance(answers[0], LeaseRevoked)
    assert answers[1] is None
    info = store.lease(new.key)
    assert info is not None and info.owner == new.run_id and info.token == new.token
    store.finish(new, end())
    assert_one_terminal_per_start(store)


def test_hundreds_of_leases_in_one_batch(store: Store) -> None:
    # Granted for 30 s (the grants take a few seconds on a server), renewed for 120 s.
    leases = [granted(store.acquire(start(f"job-{i}", ttl=30.0))).lease for i in range(300)]
    forged = {17, 150, 299}
    batch = [
        x._replace(run_id=new_id()) if i in forged else x._replace(ttl=120.0) for i, x in enumerate(leases)
    ]

    answers = store.renew_many(batch)

    assert [i for i, a in enumerate(answers) if a is not None] == sorted(forged)
    for i in (0, 16, 18, 298):
        info = store.lease(leases[i].key)
        assert info is not None and info.expires_in is not None and info.expires_in > 31.0
    info = store.lease(leases[150].key)
    assert info is not None and info.owner == leases[150].run_id
    assert info.expires_in is not None and info.expires_in <= 30.0


def test_sqlite_renewal_counts_from_the_stores_clock(store: Store, clock: Clock) -> None:
    if not isinstance(clock, FakeClock):
        pytest.skip("the servers' clocks cannot be advanced; the ttl cases above cover them")
    lease = granted(store.acquire(start(ttl=10))).lease
    clock.advance(8)
    assert store.renew_many([lease]) == [None]
    clock.advance(8)
    assert refused(store.acquire(start())).refusal is Refusal.SKIPPED
    info = store.lease(lease.key)
    assert info is not None and info.expires_in == pytest.approx(2)
    clock.advance(2.01)
    assert store.renew_many([lease])[0] is not None
    store.finish(lease, end(Outcome.LEASE_LOST))
    assert_one_terminal_per_start(store)
