"""Concurrent writers with different tokens serialise: 8 processes × 200
fenced read–modify–write transactions each, on PostgreSQL, SQLite and Redis.

Writer ``p``'s ``k``-th write carries token ``8k + p + 1``: every token is
distinct and each writer's grow, as successive runs of a job would, while
the writers race. Accepted writes must form one sequence in token order
(the order the store committed them in, read from a serial column or the
counter's value), with no lost update (the counter equals the accepted
writes), and no trace of a refused one."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from processes import spawn_python

WRITERS = 8
WRITES = 200


def writer(kind: str, where: str, p: int) -> None:
    """One writer process: waits for the go line, writes, prints what
    happened as JSON (accepted tokens with their order key, refused ones)."""
    from cronwarden import Fenced
    from cronwarden.fence import fence, fenced_incrby

    sys.stdin.readline()
    accepted: list[tuple[int, int]] = []
    refused: list[int] = []
    if kind == "sqlite":
        import sqlite3

        conn = sqlite3.connect(where, timeout=60)
        for k in range(WRITES):
            token = WRITERS * k + p + 1
            try:
                with conn:
                    fence(conn, "counter", token)
                    value = conn.execute("SELECT value FROM counter").fetchone()[0]
                    conn.execute("UPDATE counter SET value = ?", (value + 1,))
                    cur = conn.execute("INSERT INTO ledger (token) VALUES (?)", (token,))
                accepted.append((token, int(cur.lastrowid or 0)))
            except Fenced:
                refused.append(token)
    elif kind == "postgres":
        import psycopg

        url, schema = where.split(" ")
        with psycopg.connect(url, options=f"-c search_path={schema}") as conn:
            for k in range(WRITES):
                token = WRITERS * k + p + 1
                try:
                    with conn.transaction():
                        fence(conn, "counter", token)
                        value = conn.execute("SELECT value FROM counter").fetchone()[0]  # type: ignore[index]
                        conn.execute("UPDATE counter SET value = %s", (value + 1,))
                        seq = conn.execute("INSERT INTO ledger (token) VALUES (%s) RETURNING seq",
                                           (token,)).fetchone()[0]  # type: ignore[index]  # fmt: skip
                    accepted.append((token, int(seq)))
                except Fenced:
                    refused.append(token)
    else:
        import redis

        url, key = where.split(" ")
        client = redis.Redis.from_url(url)
        for k in range(WRITES):
            token = WRITERS * k + p + 1
            try:
                accepted.append((token, fenced_incrby(client, key, 1, token)))
            except Fenced:
                refused.append(token)
    print(json.dumps({"accepted": accepted, "refused": refused}), flush=True)


def _race(kind: str, where: str) -> tuple[list[tuple[int, int]], list[int]]:
    procs = [spawn_python(f"from fencing.test_concurrent import writer; writer({kind!r}, {where!r}, {p})")
             for p in range(WRITERS)]  # fmt: skip
    for proc in procs:  # all started before any writes
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    accepted: list[tuple[int, int]] = []
    refused: list[int] = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        got = json.loads(out)
        accepted += [tuple(a) for a in got["accepted"]]  # type: ignore[misc]
        refused += got["refused"]
    assert len(accepted) + len(refused) == WRITERS * WRITES
    assert accepted and refused, "the race must both accept and refuse writes to test anything"
    return accepted, refused


def _serialised(accepted: list[tuple[int, int]]) -> list[int]:
    """The accepted tokens in commit order; asserts they never go down."""
    order = sorted(accepted, key=lambda a: a[1])
    assert len({o for _, o in order}) == len(order), "two writes share a place in the order"
    tokens = [t for t, _ in order]
    backwards = [(a, b) for a, b in itertools.pairwise(tokens) if b < a]
    assert not backwards, f"{len(backwards)} writes landed after a newer token's, e.g. {backwards[:3]}"
    return tokens


def test_sqlite_writers_serialise(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE counter (value INTEGER NOT NULL)")
        conn.execute("INSERT INTO counter VALUES (0)")
        conn.execute("CREATE TABLE ledger (seq INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER NOT NULL)")
    accepted, refused = _race("sqlite", str(db))
    tokens = _serialised(accepted)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM counter").fetchone()[0] == len(accepted)
        ledger = [t for (t,) in conn.execute("SELECT token FROM ledger ORDER BY seq")]
        fence_token = conn.execute("SELECT token FROM cronwarden_fences WHERE resource='counter'").fetchone()[
            0
        ]
    assert ledger == tokens
    assert not set(refused) & set(ledger)
    assert fence_token == max(tokens)


@pytest.mark.postgres
def test_postgres_writers_serialise(pg: Any, pg_schema: str) -> None:
    from conftest import POSTGRES_URL

    with pg.transaction():
        pg.execute(f'CREATE SCHEMA "{pg_schema}"')
        pg.execute(f'CREATE TABLE "{pg_schema}".counter (value int NOT NULL)')
        pg.execute(f'INSERT INTO "{pg_schema}".counter VALUES (0)')
        pg.execute(f'CREATE TABLE "{pg_schema}".ledger (seq bigserial PRIMARY KEY, token bigint NOT NULL)')
    accepted, refused = _race("postgres", f"{POSTGRES_URL} {pg_schema}")
    tokens = _serialised(accepted)
    with pg.transaction():
        assert pg.execute(f'SELECT value FROM "{pg_schema}".counter').fetchone()[0] == len(accepted)
        ledger = [t for (t,) in pg.execute(f'SELECT token FROM "{pg_schema}".ledger ORDER BY seq')]
        (fence_token,) = pg.execute(f'SELECT token FROM "{pg_schema}".cronwarden_fences').fetchone()
    assert ledger == tokens
    assert not set(refused) & set(ledger)
    assert fence_token == max(tokens)


@pytest.mark.redis
def test_redis_writers_serialise(rds: Any, redis_prefix: str) -> None:
    from conftest import REDIS_URL

    key = f"{redis_prefix}counter"
    accepted, _refused = _race("redis", f"{REDIS_URL} {key}")
    tokens = _serialised(accepted)  # ordered by INCRBY's reply: the order Redis ran them in
    assert int(rds.get(key)) == len(accepted)
    assert sorted(v for _, v in accepted) == list(range(1, len(accepted) + 1))
    assert int(rds.get(f"{key}:cronwarden_fence")) == max(tokens)
