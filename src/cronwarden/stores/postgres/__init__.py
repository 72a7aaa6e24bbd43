"""The PostgreSQL store, for jobs on several hosts. Its schema is
``schema.sql`` and ``functions.sql`` beside this file, its statements
``queries.sql``; the read side is shared with SQLite (``stores/sql.py``).

Expiry is judged only by the server's ``clock_timestamp()``: the real time at
which the statement reads it, after it holds the lease row's lock. ``now()``
would be the transaction's start, which can lie before a lock wait, and no
client's clock is trusted for anything but the ledger's timestamps.

Every step is one autocommit statement, so one round trip and one commit:
``acquire``, ``finish``, ``claim_slot`` and the outbox's steps are plpgsql
functions (lease row + run row + events + policy branch in one
transaction); ``renew`` is one ``UPDATE``. No session advisory locks guard
leases: they die with the connection and have no TTL, so a holder whose
connection dropped would lose its lock silently while its work goes on. The
lease row, its expiry and its fencing counter are the lock.

Every call is bounded in time: ``connect_timeout`` for connecting,
``statement_timeout`` and ``lock_timeout`` on the server, and a watchdog
thread that cuts the socket of a call the server never answers (a stopped
server, a black-holed network), so the heartbeat thread always gets its turn
to notice its deadline. After a cut or dropped connection the next call
connects again.

Every statement names the schema itself (no ``SET search_path``), and
nothing is kept in the session between calls but the settings given at
connect, so each statement means the same on any connection.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerrors
from psycopg import pq

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.durations import parse_positive_duration
from cronwarden.errors import (
    LeaseLost,
    StoreError,
    StoreUnavailable,
    StoreUrlError,
    UsageError,
    mask_password,
)
from cronwarden.events import Event, RunRecord
from cronwarden.lease import Lease
from cronwarden.stores.base import (
    DEAD_LETTERS_KEPT,
    KEEP_ALL,
    NEW_SINK_BACKFILL,
    RETENTION_PARAMS,
    End,
    Finished,
    Granted,
    Holder,
    LeaseInfo,
    Refusal,
    Refused,
    Retention,
    Start,
    is_side_lease,
    pruned_kinds_sql,
    retention_of,
    revocation,
    side_lease_key,
    stop_mark,
)
from cronwarden.stores.sql import SqlStore, migrations, queries, read_sql, run_from_row

if TYPE_CHECKING:
    from cronwarden.stores.rollup import Entry, Rollup

T = TypeVar("T")

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = os.path.join(HERE, "schema.sql")
FUNCTIONS = os.path.join(HERE, "functions.sql")
QUERIES = os.path.join(HERE, "queries.sql")
MIGRATIONS_DIR = os.path.join(HERE, "migrations")
SCHEMA_VERSION = max(migrations(MIGRATIONS_DIR))
"""The newest migration's number: the version every schema is brought to."""

DEFAULT_SCHEMA = "cronwarden"
DEFAULT_CONNECT_TIMEOUT = 5
DEFAULT_STATEMENT_TIMEOUT = 5.0
DEFAULT_LOCK_TIMEOUT = 2.0
NETWORK_SLACK = 1.0
"""How much longer than ``statement_timeout`` the watchdog waits for an answer."""

OUR_PARAMS = frozenset({"schema", "statement_timeout", "lock_timeout", "pooler"})
POOLERS = ("none", "transaction")
"""``pooler=transaction``: the server is reached through a pooler in
transaction mode (PgBouncer ``pool_mode = transaction``)."""
SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
MIGRATION_TIMEOUT = "15min"
"""Bound on a schema migration (index builds on a large ledger), and on waiting for one."""
MIGRATION_LOCK = 0x63770001
"""First key of the transaction-level advisory lock that serialises migrations."""

# Connection failures in which the server answered: the configuration is
# wrong, and retrying will not help (exit 2, not 75).
CONFIG_FAILURES = (
    "does not exist",
    "password authentication failed",
    "authentication failed",
    "no password supplied",
    "no pg_hba.conf entry",
    "not permitted to log in",
    "permission denied",
    "ssl was required",
    "does not support ssl",
    "certificate",
    "invalid",
)


