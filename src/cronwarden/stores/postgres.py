"""The PostgreSQL store, for jobs on several hosts.

Expiry is judged only by the server's ``clock_timestamp()`` (G4): the real
time at which the statement reads it, after it holds the lease row's lock.
``now()`` would be the transaction's start, which can lie before a lock wait,
and no client's clock is trusted for anything but the ledger's timestamps.

Every contract step is one autocommit statement, so one round trip and one
commit: ``acquire`` and ``finish`` are plpgsql functions that the migration
creates (lease row + run row + events + policy branch in one transaction);
``renew`` is one ``UPDATE``. No session advisory locks guard leases: they die
with the connection and have no TTL, so a holder whose connection dropped
would lose its lock silently while its work goes on. The lease row, its
expiry and its fencing counter are the lock.

Every call is bounded in time: ``connect_timeout`` for connecting,
``statement_timeout`` and ``lock_timeout`` on the server, and a watchdog
thread that cuts the socket of a call the server never answers (a stopped
server, a black-holed network), so the heartbeat thread always gets its turn
to notice its deadline. After a cut or dropped connection the next call
connects again.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerrors
from psycopg import pq

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.durations import parse_positive_duration
from cronwarden.errors import (
    LeaseLost,
    LeaseRevoked,
    StoreError,
    StoreUnavailable,
    StoreUrlError,
    UsageError,
)
from cronwarden.events import Event, EventKind, JobInfo, RunRecord
from cronwarden.lease import Lease
from cronwarden.stores.base import (
    NEW_SINK_BACKFILL,
    End,
    EventQuery,
    Finished,
    Granted,
    Holder,
    LeaseInfo,
    Refusal,
    Refused,
    Start,
    Store,
    run_from_row,
)

T = TypeVar("T")

DEFAULT_SCHEMA = "cronwarden"
DEFAULT_CONNECT_TIMEOUT = 5
DEFAULT_STATEMENT_TIMEOUT = 5.0
DEFAULT_LOCK_TIMEOUT = 2.0
NETWORK_SLACK = 1.0
"""How much longer than ``statement_timeout`` the watchdog waits for an answer."""

OUR_PARAMS = frozenset({"schema", "statement_timeout", "lock_timeout"})
SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
MIGRATION_TIMEOUT = "15min"
"""Bound on a schema migration (index builds on a large ledger), and on waiting for one."""
MIGRATION_LOCK = 0x63770001
"""First key of the transaction-level advisory lock that serialises migrations."""

SCHEMA_VERSION = 5
MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE {s}.leases (
        key        text PRIMARY KEY,
        job        text NOT NULL,
        owner      text,
        token      bigint NOT NULL,
        expires    timestamptz,
        pending    integer NOT NULL DEFAULT 0,
        revoked_by text
    );
    CREATE TABLE {s}.runs (
        run_id     text PRIMARY KEY,
        job        text NOT NULL,
        key        text NOT NULL,
        host       text NOT NULL,
        pid        integer NOT NULL,
        token      bigint NOT NULL,
        slot       double precision,
        started_at double precision NOT NULL,
        ended_at   double precision,
        outcome    text,
        exit_code  integer,
        detail     text NOT NULL DEFAULT ''
    );
    CREATE INDEX runs_job_started ON {s}.runs (job, started_at);
    CREATE INDEX runs_open ON {s}.runs (job, started_at) WHERE outcome IS NULL;
    CREATE TABLE {s}.events (
        seq      bigserial PRIMARY KEY,
        event_id text NOT NULL UNIQUE DEFAULT gen_random_uuid()::text,
        kind     text NOT NULL,
        job      text NOT NULL,
        run_id   text,
        at       double precision NOT NULL,
        data     jsonb NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_job_at ON {s}.events (job, at);
    CREATE INDEX events_run ON {s}.events (run_id);
    CREATE INDEX events_kind_at ON {s}.events (kind, at);
    CREATE TABLE {s}.jobs (
        name        text PRIMARY KEY,
        schedule    text,
        period      double precision,
        policy      text NOT NULL,
        reason      text NOT NULL,
        ttl         double precision,
        grace       double precision,
        max_runtime double precision,
        updated_at  double precision NOT NULL
    );

    -- A run row and its `started` event.
    CREATE FUNCTION {s}.start_run(
        p_key text, p_job text, p_run_id text, p_host text, p_pid integer, p_token bigint,
        p_slot double precision, p_at double precision, p_ttl double precision
    ) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        WITH r AS (
            INSERT INTO {s}.runs (run_id, job, key, host, pid, token, slot, started_at)
            VALUES (p_run_id, p_job, p_key, p_host, p_pid, p_token, p_slot, p_at)
        )
        INSERT INTO {s}.events (kind, job, run_id, at, data)
        VALUES ('started', p_job, p_run_id, p_at, jsonb_build_object(
            'host', p_host, 'pid', p_pid, 'token', p_token, 'key', p_key, 'slot', p_slot, 'ttl', p_ttl));
    END $$;

    -- Store.acquire in one statement (see stores/base.py). Time is read
    -- only from clock_timestamp(), after the lease row is locked, so a lock
    -- wait cannot make a decision on a stale time.
    CREATE FUNCTION {s}.acquire(
        p_key text, p_job text, p_run_id text, p_host text, p_pid integer, p_ttl double precision,
        p_at double precision, p_slot double precision, p_policy text, p_max_pending integer,
        OUT out_status text, OUT out_token bigint, OUT out_abandoned text,
        OUT out_holder_run_id text, OUT out_holder_host text, OUT out_holder_pid integer,
        OUT out_holder_started_at double precision, OUT out_holder_token bigint,
        OUT out_holder_expires_in double precision
    ) LANGUAGE plpgsql AS $$
    DECLARE
        l {s}.leases%ROWTYPE;
        v_now timestamptz;
        v_ttl interval := make_interval(secs => p_ttl);
        v_data jsonb;
    BEGIN
        -- The common case, a released lease, in one statement: the UPDATE
        -- locks the row and re-checks `owner IS NULL` on its latest version.
        WITH g AS (
            UPDATE {s}.leases
            SET owner = p_run_id, token = token + 1, expires = clock_timestamp() + v_ttl, revoked_by = NULL
            WHERE key = p_key AND owner IS NULL
            RETURNING token
        ), r AS (
            INSERT INTO {s}.runs (run_id, job, key, host, pid, token, slot, started_at)
            SELECT p_run_id, p_job, p_key, p_host, p_pid, g.token, p_slot, p_at FROM g
        ), e AS (
            INSERT INTO {s}.events (kind, job, run_id, at, data)
            SELECT 'started', p_job, p_run_id, p_at, jsonb_build_object(
                'host', p_host, 'pid', p_pid, 'token', g.token, 'key', p_key, 'slot', p_slot, 'ttl', p_ttl)
            FROM g
        )
        SELECT g.token INTO out_token FROM g;
        IF FOUND THEN
            out_status := 'granted';
            RETURN;
        END IF;

        SELECT * INTO l FROM {s}.leases WHERE key = p_key FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO {s}.leases (key, job, owner, token, expires)
            VALUES (p_key, p_job, p_run_id, 1, clock_timestamp() + v_ttl)
            ON CONFLICT (key) DO NOTHING;
            IF FOUND THEN
                PERFORM {s}.start_run(p_key, p_job, p_run_id, p_host, p_pid, 1, p_slot, p_at, p_ttl);
                out_status := 'granted';
                out_token := 1;
                RETURN;
            END IF;
            -- A concurrent first grant won the insert; judge its row instead.
            SELECT * INTO l FROM {s}.leases WHERE key = p_key FOR UPDATE;
        END IF;
        v_now := clock_timestamp();
        IF l.owner IS NULL OR l.expires IS NULL OR l.expires <= v_now THEN
            IF l.owner IS NOT NULL THEN
                UPDATE {s}.runs
                SET outcome = 'abandoned', ended_at = p_at,
                    detail = 'lease expired with no terminal record; found by run ' || p_run_id
                WHERE run_id = l.owner AND outcome IS NULL;
                IF FOUND THEN
                    INSERT INTO {s}.events (kind, job, run_id, at, data)
                    VALUES ('abandoned', p_job, l.owner, p_at, jsonb_build_object('found_by', p_run_id));
                    out_abandoned := l.owner;
                END IF;
            END IF;
            out_token := l.token + 1;
            UPDATE {s}.leases
            SET owner = p_run_id, token = out_token, expires = v_now + v_ttl, revoked_by = NULL
            WHERE key = p_key;
            PERFORM {s}.start_run(p_key, p_job, p_run_id, p_host, p_pid, out_token, p_slot, p_at, p_ttl);
            out_status := 'granted';
            RETURN;
        END IF;

        -- Live: the holder, as every refusal reports it (G7).
        SELECT r.host, r.pid, r.started_at INTO out_holder_host, out_holder_pid, out_holder_started_at
        FROM {s}.runs r WHERE r.run_id = l.owner;
        out_holder_run_id := l.owner;
        out_holder_host := coalesce(out_holder_host, '?');
        out_holder_pid := coalesce(out_holder_pid, 0);
        out_holder_started_at := coalesce(out_holder_started_at, 0.0);
        out_holder_token := l.token;
        out_holder_expires_in := extract(epoch FROM l.expires - v_now);
        v_data := jsonb_build_object(
            'slot', p_slot, 'host', p_host, 'pid', p_pid, 'policy', p_policy,
            'holder_run_id', out_holder_run_id,
            'holder_host', out_holder_host,
            'holder_pid', out_holder_pid,
            'holder_started_at', out_holder_started_at,
            'holder_age', round((p_at - out_holder_started_at)::numeric, 3),
            'holder_token', out_holder_token);

        IF p_policy = 'replace' THEN
            UPDATE {s}.leases SET revoked_by = p_run_id WHERE key = p_key AND revoked_by IS NULL;
            out_status := 'revoking';
        ELSIF p_policy = 'allow' THEN
            INSERT INTO {s}.leases (key, job, owner, token, expires)
            VALUES (p_key || '+' || p_run_id, p_job, p_run_id, 1, v_now + v_ttl);
            PERFORM {s}.start_run(
                p_key || '+' || p_run_id, p_job, p_run_id, p_host, p_pid, 1, p_slot, p_at, p_ttl);
            INSERT INTO {s}.events (kind, job, run_id, at, data)
            VALUES ('overlap', p_job, p_run_id, p_at, v_data);
            out_status := 'overlap';
            out_token := 1;
        ELSIF p_policy = 'queue' THEN
            IF l.pending < p_max_pending THEN
                UPDATE {s}.leases SET pending = pending + 1 WHERE key = p_key;
                INSERT INTO {s}.events (kind, job, run_id, at, data)
                VALUES ('queued', p_job, p_run_id, p_at,
                        v_data || jsonb_build_object('pending', l.pending + 1));
                out_status := 'queued';
            ELSE
                INSERT INTO {s}.events (kind, job, run_id, at, data)
                VALUES ('queue_full', p_job, p_run_id, p_at,
                        v_data || jsonb_build_object('pending', l.pending));
                out_status := 'queue_full';
            END IF;
        ELSE
            INSERT INTO {s}.events (kind, job, run_id, at, data)
            VALUES ('skipped', p_job, p_run_id, p_at, v_data);
            out_status := 'skipped';
        END IF;
    END $$;

    -- Store.finish in one statement: the terminal record (at most one per
    -- run), then the release iff still owned, or the hand-over to p_then_*.
    CREATE FUNCTION {s}.finish(
        p_key text, p_job text, p_run_id text, p_token bigint, p_outcome text, p_at double precision,
        p_exit_code integer, p_detail text, p_replaced_by text, p_side boolean,
        p_then_key text, p_then_job text, p_then_run_id text, p_then_host text, p_then_pid integer,
        p_then_ttl double precision, p_then_at double precision, p_then_slot double precision,
        OUT out_owned boolean, OUT out_recorded boolean, OUT out_next_token bigint
    ) LANGUAGE plpgsql AS $$
    DECLARE
        v_pending integer;
    BEGIN
        -- The common case, a plain release, in one statement with the record.
        WITH u AS (
            UPDATE {s}.runs
            SET outcome = p_outcome, ended_at = p_at, exit_code = p_exit_code, detail = p_detail
            WHERE run_id = p_run_id AND outcome IS NULL
            RETURNING started_at
        ), e AS (
            INSERT INTO {s}.events (kind, job, run_id, at, data)
            SELECT p_outcome, p_job, p_run_id, p_at,
                   jsonb_build_object('exit_code', p_exit_code, 'token', p_token,
                                      'duration', round((p_at - u.started_at)::numeric, 6))
                   || CASE WHEN p_detail <> '' THEN jsonb_build_object('detail', p_detail)
                           ELSE '{}' END
                   || CASE WHEN p_replaced_by <> '' THEN jsonb_build_object('replaced_by', p_replaced_by)
                           ELSE '{}' END
            FROM u
        ), l AS (
            UPDATE {s}.leases SET owner = NULL, expires = NULL, revoked_by = NULL
            WHERE key = p_key AND owner = p_run_id AND NOT p_side AND (p_then_run_id IS NULL OR pending = 0)
            RETURNING 1
        )
        SELECT EXISTS (SELECT FROM u), EXISTS (SELECT FROM l) INTO out_recorded, out_owned;
        IF out_owned THEN
            RETURN;
        END IF;

        SELECT pending INTO v_pending FROM {s}.leases WHERE key = p_key AND owner = p_run_id FOR UPDATE;
        out_owned := FOUND;
        IF NOT out_owned THEN
            -- A retried finish whose first try (reply lost) handed the lease
            -- to the queued run: report that hand-over again, not lose it.
            IF p_then_run_id IS NOT NULL THEN
                SELECT token INTO out_next_token FROM {s}.leases WHERE key = p_key AND owner = p_then_run_id;
                out_owned := FOUND;
            END IF;
            RETURN;
        END IF;
        IF p_side THEN
            DELETE FROM {s}.leases WHERE key = p_key;  -- allow's side lease
        ELSIF p_then_run_id IS NOT NULL AND v_pending > 0 THEN
            UPDATE {s}.leases
            SET owner = p_then_run_id, token = token + 1,
                expires = clock_timestamp() + make_interval(secs => p_then_ttl),
                pending = pending - 1, revoked_by = NULL
            WHERE key = p_key
            RETURNING token INTO out_next_token;
            PERFORM {s}.start_run(p_then_key, p_then_job, p_then_run_id, p_then_host, p_then_pid,
                                  out_next_token, p_then_slot, p_then_at, p_then_ttl);
        ELSE
            UPDATE {s}.leases SET owner = NULL, expires = NULL, revoked_by = NULL WHERE key = p_key;
        END IF;
    END $$;
    """,
    2: """
    -- The outbox (G9): per sink, a mark below which every event is
    -- acknowledged, plus the acknowledged events above it.
    CREATE TABLE {s}.outbox_marks (
        sink          text PRIMARY KEY,
        mark          bigint NOT NULL,
        registered_at double precision NOT NULL
    );
    CREATE TABLE {s}.outbox_acks (
        sink text NOT NULL,
        seq  bigint NOT NULL,
        PRIMARY KEY (sink, seq)
    );

    -- Sequence values are drawn at insert and become visible at commit, so
    -- a slow writer's event can appear below events already acknowledged.
    -- A SHARE lock on events waits for every writer in flight (each holds
    -- ROW EXCLUSIVE from before it draws a seq until it commits) and holds
    -- new ones off for the few statements that follow: under it, every seq
    -- drawn so far is committed or dead, and the mark may move over any
    -- acknowledged prefix. If the lock does not come quickly the mark stays
    -- where it is, which is always safe.
    CREATE FUNCTION {s}.outbox_settled() RETURNS boolean LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM set_config('lock_timeout', '250ms', true);
        LOCK TABLE {s}.events IN SHARE MODE;
        RETURN true;
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END $$;

    -- A new sink's mark: just before the first event within the backfill.
    CREATE FUNCTION {s}.outbox_register(p_sink text, p_now double precision, p_backfill double precision)
    RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE
        v_mark bigint;
    BEGIN
        IF NOT {s}.outbox_settled() THEN
            -- Once per sink, so worth the session's full lock_timeout (an
            -- error here only delays the registration to the next call).
            SET LOCAL lock_timeout TO DEFAULT;
            LOCK TABLE {s}.events IN SHARE MODE;
        END IF;
        SELECT min(seq) - 1 INTO v_mark FROM {s}.events WHERE at >= p_now - p_backfill;
        IF v_mark IS NULL THEN
            SELECT coalesce(max(seq), 0) INTO v_mark FROM {s}.events;
        END IF;
        INSERT INTO {s}.outbox_marks (sink, mark, registered_at) VALUES (p_sink, v_mark, p_now)
        ON CONFLICT (sink) DO NOTHING;
        SELECT mark INTO v_mark FROM {s}.outbox_marks WHERE sink = p_sink;
        RETURN v_mark;
    END $$;

    CREATE FUNCTION {s}.undelivered(
        p_sink text, p_limit integer, p_now double precision, p_backfill double precision
    ) RETURNS TABLE (
        seq bigint, event_id text, kind text, job text, run_id text, at double precision, data jsonb
    )
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (SELECT FROM {s}.outbox_marks m WHERE m.sink = p_sink) THEN
            PERFORM {s}.outbox_register(p_sink, p_now, p_backfill);
        END IF;
        -- One statement: the mark and the events are read in one snapshot.
        RETURN QUERY
            SELECT e.seq, e.event_id, e.kind, e.job, e.run_id, e.at, e.data
            FROM {s}.outbox_marks m JOIN {s}.events e ON e.seq > m.mark
            WHERE m.sink = p_sink AND NOT EXISTS (
                SELECT FROM {s}.outbox_acks a WHERE a.sink = m.sink AND a.seq = e.seq)
            ORDER BY e.seq LIMIT p_limit;
    END $$;

    CREATE FUNCTION {s}.mark_delivered(
        p_sink text, p_ids text[], p_now double precision, p_backfill double precision
    ) RETURNS void LANGUAGE plpgsql AS $$
    DECLARE
        v_mark bigint;
        v_new bigint;
    BEGIN
        -- One acknowledger per sink at a time.
        SELECT mark INTO v_mark FROM {s}.outbox_marks WHERE sink = p_sink FOR UPDATE;
        IF NOT FOUND THEN
            PERFORM {s}.outbox_register(p_sink, p_now, p_backfill);
            SELECT mark INTO v_mark FROM {s}.outbox_marks WHERE sink = p_sink FOR UPDATE;
        END IF;
        INSERT INTO {s}.outbox_acks (sink, seq)
        SELECT p_sink, e.seq FROM {s}.events e WHERE e.event_id = ANY (p_ids) AND e.seq > v_mark
        ON CONFLICT DO NOTHING;
        IF NOT {s}.outbox_settled() THEN
            RETURN;
        END IF;
        SELECT e.seq - 1 INTO v_new FROM {s}.events e
        WHERE e.seq > v_mark AND NOT EXISTS (
            SELECT FROM {s}.outbox_acks a WHERE a.sink = p_sink AND a.seq = e.seq)
        ORDER BY e.seq LIMIT 1;
        IF v_new IS NULL THEN
            SELECT coalesce(max(e.seq), 0) INTO v_new FROM {s}.events e;
        END IF;
        IF v_new > v_mark THEN
            UPDATE {s}.outbox_marks SET mark = v_new WHERE sink = p_sink;
            DELETE FROM {s}.outbox_acks WHERE sink = p_sink AND seq <= v_new;
        END IF;
    END $$;
    """,
    3: """
    -- The bare lock (Store.lock): a fenced lease with no ledger, apart from
    -- job leases. A row is never deleted, so its token keeps counting (G2).
    CREATE TABLE {s}.locks (
        key     text PRIMARY KEY,
        owner   text,
        token   bigint NOT NULL,
        expires timestamptz
    );
    """,
    4: """
    -- Cheaper ledger writes (each cycle writes a run row and two events).
    -- One events index for what is read by job: the monitor's and the
    -- views' (job, kinds, since) and the outbox backoff's (job, kinds);
    -- nothing reads events by run_id or by kind alone across jobs at scale.
    DROP INDEX IF EXISTS {s}.events_run;
    DROP INDEX IF EXISTS {s}.events_kind_at;
    DROP INDEX IF EXISTS {s}.events_job_at;
    CREATE INDEX events_job_kind_at ON {s}.events (job, kind, at);
    -- No index on runs covers a column that finish() changes, so recording
    -- the outcome is a HOT update (no index entries); the room left in each
    -- page keeps the new version on its page. Open runs are found through
    -- their leases instead of a partial index on outcome IS NULL.
    DROP INDEX IF EXISTS {s}.runs_open;
    ALTER TABLE {s}.runs SET (fillfactor = 90);
    """,
    5: """
    -- The scheduler's slot claims (Store.claim_slot, G8): no ledger. Each
    -- claim of a job forgets that job's claims older than keep, so the table
    -- holds about keep seconds of claims per job.
    CREATE TABLE {s}.slot_claims (
        job        text,
        slot       double precision,
        owner      text NOT NULL,
        claimed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        PRIMARY KEY (job, slot)
    );

    -- Store.claim_slot in one call. Age is judged by clock_timestamp()
    -- read after the claim's row is locked (the ON CONFLICT path locks it,
    -- whether or not its WHERE holds), as for leases.
    CREATE FUNCTION {s}.claim_slot(
        p_job text, p_slot double precision, p_owner text, p_keep double precision
    ) RETURNS text LANGUAGE plpgsql AS $$
    DECLARE
        v_keep interval := make_interval(secs => p_keep);
        v_owner text;
    BEGIN
        -- First: the only statement that waits for another claim, so it
        -- waits while this transaction holds no row lock (no deadlock).
        INSERT INTO {s}.slot_claims AS c (job, slot, owner) VALUES (p_job, p_slot, p_owner)
        ON CONFLICT (job, slot) DO UPDATE SET owner = excluded.owner, claimed_at = clock_timestamp()
        WHERE c.claimed_at < clock_timestamp() - v_keep
        RETURNING c.owner INTO v_owner;
        IF NOT FOUND THEN
            -- Held and not expired. The row stays locked by the statement
            -- above until commit, so this reads the owner it keeps.
            SELECT c.owner INTO v_owner FROM {s}.slot_claims c WHERE c.job = p_job AND c.slot = p_slot;
        END IF;
        -- The job's other expired claims. SKIP LOCKED: pruning never waits
        -- (a row another claim holds is left for a later call).
        DELETE FROM {s}.slot_claims d
        WHERE d.job = p_job AND d.slot IN (
            SELECT o.slot FROM {s}.slot_claims o
            WHERE o.job = p_job AND o.slot <> p_slot AND o.claimed_at < clock_timestamp() - v_keep
            FOR UPDATE SKIP LOCKED);
        RETURN v_owner;
    END $$;
    """,
}

