"""``fence`` and ``afence`` on psycopg 3 connections (see ``cronwarden.fence``).

The hot path is one statement, ``SELECT schema.cronwarden_fence(resource,
token)``. A connection's first call per schema asks whether the function is
there (one more round trip) and creates it, with its table, when it is not;
the connection trusts the function from then on only once it found it
already there, so one whose creating transaction rolled back asks again.
"""

from __future__ import annotations

import os
import weakref
from functools import cache
from typing import Any

import psycopg
from psycopg import sql

from cronwarden.errors import Fenced, UsageError

FENCED = "CWF01"
"""The SQLSTATE ``cronwarden_fence`` raises for a stale token."""

_ready: weakref.WeakKeyDictionary[Any, dict[str | None, str]] = weakref.WeakKeyDictionary()
"""The fence statement by connection and schema, once the function was found."""


@cache
def queries() -> dict[str, str]:
    from cronwarden.stores.sql import queries

    return queries(os.path.join(os.path.dirname(os.path.abspath(__file__)), "postgres.sql"))


def script(name: str, quoted: str) -> str:
    """A query with ``{schema}`` filled in. (The DDL runs with no
    parameters; the fence statement has them, so its caller doubles any
    ``%`` in the name first.)"""
    return queries()[name].replace("{schema}", quoted)


def _check_transaction(conn: Any) -> None:
    if conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        raise UsageError(
            "fence() needs the transaction its writes are in: the connection is in autocommit mode, "
            "so call it inside 'with conn.transaction():'"
        )


def _fenced(e: psycopg.Error, resource: str, token: int) -> Fenced | None:
    if e.sqlstate != FENCED:
        return None
    detail = e.diag.message_detail
    return Fenced(resource, token, int(detail) if detail and detail.lstrip("-").isdigit() else None)


def _plan(name: str, conn: Any) -> tuple[str, str, str]:
    """(quoted schema, probe's namespace argument, probe's procedure argument)."""
    quoted = sql.Identifier(name).as_string(conn)
    return quoted, quoted, f"{quoted}.cronwarden_fence(text,bigint)"


def fence(conn: psycopg.Connection[Any], resource: str, token: int, schema: str | None) -> int:
    _check_transaction(conn)
    stmt = _ready.get(conn, {}).get(schema)
    if stmt is None:
        stmt = _prepare(conn, schema)
    try:
        conn.execute(stmt, (resource, token))
    except psycopg.Error as e:
        fenced = _fenced(e, resource, token)
        if fenced is None:
            raise
        raise fenced from None
    return token


def _prepare(conn: psycopg.Connection[Any], schema: str | None) -> str:
    name = schema
    if name is None:
        row = conn.execute(queries()["current_schema"]).fetchone()
        name = None if row is None else row[0]
        if name is None:
            raise UsageError("fence(): the connection has no current schema; pass schema=")
    quoted, ns, proc = _plan(name, conn)
    stmt = script("fence", quoted.replace("%", "%%"))
    row = conn.execute(queries()["probe"], (ns, proc)).fetchone()
    has_schema, has_function = (False, False) if row is None else (bool(row[0]), bool(row[1]))
    if has_function:
        _ready.setdefault(conn, {})[schema] = stmt
        return stmt
    conn.execute(queries()["lock"], (name,))
    if not has_schema:
        conn.execute(script("create_schema", quoted).encode())
    conn.execute(script("create", quoted).encode())
    return stmt


async def afence(conn: psycopg.AsyncConnection[Any], resource: str, token: int, schema: str | None) -> int:
    _check_transaction(conn)
    stmt = _ready.get(conn, {}).get(schema)
    if stmt is None:
        stmt = await _aprepare(conn, schema)
    try:
        await conn.execute(stmt, (resource, token))
    except psycopg.Error as e:
        fenced = _fenced(e, resource, token)
        if fenced is None:
            raise
        raise fenced from None
    return token


async def _aprepare(conn: psycopg.AsyncConnection[Any], schema: str | None) -> str:
    name = schema
    if name is None:
        row = await (await conn.execute(queries()["current_schema"])).fetchone()
        name = None if row is None else row[0]
        if name is None:
            raise UsageError("afence(): the connection has no current schema; pass schema=")
    quoted, ns, proc = _plan(name, conn)
    stmt = script("fence", quoted.replace("%", "%%"))
    row = await (await conn.execute(queries()["probe"], (ns, proc))).fetchone()
    has_schema, has_function = (False, False) if row is None else (bool(row[0]), bool(row[1]))
    if has_function:
        _ready.setdefault(conn, {})[schema] = stmt
        return stmt
    await conn.execute(queries()["lock"], (name,))
    if not has_schema:
        await conn.execute(script("create_schema", quoted).encode())
    await conn.execute(script("create", quoted).encode())
    return stmt
