"""The PostgreSQL store behind PgBouncer in transaction mode (``pooler=transaction``):
nothing kept in a server session, so many clients share a few of them. The
contract suite runs through it too (``tests/contract``, backend ``pgbouncer``)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from tests.conftest import POSTGRES_URL, BackendProbe, _drop_postgres_schema, unavailable
from tests.contract import end, granted, start
from tests.pgbouncer import PgBouncer, pgbouncer, why_not

from cronwarden.errors import StoreError, StoreUnavailable, StoreUrlError
from cronwarden.stores import open_store

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def bouncer(backend_probe: BackendProbe) -> Iterator[PgBouncer]:
    why = backend_probe.why_not("postgres") or why_not()
    if why is not None:
        unavailable(why)
    with pgbouncer(POSTGRES_URL) as running:
        yield running


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"cw_pgb_{uuid.uuid4().hex[:12]}"
    yield name
    _drop_postgres_schema(name)


def test_without_pooler_the_error_says_to_add_it(bouncer: PgBouncer, schema: str) -> None:
    url = bouncer.url(schema=schema).replace("pooler=transaction&", "")
    with pytest.raises(StoreError) as caught:
        open_store(url)
    assert not isinstance(caught.value, StoreUnavailable), "a configuration error, not a blip"
    assert "pooler=transaction" in str(caught.value) and "\n" not in str(caught.value)


def test_an_unknown_pooler_is_refused_in_one_line() -> None:
    with pytest.raises(StoreUrlError) as caught:
        open_store(f"{POSTGRES_URL}?pooler=session")
    assert "pooler must be one of none, transaction, got 'session'" in str(caught.value)


def test_many_stores_share_a_few_server_sessions(bouncer: PgBouncer, schema: str) -> None:
    """Six stores (threads) cycle through acquire, renew, renew_many and
    finish, far more often than psycopg's prepare threshold, on PgBouncer's
    four server sessions: each statement lands on whichever session is free.
    A statement prepared on one session, or a session setting, would fail or
    be missing on the next."""
    errors: list[BaseException] = []
    cycles = 25

    def worker(n: int) -> None:
        try:
            with open_store(bouncer.url(schema=schema)) as store:
                for i in range(cycles):
                    lease = granted(store.acquire(start(f"job-{n}-{i % 3}", ttl=30.0))).lease
                    store.renew(lease)
                    assert store.renew_many([lease]) == [None]
                    assert store.finish(lease, end()).recorded
        except BaseException as e:
            errors.append(e)

    open_store(bouncer.url(schema=schema)).close()  # the schema, once
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    with open_store(bouncer.url(schema=schema)) as store:
        assert len(store.runs("job-0-0", limit=100)) == len(range(0, cycles, 3))
        assert store.open_runs() == []


def test_a_call_is_bounded_by_the_client_when_the_server_settings_are_not_sent(
    bouncer: PgBouncer, schema: str
) -> None:
    """Behind the pooler the statement_timeout is not sent at connect; the
    store's watchdog still cuts a call that outlives it."""
    with open_store(bouncer.url(schema=schema, statement_timeout="1s")) as store:
        t = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store._call(lambda c: c.execute("SELECT pg_sleep(30)"))  # type: ignore[attr-defined]
        assert time.monotonic() - t < 5
