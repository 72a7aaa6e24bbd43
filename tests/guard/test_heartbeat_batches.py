"""Batched heartbeats: one ``renew_many`` round trip renews every lease of a
process that is due, each lease's deadline counting from its batch's send."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from tests.contract import start

import cronwarden.lease as lease_module
from cronwarden import Warden
from cronwarden.clock import SYSTEM_CLOCK, Clock, FakeClock
from cronwarden.errors import LeaseLost, LeaseRevoked, StoreUnavailable
from cronwarden.lease import Heartbeat, HeartbeatThread, Lease, belief
from cronwarden.policy import Policy
from cronwarden.stores import open_store
from cronwarden.stores.base import Granted, Refused, Store


class Spy:
    """The real store, with the send time and size of each ``renew_many``
    noted; ``takes`` seconds of a fake clock pass during each call, and
    ``fail`` is raised instead of answering when set."""

    def __init__(self, store: Store, clock: Clock, takes: float = 0.0) -> None:
        self.store = store
        self.clock = clock
        self.takes = takes
        self.calls: list[tuple[float, int]] = []
        self.fail: Exception | None = None

    def renew_many(self, leases: Sequence[Lease]) -> list[LeaseLost | None]:
        self.calls.append((self.clock.monotonic(), len(leases)))
        if isinstance(self.clock, FakeClock):
            self.clock.advance(self.takes)
        if self.fail is not None:
            raise self.fail
        return self.store.renew_many(leases)


@pytest.fixture
def fake() -> FakeClock:
    return FakeClock(start=time.time())


@pytest.fixture
def sqlite(tmp_path: Path, fake: FakeClock) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'cw.db'}?synchronous=normal", clock=fake) as store:
        yield store


def grant(store: Store, job: str, ttl: float) -> Lease:
    result = store.acquire(start(job, ttl=ttl))
    assert isinstance(result, Granted), result
    return result.lease


def beats(store: Spy, clock: FakeClock, leases: Sequence[Lease], thread: HeartbeatThread) -> list[Heartbeat]:
    now = clock.monotonic()
    out = [
        Heartbeat(store=store, lease=x, ttl=x.ttl, clock=clock, started_at=now, thread=thread) for x in leases
    ]
    for b in out:
        b._next_at = now + b.interval
    return out


def queue(thread: HeartbeatThread, *queued: Heartbeat) -> None:
    """Queue heartbeats on a thread that is not running, to drive it by hand."""
    with thread._wake:
        for b in queued:
            thread._beats.add(b)
            thread._push(b)


def test_every_lease_due_goes_in_one_call_and_counts_from_its_send(sqlite: Store, fake: FakeClock) -> None:
    spy = Spy(sqlite, fake, takes=0.4)  # a slow round trip
    thread = HeartbeatThread()
    hbs = beats(spy, fake, [grant(sqlite, f"job-{i}", 3.0) for i in range(5)], thread)
    fake.advance(1.0)  # the interval: every one is due
    sent = fake.monotonic()

    going = thread._serve(hbs)

    assert going == [True] * 5
    assert spy.calls == [(sent, 5)]
    for b in hbs:
        assert b.renewals == 1 and b.last_error is None
        # From the send, not from the answer 0.4 s later.
        assert b.deadline == pytest.approx(sent + belief(3.0))
        assert b._next_at == pytest.approx(sent + b.interval)


def test_a_renewal_due_within_a_tenth_of_its_interval_joins_the_batch(sqlite: Store, fake: FakeClock) -> None:
    spy = Spy(sqlite, fake)
    thread = HeartbeatThread()
    now, soon, later = beats(spy, fake, [grant(sqlite, f"job-{i}", 3.0) for i in range(3)], thread)
    soon._next_at += 0.05  # due 0.05 s after the first: within a tenth of 1 s
    later._next_at += 0.5
    queue(thread, now, soon, later)
    fake.advance(1.0)

    due, _ = thread._take()
    going = thread._serve(due)

    assert set(due) == {now, soon} and going == [True, True]
    assert spy.calls == [(fake.monotonic(), 2)]
    assert later.renewals == 0
    _, sleep = thread._take()
    assert sleep == pytest.approx(0.5)  # the thread sleeps until `later` is due


def test_more_leases_than_a_batch_holds_go_in_several_calls(
    sqlite: Store, fake: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lease_module, "BATCH_MAX", 10)
    spy = Spy(sqlite, fake)
    hbs = beats(spy, fake, [grant(sqlite, f"job-{i}", 3.0) for i in range(25)], HeartbeatThread())
    fake.advance(1.0)

    assert HeartbeatThread._serve(hbs) == [True] * 25
    assert [n for _, n in spy.calls] == [10, 10, 5]


def test_a_refused_lease_is_lost_and_the_rest_of_its_batch_renewed(sqlite: Store, fake: FakeClock) -> None:
    spy = Spy(sqlite, fake)
    leases = [grant(sqlite, f"job-{i}", 3.0) for i in range(4)]
    hbs = beats(spy, fake, leases, HeartbeatThread())
    replacer = start("job-2", policy=Policy.REPLACE, ttl=3.0)
    assert isinstance(sqlite.acquire(replacer), Refused)  # job-2's holder is asked to stop
    fake.advance(1.0)

    assert HeartbeatThread._serve(hbs) == [True, True, False, True]
    assert len(spy.calls) == 1
    assert isinstance(hbs[2].lost, LeaseRevoked) and hbs[2].lost.by_run_id == replacer.run_id
    assert [b.renewals for b in hbs] == [1, 1, 0, 1]
    assert all(b.lost is None for i, b in enumerate(hbs) if i != 2)


def test_a_batch_the_store_cannot_take_is_retried_until_each_deadline(sqlite: Store, fake: FakeClock) -> None:
    spy = Spy(sqlite, fake)
    hbs = beats(spy, fake, [grant(sqlite, f"job-{i}", 3.0) for i in range(3)], HeartbeatThread())
    spy.fail = StoreUnavailable("store down for a moment")
    fake.advance(1.0)

    assert HeartbeatThread._serve(hbs) == [True] * 3
    for b in hbs:
        assert b.lost is None and b.last_error == "store down for a moment"
        assert b._next_at == pytest.approx(fake.monotonic() + 0.3)  # retried soon: a tenth of the ttl
    fake.advance(1.75)  # past belief(3.0) from the start: every one is lost, with the reason
    assert HeartbeatThread._serve(hbs) == [False] * 3
    assert all(isinstance(b.lost, LeaseLost) and "store down" in str(b.lost) for b in hbs)
    assert len(spy.calls) == 1, "no renewal is sent once the deadline has passed"


def test_a_warden_renews_its_runs_in_batches(store_url: str) -> None:
    """Forty runs at ttl 1.5 s for 1.3 s: each renewed twice or more, in
    fewer round trips than renewals."""
    with Warden(store_url, clock=SYSTEM_CLOCK) as w, contextlib.ExitStack() as stack:
        spy = Spy(w.store, SYSTEM_CLOCK)
        runs = []
        for i in range(40):
            run = stack.enter_context(w.guard(f"job-{i}", ttl=1.5))
            run.heartbeat.store = spy
            runs.append(run)
        time.sleep(1.3)
        for run in runs:
            run.check()
            run.heartbeat.stop()  # waits for a renewal in flight: the counts below stay put
        renewals = sum(r.heartbeat.renewals for r in runs)
        assert min(r.heartbeat.renewals for r in runs) >= 2
        assert sum(n for _, n in spy.calls) == renewals
        # The runs started ~10 ms apart, and a renewal due within 50 ms goes
        # with the batch before it: a call carries several on average.
        assert len(spy.calls) <= renewals / 2, spy.calls


def test_a_replaced_run_stops_and_the_others_of_its_warden_go_on(store_url: str) -> None:
    with Warden(store_url, clock=SYSTEM_CLOCK) as w, contextlib.ExitStack() as stack:
        runs = [stack.enter_context(w.guard(f"job-{i}", ttl=1.5)) for i in range(5)]
        with Warden(store_url, clock=SYSTEM_CLOCK, quiet=True) as other:
            store = other.store
            replacer = start("job-3", policy=Policy.REPLACE, ttl=1.5)
            assert isinstance(store.acquire(replacer), Refused)
            assert runs[3].lost.wait(timeout=3), "the revoked run is told within its renew interval"
            assert isinstance(runs[3].lost_reason(), LeaseRevoked)
            before = [r.heartbeat.renewals for r in runs]
            time.sleep(0.7)
            for i, run in enumerate(runs):
                if i != 3:
                    run.check()
                    assert run.heartbeat.renewals > before[i]
