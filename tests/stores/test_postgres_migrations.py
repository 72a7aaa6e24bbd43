"""The PostgreSQL store's schema migrations: a schema written by an earlier
version upgrades in place when a newer cronwarden opens it, with its leases,
fencing counters and open runs intact."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest

from cronwarden.events import EventKind, Outcome
from cronwarden.lease import Lease
from cronwarden.stores import open_store
from cronwarden.stores.base import End, EventQuery, Granted, Start
from cronwarden.stores.sql import migrations, read_sql
from pgserver import unavailable

psycopg = pytest.importorskip("psycopg")
postgres_store = pytest.importorskip("cronwarden.stores.postgres")

pytestmark = pytest.mark.postgres

SHARED = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def schema() -> Iterator[str]:
    try:
        with psycopg.connect(SHARED, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as e:
        unavailable(f"PostgreSQL not reachable at {SHARED}: {str(e).splitlines()[0]}")
    name = f"cw_migrate_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(SHARED, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def migration(version: int) -> str:
    """The SQL of one migration file, as the store applies it."""
    return read_sql(migrations(postgres_store.MIGRATIONS_DIR)[version])


def create_at_version(schema: str, version: int) -> None:
    """The schema exactly as a cronwarden that knew up to ``version`` left it."""
    s = f'"{schema}"'
    with psycopg.connect(SHARED, autocommit=True) as conn, conn.transaction():
        conn.execute(f"CREATE SCHEMA {s}")
        conn.execute(f"CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL)")
        for v in migrations(postgres_store.MIGRATIONS_DIR):
            if v <= version:
                conn.execute(migration(v).replace("{s}", s))
        conn.execute(f"INSERT INTO {s}.meta VALUES ('schema_version', %s)", (str(version),))


def start(job: str = "nightly") -> Start:
    return Start(job=job, key=job, run_id=str(uuid.uuid4()), host="h", pid=1, ttl=60.0, at=time.time())


def version_of(schema: str) -> int:
    with psycopg.connect(SHARED, autocommit=True) as conn:
        row = conn.execute(
            f'SELECT value FROM "{schema}".meta WHERE key = %s', ("schema_version",)
        ).fetchone()
    assert row is not None
    return int(row[0])


def indexes(schema: str, table: str) -> set[str]:
    with psycopg.connect(SHARED, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = %s", (schema, table)
        ).fetchall()
    return {r[0] for r in rows}


def test_a_version_2_schema_upgrades_in_place_keeping_leases_runs_and_tokens(schema: str) -> None:
    create_at_version(schema, 2)
    s = f'"{schema}"'
    # A version-2 run in flight: its lease, run row and `started` event,
    # written by version 2's own acquire().
    with psycopg.connect(SHARED, autocommit=True) as conn:
        acquire = (
            f"SELECT out_token FROM {s}.acquire('nightly', 'nightly', %s, 'old', 7, 60, %s, NULL, 'skip', 1)"
        )
        finish = (
            f"SELECT * FROM {s}.finish('nightly', 'nightly', %s, %s, 'succeeded', %s, 0, '', NULL, false, "
            "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
        )
        for i in range(3):
            run_id = str(uuid.uuid4())
            row = conn.execute(acquire, (run_id, time.time())).fetchone()
            assert row is not None and row[0] == i + 1
            if i < 2:
                conn.execute(finish, (run_id, row[0], time.time()))
        old_run = conn.execute(f"SELECT run_id, token FROM {s}.runs WHERE outcome IS NULL").fetchone()
    assert old_run is not None
    old_run_id, old_token = old_run

    url = f"{SHARED}?schema={schema}"
    with open_store(url) as store:
        assert version_of(schema) == postgres_store.SCHEMA_VERSION
        # The old run is still open and still holds its lease.
        assert [r.run_id for r in store.open_runs("nightly")] == [old_run_id]
        assert not isinstance(store.acquire(start()), Granted)
        finished = store.finish(
            Lease(key="nightly", job="nightly", run_id=old_run_id, token=old_token, ttl=60.0),
            End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0),
        )
        assert finished.owned and finished.recorded
        assert store.open_runs() == []
        # The fencing counter went on from where version 2 left it.
        new = store.acquire(start())
        assert isinstance(new, Granted) and new.lease.token == old_token + 1
        kinds = [
            e.kind for e in store.events(EventQuery(job="nightly", run_id=old_run_id, newest_first=False))
        ]
        assert kinds == [EventKind.STARTED, EventKind.SUCCEEDED]
        # What version 3 added, and version 5.
        assert store.lock("nightly", "a", 60.0) == 1
        assert store.claim_slot("nightly", 1_700_000_040.0, "a", 60.0) == "a"
    # Version 4: one events index for reads by job, and no runs index that
    # finish() would have to update; version 15: partial ones of the trouble
    # of the finding and of the pause kinds (a run's own events have no entry in them).
    assert indexes(schema, "events") == {"events_pkey", "events_event_id_key", "events_job_kind_at",
                                         "events_trouble", "events_findings", "events_pauses"}  # fmt: skip
    assert indexes(schema, "runs") == {"runs_pkey", "runs_job_started"}
    assert indexes(schema, "slot_claims") == {"slot_claims_pkey"}

    # Opening it again is a no-op.
    with open_store(url) as store:
        assert version_of(schema) == postgres_store.SCHEMA_VERSION
        assert store.lock("nightly", "b", 60.0) is None
        assert store.claim_slot("nightly", 1_700_000_040.0, "b", 60.0) == "a"


def test_a_version_1_schema_upgrades_in_place(schema: str) -> None:
    create_at_version(schema, 1)
    with open_store(f"{SHARED}?schema={schema}") as store:
        assert version_of(schema) == postgres_store.SCHEMA_VERSION
        granted = store.acquire(start())
        assert isinstance(granted, Granted) and granted.lease.token == 1
        assert store.undelivered("sink", 10)[0].kind is EventKind.STARTED
        assert store.lock("leader", "a", 60.0) == 1


def test_a_version_4_schema_upgrades_in_place_and_claims_slots(schema: str) -> None:
    create_at_version(schema, 4)
    with psycopg.connect(SHARED, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT out_token FROM \"{schema}\".acquire('nightly', 'nightly', 'old-run', 'old', 7, 60, %s, "
            "NULL, 'skip', 1)",
            (time.time(),),
        ).fetchone()
    assert row == (1,)

    with open_store(f"{SHARED}?schema={schema}") as store:
        assert version_of(schema) == postgres_store.SCHEMA_VERSION >= 5
        assert store.claim_slot("nightly", 1_700_000_040.0, "a", 60.0) == "a"
        assert store.claim_slot("nightly", 1_700_000_040.0, "b", 60.0) == "a"
        assert [r.run_id for r in store.open_runs()] == ["old-run"], "version 4's open run is kept"
        assert store.events(EventQuery(job="nightly", kinds=[EventKind.STARTED]))[0].run_id == "old-run"
