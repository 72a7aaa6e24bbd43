"""A private Redis Sentinel set-up for tests and benches: a master, one
replica of it and three sentinels (``redis-server --sentinel``), each a child
process on a port of ``PORTS``, stopped by its pid. The master can be killed
(SIGKILL) and the promotion of the replica waited for.

The sentinels judge the master down after ``DOWN_AFTER_MS`` without an
answer, and fail over within a few seconds more.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import ClassVar, NamedTuple

import redis

from cronwarden.errors import StoreUnavailable
from cronwarden.stores import open_store
from cronwarden.stores.base import Granted, Start
from cronwarden.stores.redis import RedisStore
from processes import wait_for
from redisserver import RedisServer, redis_server_binary

PORTS = range(28800, 28900)
"""Ports for the private servers and sentinels of these tests."""
SERVICE = "cwmaster"
DOWN_AFTER_MS = 1000
PREFIX = "cw_sentinel:"


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Ports:
    """Free ports from ``PORTS``, each handed out once per test run."""

    taken: ClassVar[set[int]] = set()

    @classmethod
    def next(cls) -> int:
        for port in PORTS:
            if port not in cls.taken and _free(port):
                cls.taken.add(port)
                return port
        raise RuntimeError(f"no free port left in {PORTS.start}-{PORTS.stop - 1}")


class Sentinel:
    """One ``redis-server --sentinel`` process watching ``SERVICE``."""

    def __init__(self, directory: Path, master_port: int) -> None:
        self.port = Ports.next()
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.conf = directory / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {directory}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        self.log = directory / "sentinel.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [redis_server_binary(), str(self.conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT
            )

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, decode_responses=True)

    def master(self) -> int | None:
        """The port this sentinel names as the master, or None if it does not answer."""
        client = self.client()
        try:
            reply = client.execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)
        except redis.exceptions.RedisError:
            return None
        finally:
            client.close()
        return None if not reply else int(reply[1])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


class Cluster:
    """A master, one replica of it and three sentinels."""

    def __init__(self, base: Path) -> None:
        self.master = RedisServer(base / "master", port=Ports.next())
        self.replica = RedisServer(
            base / "replica", port=Ports.next(), args=("--replicaof", "127.0.0.1", str(self.master.port))
        )
        self.sentinels: list[Sentinel] = []
        try:
            self.master.start()
            self.replica.start()
            wait_for("the replica to sync", self._synced, timeout=20)
            self.sentinels = [Sentinel(base / f"sentinel{i}", self.master.port) for i in range(3)]
            # Each sentinel must know the replica and two others before a failover can be agreed.
            wait_for("the sentinels to find the replica and each other", self._acquainted, timeout=30)
        except BaseException:
            self.stop()
            raise

    def _synced(self) -> bool:
        admin = self.replica.admin()
        try:
            info = admin.info("replication")
        except redis.exceptions.RedisError:
            return False
        finally:
            admin.close()
        return info.get("master_link_status") == "up"

    def _acquainted(self) -> bool:
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                state = client.execute_command("SENTINEL", "master", SERVICE)
            except redis.exceptions.RedisError:
                return False
            finally:
                client.close()
            fields = dict(zip(state[::2], state[1::2], strict=True)) if isinstance(state, list) else state
            if int(fields["num-slaves"]) < 1 or int(fields["num-other-sentinels"]) < 2:
                return False
        return True

    def url(self, prefix: str = PREFIX, **params: str) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        query = "&".join(f"{k}={v}" for k, v in {"prefix": prefix, **params}.items())
        return f"redis+sentinel://{hosts}/{SERVICE}?{query}"

    def kill_master(self) -> float:
        """SIGKILL the master by its pid; the monotonic time it was sent."""
        killed = time.monotonic()
        self.master.kill()
        return killed

    def wait_promoted(self, timeout: float = 30) -> float:
        """Wait until every sentinel names the replica as master and the
        replica says it is one; how long that took."""
        began = time.monotonic()

        def promoted() -> bool:
            if any(s.master() != self.replica.port for s in self.sentinels):
                return False
            admin = self.replica.admin()
            try:
                return bool(admin.info("replication").get("role") == "master")
            except redis.exceptions.RedisError:
                return False
            finally:
                admin.close()

        wait_for("the sentinels to promote the replica", promoted, timeout=timeout, every=0.05)
        return time.monotonic() - began

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        self.replica.stop()
        self.master.stop()


def replicated(cluster: Cluster) -> bool:
    """Whether the replica has every write the master has."""
    master, replica = cluster.master.admin(), cluster.replica.admin()
    try:
        ahead = master.info("replication")["master_repl_offset"]
        return bool(ahead == replica.info("replication")["slave_repl_offset"])
    except redis.exceptions.RedisError:
        return False
    finally:
        master.close()
        replica.close()


class Lost(NamedTuple):
    acknowledged: int
    """Grants acknowledged to the callers, by the old master or the new one
    (with ``wait_replicas``, the new one has no replica left to acknowledge)."""
    lost: int
    """Of those, the ones the new master does not have."""
    latencies: list[float]
    """Seconds each acknowledged ``acquire`` took."""
    promotion: float
    """Seconds from the kill until the replica was master for every sentinel."""


def grants_lost_in_a_failover(cluster: Cluster, *, threads: int = 2, lag: float = 0.0, **params: str) -> Lost:
    """Grant fresh keys from ``threads`` threads as fast as they go, kill the
    master mid-stream, and once the replica is promoted count the
    acknowledged grants the new master does not have. With ``lag``, the
    replica is stopped (SIGSTOP) that many seconds before the kill and
    resumed just after it: a replica that far behind when the master dies.
    (A stop of a fraction of a second loses little more than none: the
    master's writes wait in the kernel's socket buffers, which the replica
    still reads after the master died. Cutting the link does not do either:
    the replica reconnects and catches up within a fraction of a second.)"""
    acked: list[tuple[str, str]] = []
    latencies: list[float] = []
    stop = threading.Event()
    lock = threading.Lock()

    def grant(store: RedisStore) -> None:
        while not stop.is_set():
            s = Start(job="window", key=f"k-{uuid.uuid4().hex}", run_id=uuid.uuid4().hex, host="sentinel",
                      pid=os.getpid(), ttl=60.0, at=time.time())  # fmt: skip
            began = time.perf_counter()
            try:
                result = store.acquire(s)
            except StoreUnavailable:
                continue
            took = time.perf_counter() - began
            if isinstance(result, Granted):
                with lock:
                    acked.append((s.key, s.run_id))
                    latencies.append(took)

    stores = []
    for _ in range(threads):
        store = open_store(cluster.url(**params))
        assert isinstance(store, RedisStore)
        stores.append(store)
    workers = [threading.Thread(target=grant, args=(s,), daemon=True) for s in stores]
    for t in workers:
        t.start()
    try:
        wait_for("grants before the kill", lambda: len(acked) >= 200, timeout=30)
        if lag:
            cluster.replica.pause()
            stop.wait(lag)
        killed = cluster.kill_master()
        if lag:
            cluster.replica.resume()
        cluster.wait_promoted()
        promotion = time.monotonic() - killed
    finally:
        stop.set()
        for t in workers:
            t.join(timeout=30)
        for s in stores:
            s.close()
    admin = cluster.replica.admin()
    try:
        owners = admin.pipeline(transaction=False)
        for key, _ in acked:
            owners.hget(f"{PREFIX}lease:{key}", "owner")
        found = owners.execute()
    finally:
        admin.close()
    lost = sum(1 for (_, run_id), owner in zip(acked, found, strict=True) if owner != run_id)
    return Lost(len(acked), lost, latencies, promotion)
