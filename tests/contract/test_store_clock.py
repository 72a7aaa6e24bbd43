"""G4: expiry is judged by the store's clock; no correctness depends on the
client's wall clock (``Start.at`` and ``End.at`` are for the ledger only).

On every backend a client whose wall clock is hours off gets the same lease
behaviour. On SQLite the store's clock is ``Clock.store_time()`` plus the
boot id, so a ``FakeClock`` shows the exact ttl boundary, renewals counted
from the store's now, wall-clock steps that change nothing, and a reboot that
voids every lease of the earlier boot.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from cronwarden.clock import FakeClock
from cronwarden.errors import LeaseLost, LeaseRevoked
from cronwarden.events import EventKind, Outcome
from cronwarden.stores.base import Refusal, Store
from cronwarden.stores.sqlite import SqliteStore

from . import LONG_TTL, assert_one_terminal_per_start, end, granted, ledger, refused, start

HOURS = 3600.0


@pytest.mark.parametrize("skew", [-6 * HOURS, 6 * HOURS], ids=["holder-behind", "holder-ahead"])
def test_wall_clock_skew_between_clients_does_not_change_the_lease(store: Store, lapse, skew: float) -> None:
    now = time.time()
    holder = granted(store.acquire(start(ttl=lapse.ttl, at=now + skew, host="skewed"))).lease

    # Live by the store's clock, however far apart the clients' clocks are.
    assert refused(store.acquire(start(at=now - skew, host="other"))).refusal is Refusal.SKIPPED
    store.renew(holder)
    lapse.expire(store, holder)
    # Expired by the store's clock, whatever the holder's clock said.
    taker = granted(store.acquire(start(ttl=LONG_TTL, at=now - skew, host="other")))

    assert taker.abandoned == (holder.run_id,)
    assert taker.lease.token > holder.token
    store.finish(taker.lease, end(at=now - skew + 1))
    assert_one_terminal_per_start(store)


def test_end_time_from_a_skewed_client_does_not_keep_the_lease(store: Store) -> None:
    lease = granted(store.acquire(start(at=time.time()))).lease

    store.finish(lease, end(at=time.time() - 6 * HOURS))

    nxt = granted(store.acquire(start(at=time.time() + 6 * HOURS)))
    assert nxt.abandoned == ()
    store.finish(nxt.lease, end())
    assert_one_terminal_per_start(store)


# -- SQLite: the store's clock is CLOCK_BOOTTIME + boot id, faked here ---------


class SteppableClock(FakeClock):
    """A FakeClock whose wall clock can be stepped (NTP) apart from the
    store's clock."""

    def __init__(self) -> None:
        super().__init__(start=time.time())
        self.wall_offset = 0.0

    def wall(self) -> float:
        return super().wall() + self.wall_offset


@pytest.fixture
def fake() -> SteppableClock:
    return SteppableClock()


@pytest.fixture
def sqlite_store(tmp_path, fake: SteppableClock) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "clock.db", clock=fake) as opened:
        yield opened  # type: ignore[misc]


def test_sqlite_lease_is_live_until_ttl_by_store_clock(sqlite_store: SqliteStore, fake: FakeClock) -> None:
    lease = granted(sqlite_store.acquire(start(ttl=10))).lease

    fake.advance(9.99)

    assert refused(sqlite_store.acquire(start())).refusal is Refusal.SKIPPED
    sqlite_store.finish(lease, end())
    assert_one_terminal_per_start(sqlite_store)


def test_sqlite_lease_expires_once_ttl_has_passed_by_store_clock(
    sqlite_store: SqliteStore, fake: FakeClock
) -> None:
    lease = granted(sqlite_store.acquire(start(ttl=10))).lease

    fake.advance(10.01)

    taker = granted(sqlite_store.acquire(start()))
    assert taker.abandoned == (lease.run_id,)
    sqlite_store.finish(taker.lease, end())
    assert_one_terminal_per_start(sqlite_store)


