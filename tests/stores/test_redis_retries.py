"""Calls whose reply was lost: the server ran the script, the connection broke
before the reply reached the client, and redis-py sent it again on a new
connection (the store's ``Retry``). Each step is answered as its first try
was, and the ledger holds it once.

The reply is lost for real: a TCP proxy in front of a private
``redis-server`` passes everything through until it is armed with a text;
then the next command holding that text goes to the server, the proxy waits
for the server's reply and closes the client's connection instead of
passing it on.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cronwarden.errors import LeaseLost
from cronwarden.events import Event, EventKind, Outcome
from cronwarden.policy import Policy
from cronwarden.stores import open_store
from cronwarden.stores.base import End, EventQuery, Granted, Refusal, Refused, Start, Store
from redisserver import RedisServer, private_redis

pytest.importorskip("redis")

pytestmark = pytest.mark.redis

LONG_TTL = 60.0


class ReplyDropper:
    """A proxy to ``port`` on 127.0.0.1 that loses the reply to one command."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.armed: bytes | None = None
        self.meanwhile: Callable[[], None] | None = None
        """Run after the server answered the dropped command and before the
        client's connection closes: what happens between a first try and
        its retry."""
        self.dropped = 0
        self.accepted = 0
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, text: str, meanwhile: Callable[[], None] | None = None) -> None:
        """Lose the reply to the next command holding ``text`` (and run
        ``meanwhile`` before the client can send it again)."""
        with self._lock:
            self.armed = text.encode()
            self.meanwhile = meanwhile

    def _take(self, data: bytes) -> bool:
        with self._lock:
            if self.armed is not None and self.armed in data:
                self.armed = None
                return True
            return False

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
        try:
            while True:
                readable, _, _ = select.select([client, upstream], [], [], 10)
                if not readable:
                    return
                if client in readable:
                    data = client.recv(65536)
                    if not data:
                        return
                    drop = self._take(data)
                    upstream.sendall(data)
                    if drop:
                        assert upstream.recv(65536), "the server answered nothing"  # it ran the command
                        if self.meanwhile is not None:
                            self.meanwhile()
                        self.dropped += 1
                        return
                if upstream in readable:
                    data = upstream.recv(65536)
                    if not data:
                        return
                    client.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with private_redis(tmp_path / "redis") as running:
        yield running


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[ReplyDropper]:
    dropper = ReplyDropper(server.port)
    try:
        yield dropper
    finally:
        dropper.close()


@pytest.fixture
def direct(server: RedisServer) -> Iterator[Store]:
    """The same ledger, not through the proxy: another process's calls."""
    with open_store(f"redis://127.0.0.1:{server.port}/0?prefix=cw_retry:") as opened:
        yield opened


@pytest.fixture
def store(proxy: ReplyDropper) -> Iterator[Store]:
    with open_store(f"redis://127.0.0.1:{proxy.port}/0?prefix=cw_retry:") as opened:
        # Each script once, so the server has them all: the reply the proxy
        # loses is then the script's, not a NOSCRIPT.
        warm = granted(opened.acquire(start("warm-up"))).lease
        opened.finish(warm, end())
        opened.record(Event(kind=EventKind.SLOW, job="warm-up", at=time.time()))
        assert opened.lock("warm-up", "w", LONG_TTL) is not None and opened.unlock("warm-up", "w")
        yield opened


def start(job: str = "nightly", policy: Policy = Policy.SKIP) -> Start:
    return Start(job=job, key=job, run_id=str(uuid.uuid4()), host="retry-host", pid=os.getpid(),
                 ttl=LONG_TTL, at=time.time(), policy=policy)  # fmt: skip


def end() -> End:
    return End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0)


def granted(result: Granted | Refused) -> Granted:
    assert isinstance(result, Granted), f"expected a grant, got {result}"
    return result


def kinds(store: Store, run_id: str) -> list[str]:
    """The kinds of the run's events, read by job (a duplicate would be
    found there even if the run's link named only one)."""
    everything = store.events(EventQuery(job="nightly", limit=1000, newest_first=False))
    return [e.kind.value for e in everything if e.run_id == run_id]


