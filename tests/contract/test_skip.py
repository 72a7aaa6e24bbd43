"""G7: a refused start is never silent. It records ``skipped`` with the
holder's run id, host, pid, start time, age and token, the refused run's id
and the slot that did no work; the refusal describes the holder."""

from __future__ import annotations

import time

import pytest

from cronwarden.events import EventKind
from cronwarden.stores.base import Refusal, Store

from . import HOLDER_FIELDS, LONG_TTL, assert_one_terminal_per_start, end, granted, ledger, refused, start

SLOT = 1_750_000_200.0


def _held(store: Store):
    holder_start = start(host="web-1", pid=1111, at=time.time() - 42.5)
    return holder_start, granted(store.acquire(holder_start)).lease


def test_skip_refusal_describes_the_holder(store: Store) -> None:
    holder_start, lease = _held(store)

    refusal = refused(store.acquire(start(host="web-2", pid=2222)))

    assert refusal.refusal is Refusal.SKIPPED
    h = refusal.holder
    assert (h.run_id, h.host, h.pid, h.token) == (lease.run_id, "web-1", 1111, lease.token)
    assert h.started_at == pytest.approx(holder_start.at, abs=1e-3)
    assert 0 < h.expires_in <= LONG_TTL
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_skip_records_skipped_with_the_refused_run_id_and_slot(store: Store) -> None:
    _, lease = _held(store)
    skipped_start = start(host="web-2", pid=2222, slot=SLOT)

    refused(store.acquire(skipped_start))

    [event] = ledger(store, kinds=[EventKind.SKIPPED])
    assert (event.job, event.run_id) == ("nightly", skipped_start.run_id)
    assert event.data["slot"] == SLOT
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_skipped_event_carries_the_holder_fields(store: Store) -> None:
    holder_start, lease = _held(store)
    skipped_start = start(host="web-2", pid=2222, slot=SLOT)

    refused(store.acquire(skipped_start))

    [event] = ledger(store, kinds=[EventKind.SKIPPED])
    assert set(HOLDER_FIELDS) <= set(event.data), sorted(event.data)
    assert event.data["holder_run_id"] == lease.run_id
    assert event.data["holder_host"] == "web-1"
    assert event.data["holder_pid"] == 1111
    assert event.data["holder_token"] == lease.token
    assert event.data["holder_started_at"] == pytest.approx(holder_start.at, abs=1e-3)
    assert event.data["holder_age"] == pytest.approx(skipped_start.at - holder_start.at, abs=2e-3)
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_a_skipped_start_is_not_a_run(store: Store) -> None:
    _, lease = _held(store)
    skipped_start = start()

    refused(store.acquire(skipped_start))

    assert store.run(skipped_start.run_id) is None
    assert [e.kind for e in ledger(store, run_id=skipped_start.run_id)] == [EventKind.SKIPPED]
    assert [r.run_id for r in store.open_runs()] == [lease.run_id]
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_every_refused_start_records_its_own_skipped(store: Store) -> None:
    _, lease = _held(store)
    refused_ids = []
    for _ in range(3):
        s = start()
        refused(store.acquire(s))
        refused_ids.append(s.run_id)

    skipped = ledger(store, kinds=[EventKind.SKIPPED])

    assert sorted(e.run_id for e in skipped) == sorted(refused_ids)
    assert {e.data["holder_run_id"] for e in skipped} == {lease.run_id}
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_skips_leave_the_holder_unaffected(store: Store) -> None:
    _, lease = _held(store)
    for _ in range(3):
        refused(store.acquire(start()))

    store.renew(lease)
    info = store.lease(lease.key)
    assert info is not None and (info.owner, info.token, info.pending) == (lease.run_id, lease.token, 0)
    assert store.finish(lease, end()).owned is True
    assert_one_terminal_per_start(store)
