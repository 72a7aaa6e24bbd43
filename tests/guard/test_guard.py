"""The library guard: ``Warden.guard`` and ``@warden.job`` on every store."""

from __future__ import annotations

import threading
import time

import pytest
from tests.contract import assert_one_terminal_per_start, ledger

from cronwarden import LeaseLost, NotStarted, Outcome, Policy
from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.events import EventKind
from cronwarden.guard import Warden
from cronwarden.lease import Lease
from cronwarden.stores import open_store
from cronwarden.stores.base import Store


@pytest.fixture
def warden(store_url: str) -> Warden:
    # Real clock: the heartbeat thread runs in real time.
    w = Warden(store_url, clock=SYSTEM_CLOCK, host="test-host")
    yield w
    w.close()


def test_exception_in_guard_records_failed_and_releases(warden: Warden) -> None:
    with pytest.raises(ZeroDivisionError), warden.guard("nightly", ttl=30) as run:
        run_id = run.run_id
        1 / 0  # noqa: B018
    record = warden.store.run(run_id)
    assert record is not None and record.outcome is Outcome.FAILED
    assert "ZeroDivisionError" in record.detail
    info = warden.store.lease("nightly")
    assert info is not None and info.owner is None


def test_next_guard_acquires_at_once_after_a_failed_run(warden: Warden) -> None:
    with pytest.raises(RuntimeError), warden.guard("nightly", ttl=30) as first:
        raise RuntimeError("boom")
    with warden.guard("nightly", ttl=30) as second:
        assert second.token > first.token
    assert_one_terminal_per_start(warden.store)


def test_successful_guard_records_succeeded_with_duration(warden: Warden) -> None:
    with warden.guard("nightly", ttl=30) as run:
        pass
    ends = ledger(warden.store, kinds=[EventKind.SUCCEEDED])
    assert [e.run_id for e in ends] == [run.run_id]
    assert ends[0].data["duration"] >= 0


def test_start_while_held_records_skip_and_raises_not_started(warden: Warden) -> None:
    with warden.guard("nightly", ttl=30) as holder:
        with pytest.raises(NotStarted) as refused, warden.guard("nightly", ttl=30):
            pytest.fail("the body of a skipped start must not run")
        assert refused.value.holder_run_id == holder.run_id
    skips = ledger(warden.store, kinds=[EventKind.SKIPPED])
    assert len(skips) == 1 and skips[0].data["holder_run_id"] == holder.run_id
    assert_one_terminal_per_start(warden.store)


def test_decorated_job_returns_none_when_skipped(warden: Warden) -> None:
    calls: list[int] = []

    @warden.job("nightly", ttl=30)
    def work() -> int:
        calls.append(1)
        return 42

    with warden.guard("nightly", ttl=30):
        assert work() is None
    assert work() == 42
    assert calls == [1]


def test_run_exposes_token_and_run_id(warden: Warden) -> None:
    with warden.guard("nightly", ttl=30) as run:
        record = warden.store.run(run.run_id)
        assert record is not None and record.token == run.token and run.job == "nightly"


def test_heartbeat_keeps_the_lease_past_its_ttl(warden: Warden) -> None:
    with warden.guard("nightly", ttl=0.6) as run:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # 2.5 ttls of real work
            run.check()
            time.sleep(0.05)
        assert run.heartbeat.renewals >= 3
        info = warden.store.lease("nightly")
        assert info is not None and info.owner == run.run_id
    assert warden.store.run(run.run_id).outcome is Outcome.SUCCEEDED  # type: ignore[union-attr]


def _open_ids(store: Store) -> list[str]:
    return [r.run_id for r in store.open_runs()]


def _steal(store: Store, lease: Lease) -> None:
    """Make the lease someone else's, as a takeover after expiry would."""
    from tests.contract import start as make_start

    deadline = time.monotonic() + 10
    while True:
        info = store.lease(lease.key)
        if info is not None and info.expires_in is not None and info.expires_in <= 0:
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)
    from cronwarden.stores.base import Granted

    assert isinstance(store.acquire(make_start(lease.job, key=lease.key, ttl=30)), Granted)


