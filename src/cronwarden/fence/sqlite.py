"""``fence`` on a ``sqlite3`` connection (see ``cronwarden.fence``)."""

from __future__ import annotations

import os
import sqlite3
from functools import cache

from cronwarden.errors import Fenced, UsageError


@cache
def _queries() -> dict[str, str]:
    from cronwarden.stores.sql import queries

    return queries(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sqlite.sql"))


@cache
def _statement(name: str, schema: str) -> str:
    return _queries()[name].replace("{schema}", '"' + schema.replace('"', '""') + '"')


def fence(conn: sqlite3.Connection, resource: str, token: int, schema: str) -> int:
    if not conn.in_transaction and (
        conn.isolation_level is None or getattr(conn, "autocommit", None) is True
    ):
        raise UsageError(
            "fence() needs the transaction its writes are in: the sqlite3 connection is in autocommit "
            "mode, so BEGIN first (or use the default isolation_level)"
        )
    stmt = _statement("fence", schema)
    try:
        changed = conn.execute(stmt, (resource, token)).rowcount
    except sqlite3.OperationalError as e:
        # The one hot-path statement, the table made only when it is missing:
        # a failed statement leaves SQLite's transaction as it was.
        if "no such table" not in str(e):
            raise
        conn.execute(_statement("create", schema))
        changed = conn.execute(stmt, (resource, token)).rowcount
    if changed == 1:
        return token
    row = conn.execute(_statement("newest", schema), (resource,)).fetchone()
    # What the transaction wrote before the fence must not commit either.
    conn.rollback()
    raise Fenced(resource, token, None if row is None else int(row[0]))