RUN_COLUMNS = "run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome, exit_code, detail"

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


class PostgresStore(Store):
    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        clock: Clock = SYSTEM_CLOCK,
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        url: str | None = None,
    ) -> None:
        """``conninfo`` is a libpq URL or ``key=value`` string; cronwarden's own
        settings come as keywords (``from_url`` takes them from the URL)."""
        if not SCHEMA_NAME.fullmatch(schema):
            raise StoreError(f"schema must be a plain SQL name (letters, digits, _), got {schema!r}")
        self._clock = clock  # kept for the interface; expiry is the server's clock (G4)
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
        # again (G2). Replication to an async standby is documented as a limit.
        ours = (
            f"-c statement_timeout={_ms(statement_timeout)} -c lock_timeout={_ms(lock_timeout)} "
            "-c synchronous_commit=on"
        )
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
        self._sql = _Statements(self._s)
        with self._lock:
            self._migrate(self._connection())

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK) -> PostgresStore:
        """``postgresql://user@host:port/db?schema=NAME&statement_timeout=5s&lock_timeout=2s``
        plus any libpq parameter (``connect_timeout``, ``sslmode``, …)."""
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
        libpq_params = [(k, v) for k, v in query if k not in OUR_PARAMS]
        known = {d.keyword.decode() for d in pq.Conninfo.get_defaults()}
        unknown = sorted({k for k, _ in libpq_params if k not in known})
        if unknown:
            raise StoreUrlError(
                url,
                f"unknown parameter(s) {', '.join(unknown)}; cronwarden takes "
                f"{', '.join(sorted(OUR_PARAMS))} and libpq's own",
            )
        schema = ours.get("schema", DEFAULT_SCHEMA)
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
        return cls(
            conninfo,
            schema=schema,
            clock=clock,
            statement_timeout=statement_timeout,
            lock_timeout=lock_timeout,
            url=url,
        )

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
                f"PostgreSQL store {self.where}: schema {self.schema!r} is incomplete ({text}); "
                "was it dropped while in use?"
            )
        return StoreError(f"PostgreSQL store {self.where}: {text}")

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        try:
            try:
                version = _version(conn, self._s)
            except (pgerrors.UndefinedTable, pgerrors.InvalidSchemaName):
                version = 0
            if version == SCHEMA_VERSION:
                return
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"PostgreSQL store {self.where} schema {self.schema!r} has version {version}; "
                    f"this cronwarden knows up to {SCHEMA_VERSION}. Upgrade cronwarden"
                )
            with conn.transaction():
                # Building an index on a large ledger takes longer than one
                # call's statement_timeout, and concurrent first opens wait
                # here for the one that migrates rather than fail.
                conn.execute(f"SET LOCAL statement_timeout = '{MIGRATION_TIMEOUT}'")
                conn.execute(f"SET LOCAL lock_timeout = '{MIGRATION_TIMEOUT}'")
                # The only advisory lock in cronwarden, and transaction-level:
                # it makes concurrent first opens of one schema run the
                # migration one after another (CREATE … IF NOT EXISTS alone
                # races). It is released at commit and guards no lease.
                conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (MIGRATION_LOCK, self.schema))
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self._s}")
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._s}.meta (key text PRIMARY KEY, value text NOT NULL)"
                )
                version = _version(conn, self._s)
                if version > SCHEMA_VERSION:
                    raise StoreError(
                        f"PostgreSQL store {self.where} schema {self.schema!r} has version {version}; "
                        f"this cronwarden knows up to {SCHEMA_VERSION}. Upgrade cronwarden"
                    )
                for v in range(version + 1, SCHEMA_VERSION + 1):
                    conn.execute(MIGRATIONS[v].replace("{s}", self._s))
                conn.execute(
                    f"INSERT INTO {self._s}.meta (key, value) VALUES ('schema_version', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(SCHEMA_VERSION),),
                )
        except psycopg.Error as e:
            conn.close()
            self._conn = None
            raise self._call_error(conn, e, -1, self._call_timeout) from None

    # -- the contract -----------------------------------------------------

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
        row = self._call(lambda c: c.execute(self._sql.acquire, args).fetchone())
        assert row is not None
        status, token, abandoned_run = row[0], row[1], row[2]
        abandoned = () if abandoned_run is None else (abandoned_run,)
        if status == "granted":
            return Granted(lease=_lease(start, start.key, token), abandoned=abandoned)
        holder = Holder(
            run_id=row[3], host=row[4], pid=row[5], started_at=row[6], token=row[7], expires_in=row[8]
        )
        if status == "overlap":
            return Granted(lease=_lease(start, f"{start.key}+{start.run_id}", token), overlapped=holder)
        return Refused(refusal=Refusal(status), holder=holder, abandoned=abandoned)

    def renew(self, lease: Lease) -> None:
        # The heartbeat retries failed renewals until its deadline, so one
        # attempt may take a tenth of the ttl (never under half a second),
        # not the full statement budget.
        bound = min(self._call_timeout, max(0.5, lease.ttl / 10))

        def step(cur: psycopg.Cursor[Any]) -> tuple[Any, ...] | None:
            if cur.execute(self._sql.renew, (lease.ttl, lease.key, lease.run_id)).rowcount == 1:
                return None
            row = cur.execute(self._sql.lease_owner, (lease.key,)).fetchone()
            return row if row is not None else (None, None)

        why = self._call(step, bound)
        if why is None:
            return
        owner, revoked_by = why
        if owner == lease.run_id and revoked_by is not None:
            raise LeaseRevoked(lease.key, revoked_by)
        raise LeaseLost(lease.key, "expired or taken by another run")

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
            # allow's side lease is deleted on release, like SQLite's
            "+" in lease.key and lease.key.endswith("+" + lease.run_id),
        )
        sql = self._sql.finish
        if then is not None:
            sql = self._sql.finish_then
            args += (then.key, then.job, then.run_id, then.host, then.pid, then.ttl, then.at, then.slot)
        row = self._call(lambda c: c.execute(sql, args).fetchone())
        assert row is not None
        owned, recorded, next_token = row
        nxt = None
        if then is not None and next_token is not None:
            nxt = Lease(key=then.key, job=then.job, run_id=then.run_id, token=next_token, ttl=then.ttl)
        return Finished(owned=owned, recorded=recorded, next=nxt)

    # -- the bare lock ------------------------------------------------------

    def lock(self, key: str, owner: str, ttl: float) -> int | None:
        row = self._call(lambda c: c.execute(self._sql.lock, (key, owner, ttl, ttl)).fetchone())
        return None if row is None else int(row[0])

    def renew_lock(self, key: str, owner: str, ttl: float) -> bool:
        # Bounded like renew: a leader's renewal loop retries until its deadline.
        bound = min(self._call_timeout, max(0.5, ttl / 10))
        return self._call(lambda c: c.execute(self._sql.renew_lock, (ttl, key, owner)).rowcount == 1, bound)

    def unlock(self, key: str, owner: str) -> bool:
        return self._call(lambda c: c.execute(self._sql.unlock, (key, owner)).rowcount == 1)

    def record(self, event: Event) -> None:
        args = (event.event_id, event.kind.value, event.job, event.run_id, event.at, _json(dict(event.data)))
        self._call(lambda c: c.execute(self._sql.record, args))

    # -- the scheduler's slot claim ---------------------------------------

    def claim_slot(self, job: str, slot: float, owner: str, keep: float) -> str:
        row = self._call(lambda c: c.execute(self._sql.claim_slot, (job, slot, owner, keep)).fetchone())
        assert row is not None and row[0] is not None
        return str(row[0])

    # -- the read side ----------------------------------------------------

    def open_runs(self, job: str | None = None) -> list[RunRecord]:
        sql = self._sql.open_runs
        args: tuple[Any, ...] = ()
        if job is not None:
            sql += " AND r.job = %s"
            args = (job,)
        rows = self._call(lambda c: c.execute(sql + " ORDER BY r.started_at", args).fetchall())
        return [run_from_row(row[:-1], expires_in=row[-1]) for row in rows]

    def runs(self, job: str, limit: int = 50) -> list[RunRecord]:
        rows = self._call(lambda c: c.execute(self._sql.runs, (job, limit)).fetchall())
        return [run_from_row(r) for r in rows]

    def run(self, run_id: str) -> RunRecord | None:
        row = self._call(lambda c: c.execute(self._sql.run, (run_id,)).fetchone())
        return None if row is None else run_from_row(row)

    def events(self, query: EventQuery) -> list[Event]:
        where: list[str] = []
        args: list[Any] = []
        if query.job is not None:
            where.append("job = %s")
            args.append(query.job)
        if query.run_id is not None:
            where.append("run_id = %s")
            args.append(query.run_id)
        if query.kinds:
            where.append("kind = ANY(%s::text[])")
            args.append([k.value for k in query.kinds])
        if query.since is not None:
            where.append("at >= %s")
            args.append(query.since)
        sql = f"SELECT seq, event_id, kind, job, run_id, at, data FROM {self._s}.events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY at {'DESC' if query.newest_first else 'ASC'}, seq LIMIT %s"
        args.append(query.limit)
        rows = self._call(lambda c: c.execute(sql, args).fetchall())
        return [_event(row) for row in rows]

    def lease(self, key: str) -> LeaseInfo | None:
        row = self._call(lambda c: c.execute(self._sql.lease, (key,)).fetchone())
        if row is None:
            return None
        owner, token, expires_in, pending, revoked_by = row
        return LeaseInfo(
            key=key, owner=owner, token=token, expires_in=expires_in, pending=pending, revoked_by=revoked_by
        )

    def save_job(self, job: JobInfo) -> None:
        args = (
            job.name,
            job.schedule,
            job.period,
            job.policy,
            job.reason,
            job.ttl,
            job.grace,
            job.max_runtime,
            job.updated_at,
        )
        self._call(lambda c: c.execute(self._sql.save_job, args))

    def jobs(self) -> list[JobInfo]:
        rows = self._call(lambda c: c.execute(self._sql.jobs).fetchall())
        # Columns in JobInfo field order.
        return [JobInfo._make(r) for r in rows]

    def job(self, name: str) -> JobInfo | None:
        row = self._call(lambda c: c.execute(self._sql.job, (name,)).fetchone())
        return None if row is None else JobInfo._make(row)

    # -- the outbox -------------------------------------------------------

    def undelivered(self, sink: str, limit: int, *, backfill: float = NEW_SINK_BACKFILL) -> list[Event]:
        if limit < 1:
            return []
        args = (sink, limit, self._clock.wall(), backfill)
        rows = self._call(lambda c: c.execute(self._sql.undelivered, args).fetchall())
        return [_event(row) for row in rows]

    def mark_delivered(self, sink: str, event_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(event_ids))
        if not ids:
            return
        args = (sink, ids, self._clock.wall(), NEW_SINK_BACKFILL)
        self._call(lambda c: c.execute(self._sql.mark_delivered, args))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._watchdog.close()
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