class _Watchdog:
    """Cuts the socket of a call that outlives its bound.

    psycopg has no per-call client timeout, and ``statement_timeout`` needs
    a server that is running: a stopped server process or a black-holed
    network would hang the caller, and with it the heartbeat thread. Shutting
    the socket down from this thread makes the waiting call fail at once with
    a connection error; the store connects again on its next call. One
    thread per store, woken only when a call needs it to look sooner than it
    would anyway.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._call: tuple[int, float, int] | None = None
        self._generation = 0
        self._sleeps_until: float | None = None
        """When the thread will next look, if it is waiting for a call's deadline."""
        self._closed = False
        self._thread: threading.Thread | None = None
        self.cut: int | None = None
        """Generation of the last call whose socket was cut."""

    def arm(self, fd: int, bound: float) -> int:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="cronwarden-pg-watchdog", daemon=True)
                self._thread.start()
            self._generation += 1
            deadline = time.monotonic() + bound
            self._call = (self._generation, deadline, fd)
            if self._sleeps_until is None or deadline < self._sleeps_until:
                self._cond.notify()
            return self._generation

    def disarm(self) -> None:
        with self._cond:
            self._call = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._call = None
            self._cond.notify()

    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                call = self._call
                if call is None:
                    self._sleeps_until = None
                    self._cond.wait()
                    continue
                generation, deadline, fd = call
                left = deadline - time.monotonic()
                if left > 0:
                    self._sleeps_until = deadline
                    self._cond.wait(left)
                    continue
                self._call = None
                self.cut = generation
                try:
                    with socket.socket(fileno=os.dup(fd)) as sock:
                        sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class PostgresStore(SqlStore):
    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        clock: Clock = SYSTEM_CLOCK,
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        url: str | None = None,
        pooler: str = "none",
        retention: Retention = KEEP_ALL,
    ) -> None:
        """``conninfo`` is a libpq URL or ``key=value`` string; cronwarden's own
        settings come as keywords (``from_url`` takes them from the URL).

        ``pooler="transaction"``: each transaction may run on another server
        session, so nothing may live in one. No statement is prepared (a
        prepared statement belongs to the session that prepared it), and the
        settings are not sent at connect (a pooler refuses or drops the
        ``options`` startup parameter): the role's or the database's own
        ``statement_timeout``, ``lock_timeout``, ``synchronous_commit`` and
        ``jit`` apply, and the client's watchdog still bounds every call."""
        if not SCHEMA_NAME.fullmatch(schema):
            raise StoreError(f"schema must be a plain SQL name (letters, digits, _), got {schema!r}")
        self._clock = clock  # kept for the interface; expiry is the server's clock
        self.retention = retention
        self.schema = schema
        self._s = f'"{schema}"'
        self._call_timeout = statement_timeout + NETWORK_SLACK
        try:
            params = psycopg.conninfo.conninfo_to_dict(conninfo)
        except psycopg.Error as e:
            raise StoreUrlError(url or conninfo, _one_line(e)) from None
        params.setdefault("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
        params.setdefault("application_name", "cronwarden")
        # synchronous_commit=on whatever the database or role says: a grant
        # acknowledged but lost in a crash would hand its fencing token out
        # again to a second holder. Replication to an async standby is documented as a limit.
        if pooler not in POOLERS:
            raise StoreError(f"pooler must be one of {', '.join(POOLERS)}, got {pooler!r}")
        self.pooler = pooler
        # jit=off: every statement of the store is short, but the planner's
        # estimates grow with the tables, and past jit_above_cost each call
        # compiled its plan first (a prune step on a year-old ledger: 20-60 ms
        # of compiling for 0.5 ms of work).
        ours = (
            f"-c statement_timeout={_ms(statement_timeout)} -c lock_timeout={_ms(lock_timeout)} "
            "-c synchronous_commit=on -c jit=off"
        )
        if pooler == "none":
            params["options"] = f"{ours} {params['options']}" if params.get("options") else ours
        self._conninfo = psycopg.conninfo.make_conninfo("", **params)
        host = str(params.get("host") or params.get("hostaddr") or "localhost")
        self.where = f"{host}:{params.get('port') or 5432}"
        self.url = url if url is not None else f"postgresql://{self.where}/{params.get('dbname', '')}"
        self._lock = threading.Lock()
        self._watchdog = _Watchdog()
        self._conn: psycopg.Connection[Any] | None = None
        self._cursor: psycopg.Cursor[Any]
        self._pid = os.getpid()
        self._orphans: list[psycopg.Connection[Any]] = []
        self._poll = select.poll()
        self._closed = False
        self._q = {name: sql.replace("{s}", self._s) for name, sql in queries(QUERIES).items()}
        self._use_shared_queries(self._s, "%s")
        with self._lock:
            self._migrate(self._connection())

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK) -> PostgresStore:
        conninfo, keywords = cls.parse_url(url)
        return cls(conninfo, clock=clock, **keywords)

    @classmethod
    def parse_url(cls, url: str) -> tuple[str, dict[str, Any]]:
        """``postgresql://user@host:port/db?schema=NAME&statement_timeout=5s&lock_timeout=2s``
        plus any libpq parameter (``connect_timeout``, ``sslmode``, …): the
        libpq URL and the store's keywords."""
        try:
            parts = urlsplit(url)
        except ValueError as e:  # e.g. "Invalid IPv6 URL"
            raise StoreUrlError(url, str(e)) from None
        if parts.scheme.lower() not in ("postgresql", "postgres"):
            raise StoreUrlError(url, "expected postgresql://user@host:port/dbname")
        try:
            query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError:
            raise StoreUrlError(url, f"cannot parse the query {parts.query!r}") from None
        ours = {k: v for k, v in query if k in OUR_PARAMS}
        retention = retention_of(url, {k: v for k, v in query if k in RETENTION_PARAMS})
        libpq_params = [(k, v) for k, v in query if k not in OUR_PARAMS and k not in RETENTION_PARAMS]
        known = {d.keyword.decode() for d in pq.Conninfo.get_defaults()}
        unknown = sorted({k for k, _ in libpq_params if k not in known})
        if unknown:
            raise StoreUrlError(
                url,
                f"unknown parameter(s) {', '.join(unknown)}; cronwarden takes "
                f"{', '.join(sorted(OUR_PARAMS))} and libpq's own",
            )
        schema = ours.get("schema", DEFAULT_SCHEMA)
        pooler = ours.get("pooler", "none")
        if pooler not in POOLERS:
            raise StoreUrlError(url, f"pooler must be one of {', '.join(POOLERS)}, got {pooler!r}")
        if not SCHEMA_NAME.fullmatch(schema):
            raise StoreUrlError(url, f"schema must be a plain SQL name (letters, digits, _), got {schema!r}")
        try:
            statement_timeout = parse_positive_duration(
                ours.get("statement_timeout", "5s"), what="statement_timeout"
            )
            lock_timeout = parse_positive_duration(ours.get("lock_timeout", "2s"), what="lock_timeout")
        except UsageError as e:
            raise StoreUrlError(url, str(e)) from None
        # quote, not quote_plus: libpq reads a '+' in options literally.
        libpq_query = urlencode(libpq_params, quote_via=quote)
        conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, libpq_query, ""))
        try:
            psycopg.conninfo.conninfo_to_dict(conninfo)
        except psycopg.Error as e:
            raise StoreUrlError(url, _one_line(e)) from None
        return conninfo, {
            "schema": schema, "statement_timeout": statement_timeout, "lock_timeout": lock_timeout,
            "url": mask_password(url), "pooler": pooler, "retention": retention,
        }  # fmt: skip

    # -- plumbing ---------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        """The kept connection, or a new one if it dropped. Called with the
        lock held."""
        if self._closed:
            raise StoreError(f"the PostgreSQL store {self.where} is closed")
        conn = self._conn
        if conn is not None and self._pid != os.getpid():
            # Forked: the socket is the parent's. Never close it from here
            # (that would end the parent's session); keep it from the GC.
            self._orphans.append(conn)
            self._pid = os.getpid()
            conn = self._conn = None
        if conn is not None and (conn.closed or self._poll.poll(0)):
            # Idle and yet readable: the server ended the session (restart,
            # pg_terminate_backend) and said so. Reconnect before sending
            # rather than fail a request that was never delivered.
            conn.close()
            conn = self._conn = None
        if conn is None:
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True)
                if self.pooler != "none":
                    conn.prepare_threshold = None  # nothing prepared: sessions change under us
            except psycopg.Error as e:
                raise self._connect_error(e) from None
            self._conn = conn
            # One cursor per connection, kept: a new cursor per statement
            # looks up every parameter's dumper and every column's loader
            # again (~15-50 µs of CPU per call with ten parameters).
            self._cursor = conn.cursor()
            self._poll = select.poll()
            self._poll.register(conn.pgconn.socket, select.POLLIN | select.POLLPRI)
        return conn

    def _connect_error(self, e: psycopg.Error) -> StoreError:
        text = _one_line(e)
        lowered = text.lower()
        if "unsupported startup parameter" in lowered:
            # PgBouncer refusing the settings sent at connect.
            return StoreError(
                f"cannot use PostgreSQL store {self.where}: {text}; behind a pooler in "
                "transaction mode (PgBouncer), add pooler=transaction to the store URL"
            )
        busy = ("starting up", "shutting down", "recovery", "too many", "connection slots")
        if any(w in lowered for w in CONFIG_FAILURES) and not any(w in lowered for w in busy):
            return StoreError(f"cannot use PostgreSQL store {self.where}: {text}")
        return StoreUnavailable(f"PostgreSQL store {self.where} is unavailable: {text}")

    def _call(self, fn: Callable[[psycopg.Cursor[Any]], T], bound: float | None = None) -> T:
        """Run ``fn`` on the connection's kept cursor, under the lock, within
        ``bound`` seconds (waiting for the lock included)."""
        bound = self._call_timeout if bound is None else bound
        if not self._lock.acquire(timeout=bound):
            raise StoreUnavailable(f"PostgreSQL store {self.where}: another call of this process is stuck")
        try:
            conn = self._connection()
            generation = self._watchdog.arm(conn.pgconn.socket, bound)
            try:
                return fn(self._cursor)
            except psycopg.Error as e:
                raise self._call_error(conn, e, generation, bound) from None
            except BaseException:
                # Interrupted mid-call (KeyboardInterrupt, a bug): the
                # session's state is unknown, so never reuse it.
                conn.close()
                self._conn = None
                raise
            finally:
                self._watchdog.disarm()
        finally:
            self._lock.release()

    def _fetch(self, sql: str, args: Sequence[Any]) -> list[Any]:
        return self._call(lambda c: c.execute(sql, args).fetchall())

    def _write(self, sql: str, args: Sequence[Any]) -> int:
        return self._call(lambda c: c.execute(sql, args).rowcount)

    def _save_rollup(self, rollup: Rollup, recent: list[Entry], seen: tuple[Any, ...] | None) -> bool:
        from cronwarden.stores.rollup import row_of

        row = row_of(rollup, recent)
        if seen is None:
            return self._write(self._q["insert_rollup"], row) == 1
        return self._write(self._q["update_rollup"], (*row, *seen)) == 1

    def _event_data(self, raw: Any) -> Mapping[str, Any]:
        data: Mapping[str, Any] = raw  # jsonb: psycopg has decoded it
        return data

    def _call_error(
        self, conn: psycopg.Connection[Any], e: psycopg.Error, generation: int, bound: float
    ) -> StoreError:
        text = _one_line(e)
        if self._watchdog.cut == generation:
            text = f"no answer within {bound:g}s"
        if conn.closed or isinstance(e, psycopg.InterfaceError):
            conn.close()
            self._conn = None
            return StoreUnavailable(f"PostgreSQL store {self.where} is unavailable: {text}")
        if isinstance(e, pgerrors.QueryCanceled | pgerrors.LockNotAvailable):
            return StoreUnavailable(f"PostgreSQL store {self.where} timed out: {text}")
        if isinstance(e, psycopg.OperationalError):
            return StoreUnavailable(f"PostgreSQL store {self.where} is unavailable: {text}")
        if isinstance(e, pgerrors.UndefinedTable | pgerrors.UndefinedFunction | pgerrors.InvalidSchemaName):
            return StoreError(
                f"PostgreSQL store {self.where}: schema {self.schema!r} is not a usable cronwarden store, "
                f"it is incomplete ({text}); was it dropped while in use?"
            )
        return StoreError(f"PostgreSQL store {self.where}: {text}")

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Create the schema (``schema.sql`` and ``functions.sql``) or bring
        it up to date (the migrations numbered above its version, in order),
        in one transaction, and set the version. The common case, up to
        date, is one read."""
        q = self._q
        try:
            try:
                version = self._version(conn)
            except (pgerrors.UndefinedTable, pgerrors.InvalidSchemaName):
                version = 0
            if version == SCHEMA_VERSION:
                return
            self._refuse_newer(version)
            with conn.transaction():
                conn.execute(q["migration_timeouts"], (MIGRATION_TIMEOUT, MIGRATION_TIMEOUT))
                conn.execute(q["migration_lock"], (MIGRATION_LOCK, self.schema))
                conn.execute(q["create_schema"])
                conn.execute(q["create_meta"])
                version = self._version(conn)  # another open may have migrated while this one waited
                self._refuse_newer(version)
                if version == 0:
                    scripts = [read_sql(SCHEMA), read_sql(FUNCTIONS)]
                else:
                    scripts = [
                        read_sql(path) for v, path in migrations(MIGRATIONS_DIR).items() if v > version
                    ]
                for script in scripts:
                    conn.execute(script.replace("{s}", self._s))
                conn.execute(q["set_schema_version"], (str(SCHEMA_VERSION),))
        except psycopg.Error as e:
            conn.close()
            self._conn = None
            raise self._call_error(conn, e, -1, self._call_timeout) from None

    def _version(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(self._q["schema_version"]).fetchone()
        return int(row[0]) if row else 0

    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"PostgreSQL store {self.where} schema {self.schema!r} has version {version}; "
                f"this cronwarden knows up to {SCHEMA_VERSION}. Upgrade cronwarden"
            )

    # -- leases and runs --------------------------------------------------

    def acquire(self, start: Start) -> Granted | Refused:
        args = (
            start.key,
            start.job,
            start.run_id,
            start.host,
            start.pid,
            start.ttl,
            start.at,
            start.slot,
            start.policy.value,
            start.max_pending,
        )
        row = self._call(lambda c: c.execute(self._q["acquire"], args).fetchone())
        assert row is not None
        status, token, abandoned_run = row[0], row[1], row[2]
        abandoned = () if abandoned_run is None else (abandoned_run,)
        if status == "granted":
            return Granted(lease=_lease(start, start.key, token), abandoned=abandoned)
        holder = Holder(
            run_id=row[3], host=row[4], pid=row[5], started_at=row[6], token=row[7], expires_in=row[8]
        )
        if status == "overlap":
            return Granted(
                lease=_lease(start, side_lease_key(start.key, start.run_id), token), overlapped=holder
            )
        return Refused(refusal=Refusal(status), holder=holder, abandoned=abandoned)

    def renew(self, lease: Lease) -> None:
        # The heartbeat retries failed renewals until its deadline, so one
        # attempt may take a tenth of the ttl (never under half a second),
        # not the full statement budget.
        bound = min(self._call_timeout, max(0.5, lease.ttl / 10))

        def step(cur: psycopg.Cursor[Any]) -> tuple[Any, ...] | None:
            if cur.execute(self._q["renew"], (lease.ttl, lease.key, lease.run_id)).rowcount == 1:
                return None
            row = cur.execute(self._q["lease_owner"], (lease.key,)).fetchone()
            return row if row is not None else (None, None)

        why = self._call(step, bound)
        if why is None:
            return
        owner, revoked_by = why
        if owner == lease.run_id and revoked_by is not None:
            raise revocation(lease.key, revoked_by)
        raise LeaseLost(lease.key, "expired or taken by another run")

    def renew_many(self, leases: Sequence[Lease]) -> list[LeaseLost | None]:
        if not leases:
            return []
        bound = min(self._call_timeout, max(0.5, min(lease.ttl for lease in leases) / 10))
        args = {
            "keys": [x.key for x in leases],
            "owners": [x.run_id for x in leases],
            "ttls": [float(x.ttl) for x in leases],
        }
        # Never prepared: a generic plan cannot see the arrays' length and
        # joins them the slow way (measured 25x slower for 1,000 leases).
        sql = self._q["renew_many"]
        rows = self._call(lambda c: c.execute(sql, args, prepare=False).fetchall(), bound)
        out: list[LeaseLost | None] = []
        for lease, (why,) in zip(leases, rows, strict=True):
            if why is None:
                out.append(None)
            elif why:
                out.append(revocation(lease.key, why))
            else:
                out.append(LeaseLost(lease.key, "expired or taken by another run"))
        return out

    def finish(self, lease: Lease, end: End, then: Start | None = None) -> Finished:
        args: tuple[Any, ...] = (
            lease.key,
            lease.job,
            lease.run_id,
            lease.token,
            end.outcome.value,
            end.at,
            end.exit_code,
            end.detail,
            end.replaced_by,
            is_side_lease(lease.key, lease.run_id),  # finish deletes a side lease's row
        )
        sql = self._q["finish"]
        if then is not None:
            sql = self._q["finish_then"]
            args += (then.key, then.job, then.run_id, then.host, then.pid, then.ttl, then.at, then.slot)
        if end.data:
            extra = (json.dumps(dict(end.data)), lease.job, end.outcome.value, lease.run_id)

            def finish_with_data(c: psycopg.Cursor[Any]) -> Any:
                # The end event's further fields, written in finish's
                # transaction: no reader (the outbox) sees the event without them.
                with c.connection.transaction():
                    found = c.execute(sql, args).fetchone()
                    if found is not None and found[1]:
                        c.execute(self._q["end_data"], extra)
                    return found

            row = self._call(finish_with_data)
        else:
            row = self._call(lambda c: c.execute(sql, args).fetchone())
        assert row is not None
        owned, recorded, next_token = row
        nxt = None
        if then is not None and next_token is not None:
            nxt = Lease(key=then.key, job=then.job, run_id=then.run_id, token=next_token, ttl=then.ttl)
        return Finished(owned=owned, recorded=recorded, next=nxt)

    # -- the bare lock ------------------------------------------------------

    def lock(self, key: str, owner: str, ttl: float) -> int | None:
        row = self._call(lambda c: c.execute(self._q["lock"], (key, owner, ttl, ttl)).fetchone())
        return None if row is None else int(row[0])

    def renew_lock(self, key: str, owner: str, ttl: float) -> bool:
        # Bounded like renew: a leader's renewal loop retries until its deadline.
        bound = min(self._call_timeout, max(0.5, ttl / 10))
        return self._call(lambda c: c.execute(self._q["renew_lock"], (ttl, key, owner)).rowcount == 1, bound)

    def unlock(self, key: str, owner: str) -> bool:
        return self._call(lambda c: c.execute(self._q["unlock"], (key, owner)).rowcount == 1)

    def request_stop(self, key: str, run_id: str, grace: float, request: Event) -> bool:
        args = (stop_mark(grace), key, run_id, request.event_id, request.kind.value, request.job,
                request.run_id, request.at, _json(dict(request.data)))  # fmt: skip
        row = self._call(lambda c: c.execute(self._q["request_stop"], args).fetchone())
        return bool(row and row[0])

    def record(self, event: Event) -> None:
        args = (event.event_id, event.kind.value, event.job, event.run_id, event.at, _json(dict(event.data)))
        self._call(lambda c: c.execute(self._q["record"], args))

    # -- the scheduler's slot claim ---------------------------------------

    def claim_slot(self, job: str, slot: float, owner: str, keep: float) -> str:
        row = self._call(lambda c: c.execute(self._q["claim_slot"], (job, slot, owner, keep)).fetchone())
        assert row is not None and row[0] is not None
        return str(row[0])

    # -- the read side (the rest is SqlStore's) -----------------------------

    def open_runs(self, job: str | None = None) -> list[RunRecord]:
        if job is None:
            rows = self._fetch(self._q["open_runs"], ())
        else:
            rows = self._fetch(self._q["open_runs_of_job"], (job,))
        return [run_from_row(row[:-1], expires_in=row[-1]) for row in rows]

    def latest_runs(self, jobs: Sequence[str], limit: int) -> dict[str, list[RunRecord]]:
        found: dict[str, list[RunRecord]] = {job: [] for job in jobs}
        for row in self._fetch(self._q["latest_runs"], (list(jobs), limit)):
            found[row[1]].append(run_from_row(row))
        return found

    def lease(self, key: str) -> LeaseInfo | None:
        rows = self._fetch(self._q["lease"], (key,))
        if not rows:
            return None
        owner, token, expires_in, pending, revoked_by = rows[0]
        return LeaseInfo(
            key=key, owner=owner, token=token, expires_in=expires_in, pending=pending, revoked_by=revoked_by
        )

    # -- the outbox -------------------------------------------------------

    def undelivered(self, sink: str, limit: int, *, backfill: float = NEW_SINK_BACKFILL) -> list[Event]:
        if limit < 1:
            return []
        args = (sink, limit, self._clock.wall(), backfill)
        return self._events_of(self._fetch(self._q["undelivered"], args))

    def mark_delivered(self, sink: str, event_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(event_ids))
        if not ids:
            return
        args = (sink, ids, self._clock.wall(), NEW_SINK_BACKFILL)
        self._call(lambda c: c.execute(self._q["mark_delivered"], args))

    def reject(self, sink: str, event_id: str, rejection: Event | None) -> None:
        r = rejection
        args = (sink, event_id, DEAD_LETTERS_KEPT, self._clock.wall(), NEW_SINK_BACKFILL,
                r and r.event_id, r and r.kind.value, r and r.job, r and r.run_id, r and r.at,
                None if r is None else _json(dict(r.data)))  # fmt: skip
        self._call(lambda c: c.execute(self._q["reject"], args))

    def forget_rejected(self, sink: str, event_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(event_ids))
        if ids:
            self._call(lambda c: c.execute(self._q["forget_rejected"], (sink, ids)))

    def _prune_step(self, job: str, bound: float, limit: int) -> tuple[int, int, int]:
        sql = self._q["prune_due"].replace("{pruned}", pruned_kinds_sql())
        args = (job, bound, limit, limit)
        row = self._call(lambda c: c.execute(sql, args).fetchone())
        assert row is not None  # counts: always one row
        return int(row[0]), int(row[1]), int(row[2])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._watchdog.close()
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), default=str)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _one_line(e: BaseException) -> str:
    """psycopg's message on one line, without the parts the caller already
    says (which host, that the connection failed)."""
    text = " ".join(str(e).split())
    text = re.sub(r"^connection failed: ", "", text)
    text = re.sub(r'connection to server at "[^"]*"(?: \([^)]*\))?, port \d+ failed: ', "", text)
    text = re.sub(r"\s*Is the server running on that host and accepting TCP/IP connections\?", "", text)
    text = text.replace("FATAL: ", "")
    text = text.split(" CONTEXT: ", 1)[0]  # where in our SQL: the whole statement, noise in one line
    return text.strip() or type(e).__name__


def _lease(start: Start, key: str, token: int) -> Lease:
    return Lease(key=key, job=start.job, run_id=start.run_id, token=token, ttl=start.ttl)