def lost_once(proxy: ReplyDropper) -> None:
    """The premise: one reply was lost, and the call went again on a new connection."""
    assert proxy.dropped == 1 and proxy.accepted >= 2, (proxy.dropped, proxy.accepted)


def test_a_grant_whose_reply_was_lost_is_answered_with_the_same_grant(
    store: Store, proxy: ReplyDropper
) -> None:
    first = start()
    proxy.arm(first.run_id)

    lease = granted(store.acquire(first)).lease

    lost_once(proxy)
    info = store.lease("nightly")
    assert info is not None and (info.owner, info.token) == (first.run_id, lease.token)
    [started] = store.events(EventQuery(run_id=first.run_id, kinds=[EventKind.STARTED], limit=10))
    assert started.data["token"] == lease.token
    assert store.finish(lease, end()).recorded
    assert granted(store.acquire(start())).lease.token == lease.token + 1


def test_a_skip_whose_reply_was_lost_is_answered_again_and_recorded_once(
    store: Store, proxy: ReplyDropper
) -> None:
    holder = granted(store.acquire(start())).lease
    second = start()
    proxy.arm(second.run_id)

    refused = store.acquire(second)

    lost_once(proxy)
    assert isinstance(refused, Refused) and refused.refusal is Refusal.SKIPPED
    assert refused.holder.run_id == holder.run_id
    assert kinds(store, second.run_id) == ["skipped"]


def test_a_queued_start_whose_reply_was_lost_is_queued_once(store: Store, proxy: ReplyDropper) -> None:
    holder = granted(store.acquire(start())).lease
    queued = start(policy=Policy.QUEUE)
    proxy.arm(queued.run_id)

    refused = store.acquire(queued)

    lost_once(proxy)
    assert isinstance(refused, Refused) and refused.refusal is Refusal.QUEUED
    info = store.lease("nightly")
    assert info is not None and info.pending == 1
    assert kinds(store, queued.run_id) == ["queued"]
    # A full queue is answered as full again, not as queued.
    full = start(policy=Policy.QUEUE)
    proxy.arm(full.run_id)
    again = store.acquire(full)
    assert isinstance(again, Refused) and again.refusal is Refusal.QUEUE_FULL
    assert proxy.dropped == 2 and kinds(store, full.run_id) == ["queue_full"]
    assert store.finish(holder, end(), then=queued).next is not None


def test_an_overlap_whose_reply_was_lost_is_answered_with_the_same_side_lease(
    store: Store, proxy: ReplyDropper
) -> None:
    holder = granted(store.acquire(start())).lease
    overlapping = start(policy=Policy.ALLOW)
    proxy.arm(overlapping.run_id)

    result = granted(store.acquire(overlapping))

    lost_once(proxy)
    assert result.overlapped is not None and result.overlapped.run_id == holder.run_id
    assert result.lease.key == f"nightly+{overlapping.run_id}" and result.lease.token == 1
    assert sorted(kinds(store, overlapping.run_id)) == ["overlap", "started"]
    assert store.finish(result.lease, end()).recorded


def test_a_release_whose_reply_was_lost_is_reported_owned_and_recorded_once(
    store: Store, proxy: ReplyDropper
) -> None:
    lease = granted(store.acquire(start())).lease
    proxy.arm(lease.run_id)

    finished = store.finish(lease, end())

    lost_once(proxy)
    # Owned: this run released its lease. Recorded already: by the first try
    # (as every store answers a finish sent again: the record was there).
    assert (finished.owned, finished.recorded) == (True, False)
    assert kinds(store, lease.run_id) == ["started", "succeeded"]
    run = store.run(lease.run_id)
    assert run is not None and run.outcome is Outcome.SUCCEEDED
    info = store.lease("nightly")
    assert info is not None and info.owner is None


def test_a_hand_over_whose_reply_was_lost_returns_the_queued_runs_lease(
    store: Store, proxy: ReplyDropper
) -> None:
    lease = granted(store.acquire(start())).lease
    then = start(policy=Policy.QUEUE)
    assert isinstance(store.acquire(then), Refused)
    proxy.arm(lease.run_id)

    finished = store.finish(lease, end(), then=then)

    lost_once(proxy)
    assert finished.owned and finished.next is not None and finished.next.run_id == then.run_id
    info = store.lease("nightly")
    assert info is not None and (info.owner, info.token, info.pending) == (
        then.run_id,
        finished.next.token,
        0,
    )
    assert store.finish(finished.next, end()).recorded


