"""The Redis store under faults, against real servers and processes.

Restarts, connection kills and a paused (SIGSTOP) server run on a private
``redis-server`` per test (``tests/redisserver.py``); the shared server on
6379 is never disturbed. Retention and URL checks use the shared server with
a unique key prefix, deleted afterwards.

The safety properties checked: fencing tokens never go backwards, even across
a restart that lost every key (G2); while the first holder still believes it
owns the lease, nobody else is granted it (G3 with G4).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cronwarden.clock import SYSTEM_CLOCK
from cronwarden.errors import LeaseLost, StoreError, StoreUnavailable, StoreUrlError
from cronwarden.events import Event, EventKind, Outcome
from cronwarden.lease import Heartbeat, Lease
from cronwarden.policy import Policy
from cronwarden.stores import open_store
from cronwarden.stores.base import End, EventQuery, Granted, Refused, Start, Store
from processes import wait_for
from redisserver import RedisServer, free_port, private_redis

redis = pytest.importorskip("redis")

pytestmark = pytest.mark.redis

SHARED = os.environ.get("CRONWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")
TTL = 1.5
"""Short enough to lose a lease within a test, long enough for a loaded 2-core box."""
LONG_TTL = 60.0


def start(job: str = "nightly", *, ttl: float = TTL, key: str | None = None) -> Start:
    return Start(
        job=job,
        key=key or job,
        run_id=str(uuid.uuid4()),
        host="fault-host",
        pid=os.getpid(),
        ttl=ttl,
        at=time.time(),
    )


def end(outcome: Outcome = Outcome.SUCCEEDED) -> End:
    return End(outcome=outcome, at=time.time(), exit_code=0)


def granted(result: Granted | Refused) -> Granted:
    assert isinstance(result, Granted), f"expected a grant, got {result}"
    return result


def heartbeat(store: Store, lease: Lease, started_at: float) -> Heartbeat:
    # Batched, as a guard's heartbeat renews (Store.renew_many).
    beat = Heartbeat(store=store, lease=lease, ttl=lease.ttl, clock=SYSTEM_CLOCK, started_at=started_at)
    beat.start(lease.key)
    return beat


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with private_redis(tmp_path / "redis") as running:
        yield running


@pytest.fixture
def shared_url() -> Iterator[str]:
    """A unique prefix on the shared server; skipped if it is not there."""
    prefix = f"cw_fault_{uuid.uuid4().hex[:12]}:"
    client = redis.Redis.from_url(SHARED, socket_timeout=3, socket_connect_timeout=3, decode_responses=True)
    try:
        client.ping()
    except redis.exceptions.RedisError as e:
        client.close()
        reason = f"shared Redis at {SHARED} not reachable: {e}"
        if os.environ.get("CRONWARDEN_REQUIRE_BACKENDS", "") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    try:
        yield f"{SHARED}?prefix={prefix}"
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


# -- G2: fencing across restarts ------------------------------------------


def test_tokens_after_a_restart_without_persistence_exceed_every_earlier_token(server: RedisServer) -> None:
    with open_store(server.url()) as store:
        before = []
        for _ in range(200):  # a fast counter on one key, slower ones on others
            lease = granted(store.acquire(start("hot"))).lease
            before.append(lease.token)
            store.finish(lease, end())
        for job in ("a", "b"):
            for _ in range(3):
                lease = granted(store.acquire(start(job))).lease
                before.append(lease.token)
                store.finish(lease, end())
        held = granted(store.acquire(start("held", ttl=LONG_TTL))).lease
        before.append(held.token)

        server.restart()

        # The premise: the server came back empty (no persistence).
        assert store.lease("hot") is None and store.run(held.run_id) is None
        # The same store object reconnects and reloads its scripts (NOSCRIPT).
        after = [granted(store.acquire(start(job, ttl=LONG_TTL))).lease for job in ("hot", "a", "b", "held")]
        assert min(lease.token for lease in after) > max(before)
        # Within the new server's lifetime the counter goes on one by one.
        store.finish(after[0], end())
        assert granted(store.acquire(start("hot"))).lease.token == after[0].token + 1
        # The holder from before the restart cannot renew: its lease is gone.
        with pytest.raises(LeaseLost):
            store.renew(held)


def test_tokens_after_restoring_an_older_snapshot_exceed_every_earlier_token(server: RedisServer) -> None:
    admin = server.admin()
    with open_store(server.url()) as store:
        lease = granted(store.acquire(start())).lease
        store.finish(lease, end())
        admin.save()  # the snapshot the server will come back with
        newer = []
        for _ in range(20):  # grants the snapshot does not know of
            lease = granted(store.acquire(start())).lease
            newer.append(lease.token)
            store.finish(lease, end())

        server.kill()  # no shutdown save: the restart loads the older snapshot
        server.start()

        info = store.lease("nightly")
        assert info is not None and info.token < max(newer), "the snapshot should hold a stale counter"
        again = granted(store.acquire(start())).lease
        assert again.token > max(newer)
        store.finish(again, end())
    admin.close()


def test_lock_tokens_after_a_restart_without_persistence_exceed_every_earlier_token(
    server: RedisServer,
) -> None:
    with open_store(server.url()) as store:
        before = []
        for i in range(50):
            token = store.lock("leader", f"owner-{i}", LONG_TTL)
            assert token is not None
            before.append(token)
            assert store.unlock("leader", f"owner-{i}")
        held = store.lock("held", "holder", LONG_TTL)
        assert held is not None
        before.append(held)

        server.restart()

        # The same store object, on a new connection to a new server process.
        after = [store.lock(key, "new-owner", LONG_TTL) for key in ("leader", "held", "never-taken")]
        assert all(token is not None for token in after)
        assert min(token or 0 for token in after) > max(before)
        # Within the new server's lifetime the counter goes on one by one.
        assert store.unlock("leader", "new-owner")
        assert store.lock("leader", "next", LONG_TTL) == (after[0] or 0) + 1
        # The holder from before the restart holds nothing any more.
        assert store.renew_lock("held", "holder", LONG_TTL) is False
        assert store.unlock("held", "holder") is False


def test_lock_tokens_after_restoring_an_older_snapshot_exceed_every_earlier_token(
    server: RedisServer,
) -> None:
    admin = server.admin()
    with open_store(server.url()) as store:
        assert store.lock("leader", "a", LONG_TTL) is not None
        assert store.unlock("leader", "a")
        admin.save()  # the snapshot the server will come back with: a stale counter
        newer = []
        for i in range(20):
            token = store.lock("leader", f"owner-{i}", LONG_TTL)
            assert token is not None
            newer.append(token)
            assert store.unlock("leader", f"owner-{i}")

        server.kill()  # no shutdown save: the restart loads the older snapshot
        server.start()

        again = store.lock("leader", "after", LONG_TTL)
        assert again is not None and again > max(newer)
    admin.close()


def test_lock_writes_nothing_but_its_own_two_keys(server: RedisServer) -> None:
    admin = server.admin()
    with open_store(server.url(prefix="cw_lock:")) as store:
        assert store.lock("leader", "a", LONG_TTL) is not None
        assert store.renew_lock("leader", "a", LONG_TTL)
        assert store.unlock("leader", "a")
        assert sorted(admin.keys("*")) == ["cw_lock:lock-token:leader"]
        assert store.lock("leader", "b", LONG_TTL) is not None
        assert sorted(admin.keys("*")) == ["cw_lock:lock-token:leader", "cw_lock:lock:leader"]
        assert 0 < admin.pttl("cw_lock:lock:leader") <= LONG_TTL * 1000
    admin.close()


def test_scripts_are_loaded_again_after_script_flush(server: RedisServer) -> None:
    admin = server.admin()
    with open_store(server.url()) as store:
        first = store.lock("leader", "a", LONG_TTL)
        assert first is not None and store.unlock("leader", "a")
        store.finish(granted(store.acquire(start())).lease, end())
        admin.script_flush()

        assert store.lock("leader", "b", LONG_TTL) == first + 1
        assert store.unlock("leader", "b")
        store.finish(granted(store.acquire(start())).lease, end())
    admin.close()


def test_a_killed_idle_connection_is_replaced_and_the_token_goes_on_by_one(server: RedisServer) -> None:
    admin = server.admin()
    with open_store(server.url()) as store:
        first = store.lock("leader", "a", LONG_TTL)
        assert first is not None and store.unlock("leader", "a")
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1

        # Same server process: the counter goes on one by one.
        assert store.lock("leader", "b", LONG_TTL) == first + 1
    admin.close()


# -- G3: a killed connection, a paused server ------------------------------


def test_renew_reconnects_after_client_kill_and_nobody_else_holds_meanwhile(server: RedisServer) -> None:
    admin = server.admin()
    with open_store(server.url()) as holder_store, open_store(server.url()) as other:
        sent = time.monotonic()
        lease = granted(holder_store.acquire(start())).lease
        beat = heartbeat(holder_store, lease, sent)
        try:
            wait_for("a first renewal", lambda: beat.renewals >= 1, timeout=TTL * 3)
            assert granted(other.acquire(start("warm-up"))) is not None  # other has a pooled connection too

            killed = admin.client_kill_filter(_type="normal", skipme=True)
            assert killed >= 2, f"expected to kill the holder's and the other's connections, killed {killed}"

            base = beat.renewals
            refusals = 0
            deadline = time.monotonic() + TTL * 4
            # Longer than a ttl: the lease lives only if renewals went through.
            while beat.renewals < base + 4:
                assert beat.believed(), f"belief lost after CLIENT KILL: {beat.lost or beat.last_error}"
                assert isinstance(other.acquire(start()), Refused), "a second holder while the first believed"
                refusals += 1
                assert time.monotonic() < deadline, f"renewals stalled at {beat.renewals} after CLIENT KILL"
                threading.Event().wait(0.05)
            assert beat.lost is None
        finally:
            beat.stop()
        assert holder_store.finish(lease, end()).owned
        started = holder_store.events(EventQuery(job="nightly", kinds=[EventKind.STARTED], limit=100))
        skipped = holder_store.events(EventQuery(job="nightly", kinds=[EventKind.SKIPPED], limit=1000))
        assert [e.run_id for e in started] == [lease.run_id]
        assert len(skipped) == refusals
    admin.close()


def test_pause_longer_than_the_ttl_ends_belief_before_the_server_side_expiry(server: RedisServer) -> None:
    admin = server.admin()
    key = "nightly"
    with open_store(server.url()) as store, open_store(server.url()) as other:
        sent = time.monotonic()
        lease = granted(store.acquire(start(key))).lease
        lost_at: list[float] = []
        beat = heartbeat(store, lease, sent)
        beat.on_lost = lambda _why: lost_at.append(time.time())
        try:
            wait_for("a first renewal", lambda: beat.renewals >= 1, timeout=TTL * 3)
            server.pause()
            paused_at = time.monotonic()
            try:
                # The renew thread must get control back from a server that
                # does not answer, and give up the lease by itself.
                assert beat.lost_event.wait(timeout=TTL * 3), "heartbeat never declared the lease lost"
                belief_ended = beat.deadline - time.monotonic() + time.time()  # as wall time
                assert not beat.believed()
                # Real time passing is the point here: keep the server stopped
                # until the lease has certainly run out by its own clock.
                time.sleep(max(0.0, paused_at + TTL + 0.2 - time.monotonic()))
            finally:
                server.resume()
            expiry = int(admin.hget(f"cw_fault:lease:{key}", "exp")) / 1000  # server clock, same host
        finally:
            beat.stop()

        assert belief_ended < expiry, "the holder believed past the server-side expiry"
        # Thread wake-ups on a loaded box are late by milliseconds, never seconds.
        assert lost_at and lost_at[0] < expiry + 0.25, (lost_at, expiry)
        taker = granted(other.acquire(start(key, ttl=LONG_TTL)))
        assert taker.lease.token > lease.token
        assert taker.abandoned == (lease.run_id,)
        with pytest.raises(LeaseLost):
            store.renew(lease)
        assert store.finish(lease, end(Outcome.LEASE_LOST)).owned is False
        other.finish(taker.lease, end())
    admin.close()


def test_a_callers_client_that_retries_timeouts_does_not_make_the_store_send_a_script_again(
    server: RedisServer,
) -> None:
    """redis-py's default client retries a timed-out command with backoff
    (ten times in redis-py 8): a script the slow server ran would be sent
    again, and the call held for seconds. The store uses its own retries."""
    from redis.backoff import ConstantBackoff
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from redis.retry import Retry

    from cronwarden.stores.redis import RedisStore

    theirs = redis.Redis(port=server.port, socket_timeout=0.3, decode_responses=True,
                         retry=Retry(ConstantBackoff(0.5), 10, (RedisTimeoutError,)))  # fmt: skip
    store = RedisStore(theirs, prefix="cw_theirs:")
    try:
        granted(store.acquire(start("warm-up")))
        server.pause()
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable):
                store.acquire(start())
            took = time.monotonic() - began
        finally:
            server.resume()
        # One try within the socket timeout, not ten tries half a second apart.
        assert took < 2.0, f"the call took {took:.2f}s: the caller's retries were used"
    finally:
        store.close()
    assert theirs.ping()  # the caller's client is the caller's, still open
    theirs.close()


def test_a_call_to_a_paused_server_fails_as_unavailable_within_the_socket_timeout(
    server: RedisServer,
) -> None:
    with open_store(server.url(socket_timeout="300ms")) as store:
        granted(store.acquire(start("warm-up")))
        server.pause()
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable) as caught:
                store.acquire(start())
            took = time.monotonic() - began
        finally:
            server.resume()
        assert took < 2.0, f"the call hung for {took:.2f}s"
        assert f"127.0.0.1:{server.port}" in str(caught.value)
        # Afterwards the store works again on a fresh connection.
        assert store.lease("warm-up") is not None


# -- errors people read ----------------------------------------------------


def test_connection_refused_is_store_unavailable_naming_host_and_port() -> None:
    port = free_port()  # nothing listens there
    store = open_store(f"redis://127.0.0.1:{port}/0?connect_timeout=1s")
    with store, pytest.raises(StoreUnavailable) as caught:
        store.acquire(start())
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "\n" not in message


def test_wrong_password_is_a_store_error_not_unavailable(tmp_path: Path) -> None:
    with private_redis(tmp_path / "auth", args=("--requirepass", "s3cret")) as locked:
        bad = f"redis://:wrong@127.0.0.1:{locked.port}/0"
        with open_store(bad) as store:
            with pytest.raises(StoreError) as caught:
                store.acquire(start())
            assert not isinstance(caught.value, StoreUnavailable)
            assert "wrong" not in store.url  # the password is masked
        with open_store(f"redis://:s3cret@127.0.0.1:{locked.port}/0") as store:
            store.finish(granted(store.acquire(start())).lease, end())


def test_missing_database_is_a_store_error(server: RedisServer) -> None:
    store = open_store(f"redis://127.0.0.1:{server.port}/99")
    with store, pytest.raises(StoreError) as caught:
        store.jobs()
    assert not isinstance(caught.value, StoreUnavailable)


@pytest.mark.parametrize("planted", ["open", "runs", "ev", "ev:r", "jobs:n", "rollup", "lease:nightly"])
def test_a_key_of_the_wrong_type_under_the_prefix_is_refused_before_anything_is_written(
    server: RedisServer, planted: str
) -> None:
    admin = server.admin()
    admin.set(f"cw_fault:{planted}", "not mine")  # another program's key where one of the store's goes
    with open_store(server.url()) as store, pytest.raises(StoreError) as caught:
        store.acquire(start())
    message = str(caught.value)
    assert not isinstance(caught.value, StoreUnavailable)
    assert f"the key cw_fault:{planted} holds a string where the store keeps a" in message, message
    assert "\n" not in message and f"127.0.0.1:{server.port}" in message and "prefix of its own" in message
    # Checked before the script's first write: nothing but the planted key (a
    # WRONGTYPE half-way through a script would leave the writes before it).
    assert admin.keys("cw_fault:*") == [f"cw_fault:{planted}"]
    admin.close()


def test_a_read_only_replica_is_unavailable_for_writes_and_names_it(
    server: RedisServer, tmp_path: Path
) -> None:
    with private_redis(tmp_path / "replica", args=("--replicaof", "127.0.0.1", str(server.port))) as replica:
        with open_store(replica.url()) as store, pytest.raises(StoreUnavailable) as caught:
            store.acquire(start())
        message = str(caught.value)
        assert "read only replica" in message and "\n" not in message and "cannot serve writes" in message


def test_a_server_out_of_memory_is_unavailable_and_leaves_no_lease(tmp_path: Path) -> None:
    with private_redis(
        tmp_path / "oom", args=("--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
    ) as full:
        admin = full.admin()
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(64):  # fill it past maxmemory
                admin.set(f"filler:{i}", "x" * 100_000)
        with open_store(full.url()) as store, pytest.raises(StoreUnavailable) as caught:
            store.acquire(start())
        message = str(caught.value)
        assert "maxmemory" in message and "\n" not in message and "cannot serve writes" in message
        assert admin.keys("cw_fault:*") == []
        admin.close()


@pytest.mark.parametrize(
    "query",
    ["colour=blue", "runs_per_job=0", "events_per_job=many", "socket_timeout=ten", "socket_timeout=0s"],
)
def test_bad_url_parameters_are_refused(query: str) -> None:
    with pytest.raises(StoreUrlError):
        open_store(f"redis://127.0.0.1:6379/0?{query}")


def test_bad_database_in_url_is_refused() -> None:
    with pytest.raises(StoreUrlError):
        open_store("redis://127.0.0.1:6379/zero")


# -- retention -------------------------------------------------------------


def test_retention_keeps_the_newest_runs_and_events_per_job_and_every_open_run(shared_url: str) -> None:
    url = f"{shared_url}&runs_per_job=3&events_per_job=5"
    with open_store(url) as store:
        still_open = granted(store.acquire(start("nightly", key="nightly:open", ttl=LONG_TTL))).lease
        finished = []
        for _ in range(12):
            lease = granted(store.acquire(start("nightly"))).lease
            store.finish(lease, end())
            finished.append(lease.run_id)
        other = granted(store.acquire(start("weekly"))).lease
        store.finish(other, end())

        runs = store.runs("nightly", limit=100)
        assert [r.run_id for r in runs][:2] == finished[::-1][:2]
        assert still_open.run_id in {r.run_id for r in runs}, "an open run was dropped"
        assert len(runs) == 3
        assert [r.run_id for r in store.open_runs()] == [still_open.run_id]
        events = store.events(EventQuery(job="nightly", limit=1000, newest_first=False))
        assert len(events) == 5
        assert [e.run_id for e in events][-2:] == [finished[-1], finished[-1]]
        # The other job's history is untouched by this job's churn.
        assert len(store.events(EventQuery(job="weekly", limit=1000))) == 2
        # Every index agrees with what is left.
        everything = store.events(EventQuery(limit=1000))
        assert len(everything) == 7
        by_kind = store.events(EventQuery(kinds=[EventKind.STARTED, EventKind.SUCCEEDED], limit=1000))
        assert sorted(e.event_id for e in by_kind) == sorted(e.event_id for e in everything)
        assert store.events(EventQuery(run_id=finished[0], limit=10)) == []
        store.finish(still_open, end())


def test_retention_is_checked_every_few_events_and_stays_within_limit_plus_that(shared_url: str) -> None:
    # 64 per job: checked every 64 / 8 = 8 events of the job, trimmed to 56.
    url = f"{shared_url}&runs_per_job=64&events_per_job=64"
    with open_store(url) as store:
        most = 0
        for _ in range(100):
            lease = granted(store.acquire(start("chatty"))).lease
            store.finish(lease, end())
            most = max(most, len(store.events(EventQuery(job="chatty", limit=1000))))
        assert 64 <= most <= 64 + 8
        assert len(store.runs("chatty", limit=1000)) <= 64 + 8


def test_jobs_listed_by_the_earlier_key_layout_stay_visible(shared_url: str) -> None:
    # Earlier versions listed jobs with a ledger in a set, `jobs:ev`; this one
    # keeps a counter per job in `jobs:n`, and reads both.
    prefix = shared_url.split("prefix=", 1)[1]
    with open_store(shared_url) as store:
        store.record(Event(kind=EventKind.SKIPPED, job="old", at=time.time()))
        client = redis.Redis.from_url(SHARED)
        client.hdel(f"{prefix}jobs:n", "old")
        client.sadd(f"{prefix}jobs:ev", "old")
        client.close()
        assert [e.job for e in store.events(EventQuery(limit=10))] == ["old"]


def mixed_ledger(store: Store) -> None:
    """Runs that end every way a run's events are written: a plain cycle, a
    skip, a queued start handed over, an overlap, an abandoned run, and an
    event recorded on its own for a run."""
    holder = granted(store.acquire(start("mixed", ttl=LONG_TTL))).lease
    assert isinstance(store.acquire(start("mixed")), Refused)
    queued = start("mixed")._replace(policy=Policy.QUEUE)
    assert isinstance(store.acquire(queued), Refused)
    side = granted(store.acquire(start("mixed")._replace(policy=Policy.ALLOW))).lease
    store.finish(side, end())
    handed = store.finish(holder, end(), then=queued).next
    assert handed is not None
    store.record(Event(kind=EventKind.SLOW, job="mixed", at=time.time(), run_id=handed.run_id))
    store.finish(handed, end())
    lost = granted(store.acquire(start("mixed", ttl=0.05))).lease
    store.record(Event(kind=EventKind.SLOW, job="mixed", at=time.time(), run_id=lost.run_id))
    time.sleep(0.1)
    taker = granted(store.acquire(start("mixed")))
    assert taker.abandoned == (lost.run_id,)
    store.finish(taker.lease, end())
    for _ in range(3):
        store.finish(granted(store.acquire(start("mixed"))).lease, end())


def test_events_by_run_id_are_every_event_of_the_run_however_it_was_written(shared_url: str) -> None:
    with open_store(shared_url) as store:
        mixed_ledger(store)
        everything = store.events(EventQuery(limit=10_000, newest_first=False))
        runs = {e.run_id for e in everything if e.run_id}
        assert len(runs) >= 8
        for run_id in runs:
            by_run = store.events(EventQuery(run_id=run_id, limit=100, newest_first=False))
            assert by_run == [e for e in everything if e.run_id == run_id], run_id


def test_events_by_run_id_after_trimming_are_still_in_the_ledger(shared_url: str) -> None:
    with open_store(f"{shared_url}&events_per_job=6&runs_per_job=2") as store:
        for _ in range(3):
            mixed_ledger(store)
        everything = store.events(EventQuery(limit=10_000, newest_first=False))
        assert len(everything) == 6
        for run_id in {e.run_id for e in everything if e.run_id}:
            by_run = store.events(EventQuery(run_id=run_id, limit=100, newest_first=False))
            assert all(e in everything for e in by_run)
        prefix = shared_url.split("prefix=", 1)[1]
        client = redis.Redis.from_url(SHARED, decode_responses=True)
        try:
            links = [f for f in client.hkeys(f"{prefix}ev") if f.startswith("r:")]
        finally:
            client.close()
        # The run links are trimmed with their runs' events: no more than the events left.
        assert len(links) <= len(everything)


def test_a_released_lease_cannot_be_renewed_though_its_live_key_is_left_to_expire(shared_url: str) -> None:
    with open_store(shared_url) as store:
        lease = granted(store.acquire(start(ttl=LONG_TTL))).lease
        assert store.finish(lease, end()).owned
        prefix = shared_url.split("prefix=", 1)[1]
        client = redis.Redis.from_url(SHARED, decode_responses=True)
        try:
            assert client.get(f"{prefix}live:nightly") == lease.run_id  # left to expire by its PX
        finally:
            client.close()

        with pytest.raises(LeaseLost):
            store.renew(lease)
        info = store.lease("nightly")
        assert info is not None and (info.owner, info.expires_in) == (None, None)
        after = granted(store.acquire(start()))
        assert after.lease.token == lease.token + 1 and after.abandoned == ()
        with pytest.raises(LeaseLost):
            store.renew(lease)
        store.finish(after.lease, end())


def test_a_lost_lease_record_still_gets_a_larger_token(shared_url: str) -> None:
    # As after an eviction or a partial restore: the lease hash is gone.
    with open_store(shared_url) as store:
        first = granted(store.acquire(start())).lease
        store.finish(first, end())
        prefix = shared_url.split("prefix=", 1)[1]
        client = redis.Redis.from_url(SHARED)
        client.delete(f"{prefix}lease:nightly")
        client.close()
        again = granted(store.acquire(start())).lease
        assert again.token > first.token
        store.finish(again, end())


def test_recorded_events_keep_exact_times_and_text(shared_url: str) -> None:
    at = 1_796_000_000.123457
    with open_store(shared_url) as store:
        event = Event(
            kind=EventKind.SLOW,
            job='odd "job"/é',
            at=at,
            run_id=None,
            data={"state": "raised", "note": 'quote " slash / \\ é', "big": 2**53 - 1},
        )
        store.record(event)
        [back] = store.events(EventQuery(job='odd "job"/é', since=at, limit=10))
        assert (back.event_id, back.kind, back.at, back.run_id, dict(back.data)) == (
            event.event_id,
            event.kind,
            at,
            None,
            dict(event.data),
        )
        assert store.events(EventQuery(kinds=[EventKind.SLOW], since=at + 1e-6, limit=10)) == []


# -- the outbox ------------------------------------------------------------


def test_outbox_passes_over_events_trimmed_before_delivery(shared_url: str) -> None:
    with open_store(f"{shared_url}&events_per_job=3") as store:
        assert store.undelivered("hook", 100, backfill=0) == []
        recorded = []
        for i in range(8):
            event = Event(kind=EventKind.SUCCEEDED, job="nightly", at=time.time(), data={"i": i})
            store.record(event)
            recorded.append(event.event_id)

        batch = store.undelivered("hook", 100)

        # Retention won: only the newest three are left to deliver.
        assert [e.event_id for e in batch] == recorded[-3:]
        store.mark_delivered("hook", [e.event_id for e in batch])
        assert store.undelivered("hook", 100) == []


def test_outbox_acknowledges_event_ids_that_need_json_escapes(shared_url: str) -> None:
    with open_store(shared_url) as store:
        assert store.undelivered("hook", 100, backfill=0) == []
        odd = Event(kind=EventKind.SKIPPED, job="nightly", at=time.time(), event_id='id/with"quote\\')
        plain = Event(kind=EventKind.SKIPPED, job="nightly", at=time.time())
        store.record(odd)
        store.record(plain)

        assert [e.event_id for e in store.undelivered("hook", 100)] == [odd.event_id, plain.event_id]
        store.mark_delivered("hook", [odd.event_id])
        assert [e.event_id for e in store.undelivered("hook", 100)] == [plain.event_id]


# -- one script per step -----------------------------------------------------


def scripts_sent(store: Store) -> list[str]:
    """The names of the scripts ``store`` sends from now on, in order."""
    scripts = store._scripts  # type: ignore[attr-defined]
    names = {getattr(scripts, n).sha: n for n in vars(scripts)}
    sent: list[str] = []
    call = store._call  # type: ignore[attr-defined]

    def logged(script: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(names.get(script.sha, "other"))
        return call(script, *args, **kwargs)

    store._call = logged  # type: ignore[attr-defined]
    return sent


def test_a_skip_start_on_an_expired_lease_records_the_dead_run_abandoned_in_one_script(
    shared_url: str,
) -> None:
    with open_store(shared_url) as store:
        dead = granted(store.acquire(start("ghost", ttl=0.05))).lease
        wait_for("the lease to expire", lambda: (store.lease("ghost").expires_in or 0) <= 0, 5)  # type: ignore[union-attr]
        sent = scripts_sent(store)
        taken = granted(store.acquire(start("ghost")))
        assert sent == ["acquire"]
        assert taken.abandoned == (dead.run_id,)
        assert store.run(dead.run_id).outcome is Outcome.ABANDONED  # type: ignore[union-attr]
        assert store.finish(taken.lease, end()).recorded
        assert sent == ["acquire", "finish"]


def sockets_from(low: int) -> list[int]:
    """This process's socket file descriptors numbered ``low`` or more."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if int(name) >= low and os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                out.append(int(name))
        except OSError:
            pass  # closed meanwhile
    return out


def test_calls_reuse_their_pooled_connection_when_its_socket_is_above_fd_1024(server: RedisServer) -> None:
    """The pool's check of an idle connection must not take a socket that
    select() cannot watch for a dead one: a process with many files open
    would reconnect on every call."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"needs 1,200 open files, the limit is {soft}")
    admin = server.admin()
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with open_store(server.url()) as store:
            store.record(Event(kind=EventKind.SLOW, job="fds", at=time.time()))
            [client] = [c for c in admin.client_list() if c["name"] == "cronwarden"]
            assert sockets_from(1024), "the premise: the store's socket is above fd 1024"
            connections = admin.info("stats")["total_connections_received"]
            for _ in range(20):
                store.record(Event(kind=EventKind.SLOW, job="fds", at=time.time()))
                store.acquire(start("fds"))
            assert admin.info("stats")["total_connections_received"] == connections
            assert [c["id"] for c in admin.client_list() if c["name"] == "cronwarden"] == [client["id"]]
    finally:
        for fd in held:
            os.close(fd)
        admin.close()