def test_refused_renewal_sets_lost_and_check_raises(store_url: str) -> None:
    # A heartbeat that cannot run (interval longer than the ttl is rejected, so
    # stop it by hand) lets the lease expire; another run takes it; the next
    # renewal is refused outright.
    with Warden(store_url, clock=SYSTEM_CLOCK) as w:
        with w.guard("nightly", ttl=0.5) as run:
            run.heartbeat.stop()
            other = open_store(store_url)
            try:
                _steal(other, run.lease)
            finally:
                other.close()
            with pytest.raises(LeaseLost):
                run.check()
        # The taker found the lease expired first and recorded the run
        # abandoned; the guard's own lease_lost is not a second terminal record.
        record = w.store.run(run.run_id)
        assert record is not None and record.outcome is Outcome.ABANDONED
        assert_one_terminal_per_start(w.store, still_open=frozenset(_open_ids(w.store)))


# The heartbeat re-raises after declaring the lease lost, so the crash is
# also visible to whoever watches thread exceptions; here that is expected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_heartbeat_thread_counts_as_lost(store_url: str) -> None:
    with Warden(store_url, clock=SYSTEM_CLOCK) as w:
        with w.guard("nightly", ttl=0.6) as run:
            run.heartbeat._renew = _explode  # the thread dies at its next renewal
            assert run.lost.wait(timeout=5), "a dead heartbeat must set run.lost"
            assert "heartbeat thread died" in str(run.lost_reason())
            with pytest.raises(LeaseLost):
                run.check()
        assert w.store.run(run.run_id).outcome is Outcome.LEASE_LOST  # type: ignore[union-attr]


def _explode() -> None:
    raise MemoryError("simulated crash in the heartbeat thread")


def test_belief_ends_on_the_deadline_even_when_the_heartbeat_hangs(store_url: str) -> None:
    hang = threading.Event()
    with Warden(store_url, clock=SYSTEM_CLOCK) as w, w.guard("nightly", ttl=0.6) as run:
        run.heartbeat._renew = lambda: hang.wait(30)  # type: ignore[assignment,return-value]
        t0 = run.started_monotonic
        while run.lost_reason() is None:
            assert time.monotonic() - t0 < 5
            time.sleep(0.01)
        believed_for = time.monotonic() - t0
        hang.set()
    assert believed_for < 0.6, f"belief outlived the ttl: {believed_for:.3f}s"


def test_queue_policy_is_refused_in_a_with_block(warden: Warden) -> None:
    from cronwarden import UsageError

    with pytest.raises(UsageError, match="queue"), warden.guard("nightly", policy=Policy.QUEUE):
        pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ttl": 0}, "ttl must be greater than zero"),
        ({"ttl": 10, "renew_every": 10}, "renew interval"),
        ({"ttl": 10, "renew_every": 0}, "renew interval"),
        ({"max_runtime": -1}, "max_runtime"),
        ({"policy": "allow"}, "needs a partition"),
        ({"policy": "sometimes"}, "policy must be one of"),
        ({"colour": "red"}, "unknown guard option"),
    ],
)
def test_bad_guard_options_raise_usage_errors(warden: Warden, options: dict, message: str) -> None:
    from cronwarden import UsageError

    with pytest.raises(UsageError, match=message):
        warden.guard("nightly", **options)


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 129, "job/1", "ünï"])
def test_bad_job_names_raise_usage_errors(warden: Warden, name: str) -> None:
    from cronwarden import UsageError

    with pytest.raises(UsageError, match="job name"):
        warden.guard(name)


def test_clock_type_is_injectable(store_url: str) -> None:
    clock: Clock = SYSTEM_CLOCK
    with Warden(store_url, clock=clock) as w:
        assert w.clock is clock