def test_a_record_whose_reply_was_lost_is_in_the_ledger_once(store: Store, proxy: ReplyDropper) -> None:
    event = Event(kind=EventKind.SLOW, job="nightly", at=time.time(), data={"state": "raised"})
    proxy.arm(event.event_id)

    store.record(event)

    lost_once(proxy)
    assert [e.event_id for e in store.events(EventQuery(job="nightly", limit=10))] == [event.event_id]


def test_a_lock_whose_reply_was_lost_is_answered_not_granted_and_granted_to_nobody_else(
    store: Store, proxy: ReplyDropper
) -> None:
    proxy.arm("leader-a")

    token = store.lock("leader", "leader-a", LONG_TTL)

    lost_once(proxy)
    # The lock is not re-entrant, so the retry cannot tell its own grant:
    # the caller is told "not granted" and the lock expires by its ttl.
    assert token is None
    assert store.lock("leader", "leader-b", LONG_TTL) is None
    assert store.unlock("leader", "leader-a")


@pytest.mark.parametrize("policy", [Policy.SKIP, Policy.QUEUE])
def test_a_refusal_whose_reply_was_lost_stays_a_refusal_when_the_holder_released_meanwhile(
    store: Store, direct: Store, proxy: ReplyDropper, policy: Policy
) -> None:
    holder = granted(store.acquire(start())).lease
    refused_start = start(policy=policy)
    proxy.arm(refused_start.run_id, meanwhile=lambda: direct.finish(holder, end()))

    refused = store.acquire(refused_start)

    lost_once(proxy)
    expected = Refusal.SKIPPED if policy is Policy.SKIP else Refusal.QUEUED
    assert isinstance(refused, Refused) and refused.refusal is expected
    assert refused.holder.run_id == holder.run_id and refused.holder.token == holder.token
    # One decision, as recorded: the slot did no work, and nothing started.
    assert kinds(store, refused_start.run_id) == [expected.value]
    info = store.lease("nightly")
    assert info is not None and info.owner is None
    assert info.pending == (1 if policy is Policy.QUEUE else 0)


def test_an_overlap_whose_reply_was_lost_keeps_its_side_lease_when_the_holder_released_meanwhile(
    store: Store, direct: Store, proxy: ReplyDropper
) -> None:
    holder = granted(store.acquire(start())).lease
    overlapping = start(policy=Policy.ALLOW)
    proxy.arm(overlapping.run_id, meanwhile=lambda: direct.finish(holder, end()))

    result = granted(store.acquire(overlapping))

    lost_once(proxy)
    assert result.overlapped is not None and result.overlapped.run_id == holder.run_id
    assert result.lease.key == f"nightly+{overlapping.run_id}"
    assert sorted(kinds(store, overlapping.run_id)) == ["overlap", "started"]
    info = store.lease("nightly")
    assert info is not None and info.owner is None  # not granted the job's own lease as well
    assert store.finish(result.lease, end()).recorded


def test_a_grant_whose_reply_was_lost_is_answered_as_granted_after_the_lease_moved_on(
    store: Store, direct: Store, proxy: ReplyDropper
) -> None:
    first = start()._replace(ttl=0.5)
    taker: list[Granted] = []

    def expired_and_taken() -> None:
        # Meanwhile the lease expires (by the server's clock) and another
        # start takes it: the retry must answer the grant the first try made,
        # not decide again (that would record a skip for a run that started).
        give_up = time.monotonic() + 10
        while (info := direct.lease("nightly")) is not None and (info.expires_in or 0) > 0:
            assert time.monotonic() < give_up, "the lease never expired"
            time.sleep(0.05)
        taker.append(granted(direct.acquire(start())))

    proxy.arm(first.run_id, meanwhile=expired_and_taken)

    lease = granted(store.acquire(first)).lease

    lost_once(proxy)
    [took] = taker
    assert took.abandoned == (first.run_id,) and took.lease.token == lease.token + 1
    assert kinds(store, first.run_id) == ["started", "abandoned"]
    with pytest.raises(LeaseLost):
        store.renew(lease)
