"""The PostgreSQL store under faults, against real servers and processes.

Connection kills run on the shared server (they end only this test's own
sessions, found by a unique application_name). Restarts and a frozen server
run on a private instance (``tests/pgserver.py``): the shared server is never
stopped.

The safety property checked throughout (G3 with G4): while the first holder
still believes it owns the lease, nobody else is granted it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from cronwarden.clock import SYSTEM_CLOCK
from cronwarden.errors import LeaseLost, StoreError, StoreUnavailable, StoreUrlError
from cronwarden.events import EventKind, Outcome
from cronwarden.lease import Heartbeat, Lease
from cronwarden.stores import open_store
from cronwarden.stores.base import End, EventQuery, Granted, Refused, Start, Store
from pgserver import PrivatePostgres, private_postgres, unavailable
from processes import wait_for

psycopg = pytest.importorskip("psycopg")
postgres_store = pytest.importorskip("cronwarden.stores.postgres")

pytestmark = pytest.mark.postgres

SHARED = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
TTL = 1.5
"""Short enough to lose a lease within a test, long enough for a loaded 2-core box."""


def with_params(url: str, **params: str) -> str:
    sep = "&" if "?" in url else "?"
    return url + sep + "&".join(f"{k}={v}" for k, v in params.items())


def start(job: str = "nightly", *, ttl: float = TTL, run_id: str | None = None) -> Start:
    return Start(
        job=job,
        key=job,
        run_id=run_id or str(uuid.uuid4()),
        host="test-host",
        pid=os.getpid(),
        ttl=ttl,
        at=time.time(),
    )


def end(outcome: Outcome = Outcome.SUCCEEDED) -> End:
    return End(outcome=outcome, at=time.time(), exit_code=0 if outcome is Outcome.SUCCEEDED else 1)


def granted(result: Granted | Refused) -> Lease:
    assert isinstance(result, Granted), result
    return result.lease


def admin(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True, connect_timeout=5)


def backend_pids(conn: psycopg.Connection, application_name: str) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
    ).fetchall()
    return [r[0] for r in rows]


def waits_on_a_lock(conn: psycopg.Connection, application_name: str) -> bool:
    """Whether the session named ``application_name`` is waiting on a lock."""
    row = conn.execute(
        "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        (application_name,),
    ).fetchone()
    return row is not None


def terminate(conn: psycopg.Connection, application_name: str) -> list[int]:
    """End the sessions of ``application_name`` and wait until they are gone."""
    pids = backend_pids(conn, application_name)
    assert pids, f"no session named {application_name}"
    for pid in pids:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_for(
        "the terminated sessions to exit",
        lambda: not set(pids) & set(backend_pids(conn, application_name)),
        5,
    )
    return pids


def expired(store: Store, lease: Lease) -> bool:
    info = store.lease(lease.key)
    return info is None or info.owner != lease.run_id or (info.expires_in or 0.0) <= 0


@dataclass
class Holder:
    """A store, its lease and the heartbeat that renews it, as a guard has them."""

    store: Store
    lease: Lease
    heartbeat: Heartbeat

    @classmethod
    def take(cls, store: Store, job: str = "nightly", ttl: float = TTL) -> Holder:
        sent = SYSTEM_CLOCK.monotonic()  # before the request, as G3 requires
        lease = granted(store.acquire(start(job, ttl=ttl)))
        # Batched, as a guard's heartbeat renews (Store.renew_many).
        heartbeat = Heartbeat(store=store, lease=lease, ttl=ttl, clock=SYSTEM_CLOCK, started_at=sent)
        heartbeat.start(lease.key)
        return cls(store=store, lease=lease, heartbeat=heartbeat)


class SafetyReferee:
    """Tries to take the holder's key from another store and checks that a
    grant never comes while the holder still believes (G3)."""

    def __init__(self, contender: Store, holder: Holder) -> None:
        self.contender = contender
        self.holder = holder
        self.attempts = 0
        self.taken: Lease | None = None

    def try_once(self) -> None:
        if self.taken is not None:
            return
        self.attempts += 1
        try:
            result = self.contender.acquire(start(self.holder.lease.job, ttl=30.0))
        except StoreUnavailable:
            return
        after = SYSTEM_CLOCK.monotonic()
        if isinstance(result, Granted):
            assert not self.holder.heartbeat.believed(now=after), (
                "a second holder was granted the lease while the first still believed it owned it"
            )
            self.taken = result.lease


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"cw_fault_{uuid.uuid4().hex[:12]}"
    yield name
    try:
        with admin(SHARED) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    except psycopg.OperationalError:
        pass


@pytest.fixture
def shared(schema: str) -> str:
    """The shared server's URL with this test's schema; skips if it is down."""
    try:
        with admin(SHARED) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as e:
        unavailable(f"PostgreSQL not reachable at {SHARED}: {str(e).splitlines()[0]}")
    return with_params(SHARED, schema=schema)


@pytest.fixture(scope="module")
def private() -> Iterator[PrivatePostgres]:
    with private_postgres() as server:
        yield server


@pytest.fixture
def private_url(private: PrivatePostgres, schema: str) -> str:
    if not private.running():
        private.start()
    return private.url(schema=schema)


# -- connections killed under a holder ------------------------------------


def test_terminated_holder_session_reconnects_and_nobody_else_is_granted_meanwhile(shared: str) -> None:
    name = f"cw-holder-{uuid.uuid4().hex[:8]}"
    with (
        open_store(with_params(shared, application_name=name)) as store,
        open_store(shared) as other,
        admin(SHARED) as kill,
    ):
        holder = Holder.take(store)
        referee = SafetyReferee(other, holder)
        try:
            for _ in range(3):
                before = holder.heartbeat.renewals
                old = terminate(kill, name)

                # The next renewal either reconnects and succeeds (the lease
                # is still ours) or fails; meanwhile the key stays refused.
                def renewed_again(before: int = before) -> bool:
                    referee.try_once()
                    return holder.heartbeat.renewals > before or holder.heartbeat.lost is not None

                wait_for("a renewal after the kill", renewed_again, timeout=4 * TTL, every=0.02)
                assert holder.heartbeat.lost is None, holder.heartbeat.lost
                assert backend_pids(kill, name) and not set(old) & set(backend_pids(kill, name))
            assert referee.taken is None
            assert referee.attempts > 3
            assert holder.heartbeat.believed()
        finally:
            holder.heartbeat.stop()
        finished = store.finish(holder.lease, end())
        assert finished.owned and finished.recorded
        assert granted(other.acquire(start(ttl=30.0))).token == holder.lease.token + 1


def test_session_killed_during_a_renewal_fails_it_and_the_next_renewal_reconnects(shared: str) -> None:
    name = f"cw-holder-{uuid.uuid4().hex[:8]}"
    with (
        open_store(with_params(shared, application_name=name)) as store,
        admin(SHARED) as kill,
        admin(shared.split("?")[0]) as blocker,
    ):
        lease = granted(store.acquire(start(ttl=30.0)))
        schema = shared.split("schema=")[1]
        # Hold the lease row's lock so the renewal waits inside the server.
        blocker.execute("BEGIN")
        blocker.execute(f'SELECT * FROM "{schema}".leases WHERE key = %s FOR UPDATE', (lease.key,))
        failure: list[BaseException] = []

        def renew() -> None:
            try:
                store.renew(lease)
            except BaseException as e:
                failure.append(e)

        renewer = threading.Thread(target=renew)
        renewer.start()
        wait_for("the renewal to wait on the row lock", lambda: waits_on_a_lock(kill, name), timeout=5)
        terminate(kill, name)
        renewer.join(timeout=10)
        blocker.execute("ROLLBACK")

        assert len(failure) == 1 and isinstance(failure[0], StoreUnavailable), failure
        assert "127.0.0.1:5432" in str(failure[0]) and "\n" not in str(failure[0])
        store.renew(lease)  # reconnects; the lease is still ours
        assert store.lease(lease.key).owner == lease.run_id  # type: ignore[union-attr]


def test_renewal_stuck_on_a_lock_returns_within_its_bound(shared: str) -> None:
    with open_store(shared) as store, admin(shared.split("?")[0]) as blocker:
        lease = granted(store.acquire(start(ttl=TTL)))
        schema = shared.split("schema=")[1]
        blocker.execute("BEGIN")
        blocker.execute(f'SELECT * FROM "{schema}".leases WHERE key = %s FOR UPDATE', (lease.key,))
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable):
                store.renew(lease)
            # A renewal may take a tenth of the ttl, at least half a second:
            # the heartbeat must get back to check its deadline.
            assert time.monotonic() - began < 0.5 + 0.5
        finally:
            blocker.execute("ROLLBACK")
        store.renew(lease)


def test_terminated_lock_holder_session_keeps_its_lock_and_nobody_else_gets_it(shared: str) -> None:
    name = f"cw-locker-{uuid.uuid4().hex[:8]}"
    with (
        open_store(with_params(shared, application_name=name)) as store,
        open_store(shared) as other,
        admin(SHARED) as kill,
    ):
        token = store.lock("leader", "a", 30.0)
        assert token is not None
        terminate(kill, name)

        # The lock is a row, not a session's advisory lock: it outlives the session.
        assert other.lock("leader", "b", 30.0) is None
        assert store.lock("leader", "c", 30.0) is None  # reconnects first, then is refused
        assert store.renew_lock("leader", "a", 30.0)
        terminate(kill, name)
        assert store.unlock("leader", "a")
        assert other.lock("leader", "b", 30.0) == token + 1


def test_lock_call_killed_in_flight_fails_loudly_and_grants_nothing(shared: str) -> None:
    name = f"cw-locker-{uuid.uuid4().hex[:8]}"
    schema = shared.split("schema=")[1]
    with (
        open_store(shared) as holder,
        open_store(with_params(shared, application_name=name)) as contender,
        admin(SHARED) as kill,
        admin(shared.split("?")[0]) as blocker,
    ):
        token = holder.lock("leader", "a", 0.5)
        assert token is not None
        # Hold the lock's row so the contender's lock() waits inside the server,
        # past the holder's expiry; then end its session mid-call.
        blocker.execute("BEGIN")
        blocker.execute(f'SELECT * FROM "{schema}".locks WHERE key = %s FOR UPDATE', ("leader",))
        failure: list[BaseException] = []
        got: list[int | None] = []

        def take() -> None:
            try:
                got.append(contender.lock("leader", "b", 30.0))
            except BaseException as e:
                failure.append(e)

        taker = threading.Thread(target=take)
        taker.start()
        wait_for("the lock() to wait on the row lock", lambda: waits_on_a_lock(kill, name), timeout=5)
        time.sleep(0.6)  # the holder's lock expires while the contender waits
        terminate(kill, name)
        taker.join(timeout=10)
        blocker.execute("ROLLBACK")

        assert got == [] and len(failure) == 1 and isinstance(failure[0], StoreUnavailable), (got, failure)
        # The killed statement granted nothing: the next grant is the very next token.
        assert holder.renew_lock("leader", "a", 30.0) is False
        assert contender.lock("leader", "b", 30.0) == token + 1
        assert holder.lock("leader", "a", 30.0) is None


# -- the server restarts or freezes (private instance) ----------------------


def test_lock_and_its_fencing_counter_survive_a_server_restart(
    private: PrivatePostgres, private_url: str
) -> None:
    with open_store(private_url) as store:
        first = store.lock("leader", "a", 60.0)
        assert first is not None and store.unlock("leader", "a")
        token = store.lock("leader", "b", 60.0)
        assert token == first + 1
        private.stop(mode="immediate")
        private.start()
        with open_store(private_url) as other:
            assert other.lock("leader", "c", 60.0) is None, "the lock outlives the restart"
        assert store.unlock("leader", "b")  # the old store reconnects
        assert store.lock("leader", "c", 60.0) == token + 1


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_holder_stops_believing_before_its_lease_expires_while_the_server_is_down(
    private: PrivatePostgres, private_url: str, schema: str, mode: str
) -> None:
    wall_minus_mono = time.time() - time.monotonic()
    with open_store(private_url) as store, open_store(private_url) as other:
        holder = Holder.take(store)
        try:
            wait_for("a first renewal", lambda: holder.heartbeat.renewals >= 1, timeout=2 * TTL)
            private.stop(mode=mode)
            with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{private.port}"):
                store.renew(holder.lease)
            with pytest.raises(StoreUnavailable):
                other.acquire(start(ttl=30.0))

            assert holder.heartbeat.lost_event.wait(timeout=2 * TTL), "the heartbeat never gave up"
            lost_at = time.monotonic()
            deadline = holder.heartbeat.deadline
            assert not holder.heartbeat.believed()
            # It gave up on time: at its deadline, not a renewal bound later.
            assert deadline <= lost_at < deadline + 1.0
        finally:
            holder.heartbeat.stop()
            private.start()

        with admin(private.url()) as conn:
            row = conn.execute(
                f'SELECT extract(epoch FROM expires)::float8 FROM "{schema}".leases WHERE key = %s',
                (holder.lease.key,),
            ).fetchone()
        assert row is not None
        # Belief ended before the store's expiry, by the same host's clock.
        assert deadline + wall_minus_mono < row[0]

        # The lease and its fencing counter survived the restart.
        wait_for("the lease to expire", lambda: expired(other, holder.lease), timeout=2 * TTL)
        taker = other.acquire(start(ttl=30.0))
        assert isinstance(taker, Granted), taker
        assert taker.lease.token == holder.lease.token + 1
        assert taker.abandoned == (holder.lease.run_id,)
        stale = store.finish(holder.lease, end(Outcome.LEASE_LOST))
        assert not stale.owned and not stale.recorded
        assert other.finish(taker.lease, end()).owned
        assert granted(store.acquire(start(ttl=30.0))).token == holder.lease.token + 2
        kinds = [e.kind for e in other.events(EventQuery(job="nightly", newest_first=False))]
        assert kinds == [
            EventKind.STARTED,
            EventKind.ABANDONED,
            EventKind.STARTED,
            EventKind.SUCCEEDED,
            EventKind.STARTED,
        ]


def test_frozen_session_does_not_hang_renew_and_the_next_renewal_reconnects(
    private: PrivatePostgres, private_url: str
) -> None:
    name = f"cw-holder-{uuid.uuid4().hex[:8]}"
    with open_store(with_params(private_url, application_name=name)) as store, admin(private.url()) as conn:
        lease = granted(store.acquire(start(ttl=TTL)))
        (pid,) = backend_pids(conn, name)
        os.kill(pid, signal.SIGSTOP)  # the session stops answering; the kernel still acks
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match="no answer within"):
                store.renew(lease)
            assert time.monotonic() - began < 0.5 + 0.5
            store.renew(lease)  # on a new session; the lease is still ours
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for("the frozen session to exit", lambda: pid not in backend_pids(conn, name), timeout=5)


def test_frozen_server_ends_belief_at_the_deadline_and_the_heartbeat_gives_up(
    private: PrivatePostgres, private_url: str
) -> None:
    # connect_timeout is the bound on reconnecting (libpq: at least 2s).
    with open_store(with_params(private_url, connect_timeout="2")) as store, admin(private.url()) as conn:
        holder = Holder.take(store)
        pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity").fetchall()]
        postmaster = private.postmaster_pid()
        assert postmaster is not None
        frozen = [postmaster, *pids]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            deadline = holder.heartbeat.deadline
            wait_for("the deadline", lambda: time.monotonic() >= deadline, timeout=2 * TTL)
            # Belief ends by the clock, whatever the heartbeat thread is waiting for.
            assert not holder.heartbeat.believed()
            # Its thread waits at most a renewal bound or a connect_timeout, then gives up.
            assert holder.heartbeat.lost_event.wait(timeout=2.0 + 0.5 + 1.0), "the heartbeat hung"
            assert isinstance(holder.heartbeat.lost, LeaseLost)
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
            holder.heartbeat.stop()
        # The server answers again, and so does the store.
        wait_for("the store to answer", lambda: answers(store, holder.lease), timeout=10)


def answers(store: Store, lease: Lease) -> bool:
    try:
        store.lease(lease.key)
    except StoreUnavailable:
        return False
    return True


# -- connecting: errors for people ---------------------------------------------


def test_refused_connection_is_unavailable_naming_host_and_port() -> None:
    with socket_port() as port:
        pass
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}") as caught:
        open_store(f"postgresql://postgres@127.0.0.1:{port}/postgres")
    assert caught.value.exit_code == 75 and "\n" not in str(caught.value)


def test_unknown_database_is_a_store_error_not_unavailable(shared: str) -> None:
    with pytest.raises(StoreError) as caught:
        open_store("postgresql://postgres@127.0.0.1:5432/cw_no_such_database_here")
    assert not isinstance(caught.value, StoreUnavailable)
    assert caught.value.exit_code == 2
    assert "cw_no_such_database_here" in str(caught.value) and "\n" not in str(caught.value)


def test_unknown_role_is_a_store_error(shared: str) -> None:
    with pytest.raises(StoreError) as caught:
        open_store("postgresql://cw_no_such_role@127.0.0.1:5432/test")
    assert not isinstance(caught.value, StoreUnavailable)


@pytest.mark.parametrize(
    "query",
    ["schema=cw&bogus=1", "schema=no-dashes", "statement_timeout=soon", "schema=cw&sslmodee=disable"],
)
def test_bad_url_parameters_are_url_errors(query: str) -> None:
    with pytest.raises(StoreUrlError):
        open_store(f"postgresql://postgres@127.0.0.1:5432/test?{query}")


def test_libpq_parameters_pass_through_and_postgres_scheme_works(shared: str) -> None:
    name = f"cw-app-{uuid.uuid4().hex[:8]}"
    url = with_params(
        shared.replace("postgresql://", "postgres://"), application_name=name, sslmode="disable"
    )
    with open_store(url) as store, admin(SHARED) as conn:
        store.lease("x")
        assert backend_pids(conn, name)


def test_default_application_name_and_timeouts_are_set(shared: str) -> None:
    with open_store(shared) as store:
        store.lease("x")
        conn = store._conn  # type: ignore[attr-defined]
        assert conn.execute("SHOW application_name").fetchone()[0] == "cronwarden"
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "5s"
        assert conn.execute("SHOW lock_timeout").fetchone()[0] == "2s"


def test_the_stores_sessions_turn_jit_off_unless_the_url_asks_for_it(shared: str) -> None:
    # JIT off comes from the store's own session options, which the URL's
    # `options` follow and so override, as for the timeouts.
    with open_store(shared) as store, open_store(with_params(shared, options="-c%20jit%3Don")) as asked:
        store.lease("x")
        asked.lease("x")
        assert store._conn.execute("SHOW jit").fetchone()[0] == "off"  # type: ignore[attr-defined]
        assert asked._conn.execute("SHOW jit").fetchone()[0] == "on"  # type: ignore[attr-defined]


def test_concurrent_first_opens_of_one_schema_migrate_once(shared: str) -> None:
    opened: list[Store] = []
    failed: list[BaseException] = []
    gate = threading.Barrier(4)

    def open_one() -> None:
        gate.wait()
        try:
            opened.append(open_store(shared))
        except BaseException as e:
            failed.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    try:
        assert not failed, failed
        assert len(opened) == 4
        assert [granted(s.acquire(start(f"job{i}", ttl=30.0))).token for i, s in enumerate(opened)] == [1] * 4
    finally:
        for s in opened:
            s.close()
    schema = shared.split("schema=")[1]
    with admin(SHARED) as conn:
        row = conn.execute(
            f'SELECT value FROM "{schema}".meta WHERE key = %s', ("schema_version",)
        ).fetchone()
    assert row == (str(postgres_store.SCHEMA_VERSION),)


def test_newer_schema_version_is_refused_with_upgrade_advice(shared: str) -> None:
    open_store(shared).close()
    schema = shared.split("schema=")[1]
    with admin(SHARED) as conn:
        conn.execute(f"UPDATE \"{schema}\".meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="Upgrade cronwarden"):
        open_store(shared)


def test_dropped_schema_under_an_open_store_is_a_store_error(shared: str) -> None:
    with open_store(shared) as store:
        schema = shared.split("schema=")[1]
        with admin(SHARED) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        with pytest.raises(StoreError, match="incomplete") as caught:
            store.acquire(start())
        assert not isinstance(caught.value, StoreUnavailable)


class socket_port:
    """A port on 127.0.0.1 that nothing listens on once the block ends."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        return int(self._sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


def test_libpq_options_in_the_url_reach_the_server(shared: str) -> None:
    store = open_store(shared + "&options=-c%20work_mem%3D8MB")
    try:
        assert store._call(lambda c: c.execute("SHOW work_mem").fetchone()) == ("8MB",)  # type: ignore[attr-defined]
    finally:
        store.close()
