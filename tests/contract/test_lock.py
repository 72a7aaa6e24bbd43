"""The bare lock (``Store.lock`` / ``renew_lock`` / ``unlock``): a fenced
lease with no ledger. G1, G2 and G4 hold for it as for a job's lease, and it
never writes to the ledger."""

from __future__ import annotations

import itertools
import time

import pytest

from cronwarden.clock import Clock, FakeClock
from cronwarden.stores.base import Store

from . import LONG_TTL, end, granted, ledger, start


def expire_lock(store: Store, clock: Clock, key: str, ttl: float) -> int:
    """Let a lock of ``ttl`` expire by the store's clock and take it as a new
    owner; returns the new token. A fake clock is advanced; on a server the
    test polls ``lock`` itself until it is granted (the behaviour under test),
    with a deadline."""
    if isinstance(clock, FakeClock):
        clock.advance(ttl + 1.0)
        token = store.lock(key, "late-owner", LONG_TTL)
        assert token is not None
        return token
    deadline = time.monotonic() + ttl + 10.0
    while (token := store.lock(key, "late-owner", LONG_TTL)) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"lock {key!r} still held {ttl + 10.0:g}s after its ttl")
        time.sleep(0.02)
    return token


def short_ttl(clock: Clock) -> float:
    return 30.0 if isinstance(clock, FakeClock) else 0.3


def test_second_owner_is_refused_while_the_lock_is_held(store: Store) -> None:
    first = store.lock("leader", "a", LONG_TTL)

    assert first is not None
    assert store.lock("leader", "b", LONG_TTL) is None
    assert store.lock("leader", "a", LONG_TTL) is None, "a lock is not re-entrant"


def test_tokens_increase_across_unlock(store: Store) -> None:
    tokens = []
    for i in range(5):
        token = store.lock("leader", f"owner-{i}", LONG_TTL)
        assert token is not None
        tokens.append(token)
        assert store.unlock("leader", f"owner-{i}")

    assert tokens == sorted(set(tokens))
    assert all(b == a + 1 for a, b in itertools.pairwise(tokens))


def test_stale_unlock_changes_nothing(store: Store, clock: Clock) -> None:
    ttl = short_ttl(clock)
    assert store.lock("leader", "a", ttl) is not None
    taken = expire_lock(store, clock, "leader", ttl)

    assert store.unlock("leader", "a") is False
    assert store.lock("leader", "c", LONG_TTL) is None, "the new owner still holds it"
    assert store.unlock("leader", "late-owner") is True
    assert (store.lock("leader", "c", LONG_TTL) or 0) > taken


def test_unlock_after_expiry_is_false_even_if_nobody_took_it(store: Store, clock: Clock) -> None:
    if not isinstance(clock, FakeClock):
        pytest.skip("needs a clock the test moves: the SQLite store's injected clock")
    assert store.lock("leader", "a", 10.0) is not None
    clock.advance(11.0)

    assert store.unlock("leader", "a") is False
    assert store.lock("leader", "b", 10.0) is not None


def test_renew_only_by_the_owner_and_only_before_expiry(store: Store, clock: Clock) -> None:
    ttl = short_ttl(clock)
    assert store.lock("leader", "a", ttl) is not None

    assert store.renew_lock("leader", "b", ttl) is False
    assert store.renew_lock("leader", "a", ttl) is True
    expire_lock(store, clock, "leader", ttl)
    assert store.renew_lock("leader", "a", ttl) is False


def test_renew_extends_by_the_stores_clock(store: Store, clock: Clock) -> None:
    if not isinstance(clock, FakeClock):
        pytest.skip("needs a clock the test moves: the SQLite store's injected clock")
    assert store.lock("leader", "a", 10.0) is not None
    clock.advance(8.0)
    assert store.renew_lock("leader", "a", 10.0)
    clock.advance(8.0)

    assert store.lock("leader", "b", 10.0) is None, "renewed at t=8 for 10 s: live until t=18"
    clock.advance(3.0)
    assert store.lock("leader", "b", 10.0) is not None


def test_unlock_of_a_never_taken_key_is_false(store: Store) -> None:
    assert store.unlock("nobody", "a") is False
    assert store.renew_lock("nobody", "a", LONG_TTL) is False


def test_locks_are_apart_from_job_leases_and_write_no_ledger(store: Store) -> None:
    run = granted(store.acquire(start(key="nightly")))
    before = ledger(store)

    token = store.lock("nightly", "a", LONG_TTL)

    assert token is not None, "a lock named like a job's lease key is a different lease"
    assert store.unlock("nightly", "a")
    assert ledger(store) == before
    info = store.lease("nightly")
    assert info is not None and info.owner == run.lease.run_id
    store.finish(run.lease, end())
