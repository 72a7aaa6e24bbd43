"""The fencing helpers on each store the user writes to: a stale token
raises ``Fenced`` and changes nothing, an equal token passes (the same run
writing twice), a greater one advances the fence."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import POSTGRES_URL
from cronwarden import Fenced, UsageError
from cronwarden.fence import afence, fence, fenced_delete, fenced_hset, fenced_incrby, fenced_set

# -- SQLite ----------------------------------------------------------------------


def _sqlite(tmp_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(tmp_path / "app.db")
    with conn:
        conn.execute("CREATE TABLE totals (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
        conn.execute("INSERT INTO totals VALUES (1, 0)")
    return conn


def _sqlite_write(conn: sqlite3.Connection, token: int, amount: int) -> None:
    with conn:
        fence(conn, "totals", token)
        conn.execute("UPDATE totals SET amount = amount + ? WHERE id = 1", (amount,))


def _sqlite_state(conn: sqlite3.Connection) -> tuple[int, int]:
    amount = conn.execute("SELECT amount FROM totals").fetchone()[0]
    token = conn.execute("SELECT token FROM cronwarden_fences WHERE resource = 'totals'").fetchone()[0]
    return amount, token


def test_sqlite_stale_token_raises_and_leaves_everything_unchanged(tmp_path: Path) -> None:
    conn = _sqlite(tmp_path)
    _sqlite_write(conn, 7, 10)
    with pytest.raises(Fenced) as caught, conn:
        # A write before the fence, in the same transaction: it must not commit either.
        conn.execute("UPDATE totals SET amount = amount + 1000 WHERE id = 1")
        fence(conn, "totals", 6)
        conn.execute("UPDATE totals SET amount = amount + 5 WHERE id = 1")
    assert (caught.value.resource, caught.value.token, caught.value.current) == ("totals", 6, 7)
    assert "token 6 is older than 7" in str(caught.value)
    assert _sqlite_state(conn) == (10, 7)
    assert not conn.in_transaction


def test_sqlite_equal_token_passes_and_greater_advances(tmp_path: Path) -> None:
    conn = _sqlite(tmp_path)
    _sqlite_write(conn, 7, 10)
    _sqlite_write(conn, 7, 1)  # the same run, writing twice
    assert _sqlite_state(conn) == (11, 7)
    _sqlite_write(conn, 9, 1)
    assert _sqlite_state(conn) == (12, 9)
    with pytest.raises(Fenced):
        _sqlite_write(conn, 8, 1)
    assert _sqlite_state(conn) == (12, 9)


def test_sqlite_resources_are_fenced_separately_and_in_the_schema_asked(tmp_path: Path) -> None:
    conn = _sqlite(tmp_path)
    conn.execute(f"ATTACH DATABASE '{tmp_path / 'fences.db'}' AS fences")
    with conn:
        fence(conn, "a", 5, schema="fences")
        fence(conn, "b", 1, schema="fences")
    rows = conn.execute("SELECT resource, token FROM fences.cronwarden_fences ORDER BY resource").fetchall()
    assert rows == [("a", 5), ("b", 1)]
    assert (
        conn.execute("SELECT name FROM main.sqlite_master WHERE name = 'cronwarden_fences'").fetchall() == []
    )


def test_sqlite_autocommit_connection_is_refused(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    with pytest.raises(UsageError, match="autocommit"):
        fence(conn, "totals", 1)
    conn.execute("BEGIN")
    assert fence(conn, "totals", 1) == 1  # inside an explicit transaction it works
    conn.execute("COMMIT")


@pytest.mark.parametrize("token", ["x", "1.5", 1.5, True, None, 2**63])
def test_bad_token_is_one_line_usage_error(tmp_path: Path, token: Any) -> None:
    conn = _sqlite(tmp_path)
    with pytest.raises(UsageError, match="a fencing token must"):
        fence(conn, "totals", token)


def test_a_token_from_the_environment_is_accepted_as_text(tmp_path: Path) -> None:
    conn = _sqlite(tmp_path)
    with conn:
        assert fence(conn, "totals", "42") == 42


def test_an_unknown_connection_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="expected a psycopg Connection, a sqlite3 Connection or a redis"):
        fence(object(), "totals", 1)


# -- PostgreSQL ------------------------------------------------------------------


def _pg_setup(conn: Any, schema: str) -> None:
    from psycopg import sql

    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("CREATE TABLE {}.totals (id int PRIMARY KEY, amount int NOT NULL)")
                     .format(sql.Identifier(schema)))  # fmt: skip
        conn.execute(sql.SQL("INSERT INTO {}.totals VALUES (1, 0)").format(sql.Identifier(schema)))


def _pg_write(conn: Any, schema: str, token: int, amount: int) -> None:
    with conn.transaction():
        fence(conn, "totals", token, schema=schema)
        conn.execute(f'UPDATE "{schema}".totals SET amount = amount + %s WHERE id = 1', (amount,))


def _pg_state(conn: Any, schema: str) -> tuple[int, int]:
    with conn.transaction():
        amount = conn.execute(f'SELECT amount FROM "{schema}".totals').fetchone()[0]
        token = conn.execute(f"SELECT token FROM \"{schema}\".cronwarden_fences WHERE resource = 'totals'"
                             ).fetchone()[0]  # fmt: skip
    return int(amount), int(token)


@pytest.mark.postgres
def test_postgres_stale_token_raises_aborts_and_leaves_everything_unchanged(pg: Any, pg_schema: str) -> None:
    import psycopg

    _pg_setup(pg, pg_schema)
    _pg_write(pg, pg_schema, 7, 10)
    with pytest.raises(Fenced) as caught, pg.transaction():
        pg.execute(f'UPDATE "{pg_schema}".totals SET amount = amount + 1000 WHERE id = 1')
        fence(pg, "totals", 6, schema=pg_schema)
    assert (caught.value.token, caught.value.current) == (6, 7)
    assert _pg_state(pg, pg_schema) == (10, 7)
    # A caller that swallows Fenced still cannot commit: the statement failed in the server.
    try:
        fence(pg, "totals", 6, schema=pg_schema)
    except Fenced:
        pass
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        pg.execute(f'UPDATE "{pg_schema}".totals SET amount = amount + 1 WHERE id = 1')
    pg.rollback()
    assert _pg_state(pg, pg_schema) == (10, 7)


@pytest.mark.postgres
def test_postgres_equal_token_passes_and_greater_advances(pg: Any, pg_schema: str) -> None:
    _pg_setup(pg, pg_schema)
    _pg_write(pg, pg_schema, 7, 10)
    _pg_write(pg, pg_schema, 7, 1)
    assert _pg_state(pg, pg_schema) == (11, 7)
    _pg_write(pg, pg_schema, 9, 1)
    assert _pg_state(pg, pg_schema) == (12, 9)
    with pytest.raises(Fenced):
        _pg_write(pg, pg_schema, 8, 1)
    assert _pg_state(pg, pg_schema) == (12, 9)


@pytest.mark.postgres
def test_postgres_creates_schema_table_and_function_on_demand_and_sql_form_works(pg: Any, pg_schema: str
                                                                                 ) -> None:  # fmt: skip
    import psycopg

    with pg.transaction():  # the schema does not exist yet: created with the table
        fence(pg, "nightly", 3, schema=pg_schema)
    # The SQL-only form, as a shell job's psql would call it.
    with psycopg.connect(POSTGRES_URL, autocommit=True) as other:
        other.execute(f'SELECT "{pg_schema}".cronwarden_fence(%s, %s)', ("nightly", 4))
        with pytest.raises(psycopg.Error) as caught:
            other.execute(f'SELECT "{pg_schema}".cronwarden_fence(%s, %s)', ("nightly", 2))
    assert caught.value.sqlstate == "CWF01"
    assert caught.value.diag.message_detail == "4"
    with pytest.raises(Fenced), pg.transaction():
        fence(pg, "nightly", 3, schema=pg_schema)


@pytest.mark.postgres
def test_postgres_default_schema_is_the_connections_current_one(pg_schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, options=f"-c search_path={pg_schema}") as conn:
        conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        conn.commit()
        with conn.transaction():
            fence(conn, "r", 1)
        row = conn.execute(f'SELECT token FROM "{pg_schema}".cronwarden_fences').fetchone()
    assert row == (1,)


@pytest.mark.postgres
def test_postgres_autocommit_outside_a_transaction_is_refused(pg_schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        with pytest.raises(UsageError, match="autocommit"):
            fence(conn, "r", 1, schema=pg_schema)
        with conn.transaction():
            assert fence(conn, "r", 1, schema=pg_schema) == 1


@pytest.mark.postgres
def test_postgres_async(pg_schema: str) -> None:
    import psycopg

    async def scenario() -> tuple[int | None, list[Any]]:
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as conn:
            async with conn.transaction():
                await afence(conn, "r", 5, schema=pg_schema)
            async with conn.transaction():
                await afence(conn, "r", 5, schema=pg_schema)
            current = None
            try:
                async with conn.transaction():
                    await afence(conn, "r", 4, schema=pg_schema)
            except Fenced as e:
                current = e.current
            rows = await (await conn.execute(f'SELECT resource, token FROM "{pg_schema}".cronwarden_fences')
                          ).fetchall()  # fmt: skip
            with pytest.raises(UsageError, match="afence"):
                fence(conn, "r", 6)
            return current, rows

    assert asyncio.run(scenario()) == (5, [("r", 5)])


# -- Redis -----------------------------------------------------------------------


@pytest.mark.redis
def test_redis_incrby_stale_raises_and_leaves_the_key_unchanged(rds: Any, redis_prefix: str) -> None:
    key = f"{redis_prefix}total"
    assert fenced_incrby(rds, key, 10, 7) == 10
    assert fenced_incrby(rds, key, 1, 7) == 11  # equal token
    with pytest.raises(Fenced) as caught:
        fenced_incrby(rds, key, 100, 6)
    assert caught.value.current == 7
    assert rds.get(key) == b"11"
    assert fenced_incrby(rds, key, 1, 8) == 12
    assert rds.get(f"{key}:cronwarden_fence") == b"8"


@pytest.mark.redis
def test_redis_set_hset_delete_and_a_shared_resource(rds: Any, redis_prefix: str) -> None:
    res = f"{redis_prefix}report"
    a, b = f"{redis_prefix}report:a", f"{redis_prefix}report:b"
    fenced_set(rds, a, "v1", 5, resource=res, px=60_000)
    assert rds.get(a) == b"v1" and 0 < rds.pttl(a) <= 60_000
    assert fenced_hset(rds, b, {"x": 1, "y": "2"}, 6, resource=res) == 2
    with pytest.raises(Fenced):
        fenced_set(rds, a, "late", 5, resource=res)  # the resource has seen 6
    with pytest.raises(Fenced):
        fenced_delete(rds, b, 5, resource=res)
    assert rds.get(a) == b"v1" and rds.hgetall(b) == {b"x": b"1", b"y": b"2"}
    assert fenced_delete(rds, a, 6, resource=res) == 1
    assert fence(rds, res, 9) == 9
    with pytest.raises(Fenced):
        fence(rds, res, 8)
    with pytest.raises(UsageError, match="at least one field"):
        fenced_hset(rds, b, {}, 9, resource=res)
