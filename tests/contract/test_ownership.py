"""G1: only the run that acquired a lease can renew or release it; a stale
release is a no-op reported as lost, never a deletion of another's lease."""

from __future__ import annotations

import pytest

from cronwarden.errors import LeaseLost, LeaseRevoked
from cronwarden.events import Outcome, new_id
from cronwarden.stores.base import Store

from . import LONG_TTL, assert_one_terminal_per_start, end, granted, start


def test_owner_can_renew_its_live_lease(store: Store) -> None:
    lease = granted(store.acquire(start())).lease

    store.renew(lease)
    store.renew(lease)

    info = store.lease(lease.key)
    assert info is not None and info.owner == lease.run_id and info.token == lease.token
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_renew_by_another_run_id_raises_lease_lost(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    forged = lease._replace(run_id=new_id())

    with pytest.raises(LeaseLost) as caught:
        store.renew(forged)

    assert not isinstance(caught.value, LeaseRevoked)
    assert caught.value.key == lease.key
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_renew_by_another_run_id_leaves_the_holders_lease(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    with pytest.raises(LeaseLost):
        store.renew(lease._replace(run_id=new_id()))

    info = store.lease(lease.key)
    assert info is not None and info.owner == lease.run_id and info.token == lease.token
    store.renew(lease)
    assert store.finish(lease, end()).owned
    assert_one_terminal_per_start(store)


def test_owner_renew_after_expiry_raises_lease_lost(store: Store, lapse) -> None:
    lease = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, lease)

    with pytest.raises(LeaseLost):
        store.renew(lease)

    store.finish(lease, end(Outcome.LEASE_LOST))
    assert_one_terminal_per_start(store)


def test_stale_release_after_takeover_is_reported_not_owned(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, old)
    new = granted(store.acquire(start(ttl=LONG_TTL))).lease

    finished = store.finish(old, end())

    assert finished.owned is False
    store.finish(new, end())
    assert_one_terminal_per_start(store)


def test_stale_release_after_takeover_leaves_the_new_holders_lease(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, old)
    new = granted(store.acquire(start(ttl=LONG_TTL))).lease

    store.finish(old, end())

    info = store.lease(new.key)
    assert info is not None
    assert (info.owner, info.token) == (new.run_id, new.token)
    assert info.expires_in is not None and info.expires_in > 0
    store.renew(new)
    assert store.finish(new, end()).owned is True
    assert_one_terminal_per_start(store)


def test_stale_renew_after_takeover_raises_lease_lost(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, old)
    new = granted(store.acquire(start(ttl=LONG_TTL))).lease

    with pytest.raises(LeaseLost) as caught:
        store.renew(old)

    assert not isinstance(caught.value, LeaseRevoked)
    info = store.lease(new.key)
    assert info is not None and info.owner == new.run_id
    store.finish(new, end())
    store.finish(old, end())
    assert_one_terminal_per_start(store)


def test_owner_finish_releases_the_lease(store: Store) -> None:
    lease = granted(store.acquire(start())).lease

    finished = store.finish(lease, end())

    assert (finished.owned, finished.recorded, finished.next) == (True, True, None)
    info = store.lease(lease.key)
    assert info is not None and info.owner is None
    nxt = granted(store.acquire(start()))
    assert nxt.abandoned == ()
    store.finish(nxt.lease, end())
    assert_one_terminal_per_start(store)


def test_leases_on_different_keys_are_independent(store: Store) -> None:
    a = granted(store.acquire(start("backup", key="backup:eu"))).lease
    b = granted(store.acquire(start("backup", key="backup:us"))).lease

    store.finish(a, end())

    store.renew(b)
    info = store.lease(b.key)
    assert info is not None and info.owner == b.run_id
    store.finish(b, end())
    assert_one_terminal_per_start(store)
