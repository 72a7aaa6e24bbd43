"""The embedded store: one SQLite file in WAL mode, safe for many processes
on one host.

Expiry is judged by CLOCK_BOOTTIME (shared by every process on the host,
never stepped by NTP) plus the boot id: a lease written in an earlier boot is
expired, since every process of that boot is gone (G4).

``synchronous=FULL`` by default: every commit is fsynced, so a ``skipped`` or
``started`` record and the fencing counter survive a power cut. It costs one
fsync per commit (about a millisecond here); a cron job starts at most a few
times a minute, and a fencing counter that goes backwards after a crash would
break G2. ``?synchronous=normal`` in the URL trades that for speed on hosts
where losing the last commits on power loss is acceptable.

The outbox (schema v2) is a mark per sink plus the acknowledged events above
it. SQLite has one writer at a time and assigns ``seq`` inside the write
transaction, so ``seq`` order is commit order here: no event can appear below
an acknowledged one, and the mark moves right up to the end of the
acknowledged prefix.

Since schema v3 ``seq`` is a plain ``INTEGER PRIMARY KEY`` (the rowid), not
AUTOINCREMENT, which wrote the ``sqlite_sequence`` page in every commit that
appends an event. A plain rowid is ``max(seq) + 1``, so it could reuse the
seq of a deleted *newest* event, and a sink whose mark had passed that seq
would never see the new event. That cannot happen here, because the newest
event cannot be deleted: the trigger ``events_keep_newest`` aborts any delete
of the row holding ``max(seq)``. So ``max(seq)`` never decreases, every new
seq is greater than every seq ever assigned (deleted ones were below the max
when deleted), and a mark, which never exceeds ``max(seq)``, stays below every
new event. The v3 migration lowers any mark above ``max(seq)`` (possible only
if a v2 file's newest events were deleted by hand) to ``max(seq)``, so the
same holds for files upgraded from v2. Nothing in cronwarden deletes events
from SQLite; a retention policy must keep the newest one.

Write cost per guarded run (schema v3): each commit appends one WAL page per
b-tree it touches, and with ``synchronous=FULL`` fsyncs them. ``runs`` is a
WITHOUT ROWID table keyed by ``run_id`` (one b-tree, not a rowid table plus a
separate primary-key index), and ``events`` has the indexes its readers use:
``event_id`` (unique: the outbox acknowledges by id) and ``(job, at)`` (the
monitor's bounded window reads, ``history``). ``events(run_id=…)`` without a
job scans the ledger; nothing on a hot path asks for it.

Schema v4 adds ``slot_claims`` (``claim_slot``, G8): one row per claimed
``(job, slot)``, keyed by both (WITHOUT ROWID), with the owner and when it
was claimed by the store's clock and boot. Each claim of a job forgets that
job's claims older than ``keep`` in the same transaction, so the table holds
about ``keep`` seconds of claims per job. CLOCK_BOOTTIME starts again at a
reboot, so a claim of an earlier boot is judged by this boot's clock alone:
once this boot has run longer than ``keep``, more than ``keep`` has passed
since any claim made before it.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.durations import parse_duration
from cronwarden.errors import LeaseLost, LeaseRevoked, StoreError, StoreUnavailable, StoreUrlError
from cronwarden.events import Event, EventKind, JobInfo, RunRecord, new_id
from cronwarden.lease import Lease
from cronwarden.policy import Policy
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
    holder_data,
    run_from_row,
)

try:
    # The C function json.encoder itself uses. ``json`` is imported only off
    # the per-run path (reads, unusual values): importing it compiles its
    # decoder's regular expressions, ~5M instructions on every cron tick.
    from _json import encode_basestring_ascii
except ImportError:  # pragma: no cover - an interpreter without the _json accelerator
    from json.encoder import encode_basestring_ascii

T = TypeVar("T")

SCHEMA_VERSION = 4
MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE leases (
        key        TEXT PRIMARY KEY,
        job        TEXT NOT NULL,
        owner      TEXT,
        token      INTEGER NOT NULL,
        expires    REAL,
        boot_id    TEXT,
        pending    INTEGER NOT NULL DEFAULT 0,
        revoked_by TEXT
    );
    CREATE TABLE runs (
        run_id     TEXT PRIMARY KEY,
        job        TEXT NOT NULL,
        key        TEXT NOT NULL,
        host       TEXT NOT NULL,
        pid        INTEGER NOT NULL,
        token      INTEGER NOT NULL,
        slot       REAL,
        started_at REAL NOT NULL,
        ended_at   REAL,
        outcome    TEXT,
        exit_code  INTEGER,
        detail     TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX runs_job_started ON runs (job, started_at);
    CREATE INDEX runs_open ON runs (job, started_at) WHERE outcome IS NULL;
    CREATE TABLE events (
        seq      INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id TEXT NOT NULL UNIQUE,
        kind     TEXT NOT NULL,
        job      TEXT NOT NULL,
        run_id   TEXT,
        at       REAL NOT NULL,
        data     TEXT NOT NULL
    );
    CREATE INDEX events_job_at ON events (job, at);
    CREATE INDEX events_run ON events (run_id);
    CREATE TABLE jobs (
        name        TEXT PRIMARY KEY,
        schedule    TEXT,
        period      REAL,
        policy      TEXT NOT NULL,
        reason      TEXT NOT NULL,
        ttl         REAL,
        grace       REAL,
        max_runtime REAL,
        updated_at  REAL NOT NULL
    );
    """,
    2: """
    CREATE TABLE outbox_marks (
        sink          TEXT PRIMARY KEY,
        mark          INTEGER NOT NULL,
        registered_at REAL NOT NULL
    );
    CREATE TABLE outbox_acks (
        sink TEXT NOT NULL,
        seq  INTEGER NOT NULL,
        PRIMARY KEY (sink, seq)
    ) WITHOUT ROWID;
    """,
    # v3: fewer pages per commit (see the module docstring), and the bare lock.
    # The tables are rebuilt in key order and their indexes (event_id's unique
    # one too) built once at the end: row by row, the random event ids made
    # the copy several times slower. Still a rewrite of the ledger under the
    # write lock: about 20 s for 200,000 runs on a busy disk here.
    3: """
    CREATE TABLE locks (
        key     TEXT PRIMARY KEY,
        owner   TEXT,
        token   INTEGER NOT NULL,
        expires REAL,
        boot_id TEXT
    ) WITHOUT ROWID;
    CREATE TABLE runs_v3 (
        run_id     TEXT PRIMARY KEY,
        job        TEXT NOT NULL,
        key        TEXT NOT NULL,
        host       TEXT NOT NULL,
        pid        INTEGER NOT NULL,
        token      INTEGER NOT NULL,
        slot       REAL,
        started_at REAL NOT NULL,
        ended_at   REAL,
        outcome    TEXT,
        exit_code  INTEGER,
        detail     TEXT NOT NULL DEFAULT ''
    ) WITHOUT ROWID;
    INSERT INTO runs_v3 (run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome,
                         exit_code, detail)
        SELECT run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome, exit_code, detail
        FROM runs ORDER BY run_id;
    DROP TABLE runs;
    ALTER TABLE runs_v3 RENAME TO runs;
    CREATE INDEX runs_job_started ON runs (job, started_at);
    CREATE INDEX runs_open ON runs (job, started_at) WHERE outcome IS NULL;
    CREATE TABLE events_v3 (
        seq      INTEGER PRIMARY KEY,
        event_id TEXT NOT NULL,
        kind     TEXT NOT NULL,
        job      TEXT NOT NULL,
        run_id   TEXT,
        at       REAL NOT NULL,
        data     TEXT NOT NULL
    );
    INSERT INTO events_v3 (seq, event_id, kind, job, run_id, at, data)
        SELECT seq, event_id, kind, job, run_id, at, data FROM events ORDER BY seq;
    DROP TABLE events;
    ALTER TABLE events_v3 RENAME TO events;
    CREATE UNIQUE INDEX events_event_id ON events (event_id);
    CREATE INDEX events_job_at ON events (job, at);
    CREATE TRIGGER events_keep_newest BEFORE DELETE ON events
        WHEN old.seq = (SELECT max(seq) FROM events)
    BEGIN
        SELECT RAISE(ABORT, 'the newest event must not be deleted: seq numbers would be reused');
    END;
    UPDATE outbox_marks SET mark = (SELECT coalesce(max(seq), 0) FROM events)
        WHERE mark > (SELECT coalesce(max(seq), 0) FROM events);
    DELETE FROM outbox_acks WHERE seq > (SELECT coalesce(max(seq), 0) FROM events);
    """,
    # v4: the scheduler's slot claims (see the module docstring). A new
    # table only: the upgrade rewrites nothing.
    4: """
    CREATE TABLE slot_claims (
        job        TEXT NOT NULL,
        slot       REAL NOT NULL,
        owner      TEXT NOT NULL,
        claimed_at REAL NOT NULL,
        boot_id    TEXT NOT NULL,
        PRIMARY KEY (job, slot)
    ) WITHOUT ROWID;
    """,
}
ACK_CHUNK = 500
"""Event ids per ``IN (…)`` when acknowledging (SQLite limits bound parameters)."""

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smbfs",
        "smb3",
        "9p",
        "afs",
        "ncpfs",
        "fuse.sshfs",
        "glusterfs",
        "ceph",
        "lustre",
        "gpfs",
        "fuse.s3fs",
        "fuse.rclone",
        "davfs",
        "fuse.gcsfuse",
    }
)