def test_sqlite_renew_extends_expiry_from_store_now(sqlite_store: SqliteStore, fake: FakeClock) -> None:
    lease = granted(sqlite_store.acquire(start(ttl=10))).lease
    fake.advance(8)
    sqlite_store.renew(lease)
    fake.advance(8)

    assert refused(sqlite_store.acquire(start())).refusal is Refusal.SKIPPED
    info = sqlite_store.lease(lease.key)
    assert info is not None and info.expires_in == pytest.approx(2)
    fake.advance(2.01)
    taker = granted(sqlite_store.acquire(start()))
    assert taker.abandoned == (lease.run_id,)
    sqlite_store.finish(taker.lease, end())
    assert_one_terminal_per_start(sqlite_store)


def test_sqlite_wall_clock_step_does_not_expire_a_lease(
    sqlite_store: SqliteStore, fake: SteppableClock
) -> None:
    lease = granted(sqlite_store.acquire(start(ttl=10, at=fake.wall()))).lease

    fake.wall_offset = 2 * 24 * HOURS  # NTP steps the wall clock two days ahead

    assert refused(sqlite_store.acquire(start(at=fake.wall()))).refusal is Refusal.SKIPPED
    sqlite_store.renew(lease)
    sqlite_store.finish(lease, end(at=fake.wall()))
    assert_one_terminal_per_start(sqlite_store)


def test_sqlite_wall_clock_step_back_does_not_keep_a_lease(
    sqlite_store: SqliteStore, fake: SteppableClock
) -> None:
    lease = granted(sqlite_store.acquire(start(ttl=10, at=fake.wall()))).lease

    fake.wall_offset = -2 * 24 * HOURS
    fake.advance(11)

    taker = granted(sqlite_store.acquire(start(at=fake.wall())))
    assert taker.abandoned == (lease.run_id,)
    sqlite_store.finish(taker.lease, end(at=fake.wall()))
    assert_one_terminal_per_start(sqlite_store)


def test_sqlite_reboot_voids_leases_of_the_previous_boot(sqlite_store: SqliteStore, fake: FakeClock) -> None:
    lease = granted(sqlite_store.acquire(start(ttl=LONG_TTL))).lease

    fake.reboot("boot-2")  # no time passes: the boot id alone voids the lease

    taker = granted(sqlite_store.acquire(start(ttl=LONG_TTL)))
    assert taker.abandoned == (lease.run_id,)
    assert taker.lease.token > lease.token
    sqlite_store.finish(taker.lease, end())
    assert_one_terminal_per_start(sqlite_store)


def test_sqlite_renew_after_reboot_raises_lease_lost(sqlite_store: SqliteStore, fake: FakeClock) -> None:
    lease = granted(sqlite_store.acquire(start(ttl=LONG_TTL))).lease

    fake.reboot("boot-2")

    with pytest.raises(LeaseLost) as caught:
        sqlite_store.renew(lease)
    assert not isinstance(caught.value, LeaseRevoked)
    sqlite_store.finish(lease, end(Outcome.LEASE_LOST))
    assert_one_terminal_per_start(sqlite_store)


def test_sqlite_lease_of_previous_boot_reads_as_expired(sqlite_store: SqliteStore, fake: FakeClock) -> None:
    lease = granted(sqlite_store.acquire(start(ttl=LONG_TTL))).lease

    fake.reboot("boot-2")

    info = sqlite_store.lease(lease.key)
    assert info is not None and info.expires_in is not None and info.expires_in < 0
    [run] = sqlite_store.open_runs()
    assert run.run_id == lease.run_id and run.expires_in is not None and run.expires_in < 0
    sqlite_store.finish(lease, end(Outcome.LEASE_LOST))
    assert_one_terminal_per_start(sqlite_store)


def test_sqlite_run_abandoned_by_reboot_has_one_terminal_record(
    sqlite_store: SqliteStore, fake: FakeClock
) -> None:
    lease = granted(sqlite_store.acquire(start(ttl=LONG_TTL))).lease
    fake.reboot("boot-2")
    taker = granted(sqlite_store.acquire(start(ttl=LONG_TTL))).lease

    late = sqlite_store.finish(lease, end(Outcome.SUCCEEDED))

    assert (late.owned, late.recorded) == (False, False)
    [terminal] = ledger(sqlite_store, run_id=lease.run_id, kinds=[EventKind.ABANDONED, EventKind.SUCCEEDED])
    assert terminal.kind is EventKind.ABANDONED
    sqlite_store.finish(taker, end())
    assert_one_terminal_per_start(sqlite_store)
