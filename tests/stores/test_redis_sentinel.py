"""The Redis store through Sentinel: ``redis+sentinel://`` URLs, and a
failover of a real master.

Each failover test starts a private master, one replica and three sentinels
(``redis-server --sentinel``) on ports of their own, kills the master with
SIGKILL by its pid and waits for the sentinels to promote the replica. What
is checked: fencing tokens still increase after the failover (the new master
is another server process, so tokens restart from its clock, G2); a holder
that cannot renew while the master is gone stops before its ttl (G3); and
how many acknowledged grants a failover loses (replication is asynchronous),
with and without ``wait_replicas``.

The sentinels judge the master down after ``DOWN_AFTER`` without an answer;
the lease ttl of the holder test is no longer than that, so its renewals
cannot reach a new master before its belief ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cronwarden.clock import SYSTEM_CLOCK
from cronwarden.errors import LeaseLost, StoreUnavailable, StoreUrlError
from cronwarden.events import Outcome
from cronwarden.lease import Heartbeat
from cronwarden.stores import open_store
from cronwarden.stores.base import End, Granted, Refused, Start
from cronwarden.stores.redis import RedisStore

redis = pytest.importorskip("redis")

from sentinels import DOWN_AFTER_MS, Cluster, grants_lost_in_a_failover, replicated, wait_for  # noqa: E402

pytestmark = pytest.mark.redis

TTL = DOWN_AFTER_MS / 1000
"""No longer than the sentinels wait before judging the master down, so a
holder's renewals cannot reach a new master before its belief ends."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def start(key: str, *, ttl: float = TTL) -> Start:
    run_id = str(uuid.uuid4())
    return Start(job=key, key=key, run_id=run_id, host="sentinel", pid=os.getpid(), ttl=ttl, at=time.time())


def end() -> End:
    return End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0)


def granted(result: Granted | Refused) -> Granted:
    assert isinstance(result, Granted), f"expected a grant, got {result}"
    return result


# -- URLs -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis+sentinel://127.0.0.1:26379", "name the master the sentinels monitor"),
        ("redis+sentinel://h1:26379,,h2/m", "one was empty"),
        ("redis+sentinel://h1:99999/m", "port must be a number from 1 to 65535"),
        ("redis+sentinel://h1/m?db=one", "db must be a database number"),
        ("redis+sentinel://h1/m?wait_replicas=-1", "wait_replicas must be a whole number"),
        ("redis+sentinel://h1/m?wait_replicas=1&wait_timeout=3s", "must be shorter than socket_timeout"),
        ("redis+sentinel://h1/m?shards=2", "unknown parameter(s) shards"),
        ("redis+sentinel://h1/a/b", "the master name must be one name"),
    ],
)
def test_a_bad_sentinel_url_says_what_is_wrong_in_one_line(url: str, said: str) -> None:
    with pytest.raises(StoreUrlError) as caught:
        open_store(url)
    text = str(caught.value)
    assert "\n" not in text and said in text, text


def test_a_bad_sentinel_url_on_the_command_line_exits_2_with_one_line_and_the_password_masked(
    tmp_path: Path,
) -> None:
    url = "redis+sentinel://cw:s3cret@127.0.0.1:1/mymaster?db=x"
    done = subprocess.run(
        [sys.executable, "-m", "cronwarden", "status", "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "db must be a database number" in lines[0], done.stderr
    assert "s3cret" not in done.stderr and "***" in done.stderr


def test_unreachable_sentinels_are_store_unavailable_soon_and_the_url_masks_the_password() -> None:
    url = "redis+sentinel://cw:s3cret@127.0.0.1:1,127.0.0.1:2/mymaster?connect_timeout=1s"
    with open_store(url) as store:
        assert "s3cret" not in store.url and "***" in store.url
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            store.acquire(start("nightly"))
        assert time.monotonic() - began < 10
    text = str(caught.value)
    assert "\n" not in text and "mymaster" in text and "s3cret" not in text, text


# -- failover ---------------------------------------------------------------


def test_after_a_failover_tokens_still_increase_and_a_holder_that_cannot_renew_stops_before_its_ttl(
    cluster: Cluster,
) -> None:
    with open_store(cluster.url()) as store:
        assert isinstance(store, RedisStore)
        # Tokens before: a key used often, and the held lease (replicated before the kill).
        tokens = []
        for _ in range(20):
            lease = granted(store.acquire(start("hot", ttl=60))).lease
            tokens.append(lease.token)
            store.finish(lease, end())
        sent = time.monotonic()
        held = granted(store.acquire(start("held"))).lease
        beat = Heartbeat(store=store, lease=held, ttl=TTL, clock=SYSTEM_CLOCK, started_at=sent)
        beat.start(held.key)
        try:
            wait_for("a first renewal", lambda: beat.renewals >= 1, timeout=TTL * 5)
            wait_for("the replica to have the renewal", lambda: replicated(cluster), timeout=5)
            killed = cluster.kill_master()
            assert beat.lost_event.wait(timeout=TTL * 5), "the heartbeat never gave the lease up"
            belief_ended = beat.deadline
            # The master was down for DOWN_AFTER before any sentinel could act:
            # the holder gave up within its ttl of the kill, before a new master existed.
            assert belief_ended < killed + TTL, (belief_ended - killed, TTL)
            promotion = cluster.wait_promoted()
        finally:
            beat.stop()
        assert promotion > 0

        with pytest.raises((LeaseLost, StoreUnavailable)):
            store.renew(held)
        after = granted(store.acquire(start("hot", ttl=60))).lease
        assert after.token > max(tokens), (after.token, max(tokens))
        store.finish(after, end())
        taker = granted(store.acquire(start("held", ttl=60)))
        assert taker.lease.token > held.token
        assert taker.abandoned == (held.run_id,)


def test_with_wait_replicas_no_acknowledged_grant_is_lost_in_a_failover(cluster: Cluster) -> None:
    # Without the wait a failover can lose the grants the replica had not
    # received yet (bench/sentinel.py measures how many); with it, a grant
    # is only answered once the replica has it.
    url = cluster.url(wait_replicas="1", wait_timeout="500ms")
    measured = grants_lost_in_a_failover(cluster, wait_replicas="1", wait_timeout="500ms")
    assert measured.acknowledged >= 200
    assert measured.lost == 0, measured[:2]
    # The price: the new master has no replica until the old one comes back
    # as one, and grants that must be acknowledged by one are refused.
    with open_store(url) as store, pytest.raises(StoreUnavailable, match="0 of 1 replica"):
        store.acquire(start("after", ttl=60))


def test_wait_replicas_with_no_replica_to_acknowledge_is_store_unavailable(cluster: Cluster) -> None:
    cluster.replica.pause()
    try:
        url = cluster.url(wait_replicas="1", wait_timeout="200ms")
        with open_store(url) as store, pytest.raises(StoreUnavailable) as caught:
            store.acquire(start("nightly", ttl=60))
    finally:
        cluster.replica.resume()
    text = str(caught.value)
    assert "\n" not in text and "0 of 1 replica(s) acknowledged" in text, text