def filesystem_type(path: str) -> str | None:
    """The type of the filesystem ``path`` lives on, from /proc/mounts."""
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    best, fstype = "", None
    target = os.path.realpath(path)
    for fields in mounts:
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, fields[2]
    return fstype


class SqliteStore(Store):
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = SYSTEM_CLOCK,
        synchronous: str = "FULL",
        busy_timeout: float = 5.0,
    ) -> None:
        self.path = os.fspath(path)
        self.url = f"sqlite:///{self.path}"
        self._clock = clock
        self._busy_ms = int(busy_timeout * 1000)
        self._lock = threading.Lock()
        self._transaction = _Transaction(self)
        parent = os.path.dirname(os.path.abspath(self.path))
        exists = os.path.exists(self.path)
        fstype = filesystem_type(self.path if exists else parent)
        if fstype in NETWORK_FILESYSTEMS:
            raise StoreError(
                f"{self.path} is on a network filesystem ({fstype}); SQLite locking is not safe "
                "there. Use a local path, or postgresql:// or redis:// for jobs on several hosts"
            )
        if exists and not os.path.isfile(self.path):
            # A directory or a device (/dev/null): SQLite would say "unable to
            # open" or fail later with a retryable-looking I/O error.
            what = "a directory" if os.path.isdir(self.path) else "not a regular file"
            raise StoreError(f"SQLite store {self.path} is {what}; expected a database file path")
        try:
            os.makedirs(parent, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout
            )
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open SQLite store {self.path}: {e}") from None
        try:
            self._db.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            self._prepare(synchronous, deadline=time.monotonic() + busy_timeout)
        except StoreError:
            self._db.close()
            raise
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise _store_error(self.path, e) from None

    def _prepare(self, synchronous: str, deadline: float) -> None:
        """Check the file is ours, set WAL mode, create or upgrade the schema.

        Several processes may open a new file at once (two cron lines firing
        in the same minute, scheduler instances starting together): the
        version and the tables are read in one snapshot, so a schema being
        created by another process is never mistaken for another program's
        tables, and a busy answer SQLite gives without waiting (a connection
        that holds a read lock while another writes; the busy timeout does
        not apply there) is retried until the busy timeout has passed."""
        db = self._db
        while True:
            try:
                db.execute("BEGIN")
                try:
                    version = db.execute("PRAGMA user_version").fetchone()[0]
                    if version == 0:
                        self._refuse_foreign()  # before WAL mode rewrites the file's header
                finally:
                    if db.in_transaction:
                        db.execute("COMMIT")
                mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode.lower() != "wal":
                    raise StoreError(f"cannot put {self.path} in WAL mode (got {mode})")
                db.execute(f"PRAGMA synchronous = {synchronous}")
                if version != SCHEMA_VERSION:
                    self._migrate()
                return
            except sqlite3.OperationalError as e:
                text = str(e)
                if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)  # another process is creating or upgrading the schema

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK) -> SqliteStore:
        path = path_of(url)
        query = url.partition("?")[2]
        params: dict[str, str] = {}
        if query:  # urllib.parse only when there is a query: it costs the wrapper ~1 ms
            from urllib.parse import parse_qs

            params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        sync = params.pop("synchronous", "full").upper()
        if sync not in ("FULL", "NORMAL", "EXTRA"):
            raise StoreUrlError(url, f"synchronous must be full, normal or extra, got {sync.lower()!r}")
        busy = parse_duration(params.pop("busy_timeout", "5s"), what="busy_timeout")
        if params:
            raise StoreUrlError(url, f"unknown parameter(s) {', '.join(sorted(params))}")
        return cls(path, clock=clock, synchronous=sync, busy_timeout=busy)

    # -- plumbing ---------------------------------------------------------

    def _refuse_foreign(self) -> None:
        """Schema version 0 is a new file, or another program's database: one
        with tables of its own is not ours to change (a table named like one
        of ours would fail the schema, or be written into)."""
        tables = [r[0] for r in self._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%' "
            "ORDER BY name LIMIT 4")]  # fmt: skip
        if tables:
            named = ", ".join(tables[:3]) + (", …" if len(tables) > 3 else "")
            raise StoreError(
                f"{self.path} is not a cronwarden store: it holds other tables ({named}) and no cronwarden "
                "schema version; give a new file or a cronwarden one (sqlite:///PATH)"
            )

    def _migrate(self) -> None:
        """The schema version lives in SQLite's ``user_version`` header field,
        so the common case (up to date) is one read at open, with no write
        lock; this takes the lock and upgrades (or creates) the schema."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}; this cronwarden knows up to "
                    f"{SCHEMA_VERSION}. Upgrade cronwarden"
                )
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for statement in statements(MIGRATIONS[v]):
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _tx(self) -> _Transaction:
        """One write transaction (``with self._tx() as db``). BEGIN IMMEDIATE
        takes the write lock up front, so two processes never both read a
        free lease and grant it."""
        return self._transaction

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            try:
                return fn(self._db)
            except sqlite3.Error as e:
                raise _store_error(self.path, e) from None

    def _now(self) -> tuple[float, str]:
        return self._clock.store_time(), self._clock.boot_id()

    @staticmethod
    def _insert_event(db: sqlite3.Connection, event: Event) -> None:
        import json

        data = json.dumps(dict(event.data), separators=(",", ":"), default=str)
        db.execute(_INSERT_EVENT, (event.event_id, event.kind.value, event.job, event.run_id, event.at, data))

    def _start_run(self, db: sqlite3.Connection, start: Start, token: int) -> None:
        db.execute(
            "INSERT INTO runs (run_id, job, key, host, pid, token, slot, started_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (start.run_id, start.job, start.key, start.host, start.pid, token, start.slot, start.at),
        )
        # The event data by hand, in json.dumps's format: the encoder costs
        # several times this on every start.
        data = (
            f'{{"host":{_str(start.host)},"pid":{_num(start.pid)},"token":{_num(token)},'
            f'"key":{_str(start.key)},"slot":{_num(start.slot)},"ttl":{_num(start.ttl)}}}'
        )
        db.execute(
            _INSERT_EVENT, (new_id(), EventKind.STARTED.value, start.job, start.run_id, start.at, data)
        )

    def _abandon(self, db: sqlite3.Connection, run_id: str, job: str, at: float, found_by: str) -> bool:
        cur = db.execute(
            "UPDATE runs SET outcome = 'abandoned', ended_at = ?, detail = ? "
            "WHERE run_id = ? AND outcome IS NULL",
            (at, f"lease expired with no terminal record; found by run {found_by}", run_id),
        )
        if cur.rowcount:
            self._insert_event(
                db,
                Event(
                    kind=EventKind.ABANDONED,
                    job=job,
                    run_id=run_id,
                    at=at,
                    data={"found_by": found_by},
                ),
            )
        return bool(cur.rowcount)

    # -- the contract -----------------------------------------------------

    def acquire(self, start: Start) -> Granted | Refused:
        now, boot = self._now()
        with self._tx() as db:
            # The common case in one statement: the lease is new or released
            # (no owner, so no run to abandon). Anything else reads the holder.
            free = db.execute(
                _GRANT_FREE, (start.key, start.job, start.run_id, now + start.ttl, boot)
            ).fetchone()
            if free is not None:
                self._start_run(db, start, free[0])
                return Granted(lease=_lease(start, free[0]))
            row = db.execute(
                "SELECT l.owner, l.token, l.expires, l.boot_id, l.pending, r.host, r.pid, r.started_at "
                "FROM leases l LEFT JOIN runs r ON r.run_id = l.owner WHERE l.key = ?",
                (start.key,),
            ).fetchone()
            abandoned: tuple[str, ...] = ()
            if row is None:
                token = 1
                db.execute(
                    "INSERT INTO leases (key, job, owner, token, expires, boot_id) VALUES (?, ?, ?, ?, ?, ?)",
                    (start.key, start.job, start.run_id, token, now + start.ttl, boot),
                )
                self._start_run(db, start, token)
                return Granted(lease=_lease(start, token))
            owner, last_token, expires, lease_boot, pending, host, pid, started_at = row
            live = owner is not None and lease_boot == boot and expires is not None and expires > now
            if owner is not None and not live and self._abandon(db, owner, start.job, start.at, start.run_id):
                abandoned = (owner,)
            if not live:
                token = last_token + 1
                db.execute(
                    "UPDATE leases SET owner = ?, token = ?, expires = ?, boot_id = ?, revoked_by = NULL "
                    "WHERE key = ?",
                    (start.run_id, token, now + start.ttl, boot, start.key),
                )
                self._start_run(db, start, token)
                return Granted(lease=_lease(start, token), abandoned=abandoned)
            holder = Holder(
                run_id=owner,
                host=host or "?",
                pid=pid or 0,
                started_at=started_at or 0.0,
                token=last_token,
                expires_in=expires - now,
            )
            return self._refuse_or_overlap(db, start, holder, pending, now, boot)

    def _refuse_or_overlap(
        self, db: sqlite3.Connection, start: Start, holder: Holder, pending: int, now: float, boot: str
    ) -> Granted | Refused:
        data: dict[str, Any] = {
            **holder_data(holder, start.at),
            "slot": start.slot,
            "host": start.host,
            "pid": start.pid,
            "policy": start.policy.value,
        }
        if start.policy is Policy.REPLACE:
            db.execute(
                "UPDATE leases SET revoked_by = ? WHERE key = ? AND revoked_by IS NULL",
                (start.run_id, start.key),
            )
            return Refused(refusal=Refusal.REVOKING, holder=holder)
        if start.policy is Policy.ALLOW:
            side = start._replace(key=f"{start.key}+{start.run_id}")
            db.execute(
                "INSERT INTO leases (key, job, owner, token, expires, boot_id) VALUES (?, ?, ?, 1, ?, ?)",
                (side.key, start.job, start.run_id, now + start.ttl, boot),
            )
            self._start_run(db, side, 1)
            self._insert_event(
                db, Event(kind=EventKind.OVERLAP, job=start.job, run_id=start.run_id, at=start.at, data=data)
            )
            return Granted(lease=_lease(side, 1), overlapped=holder)
        if start.policy is Policy.QUEUE:
            if pending < start.max_pending:
                db.execute("UPDATE leases SET pending = pending + 1 WHERE key = ?", (start.key,))
                kind, refusal = EventKind.QUEUED, Refusal.QUEUED
                data["pending"] = pending + 1
            else:
                kind, refusal = EventKind.QUEUE_FULL, Refusal.QUEUE_FULL
                data["pending"] = pending
        else:
            kind, refusal = EventKind.SKIPPED, Refusal.SKIPPED
        self._insert_event(db, Event(kind=kind, job=start.job, run_id=start.run_id, at=start.at, data=data))
        return Refused(refusal=refusal, holder=holder)

    def renew(self, lease: Lease) -> None:
        now, boot = self._now()
        # Wait for the write lock at most a tenth of the ttl per attempt: the
        # heartbeat retries, and must be free to notice its deadline.
        busy_ms = max(20, int(lease.ttl * 100))
        with self._lock:
            try:
                self._db.execute(f"PRAGMA busy_timeout = {busy_ms}")
                try:
                    cur = self._db.execute(
                        "UPDATE leases SET expires = ? WHERE key = ? AND owner = ? AND boot_id = ? "
                        "AND expires > ? AND revoked_by IS NULL",
                        (now + lease.ttl, lease.key, lease.run_id, boot, now),
                    )
                    if cur.rowcount == 1:
                        return
                    row = self._db.execute(
                        "SELECT owner, revoked_by FROM leases WHERE key = ?", (lease.key,)
                    ).fetchone()
                finally:
                    self._db.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            except sqlite3.Error as e:
                raise _store_error(self.path, e) from None
        if row is not None and row[0] == lease.run_id and row[1] is not None:
            raise LeaseRevoked(lease.key, row[1])
        raise LeaseLost(lease.key, "expired or taken by another run")

    def finish(self, lease: Lease, end: End, then: Start | None = None) -> Finished:
        now, boot = self._now()
        side = "+" in lease.key and lease.key.endswith("+" + lease.run_id)  # policy allow's side lease
        with self._tx() as db:
            started = db.execute(
                "UPDATE runs SET outcome = ?, ended_at = ?, exit_code = ?, detail = ? "
                "WHERE run_id = ? AND outcome IS NULL RETURNING started_at",
                (end.outcome.value, end.at, end.exit_code, end.detail, lease.run_id),
            ).fetchone()
            recorded = started is not None
            if started is not None:
                # {"exit_code", "token", "detail"?, "replaced_by"?, "duration"}, by hand as in _start_run.
                data = f'{{"exit_code":{_num(end.exit_code)},"token":{_num(lease.token)},'
                if end.detail:
                    data += f'"detail":{_str(end.detail)},'
                if end.replaced_by:
                    data += f'"replaced_by":{_str(end.replaced_by)},'
                data += f'"duration":{_num(round(end.at - started[0], 6))}}}'
                db.execute(
                    _INSERT_EVENT, (new_id(), end.outcome.value, lease.job, lease.run_id, end.at, data)
                )
            if then is None and not side:
                # The common case: release iff still ours (G1), pending or not.
                cur = db.execute(
                    "UPDATE leases SET owner = NULL, expires = NULL, revoked_by = NULL "
                    "WHERE key = ? AND owner = ?",
                    (lease.key, lease.run_id),
                )
                return Finished(owned=cur.rowcount == 1, recorded=recorded)
            row = db.execute(
                "SELECT pending FROM leases WHERE key = ? AND owner = ?", (lease.key, lease.run_id)
            ).fetchone()
            if row is None:
                if then is not None:
                    # A retried finish whose first try handed the lease to the
                    # queued run: report that hand-over again, not lose it.
                    handed = db.execute(
                        "SELECT token FROM leases WHERE key = ? AND owner = ?", (lease.key, then.run_id)
                    ).fetchone()
                    if handed is not None:
                        return Finished(owned=True, recorded=recorded, next=_lease(then, handed[0]))
                return Finished(owned=False, recorded=recorded)
            if side:
                db.execute("DELETE FROM leases WHERE key = ?", (lease.key,))
                return Finished(owned=True, recorded=recorded)
            if then is not None and row[0] > 0:
                db.execute(
                    "UPDATE leases SET owner = ?, token = token + 1, expires = ?, boot_id = ?, "
                    "pending = pending - 1, revoked_by = NULL WHERE key = ?",
                    (then.run_id, now + then.ttl, boot, lease.key),
                )
                token = db.execute("SELECT token FROM leases WHERE key = ?", (lease.key,)).fetchone()[0]
                self._start_run(db, then, token)
                return Finished(owned=True, recorded=recorded, next=_lease(then, token))
            db.execute(
                "UPDATE leases SET owner = NULL, expires = NULL, revoked_by = NULL WHERE key = ?",
                (lease.key,),
            )
            return Finished(owned=True, recorded=recorded)

    def record(self, event: Event) -> None:
        with self._tx() as db:
            self._insert_event(db, event)

    # -- the bare lock ----------------------------------------------------
    # One autocommit statement each: SQLite takes the write lock for the
    # statement, so the check and the change are one atomic step.

    def lock(self, key: str, owner: str, ttl: float) -> int | None:
        now, boot = self._now()
        rows, _ = self._statement(_LOCK, (key, owner, now, now + ttl, boot))
        return int(rows[0][0]) if rows else None

    def renew_lock(self, key: str, owner: str, ttl: float) -> bool:
        now, boot = self._now()
        return self._statement(_RENEW_LOCK, (now + ttl, key, owner, boot, now))[1] == 1

    def unlock(self, key: str, owner: str) -> bool:
        now, boot = self._now()
        return self._statement(_UNLOCK, (key, owner, boot, now))[1] == 1

    def _statement(self, sql: str, args: tuple[Any, ...]) -> tuple[list[Any], int]:
        """One autocommit statement: its rows (read to the end, which ends
        its transaction) and how many rows it changed."""
        with self._lock:
            try:
                cur = self._db.execute(sql, args)
                return cur.fetchall(), cur.rowcount
            except sqlite3.Error as e:
                raise _store_error(self.path, e) from None

    # -- the scheduler's slot claim -------------------------------------------

    def claim_slot(self, job: str, slot: float, owner: str, keep: float) -> str:
        slot = float(slot)
        with self._tx() as db:
            # The time is read under the write lock (held from BEGIN
            # IMMEDIATE), so a wait for the lock cannot date the claim early,
            # and nobody claims between the insert and the read of the owner.
            now, boot = self._now()
            db.execute(_FORGET_CLAIMS, (job, now, keep, boot))
            db.execute(_CLAIM, (job, slot, owner, now, boot))
            row = db.execute(_SLOT_OWNER, (job, slot)).fetchone()
        return str(row[0])

    # -- the read side ----------------------------------------------------

    def open_runs(self, job: str | None = None) -> list[RunRecord]:
        now, boot = self._now()
        sql = (
            "SELECT r.*, l.expires, l.boot_id FROM runs r "
            "LEFT JOIN leases l ON l.key = r.key AND l.owner = r.run_id WHERE r.outcome IS NULL"
        )
        args: tuple[Any, ...] = ()
        if job is not None:
            sql += " AND r.job = ?"
            args = (job,)
        rows = self._read(lambda db: db.execute(sql + " ORDER BY r.started_at", args).fetchall())
        out = []
        for row in rows:
            expires, lease_boot = row[-2], row[-1]
            if expires is None:
                left = None
            elif lease_boot != boot:
                left = -1.0
            else:
                left = expires - now
            out.append(run_from_row(row[:-2], expires_in=left))
        return out

    def runs(self, job: str, limit: int = 50) -> list[RunRecord]:
        rows = self._read(
            lambda db: db.execute(
                "SELECT * FROM runs WHERE job = ? ORDER BY started_at DESC LIMIT ?", (job, limit)
            ).fetchall()
        )
        return [run_from_row(r) for r in rows]

    def run(self, run_id: str) -> RunRecord | None:
        row = self._read(lambda db: db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone())
        return None if row is None else run_from_row(row)

    def events(self, query: EventQuery) -> list[Event]:
        where: list[str] = []
        args: list[Any] = []
        if query.job is not None:
            where.append("job = ?")
            args.append(query.job)
        if query.run_id is not None:
            where.append("run_id = ?")
            args.append(query.run_id)
        if query.kinds:
            where.append(f"kind IN ({','.join('?' * len(query.kinds))})")
            args.extend(k.value for k in query.kinds)
        if query.since is not None:
            where.append("at >= ?")
            args.append(query.since)
        sql = "SELECT seq, event_id, kind, job, run_id, at, data FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY at {'DESC' if query.newest_first else 'ASC'}, seq LIMIT ?"
        args.append(query.limit)
        rows = self._read(lambda db: db.execute(sql, args).fetchall())
        return [_event(row) for row in rows]

    def lease(self, key: str) -> LeaseInfo | None:
        now, boot = self._now()
        row = self._read(
            lambda db: db.execute(
                "SELECT owner, token, expires, boot_id, pending, revoked_by FROM leases WHERE key = ?", (key,)
            ).fetchone()
        )
        if row is None:
            return None
        owner, token, expires, lease_boot, pending, revoked_by = row
        left = None if expires is None else (expires - now if lease_boot == boot else -1.0)
        return LeaseInfo(
            key=key, owner=owner, token=token, expires_in=left, pending=pending, revoked_by=revoked_by
        )

    def save_job(self, job: JobInfo) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO jobs (name, schedule, period, policy, reason, ttl, grace, max_runtime, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "schedule = excluded.schedule, period = excluded.period, policy = excluded.policy, "
                "reason = excluded.reason, ttl = excluded.ttl, grace = excluded.grace, "
                "max_runtime = excluded.max_runtime, updated_at = excluded.updated_at",
                (
                    job.name,
                    job.schedule,
                    job.period,
                    job.policy,
                    job.reason,
                    job.ttl,
                    job.grace,
                    job.max_runtime,
                    job.updated_at,
                ),
            )

    def jobs(self) -> list[JobInfo]:
        rows = self._read(lambda db: db.execute(f"{_SELECT_JOBS} ORDER BY name").fetchall())
        return [JobInfo._make(r) for r in rows]

    def job(self, name: str) -> JobInfo | None:
        row = self._read(
            lambda db: db.execute(
                f"{_SELECT_JOBS} WHERE name = ?",
                (name,),
            ).fetchone()
        )
        return None if row is None else JobInfo._make(row)

    # -- the outbox -------------------------------------------------------

    def undelivered(self, sink: str, limit: int, *, backfill: float = NEW_SINK_BACKFILL) -> list[Event]:
        if limit < 1:
            return []
        if self._read(lambda db: _mark(db, sink)) is None:
            with self._tx() as db:
                if _mark(db, sink) is None:
                    self._register(db, sink, backfill)
        # One statement, so the mark and the events are read in one snapshot.
        rows = self._read(
            lambda db: db.execute(
                "SELECT e.seq, e.event_id, e.kind, e.job, e.run_id, e.at, e.data "
                "FROM outbox_marks m JOIN events e ON e.seq > m.mark WHERE m.sink = ? AND NOT EXISTS "
                "(SELECT 1 FROM outbox_acks a WHERE a.sink = m.sink AND a.seq = e.seq) "
                "ORDER BY e.seq LIMIT ?",
                (sink, limit),
            ).fetchall()
        )
        return [_event(row) for row in rows]

    def mark_delivered(self, sink: str, event_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(event_ids))
        if not ids:
            return
        with self._tx() as db:
            mark = _mark(db, sink)
            if mark is None:
                mark = self._register(db, sink, NEW_SINK_BACKFILL)
            for i in range(0, len(ids), ACK_CHUNK):
                chunk = ids[i : i + ACK_CHUNK]
                db.execute(
                    "INSERT OR IGNORE INTO outbox_acks (sink, seq) SELECT ?, seq FROM events "
                    f"WHERE event_id IN ({','.join('?' * len(chunk))}) AND seq > ?",
                    (sink, *chunk, mark),
                )
            gap = db.execute(
                "SELECT seq FROM events e WHERE seq > ? AND NOT EXISTS "
                "(SELECT 1 FROM outbox_acks a WHERE a.sink = ? AND a.seq = e.seq) ORDER BY seq LIMIT 1",
                (mark, sink),
            ).fetchone()
            if gap is not None:
                new_mark = gap[0] - 1
            else:
                new_mark = db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
            if new_mark > mark:
                db.execute("UPDATE outbox_marks SET mark = ? WHERE sink = ?", (new_mark, sink))
                db.execute("DELETE FROM outbox_acks WHERE sink = ? AND seq <= ?", (sink, new_mark))

    def _register(self, db: sqlite3.Connection, sink: str, backfill: float) -> int:
        """A new sink's mark: just before the first event within ``backfill``.
        One scan of the ledger, once per sink name."""
        now = self._clock.wall()
        first = db.execute("SELECT min(seq) FROM events WHERE at >= ?", (now - backfill,)).fetchone()[0]
        if first is not None:
            mark = int(first) - 1
        else:
            mark = int(db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0])
        db.execute("INSERT INTO outbox_marks (sink, mark, registered_at) VALUES (?, ?, ?)", (sink, mark, now))
        return mark

    def close(self) -> None:
        with self._lock:
            self._db.close()


_SELECT_JOBS = "SELECT name, schedule, period, policy, reason, ttl, grace, max_runtime, updated_at FROM jobs"
"""Columns in JobInfo field order."""


def path_of(url: str) -> str:
    """The file a ``sqlite:///PATH`` URL names."""
    path = url.split("://", 1)[1].partition("?")[0]
    while path.startswith("//"):  # sqlite:////abs/path, as SQLAlchemy writes it
        path = path[1:]
    if not path or path == "/":
        raise StoreUrlError(url, "expected sqlite:///PATH/TO/FILE.db")
    return path


