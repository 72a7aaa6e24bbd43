"""Fixtures shared by every test suite: one store per test, on every backend.

- ``backend``: ``sqlite``, ``postgres`` or ``redis``. A backend whose store
  module or driver is missing, or whose server does not answer, is skipped
  with the reason; with ``CRONWARDEN_REQUIRE_BACKENDS=1`` it fails instead,
  so CI cannot pass by skipping.
- ``store_url``: a fresh, isolated URL per test (a file under ``tmp_path``; a
  PostgreSQL schema dropped afterwards; a Redis key prefix deleted afterwards).
- ``clock``: the clock the ``store`` fixture is opened with. On SQLite the
  store's clock *is* this object, so it is a ``FakeClock`` that tests advance
  instead of sleeping; PostgreSQL and Redis judge expiry by the server's
  clock, so they get the system clock. Override it in a nearer conftest to
  get something else.
- ``lapse``: lets a lease expire by the store's clock (advances the fake
  clock on SQLite, polls the store with a deadline on the servers).
- ``store``: ``open_store(store_url, clock=clock)``, closed afterwards.

Servers are found at ``CRONWARDEN_TEST_POSTGRES`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and ``CRONWARDEN_TEST_REDIS``
(default ``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import importlib.util
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from cronwarden.clock import SYSTEM_CLOCK, Clock, FakeClock
from cronwarden.lease import Lease
from cronwarden.stores import open_store
from cronwarden.stores.base import Store

BACKENDS = ("sqlite", "postgres", "redis")
POSTGRES_URL = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CRONWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")
PROBE_TIMEOUT = 3
STORE_MODULES = {
    "sqlite": ("cronwarden.stores.sqlite", "sqlite3"),
    "postgres": ("cronwarden.stores.postgres", "psycopg"),
    "redis": ("cronwarden.stores.redis", "redis"),
}


def require_backends() -> bool:
    return os.environ.get("CRONWARDEN_REQUIRE_BACKENDS", "") == "1"


def unavailable(reason: str) -> None:
    """Skip, or fail when every backend is required."""
    if require_backends():
        pytest.fail(f"{reason} (CRONWARDEN_REQUIRE_BACKENDS=1)", pytrace=False)
    pytest.skip(reason)


def _address(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def missing_module(backend: str) -> str | None:
    """Why ``backend``'s store cannot even be imported, or None."""
    store_module, driver = STORE_MODULES[backend]
    for name in (driver, store_module):
        if importlib.util.find_spec(name) is None:
            return f"{backend}: module {name} is missing"
    return None


def _probe(backend: str) -> str | None:
    why = missing_module(backend)
    if why is not None or backend == "sqlite":
        return why
    try:
        if backend == "postgres":
            import psycopg

            with psycopg.connect(POSTGRES_URL, connect_timeout=PROBE_TIMEOUT, autocommit=True) as conn:
                conn.execute("SELECT 1")
        else:
            import redis

            client = redis.Redis.from_url(
                REDIS_URL, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT
            )
            try:
                client.ping()
            finally:
                client.close()
    except Exception as e:
        name = "PostgreSQL" if backend == "postgres" else "Redis"
        url = POSTGRES_URL if backend == "postgres" else REDIS_URL
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"{name} not reachable at {_address(url)}: {first_line}"
    return None


class BackendProbe:
    """Asks each server once per session whether it is there."""

    def __init__(self) -> None:
        self._seen: dict[str, str | None] = {}

    def why_not(self, backend: str) -> str | None:
        if backend not in self._seen:
            self._seen[backend] = _probe(backend)
        return self._seen[backend]

    def require_module(self, backend: str) -> None:
        """Skip (or fail) unless ``backend``'s store can be imported; for
        tests that need the code but not the server."""
        why = missing_module(backend)
        if why is not None:
            unavailable(why)


@pytest.fixture(scope="session")
def backend_probe() -> BackendProbe:
    return BackendProbe()


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def backend(request: pytest.FixtureRequest, backend_probe: BackendProbe) -> str:
    name: str = request.param
    why = backend_probe.why_not(name)
    if why is not None:
        unavailable(why)
    return name


def _drop_postgres_schema(schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES_URL, connect_timeout=PROBE_TIMEOUT, autocommit=True) as conn:
        # A connection a test leaked would block the drop forever; fail instead.
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _delete_redis_prefix(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=PROBE_TIMEOUT)
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    finally:
        client.close()


def _with_param(url: str, name: str, value: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{name}={value}"


@pytest.fixture
def store_url(
    backend: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[str]:
    unique = uuid.uuid4().hex[:16]
    if backend == "pgbouncer":  # the contract suite's PostgreSQL through PgBouncer (tests/contract)
        schema = f"cw_test_{unique}"
        yield request.getfixturevalue("bouncer").url(schema=schema)
        _drop_postgres_schema(schema)
    elif backend == "sqlite":
        # Not tmp_path: a test may use tmp_path for its own files.
        yield f"sqlite:///{tmp_path_factory.mktemp('store') / 'cronwarden.db'}"
    elif backend == "postgres":
        schema = f"cw_test_{unique}"
        yield _with_param(POSTGRES_URL, "schema", schema)
        _drop_postgres_schema(schema)
    else:
        prefix = f"cw_test_{unique}:"
        yield _with_param(REDIS_URL, "prefix", prefix)
        _delete_redis_prefix(prefix)


@pytest.fixture
def clock(backend: str) -> Clock:
    return FakeClock(start=time.time()) if backend == "sqlite" else SYSTEM_CLOCK


@pytest.fixture
def store(store_url: str, clock: Clock) -> Iterator[Store]:
    opened = open_store(store_url, clock=clock)
    try:
        yield opened
    finally:
        opened.close()


@dataclass
class Lapse:
    """Makes leases expire by the store's clock.

    With a ``FakeClock`` (SQLite), ``expire`` advances it past the ttl: no
    sleeping. On a server the ttl must be real and short, and ``expire``
    polls the store's own view of the lease until it has expired, with a
    deadline, rather than sleeping a guessed time.
    """

    clock: Clock
    ttl: float
    """Ttl for a lease a test means to let expire."""

    def expire(self, store: Store, lease: Lease) -> None:
        if isinstance(self.clock, FakeClock):
            self.clock.advance(lease.ttl + 1.0)
            return
        deadline = time.monotonic() + lease.ttl + 10.0
        while True:
            info = store.lease(lease.key)
            if info is None or info.owner != lease.run_id or info.expires_in is None or info.expires_in <= 0:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"lease {lease.key!r} still live {lease.ttl + 10.0:g}s after its ttl: {info}")
            # Poll a few times per remaining ttl, never busy-spin.
            time.sleep(min(0.05, max(0.005, info.expires_in / 4)))


@pytest.fixture
def lapse(clock: Clock) -> Lapse:
    return Lapse(clock=clock, ttl=30.0 if isinstance(clock, FakeClock) else 0.5)
