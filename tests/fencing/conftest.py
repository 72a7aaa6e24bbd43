"""Fixtures for the fencing helpers: the user's own connections, on the
test servers (a fresh PostgreSQL schema, a fresh Redis key prefix) and on a
SQLite file under tmp_path."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import (
    POSTGRES_URL,
    REDIS_URL,
    BackendProbe,
    _delete_redis_prefix,
    _drop_postgres_schema,
    unavailable,
)


@pytest.fixture
def pg_schema(backend_probe: BackendProbe) -> Iterator[str]:
    why = backend_probe.why_not("postgres")
    if why is not None:
        unavailable(why)
    schema = f"cw_fence_{uuid.uuid4().hex[:12]}"
    yield schema
    _drop_postgres_schema(schema)


@pytest.fixture
def pg(pg_schema: str) -> Iterator[Any]:
    import psycopg

    with psycopg.connect(POSTGRES_URL) as conn:
        yield conn


@pytest.fixture
def redis_prefix(backend_probe: BackendProbe) -> Iterator[str]:
    why = backend_probe.why_not("redis")
    if why is not None:
        unavailable(why)
    prefix = f"cw_fence_{uuid.uuid4().hex[:12]}:"
    yield prefix
    _delete_redis_prefix(prefix)


@pytest.fixture
def rds(redis_prefix: str) -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()
