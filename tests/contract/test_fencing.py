"""G2: every grant of a key returns a token larger than every earlier one; a
release keeps the counter, and so does reopening the store."""

from __future__ import annotations

import itertools

from cronwarden.clock import Clock
from cronwarden.events import EventKind, Outcome
from cronwarden.stores import open_store
from cronwarden.stores.base import Store

from . import LONG_TTL, assert_one_terminal_per_start, end, granted, ledger, start


def test_tokens_strictly_increase_over_1000_grant_finish_cycles(store: Store) -> None:
    tokens = []
    for _ in range(1000):
        lease = granted(store.acquire(start("tick"))).lease
        tokens.append(lease.token)
        store.finish(lease, end())

    assert all(b > a for a, b in itertools.pairwise(tokens)), tokens
    assert_one_terminal_per_start(store)


def test_each_grant_takes_the_next_token(store: Store) -> None:
    first = granted(store.acquire(start())).lease
    store.finish(first, end())
    second = granted(store.acquire(start())).lease
    store.finish(second, end(Outcome.FAILED, exit_code=1))
    third = granted(store.acquire(start())).lease

    assert (second.token, third.token) == (first.token + 1, first.token + 2)
    store.finish(third, end())
    assert_one_terminal_per_start(store)


def test_takeover_after_expiry_gets_a_larger_token(store: Store, lapse) -> None:
    old = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, old)

    new = granted(store.acquire(start(ttl=LONG_TTL))).lease

    assert new.token > old.token
    store.finish(new, end())
    store.finish(old, end())
    assert_one_terminal_per_start(store)


def test_release_keeps_the_token_counter(store: Store) -> None:
    lease = granted(store.acquire(start())).lease
    store.finish(lease, end())

    info = store.lease(lease.key)

    assert info is not None
    assert (info.owner, info.token, info.expires_in) == (None, lease.token, None)
    assert_one_terminal_per_start(store)


def test_reopened_store_continues_the_token_counter(store_url: str, clock: Clock) -> None:
    with open_store(store_url, clock=clock) as first:
        lease = granted(first.acquire(start())).lease
        first.finish(lease, end())
    with open_store(store_url, clock=clock) as again:
        later = granted(again.acquire(start())).lease
        again.finish(later, end())

        assert later.token > lease.token
        assert_one_terminal_per_start(again)


def test_token_is_given_in_the_run_record_and_started_event(store: Store) -> None:
    lease = granted(store.acquire(start())).lease

    record = store.run(lease.run_id)
    assert record is not None and record.token == lease.token
    [started] = ledger(store, run_id=lease.run_id, kinds=[EventKind.STARTED])
    assert started.data["token"] == lease.token
    store.finish(lease, end())
    assert_one_terminal_per_start(store)
