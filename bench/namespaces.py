"""A benchmark's own namespace on the shared servers: a PostgreSQL schema or
a Redis key prefix per run, named ``cw_bench_<unique>``, and its removal."""

from __future__ import annotations

import os

POSTGRES = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("CRONWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")


def url_for(store: str, unique: str) -> str:
    """The store URL of the namespace, for ``postgres`` or ``redis``."""
    if store == "postgres":
        return f"{POSTGRES}{'&' if '?' in POSTGRES else '?'}schema=cw_bench_{unique}"
    return f"{REDIS}{'&' if '?' in REDIS else '?'}prefix=cw_bench_{unique}:"


def cleanup(store: str, unique: str) -> None:
    """Drop the namespace's schema or delete its keys (nothing for SQLite).
    Keys go by ``UNLINK``: the server frees them in the background, where a
    ``DEL`` of a run's big hashes (a million fields) holds the server for
    seconds, and every other client of a shared server meanwhile times out."""
    if store == "postgres":
        import psycopg

        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "cw_bench_{unique}" CASCADE')
    elif store == "redis":
        import redis

        client = redis.Redis.from_url(REDIS)
        try:
            batch = []
            for key in client.scan_iter(match=f"cw_bench_{unique}:*", count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    client.unlink(*batch)
                    batch.clear()
            if batch:
                client.unlink(*batch)
        finally:
            client.close()