class _Statements:
    """The SQL of each step, with the schema filled in once."""

    def __init__(self, s: str) -> None:
        self.acquire = (
            f"SELECT * FROM {s}.acquire(%s::text, %s::text, %s::text, %s::text, %s::integer, "
            "%s::float8, %s::float8, %s::float8, %s::text, %s::integer)"
        )
        finish = (
            f"SELECT * FROM {s}.finish(%s::text, %s::text, %s::text, %s::bigint, %s::text, %s::float8, "
            "%s::integer, %s::text, %s::text, %s::boolean, "
        )
        self.finish = finish + "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
        self.finish_then = (
            finish
            + "%s::text, %s::text, %s::text, %s::text, %s::integer, %s::float8, %s::float8, %s::float8)"
        )
        self.renew = (
            f"UPDATE {s}.leases SET expires = clock_timestamp() + make_interval(secs => %s::float8) "
            "WHERE key = %s AND owner = %s AND expires > clock_timestamp() AND revoked_by IS NULL"
        )
        self.lease_owner = f"SELECT owner, revoked_by FROM {s}.leases WHERE key = %s"
        # The expiry in SET is read after the row is locked (excluded's was
        # read before any wait), like the judgement in WHERE (G4).
        self.lock = (
            f"INSERT INTO {s}.locks AS l (key, owner, token, expires) "
            "VALUES (%s, %s, 1, clock_timestamp() + make_interval(secs => %s::float8)) "
            "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = l.token + 1, "
            "expires = clock_timestamp() + make_interval(secs => %s::float8) "
            "WHERE l.owner IS NULL OR l.expires <= clock_timestamp() RETURNING token"
        )
        self.renew_lock = (
            f"UPDATE {s}.locks SET expires = clock_timestamp() + make_interval(secs => %s::float8) "
            "WHERE key = %s AND owner = %s AND expires > clock_timestamp()"
        )
        # An expired lock is no longer held (as with Redis's PX), so its
        # owner's unlock is stale: False, and the row stays as it is.
        self.unlock = (
            f"UPDATE {s}.locks SET owner = NULL, expires = NULL "
            "WHERE key = %s AND owner = %s AND expires > clock_timestamp()"
        )
        self.claim_slot = f"SELECT {s}.claim_slot(%s::text, %s::float8, %s::text, %s::float8)"
        self.record = (
            f"INSERT INTO {s}.events (event_id, kind, job, run_id, at, data) "
            "VALUES (%s, %s, %s, %s, %s::float8, %s::jsonb) ON CONFLICT (event_id) DO NOTHING"
        )
        self.lease = (
            "SELECT owner, token, extract(epoch FROM expires - clock_timestamp())::float8, pending, "
            f"revoked_by FROM {s}.leases WHERE key = %s"
        )
        # A run with no terminal record always owns its lease row: every
        # step that moves a lease to another owner or deletes it records
        # the previous owner's terminal record first (acquire's abandoned,
        # finish). So the open runs are among the lease owners, a table of
        # one row per key, and runs needs no index on outcome (HOT finish).
        self.open_runs = (
            f"SELECT {', '.join('r.' + c for c in RUN_COLUMNS.split(', '))}, "
            "extract(epoch FROM l.expires - clock_timestamp())::float8 "
            f"FROM {s}.leases l JOIN {s}.runs r ON r.run_id = l.owner AND r.key = l.key "
            "WHERE r.outcome IS NULL"
        )
        self.runs = f"SELECT {RUN_COLUMNS} FROM {s}.runs WHERE job = %s ORDER BY started_at DESC LIMIT %s"
        self.run = f"SELECT {RUN_COLUMNS} FROM {s}.runs WHERE run_id = %s"
        self.save_job = (
            f"INSERT INTO {s}.jobs (name, schedule, period, policy, reason, ttl, grace, max_runtime, "
            "updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
            "schedule = excluded.schedule, period = excluded.period, policy = excluded.policy, "
            "reason = excluded.reason, ttl = excluded.ttl, grace = excluded.grace, "
            "max_runtime = excluded.max_runtime, updated_at = excluded.updated_at"
        )
        self.undelivered = f"SELECT * FROM {s}.undelivered(%s::text, %s::integer, %s::float8, %s::float8)"
        self.mark_delivered = f"SELECT {s}.mark_delivered(%s::text, %s::text[], %s::float8, %s::float8)"
        job_columns = "SELECT name, schedule, period, policy, reason, ttl, grace, max_runtime, updated_at "
        self.jobs = f"{job_columns} FROM {s}.jobs ORDER BY name"
        self.job = f"{job_columns} FROM {s}.jobs WHERE name = %s"


def _version(conn: psycopg.Connection[Any], s: str) -> int:
    row = conn.execute(f"SELECT value FROM {s}.meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def _event(row: Any) -> Event:
    seq, eid, kind, job, rid, at, data = row
    return Event(seq=seq, event_id=eid, kind=EventKind(kind), job=job, run_id=rid, at=at, data=data)


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
