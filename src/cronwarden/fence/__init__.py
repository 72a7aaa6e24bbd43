"""Fence the effects: make a late write of a run that lost its lease fail in
the place it writes to.

A lease can expire while its holder is paused (a GC pause, a frozen VM, a
stopped container); when the holder wakes, it may write before it notices.
Each run gets a fencing token (``run.token``, ``$CRONWARDEN_FENCING_TOKEN``)
greater than every earlier run's of the job. These helpers keep, per
resource, the newest token that has written it, and refuse a write with an
older one by raising ``Fenced``:

- ``fence(conn, resource, token)``: PostgreSQL (a psycopg 3 connection) or
  SQLite (a ``sqlite3`` connection), inside the caller's transaction, one
  statement. Call it first in the transaction: it locks the resource's fence
  row until commit, so writers of one resource take turns.
- ``afence(conn, resource, token)``: the same for psycopg's ``AsyncConnection``.
- ``fenced_set``, ``fenced_incrby``, ``fenced_hset``, ``fenced_delete``: Redis
  writes that check the fence and write in one script call; ``fence`` on a
  Redis client advances the fence alone.

An equal token passes (the same run writing twice), a greater one advances
the fence. See docs/fencing.md for the SQL-only form, what fencing covers and
what it cannot.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from cronwarden.errors import Fenced, UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "Fenced",
    "afence",
    "fence",
    "fenced_delete",
    "fenced_hset",
    "fenced_incrby",
    "fenced_set",
    "token_from_env",
]

TOKEN_ENV = "CRONWARDEN_FENCING_TOKEN"


def token_from_env() -> int:
    """The running job's token, from ``$CRONWARDEN_FENCING_TOKEN`` (set by
    ``cronwarden run`` and the scheduler for the command they start).

    :raises UsageError: the variable is unset or not an integer
    """
    raw = os.environ.get(TOKEN_ENV)
    if raw is None:
        raise UsageError(f"${TOKEN_ENV} is not set; expected the command to run under cronwarden run")
    return check_token(raw)


def check_token(token: int | str) -> int:
    """``token`` as an int: an int, or its decimal text (as the environment
    holds it).

    :raises UsageError: anything else
    """
    if isinstance(token, bool) or not isinstance(token, int | str):
        raise UsageError(f"a fencing token must be an integer, got {type(token).__name__} {token!r}")
    if isinstance(token, str):
        text = token.strip()
        if not text.lstrip("-").isdigit():
            raise UsageError(f"a fencing token must be an integer, got {token!r}")
        token = int(text)
    if not -(2**63) <= token < 2**63:
        raise UsageError(f"a fencing token must fit in 64 bits, got {token}")
    return token


def check_resource(resource: str) -> str:
    if not isinstance(resource, str) or not resource:
        raise UsageError(f"a fence's resource must be a non-empty string, got {resource!r}")
    return resource


def fence(conn: Any, resource: str, token: int | str, *, schema: str | None = None) -> int:
    """Check and advance ``resource``'s fence to ``token`` in ``conn``'s
    current transaction, in one statement: a ``psycopg.Connection`` or a
    ``sqlite3.Connection`` (or a ``redis.Redis`` client, where it stands
    alone: Redis has no transaction to join). The fence table
    ``cronwarden_fences`` (and, on PostgreSQL, the function
    ``cronwarden_fence``) is created on first use in ``schema``: on
    PostgreSQL the connection's current schema when None, on SQLite ``main``
    (or an attached database's name).

    :return: ``token``, now the resource's newest
    :raises Fenced: the resource has seen a newer token. Nothing was
        written; on PostgreSQL the transaction is aborted (it can only roll
        back), on SQLite it is rolled back
    :raises UsageError: a bad token or resource, a connection in autocommit
        mode outside a transaction, or a connection of no supported kind
    """
    resource, number = check_resource(resource), check_token(token)
    kind = _kind(conn)
    if kind == "sqlite":
        from cronwarden.fence import sqlite

        return sqlite.fence(conn, resource, number, schema or "main")
    if kind == "postgres":
        from cronwarden.fence import postgres

        return postgres.fence(conn, resource, number, schema)
    if kind == "redis":
        from cronwarden.fence import redis

        redis.fence(conn, resource, number)
        return number
    if kind == "postgres-async":
        raise UsageError("fence() got a psycopg AsyncConnection: use 'await afence(conn, resource, token)'")
    raise UsageError(
        f"fence() got a {type(conn).__module__}.{type(conn).__name__}; expected a psycopg Connection, "
        "a sqlite3 Connection or a redis.Redis client"
    )


async def afence(conn: Any, resource: str, token: int | str, *, schema: str | None = None) -> int:
    """``fence`` for a ``psycopg.AsyncConnection``: the same statement, the
    same errors."""
    resource, number = check_resource(resource), check_token(token)
    if _kind(conn) != "postgres-async":
        raise UsageError(
            f"afence() got a {type(conn).__module__}.{type(conn).__name__}; expected a psycopg "
            "AsyncConnection (fence() takes the synchronous connections)"
        )
    from cronwarden.fence import postgres

    return await postgres.afence(conn, resource, number, schema)


def _kind(conn: Any) -> str | None:
    """Which helper ``conn`` needs. Only modules the caller already imported
    are looked at: a connection's module is loaded by the time it exists."""
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and isinstance(conn, sqlite3.Connection):
        return "sqlite"
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None:
        if isinstance(conn, psycopg.Connection):
            return "postgres"
        if isinstance(conn, psycopg.AsyncConnection):
            return "postgres-async"
    redis = sys.modules.get("redis")
    if redis is not None and isinstance(conn, redis.Redis):
        return "redis"
    return None


def _target(key: str, resource: str | None) -> tuple[str, str]:
    """(resource, key) for a Redis write: the key is its own resource unless
    one is named."""
    check_resource(key)
    return check_resource(resource if resource is not None else key), key


def fenced_set(
    client: Any, key: str, value: str | bytes | int | float, token: int | str, *,
    resource: str | None = None, px: int | None = None,
) -> None:  # fmt: skip
    """Redis ``SET key value [PX px]`` if ``token`` passes the fence of
    ``resource`` (``key`` when None), in one script call.

    :raises Fenced: the resource has seen a newer token; the key is unchanged
    """
    from cronwarden.fence import redis

    redis.call(client, "fenced_set", *_target(key, resource), check_token(token),
               [value, "" if px is None else int(px)])  # fmt: skip


def fenced_incrby(
    client: Any, key: str, amount: int, token: int | str, *, resource: str | None = None
) -> int:
    """Redis ``INCRBY key amount`` if ``token`` passes the fence of
    ``resource`` (``key`` when None), in one script call.

    :return: the key's new value
    :raises Fenced: the resource has seen a newer token; the key is unchanged
    """
    from cronwarden.fence import redis

    return int(
        redis.call(client, "fenced_incrby", *_target(key, resource), check_token(token), [int(amount)])
    )


def fenced_hset(
    client: Any, key: str, mapping: Mapping[str, str | bytes | int | float], token: int | str, *,
    resource: str | None = None,
) -> int:  # fmt: skip
    """Redis ``HSET key field value …`` if ``token`` passes the fence of
    ``resource`` (``key`` when None), in one script call.

    :return: the number of fields added
    :raises Fenced: the resource has seen a newer token; the hash is unchanged
    """
    from cronwarden.fence import redis

    if not mapping:
        raise UsageError("fenced_hset() needs at least one field")
    args = [x for pair in mapping.items() for x in pair]
    return int(redis.call(client, "fenced_hset", *_target(key, resource), check_token(token), args))


def fenced_delete(client: Any, key: str, token: int | str, *, resource: str | None = None) -> int:
    """Redis ``DEL key`` if ``token`` passes the fence of ``resource``
    (``key`` when None), in one script call.

    :return: the number of keys removed (0 or 1)
    :raises Fenced: the resource has seen a newer token; the key is unchanged
    """
    from cronwarden.fence import redis

    return int(redis.call(client, "fenced_delete", *_target(key, resource), check_token(token), []))