def test_runs_of_one_warden_share_one_heartbeat_thread_and_all_renew(store_url: str) -> None:
    with Warden(store_url, clock=SYSTEM_CLOCK) as w:
        with w.guard("a", ttl=1.2) as a, w.guard("b", ttl=1.5) as b:
            thread = w.heartbeats._thread
            assert thread is not None and a.heartbeat._thread is b.heartbeat._thread is w.heartbeats
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:  # past both ttls
                a.check()
                b.check()
                time.sleep(0.05)
            assert a.heartbeat.renewals >= 3 and b.heartbeat.renewals >= 3
            assert w.heartbeats._thread is thread, "one thread all along"
        assert w.store.run(a.run_id).outcome is Outcome.SUCCEEDED  # type: ignore[union-attr]
        assert w.store.run(b.run_id).outcome is Outcome.SUCCEEDED  # type: ignore[union-attr]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_shared_heartbeat_thread_loses_every_run_it_served_and_the_next_run_gets_a_new_one(
    store_url: str,
) -> None:
    with Warden(store_url, clock=SYSTEM_CLOCK) as w:
        with w.guard("a", ttl=0.6) as a, w.guard("b", ttl=30) as b:
            a.heartbeat._renew = _explode  # due first: the thread dies serving a
            assert a.lost.wait(timeout=5) and b.lost.wait(timeout=5), "every run it served is lost"
            assert "heartbeat thread died" in str(b.lost_reason())
        with w.guard("a", ttl=0.6) as again:
            time.sleep(0.5)
            again.check()
            assert again.heartbeat.renewals >= 1
        assert w.store.run(b.run_id).outcome is Outcome.LEASE_LOST  # type: ignore[union-attr]


def test_stop_waits_for_the_renewal_in_flight(store_url: str) -> None:
    entered, release = threading.Event(), threading.Event()
    renewed: list[float] = []

    with Warden(store_url, clock=SYSTEM_CLOCK) as w, w.guard("nightly", ttl=3, renew_every=0.1) as run:
        lease = run.lease

        def slow_renew() -> None:
            entered.set()
            release.wait(5)
            try:
                w.store.renew(lease)
            finally:
                renewed.append(time.monotonic())

        run.heartbeat._renew = slow_renew
        assert entered.wait(5)
        threading.Timer(0.2, release.set).start()
        run.heartbeat.stop()
        stopped = time.monotonic()
    assert renewed and renewed[0] <= stopped, "stop returned while a renewal was still running"


def test_the_heartbeat_thread_ends_when_the_warden_closes(store_url: str) -> None:
    w = Warden(store_url, clock=SYSTEM_CLOCK)
    with w.guard("nightly", ttl=30):
        thread = w.heartbeats._thread
        assert thread is not None and thread.is_alive()
    w.close()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_a_renewal_is_late_only_until_it_fails_or_waits_on_the_store_past_the_grace() -> None:
    """The supervisor lets a late renewal (its thread ran late: the process
    was frozen) run to the deadline; a failing or hung one gets SIGTERM at
    the usual threshold (``Heartbeat.late_until``)."""
    from cronwarden.clock import FakeClock
    from cronwarden.errors import StoreUnavailable
    from cronwarden.lease import Heartbeat

    clock = FakeClock()
    seen: list[tuple[float | None, float | None]] = []
    outcomes: list[Exception | None] = [None, StoreUnavailable("down")]

    def renew() -> None:
        now = clock.monotonic()  # in flight, sent just now
        seen.append((hb.late_until(now + 0.4, within=0.5), hb.late_until(now + 0.6, within=0.5)))
        failure = outcomes.pop(0)
        if failure is not None:
            raise failure

    hb = Heartbeat(renew, ttl=3.0, clock=clock, started_at=clock.monotonic())
    assert hb.late_until(clock.monotonic(), within=0.5) is None  # nothing due yet
    clock.advance(2.4)  # frozen past the renewal due at 1.0 and past the threshold at 2.2
    # due and not sent: the thread is late, and the renewal has until the deadline
    assert hb.late_until(clock.monotonic(), within=0.5) == hb.deadline
    sent, deadline = clock.monotonic(), hb.deadline
    assert hb._step()
    # in flight: late for the grace (but never past the deadline), hung after it
    assert seen == [(min(deadline, sent + 0.5), None)]
    assert hb.deadline == clock.monotonic() + 2.7
    clock.advance(1.0)
    assert hb._step()  # this renewal fails (store unreachable)
    assert hb.last_error is not None
    assert hb.late_until(clock.monotonic(), within=0.5) is None  # a failing store is not a late thread