_INSERT_EVENT = (
    "INSERT INTO events (event_id, kind, job, run_id, at, data) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (event_id) DO NOTHING"
)
"""Once per event id (``record``'s contract)."""

_GRANT_FREE = (
    "INSERT INTO leases (key, job, owner, token, expires, boot_id) VALUES (?1, ?2, ?3, 1, ?4, ?5) "
    "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = token + 1, expires = excluded.expires, "
    "boot_id = excluded.boot_id, revoked_by = NULL WHERE owner IS NULL RETURNING token"
)
"""Grant a lease that is new or released; no row back when it has an owner."""

# The bare lock. Free: no owner, or expired by the store's clock (G4: boot
# time plus boot id, as for leases). The token survives unlock (G2).
_LOCK = (
    "INSERT INTO locks (key, owner, token, expires, boot_id) VALUES (?1, ?2, 1, ?4, ?5) "
    "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = token + 1, expires = excluded.expires, "
    "boot_id = excluded.boot_id WHERE owner IS NULL OR boot_id IS NOT ?5 OR expires <= ?3 RETURNING token"
)
_RENEW_LOCK = "UPDATE locks SET expires = ?1 WHERE key = ?2 AND owner = ?3 AND boot_id = ?4 AND expires > ?5"
# An expired lock is no longer its owner's to release: False, as on a server
# where the key is gone; the row stays, free for the next ``lock``.
_UNLOCK = (
    "UPDATE locks SET owner = NULL, expires = NULL WHERE key = ?1 AND owner = ?2 AND boot_id = ?3 "
    "AND expires > ?4"
)

