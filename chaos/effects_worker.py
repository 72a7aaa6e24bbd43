"""The command each ``cronwarden run`` runs in effects mode: read–modify–write
increments of a counter in the user's own databases, through the fencing
helpers, ``--steps`` times, with the run's ``CRONWARDEN_FENCING_TOKEN``.

Each step reads the counter in PostgreSQL (a table) and in Redis (a hash),
works (``--sleep``: the window a paused holder is frozen in), then writes
each counter back as the value it read plus one, with a record of the write
(run, token, step) made atomically with it. The read and the write are two
short transactions, each fenced first (``fence``; on Redis ``fence`` then
``fenced_hset``): a newer run's fenced read raises the fence, so the older
run's write after it fails, whatever it read. The work happens outside any
transaction, so a frozen run holds no lock the next run would wait on.

With ``--no-fencing`` (the positive control) the same reads and writes are
made without the helpers.

The referee only records: every read and write is reported to it
(``EFFECT``), which is how the harness finds the run to freeze, sees the
takeover, and knows which writes the database acknowledged.

Exit status: 0 done; 5 fenced out (a helper raised ``Fenced``: this run's
token is stale, so it stops, as a fenced job should); 6 referee gone or a
database error.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from functools import cache
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
EXIT_FENCED = 5
EXIT_GONE = 6


@cache
def queries(schema: str) -> dict[str, str]:
    from cronwarden.stores.sql import queries

    return {k: v.replace("{schema}", schema) for k, v in queries(os.path.join(HERE, "effects.sql")).items()}


class PostgresCounter:
    name = "postgres"

    def __init__(self, url: str, schema: str, resource: str, idle_timeout_ms: int) -> None:
        import psycopg
        from psycopg import sql

        # As docs/fencing.md advises: a holder frozen inside a transaction is
        # aborted by the server instead of stalling the next run.
        options = f"-c idle_in_transaction_session_timeout={idle_timeout_ms}"
        self.conn = psycopg.connect(url, autocommit=True, options=options, connect_timeout=10)
        self.schema = schema
        self.q = queries(sql.Identifier(schema).as_string(self.conn))
        self.resource = resource

    def read(self, token: int, fenced: bool) -> int:
        from cronwarden.fence import fence

        with self.conn.transaction():
            if fenced:
                fence(self.conn, self.resource, token, schema=self.schema)
            row = self.conn.execute(self.q["read"]).fetchone()
        assert row is not None
        return int(row[0])

    def write(self, value: int, run: str, token: int, step: int, fenced: bool) -> None:
        from cronwarden.fence import fence

        with self.conn.transaction():
            if fenced:
                fence(self.conn, self.resource, token, schema=self.schema)
            self.conn.execute(self.q["update"], (value,))
            self.conn.execute(self.q["record"], (run, token, step, value))


class RedisCounter:
    """The counter is the hash's ``value``; the write that set it to ``n``
    is recorded in its field ``w<n>``, in the same call."""

    name = "redis"

    def __init__(self, url: str, key: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=30)
        self.key = key

    def read(self, token: int, fenced: bool) -> int:
        from cronwarden.fence import fence

        if fenced:
            fence(self.client, self.key, token)
        return int(self.client.hget(self.key, "value") or 0)

    def write(self, value: int, run: str, token: int, step: int, fenced: bool) -> None:
        from cronwarden.fence import fenced_hset

        mapping = {"value": value, f"w{value}": f"{run} {token} {step}"}
        if fenced:
            fenced_hset(self.client, self.key, mapping, token)
        else:
            self.client.hset(self.key, mapping=mapping)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos-effects-worker")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.1, help="seconds between each read and its write")
    p.add_argument("--no-fencing", action="store_true")
    p.add_argument("--postgres", metavar="URL")
    p.add_argument("--schema", default="public")
    p.add_argument("--idle-timeout-ms", type=int, default=60_000)
    p.add_argument("--redis", metavar="URL")
    p.add_argument("--key", default="cw_effects:counter")
    args = p.parse_args(argv)
    run = os.environ["CRONWARDEN_RUN_ID"]
    token = int(os.environ["CRONWARDEN_FENCING_TOKEN"])
    fenced = not args.no_fencing
    try:
        sock = socket.create_connection(("127.0.0.1", args.port), timeout=30)
    except OSError:
        return EXIT_GONE
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    f = sock.makefile("rb")

    def ask(line: str) -> None:
        sock.sendall(line.encode() + b"\n")
        if not f.readline():
            raise ConnectionError

    def note(op: str, ok: bool, **fields: Any) -> None:
        ask(f"EFFECT {op} {int(ok)} {json.dumps(fields, separators=(',', ':'))}")

    from cronwarden import Fenced

    try:
        ask(f"HELLO {run} {token} {os.getpid()}")
        counters: list[Any] = []
        try:
            if args.postgres:
                counters.append(PostgresCounter(args.postgres, args.schema, "counter", args.idle_timeout_ms))
            if args.redis:
                counters.append(RedisCounter(args.redis, args.key))
            for step in range(args.steps):
                values: dict[str, int] = {}
                refused: list[str] = []
                for c in counters:  # a stale run still tries every counter, so each helper is tested
                    try:
                        values[c.name] = c.read(token, fenced)
                    except Fenced:
                        refused.append(c.name)
                note("read", not refused, values=values, fenced=refused, step=step)
                if refused:
                    return EXIT_FENCED
                time.sleep(args.sleep)
                for c in counters:
                    value = values[c.name] + 1
                    try:
                        c.write(value, run, token, step, fenced)
                    except Fenced:
                        refused.append(c.name)
                        note("write", False, target=c.name, value=value, step=step, fenced=True)
                    else:
                        note("write", True, target=c.name, value=value, step=step)
                if refused:
                    return EXIT_FENCED
        except (OSError, ConnectionError):
            raise
        except Exception as e:  # a database error: recorded, never counted as a write
            note("error", False, error=f"{type(e).__name__}: {e}"[:300])
            return EXIT_GONE
    except (OSError, ConnectionError):
        return EXIT_GONE
    return 0


if __name__ == "__main__":
    sys.exit(main())