# The slot claim. The job's claims older than ``keep`` go first (the same
# slot's too, so it can be claimed again); an earlier boot's claims once this
# boot's clock is past ``keep`` (see the module docstring). The primary key
# serves the delete.
_FORGET_CLAIMS = (
    "DELETE FROM slot_claims WHERE job = ?1 AND (claimed_at < ?2 - ?3 OR (boot_id <> ?4 AND ?2 > ?3))"
)
_CLAIM = (
    "INSERT INTO slot_claims (job, slot, owner, claimed_at, boot_id) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (job, slot) DO NOTHING"
)
_SLOT_OWNER = "SELECT owner FROM slot_claims WHERE job = ? AND slot = ?"


def _str(value: object) -> str:
    """``value`` as json.dumps writes it, fast for a str."""
    if type(value) is str:
        return str(encode_basestring_ascii(value))
    import json

    return json.dumps(value, default=str)


def _num(value: object) -> str:
    """``value`` as json.dumps writes it, fast for an int, a finite float or None."""
    if value is None:
        return "null"
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return repr(value)
    import json

    return json.dumps(value, default=str)


def statements(script: str) -> Iterator[str]:
    """The SQL statements of ``script``, one at a time (a trigger's body has
    semicolons of its own, so splitting on ";" alone is not enough)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                yield pending.strip()
            pending = ""
    if pending.strip(" \n;"):
        yield pending.strip()


class _Transaction:
    """``SqliteStore._tx``: one reusable object (the store's lock serializes
    its users), cheaper than a generator-based context manager per call."""

    __slots__ = ("_store",)

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    def __enter__(self) -> sqlite3.Connection:
        store = self._store
        store._lock.acquire()
        try:
            store._db.execute("BEGIN IMMEDIATE")
        except BaseException as e:
            store._lock.release()
            if isinstance(e, sqlite3.Error):
                raise _store_error(store.path, e) from None
            raise
        return store._db

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        store = self._store
        db = store._db
        try:
            if exc is None:
                try:
                    db.execute("COMMIT")
                    return
                except BaseException as e:
                    exc = e
            if db.in_transaction:
                db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _store_error(store.path, exc) from None
            if exc_type is None:
                raise exc
        finally:
            store._lock.release()


def _mark(db: sqlite3.Connection, sink: str) -> int | None:
    row = db.execute("SELECT mark FROM outbox_marks WHERE sink = ?", (sink,)).fetchone()
    return None if row is None else int(row[0])


def _event(row: Any) -> Event:
    import json

    seq, eid, kind, job, rid, at, data = row
    return Event(
        seq=seq, event_id=eid, kind=EventKind(kind), job=job, run_id=rid, at=at, data=json.loads(data)
    )


def _lease(start: Start, token: int) -> Lease:
    return Lease(key=start.key, job=start.job, run_id=start.run_id, token=token, ttl=start.ttl)


def _store_error(path: str, e: sqlite3.Error) -> StoreError:
    text = str(e)
    if "locked" in text or "busy" in text:
        return StoreUnavailable(f"SQLite store {path} is locked by another process ({text})")
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return StoreError(f"{path} is not a usable cronwarden SQLite database ({text})")
    if "readonly" in text or "unable to open" in text:
        return StoreError(f"cannot write SQLite store {path} ({text}); check its permissions")
    if isinstance(e, sqlite3.IntegrityError):  # a request the ledger refuses: no retry will do
        return StoreError(f"SQLite store {path} refused the write: {text}")
    return StoreUnavailable(f"SQLite store {path}: {text}")
