"""The embedded store: one SQLite file in WAL mode, safe for many processes
on one host. Its schema is ``schema.sql`` beside this file, its statements
``queries.sql``; the read side is shared with PostgreSQL (``stores/sql.py``).

Expiry is judged by CLOCK_BOOTTIME (shared by every process on the host,
never stepped by NTP) plus the boot id: a lease written in an earlier boot is
expired, since every process of that boot is gone.

``synchronous=FULL`` by default: every commit is fsynced, so a ``skipped`` or
``started`` record and the fencing counter survive a power cut. It costs one
fsync per commit (about a millisecond here); a cron job starts at most a few
times a minute, and a fencing counter that goes backwards after a crash would
hand a token out twice. ``?synchronous=normal`` in the URL trades that for
speed on hosts where losing the last commits on power loss is acceptable.

Every write is one transaction begun with ``BEGIN IMMEDIATE``, which takes
the file's write lock up front: two processes never both read a free lease
and grant it, and the store's clock is read once per step.

Writes from several threads of one process share commits (``_Serial``): a
write that ends while others wait for the connection leaves the transaction
open for them (its own statements under a savepoint), and one commit, one
fsync, covers them all; none returns before that commit. A scheduler's
workers starting hundreds of runs a second would otherwise queue behind one
fsync each, three a run. A single thread commits every write at once, as
before.

The outbox is a mark per sink plus the acknowledged events above it. SQLite
has one writer at a time and assigns ``seq`` inside the write transaction, so
``seq`` order is commit order here: no event can appear below an
acknowledged one, and the mark moves right up to the end of the acknowledged
prefix. A ``seq`` is never handed out twice because the newest event cannot
be deleted (the trigger ``events_keep_newest`` in ``schema.sql`` says why).
Nothing in cronwarden deletes events from SQLite; a retention policy must
keep the newest one.

The scheduler's slot claims are judged by this boot's clock alone: once this
boot has run longer than ``keep``, more than ``keep`` has passed since any
claim made before it.

The schema version lives in the file header's ``user_version``, so the
common case (up to date) is one read at open, with no write lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.durations import parse_duration
from cronwarden.errors import LeaseLost, StoreError, StoreUnavailable, StoreUrlError, UsageError
from cronwarden.events import Event, EventKind, RunRecord, new_id
from cronwarden.lease import Lease
from cronwarden.policy import Policy
from cronwarden.stores.base import (
    DEAD_LETTERS_KEPT,
    KEEP_ALL,
    NEW_SINK_BACKFILL,
    End,
    Finished,
    Granted,
    Holder,
    LeaseInfo,
    Refusal,
    Refused,
    Retention,
    Start,
    holder_data,
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
MIGRATIONS_DIR = os.path.join(HERE, "migrations")
SCHEMA_VERSION = max(migrations(MIGRATIONS_DIR))
"""The newest migration's number: the version every file is brought to."""
ACK_CHUNK = 500
"""Event ids per ``IN (…)`` when acknowledging (SQLite limits bound parameters)."""

_dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode
"""``json.dumps(value, separators=(",", ":"), default=str)`` without building
an encoder per call (``json.dumps`` does, given any argument)."""


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


class SqliteStore(SqlStore):
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = SYSTEM_CLOCK,
        synchronous: str = "FULL",
        busy_timeout: float = 5.0,
        retention: Retention = KEEP_ALL,
        read_only: bool = False,
    ) -> None:
        """``read_only``: for a caller that only reads. A file cronwarden
        cannot write (a read-only filesystem, a file or directory without
        write permission) is then opened read-only: nothing is migrated, and
        any write raises ``StoreError``. A writable file is opened as usual."""
        self.path = os.fspath(path)
        self.url = f"sqlite:///{self.path}"
        self.retention = retention
        self._clock = clock
        self._busy_ms = int(busy_timeout * 1000)
        self._lock = _Serial(self)
        self._transaction = _Transaction(self)
        self._q = queries(os.path.join(HERE, "queries.sql"))
        self._use_shared_queries("main", "?")
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
        unwritable = _unwritable(self.path) if exists else None
        if unwritable is not None and read_only:
            self._db = self._open_read_only(busy_timeout)
            return
        if unwritable is not None:
            raise StoreError(f"cannot write SQLite store {self.path}: {unwritable}; cronwarden run records "
                             "every run there (status, history and audit can still read it)")  # fmt: skip
        try:
            if not exists:
                _create_private(parent, self.path)
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

    def _open_read_only(self, busy_timeout: float) -> sqlite3.Connection:
        """The file, opened for reading only, if its schema is this
        version's (an older one cannot be upgraded without writing).

        A WAL database needs its ``-shm`` index to be read: SQLite makes one
        if it can, and reads an existing one. On a read-only filesystem with
        neither, the file is read as immutable (the ``-wal`` file, if any, is
        not read: what a writer left there uncheckpointed is not seen)."""
        from urllib.parse import quote

        base = f"file:{quote(os.path.abspath(self.path))}?mode=ro"
        db: sqlite3.Connection | None = None
        try:
            for uri in (base, base + "&immutable=1"):
                db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                                     timeout=busy_timeout)  # fmt: skip
                try:
                    version = db.execute("PRAGMA user_version").fetchone()[0]
                    break
                except sqlite3.OperationalError:
                    db.close()
                    if uri != base:
                        raise
        except sqlite3.DatabaseError as e:
            raise _store_error(self.path, e) from None
        assert db is not None
        db.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        problem = None
        if version == 0:
            problem = "is not a cronwarden store (no cronwarden schema version)"
        elif version > SCHEMA_VERSION:
            problem = (f"has schema version {version}; this cronwarden knows up to {SCHEMA_VERSION}. "
                       "Upgrade cronwarden")  # fmt: skip
        elif version < SCHEMA_VERSION:
            problem = (f"has schema version {version}, older than this cronwarden's {SCHEMA_VERSION}, and "
                       "cannot be written to bring it up to date; run cronwarden where it can write the file "
                       "once")  # fmt: skip
        if problem is not None:
            db.close()
            raise StoreError(f"{self.path} {problem}")
        return db

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
    def parse_url(cls, url: str) -> dict[str, Any]:
        """``sqlite:///PATH?synchronous=full&busy_timeout=5s&retention=90d&keep_runs=1000``:
        the keywords of the store it opens."""
        path = path_of(url)
        query = url.partition("?")[2]
        params: dict[str, str] = {}
        if query:  # urllib.parse only when there is a query: it costs the wrapper ~1 ms
            from urllib.parse import parse_qs

            params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        sync = params.pop("synchronous", "full").upper()
        if sync not in ("FULL", "NORMAL", "EXTRA"):
            raise StoreUrlError(url, f"synchronous must be full, normal or extra, got {sync.lower()!r}")
        try:
            busy = parse_duration(params.pop("busy_timeout", "5s"), what="busy_timeout")
        except UsageError as e:
            raise StoreUrlError(url, str(e)) from None
        retention = retention_of(url, params)
        if params:
            raise StoreUrlError(url, f"unknown parameter(s) {', '.join(sorted(params))}")
        return {"path": path, "synchronous": sync, "busy_timeout": busy, "retention": retention}

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK, read_only: bool = False) -> SqliteStore:
        return cls(**cls.parse_url(url), clock=clock, read_only=read_only)

    # -- plumbing ---------------------------------------------------------

    def _refuse_foreign(self) -> None:
        """Schema version 0 is a new file, or another program's database: one
        with tables of its own is not ours to change (a table named like one
        of ours would fail the schema, or be written into)."""
        tables = [r[0] for r in self._db.execute(self._q["foreign_tables"])]
        if tables:
            named = ", ".join(tables[:3]) + (", …" if len(tables) > 3 else "")
            raise StoreError(
                f"{self.path} is not a cronwarden store: it holds other tables ({named}) and no cronwarden "
                "schema version; give a new file or a cronwarden one (sqlite:///PATH)"
            )

    def _migrate(self) -> None:
        """Create the schema (a new file: ``schema.sql``) or bring it up to
        date (the migrations numbered above its version, in order), under the
        write lock, and set the version. Another process may have done it
        while this one waited for the lock: the version is read again."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}; this cronwarden knows up to "
                    f"{SCHEMA_VERSION}. Upgrade cronwarden"
                )
            if version == 0:
                scripts = [read_sql(SCHEMA)]
            else:
                scripts = [read_sql(path) for v, path in migrations(MIGRATIONS_DIR).items() if v > version]
            for script in scripts:
                for statement in statements(script):
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
        with self._lock.reading():
            try:
                return fn(self._db)
            except sqlite3.Error as e:
                raise _store_error(self.path, e) from None

    def _fetch(self, sql: str, args: Sequence[Any]) -> list[Any]:
        return self._read(lambda db: db.execute(sql, args).fetchall())

    def _write(self, sql: str, args: Sequence[Any]) -> int:
        with self._tx() as db:
            return db.execute(sql, args).rowcount

    def latest_runs(self, jobs: Sequence[str], limit: int) -> dict[str, list[RunRecord]]:
        found: dict[str, list[RunRecord]] = {job: [] for job in jobs}
        if jobs and limit != 0:
            for row in self._fetch(self._q["latest_runs"], (json.dumps(list(jobs)), limit)):
                found[row[1]].append(run_from_row(row))
        return found

    def _save_rollup(self, rollup: Rollup, recent: list[Entry], seen: tuple[Any, ...] | None) -> bool:
        from cronwarden.stores.rollup import ROLLUP_RUNS, row_of

        row = row_of(rollup, recent)[:-1]  # the window is rows of its own here
        q = self._q
        with self._tx() as db:
            if seen is None:
                written = db.execute(q["insert_rollup"], row).rowcount
            else:
                written = db.execute(q["update_rollup"], (*row, *seen)).rowcount
            if written != 1:
                return False
            db.execute(q["forget_window"], (rollup.job,))
            first = rollup.ended - len(recent)
            db.executemany(q["insert_window"], [
                (rollup.job, (first + k) % ROLLUP_RUNS, *e) for k, e in enumerate(recent)
            ])  # fmt: skip
            return True

    def _event_data(self, raw: Any) -> Mapping[str, Any]:
        data: Mapping[str, Any] = json.loads(raw)
        return data

    def _now(self) -> tuple[float, str]:
        return self._clock.store_time(), self._clock.boot_id()

    def _insert_event(self, db: sqlite3.Connection, event: Event) -> None:
        db.execute(
            self._q["insert_event"],
            (event.event_id, event.kind.value, event.job, event.run_id, event.at, _dumps(dict(event.data))),
        )

    def _start_run(self, db: sqlite3.Connection, start: Start, token: int) -> None:
        q = self._q
        db.execute(
            q["insert_run"],
            (start.run_id, start.job, start.key, start.host, start.pid, token, start.slot, start.at),
        )
        data = {"host": start.host, "pid": start.pid, "token": token, "key": start.key, "slot": start.slot,
                "ttl": start.ttl}  # fmt: skip
        db.execute(
            q["insert_event"],
            (new_id(), EventKind.STARTED.value, start.job, start.run_id, start.at, _dumps(data)),
        )

    def _abandon(self, db: sqlite3.Connection, run_id: str, job: str, at: float, found_by: str) -> bool:
        cur = db.execute(
            self._q["abandon"],
            (at, f"lease expired with no terminal record; found by run {found_by}", run_id),
        )
        if cur.rowcount:
            self._insert_event(
                db,
                Event(kind=EventKind.ABANDONED, job=job, run_id=run_id, at=at, data={"found_by": found_by}),
            )
        return bool(cur.rowcount)

    # -- leases and runs --------------------------------------------------

    def acquire(self, start: Start) -> Granted | Refused:
        q = self._q
        now, boot = self._now()
        with self._tx() as db:
            # The common case in one statement: the lease is new or released
            # (no owner, so no run to abandon). Anything else reads the holder.
            free = db.execute(
                q["grant_free"], (start.key, start.job, start.run_id, now + start.ttl, boot)
            ).fetchone()
            if free is not None:
                self._start_run(db, start, free[0])
                return Granted(lease=_lease(start, free[0]))
            row = db.execute(q["lease_and_holder"], (start.key,)).fetchone()
            abandoned: tuple[str, ...] = ()
            if row is None:
                db.execute(q["insert_lease"], (start.key, start.job, start.run_id, 1, now + start.ttl, boot))
                self._start_run(db, start, 1)
                return Granted(lease=_lease(start, 1))
            owner, last_token, expires, lease_boot, pending, host, pid, started_at = row
            live = owner is not None and lease_boot == boot and expires is not None and expires > now
            if owner is not None and not live and self._abandon(db, owner, start.job, start.at, start.run_id):
                abandoned = (owner,)
            if not live:
                token = last_token + 1
                db.execute(q["grant_expired"], (start.run_id, token, now + start.ttl, boot, start.key))
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
        q = self._q
        data: dict[str, Any] = {
            **holder_data(holder, start.at),
            "slot": start.slot,
            "host": start.host,
            "pid": start.pid,
            "policy": start.policy.value,
        }
        if start.policy is Policy.REPLACE:
            db.execute(q["revoke"], (start.run_id, start.key))
            return Refused(refusal=Refusal.REVOKING, holder=holder)
        if start.policy is Policy.ALLOW:
            side = start._replace(key=side_lease_key(start.key, start.run_id))
            db.execute(q["insert_lease"], (side.key, start.job, start.run_id, 1, now + start.ttl, boot))
            self._start_run(db, side, 1)
            self._insert_event(
                db, Event(kind=EventKind.OVERLAP, job=start.job, run_id=start.run_id, at=start.at, data=data)
            )
            return Granted(lease=_lease(side, 1), overlapped=holder)
        if start.policy is Policy.QUEUE:
            if pending < start.max_pending:
                db.execute(q["queue"], (start.key,))
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
                        self._q["renew"], (now + lease.ttl, lease.key, lease.run_id, boot, now)
                    )
                    if cur.rowcount == 1:
                        return
                    row = self._db.execute(self._q["lease_owner"], (lease.key,)).fetchone()
                finally:
                    self._db.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            except sqlite3.Error as e:
                raise _store_error(self.path, e) from None
        raise _refused(lease, row)

    def renew_many(self, leases: Sequence[Lease]) -> list[LeaseLost | None]:
        if not leases:
            return []
        now, boot = self._now()
        # As renew: wait for the write lock at most a tenth of the shortest ttl.
        busy_ms = max(20, int(min(lease.ttl for lease in leases) * 100))
        q = self._q
        out: list[LeaseLost | None] = []
        with self._lock:
            db = self._db
            try:
                db.execute(f"PRAGMA busy_timeout = {busy_ms}")
                try:
                    # One transaction: one write lock, one commit for the batch.
                    db.execute("BEGIN IMMEDIATE")
                    try:
                        for lease in leases:
                            args = (now + lease.ttl, lease.key, lease.run_id, boot, now)
                            if db.execute(q["renew"], args).rowcount == 1:
                                out.append(None)
                                continue
                            row = db.execute(q["lease_owner"], (lease.key,)).fetchone()
                            out.append(_refused(lease, row))
                        db.execute("COMMIT")
                    except BaseException:
                        if db.in_transaction:
                            db.execute("ROLLBACK")
                        raise
                finally:
                    db.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            except sqlite3.Error as e:
                raise _store_error(self.path, e) from None
        return out

    def finish(self, lease: Lease, end: End, then: Start | None = None) -> Finished:
        q = self._q
        now, boot = self._now()
        side = is_side_lease(lease.key, lease.run_id)
        with self._tx() as db:
            started = db.execute(
                q["end_run"], (end.outcome.value, end.at, end.exit_code, end.detail, lease.run_id)
            ).fetchone()
            recorded = started is not None
            if started is not None:
                data: dict[str, Any] = {"exit_code": end.exit_code, "token": lease.token}
                if end.detail:
                    data["detail"] = end.detail
                if end.replaced_by:
                    data["replaced_by"] = end.replaced_by
                if end.data:
                    data.update(end.data)
                data["duration"] = round(end.at - started[0], 6)
                db.execute(
                    q["insert_event"],
                    (new_id(), end.outcome.value, lease.job, lease.run_id, end.at, _dumps(data)),
                )
            if then is None and not side:
                # The common case: release iff still ours, pending or not.
                cur = db.execute(q["release"], (lease.key, lease.run_id))
                return Finished(owned=cur.rowcount == 1, recorded=recorded)
            row = db.execute(q["owned_lease"], (lease.key, lease.run_id)).fetchone()
            if row is None:
                if then is not None:
                    # A retried finish whose first try handed the lease to the
                    # queued run: report that hand-over again, not lose it.
                    handed = db.execute(q["owned_lease"], (lease.key, then.run_id)).fetchone()
                    if handed is not None:
                        return Finished(owned=True, recorded=recorded, next=_lease(then, handed[1]))
                return Finished(owned=False, recorded=recorded)
            if side:
                db.execute(q["delete_lease"], (lease.key,))
                return Finished(owned=True, recorded=recorded)
            if then is not None and row[0] > 0:
                token = db.execute(q["hand_over"], (then.run_id, now + then.ttl, boot, lease.key)).fetchone()[
                    0
                ]
                self._start_run(db, then, token)
                return Finished(owned=True, recorded=recorded, next=_lease(then, token))
            db.execute(q["release"], (lease.key, lease.run_id))
            return Finished(owned=True, recorded=recorded)

    def request_stop(self, key: str, run_id: str, grace: float, request: Event) -> bool:
        now, boot = self._now()
        with self._tx() as db:
            if db.execute(self._q["request_stop"], (stop_mark(grace), key, run_id, boot, now)).rowcount != 1:
                return False
            self._insert_event(db, request)
            return True

    def record(self, event: Event) -> None:
        with self._tx() as db:
            self._insert_event(db, event)

    # -- the bare lock ----------------------------------------------------
    # One autocommit statement each: SQLite takes the write lock for the
    # statement, so the check and the change are one atomic step.

    def lock(self, key: str, owner: str, ttl: float) -> int | None:
        now, boot = self._now()
        rows, _ = self._statement(self._q["lock"], (key, owner, now, now + ttl, boot))
        return int(rows[0][0]) if rows else None

    def renew_lock(self, key: str, owner: str, ttl: float) -> bool:
        now, boot = self._now()
        return self._statement(self._q["renew_lock"], (now + ttl, key, owner, boot, now))[1] == 1

    def unlock(self, key: str, owner: str) -> bool:
        now, boot = self._now()
        return self._statement(self._q["unlock"], (key, owner, boot, now))[1] == 1

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
        q = self._q
        slot = float(slot)
        with self._tx() as db:
            # The time is read under the write lock (held from BEGIN
            # IMMEDIATE), so a wait for the lock cannot date the claim early,
            # and nobody claims between the insert and the read of the owner.
            now, boot = self._now()
            db.execute(q["forget_claims"], (job, now, keep, boot))
            db.execute(q["claim"], (job, slot, owner, now, boot))
            row = db.execute(q["slot_owner"], (job, slot)).fetchone()
        return str(row[0])

    # -- the read side (the rest is SqlStore's) -----------------------------

    def open_runs(self, job: str | None = None) -> list[RunRecord]:
        now, boot = self._now()
        if job is None:
            rows = self._fetch(self._q["open_runs"], ())
        else:
            rows = self._fetch(self._q["open_runs_of_job"], (job,))
        out = []
        for row in rows:
            expires, lease_boot = row[-2], row[-1]
            out.append(run_from_row(row[:-2], expires_in=_left(expires, lease_boot, now, boot)))
        return out

    def lease(self, key: str) -> LeaseInfo | None:
        now, boot = self._now()
        rows = self._fetch(self._q["lease"], (key,))
        if not rows:
            return None
        owner, token, expires, lease_boot, pending, revoked_by = rows[0]
        return LeaseInfo(
            key=key, owner=owner, token=token, expires_in=_left(expires, lease_boot, now, boot),
            pending=pending, revoked_by=revoked_by,
        )  # fmt: skip

    # -- the outbox -------------------------------------------------------

    def undelivered(self, sink: str, limit: int, *, backfill: float = NEW_SINK_BACKFILL) -> list[Event]:
        if limit < 1:
            return []
        if self._read(lambda db: self._mark(db, sink)) is None:
            with self._tx() as db:
                if self._mark(db, sink) is None:
                    self._register(db, sink, backfill)
        return self._events_of(self._fetch(self._q["undelivered"], (sink, limit)))

    def mark_delivered(self, sink: str, event_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(event_ids))
        if not ids:
            return
        with self._tx() as db:
            self._acknowledge(db, sink, ids)

    def _acknowledge(self, db: sqlite3.Connection, sink: str, ids: list[str]) -> None:
        q = self._q
        mark = self._mark(db, sink)
        if mark is None:
            mark = self._register(db, sink, NEW_SINK_BACKFILL)
        for chunk in _chunks(ids):
            db.execute(q["acknowledge"].replace("{ids}", ",".join("?" * len(chunk))), (sink, *chunk, mark))
        gap = db.execute(q["first_unacknowledged"], (mark, sink)).fetchone()
        new_mark = gap[0] - 1 if gap is not None else db.execute(q["newest_seq"]).fetchone()[0]
        if new_mark > mark:
            db.execute(q["move_mark"], (new_mark, sink))
            db.execute(q["prune_acks"], (sink, new_mark))

    def reject(self, sink: str, event_id: str, rejection: Event | None) -> None:
        q = self._q
        with self._tx() as db:
            self._acknowledge(db, sink, [event_id])
            db.execute(q["set_aside"].replace("{ids}", "?"), (sink, event_id))
            db.execute(q["trim_rejected"], (sink, sink, DEAD_LETTERS_KEPT))
            if rejection is not None:
                self._insert_event(db, rejection)

    def forget_rejected(self, sink: str, event_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(event_ids))
        if not ids:
            return
        with self._tx() as db:
            for chunk in _chunks(ids):
                db.execute(self._q["forget_rejected"].replace("{ids}", ",".join("?" * len(chunk))),
                           (sink, *chunk))  # fmt: skip

    def _mark(self, db: sqlite3.Connection, sink: str) -> int | None:
        row = db.execute(self._q["mark"], (sink,)).fetchone()
        return None if row is None else int(row[0])

    def _register(self, db: sqlite3.Connection, sink: str, backfill: float) -> int:
        """A new sink's mark: just before the first event within ``backfill``."""
        q = self._q
        now = self._clock.wall()
        first = db.execute(q["first_seq_since"], (now - backfill,)).fetchone()[0]
        mark = int(first) - 1 if first is not None else int(db.execute(q["newest_seq"]).fetchone()[0])
        db.execute(q["register_sink"], (sink, mark, now))
        return mark

    # -- retention --------------------------------------------------------

    def _prune_step(self, job: str, bound: float, limit: int) -> tuple[int, int, int]:
        q = self._q
        sql, args = q["prune_due"].replace("{pruned}", pruned_kinds_sql()), (job, bound, limit)
        with self._tx() as db:
            rows = db.execute(sql, args).fetchall()
            seqs = [int(seq) for seq, _, _ in rows]
            started = [run_id for _, run_id, kind in rows if kind == "started" and run_id]
            runs = events = 0
            for chunk in _chunks(started):
                marks = ",".join("?" * len(chunk))
                runs += db.execute(q["prune_runs"].replace("{ids}", marks), chunk).rowcount
            for chunk in _chunks(seqs):
                marks = ",".join("?" * len(chunk))
                events += db.execute(q["prune_events"].replace("{ids}", marks), chunk).rowcount
                db.execute(q["prune_dead_letters"].replace("{ids}", marks), chunk)
                db.execute(q["prune_acks_of"].replace("{ids}", marks), chunk)
        return runs, events, len(rows)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _chunks(ids: list[T]) -> Iterator[list[T]]:
    """``ids`` in pieces of at most ``ACK_CHUNK``, one ``IN (…)`` each."""
    for i in range(0, len(ids), ACK_CHUNK):
        yield ids[i : i + ACK_CHUNK]


def path_of(url: str) -> str:
    """The file a ``sqlite:///PATH`` URL names."""
    path = url.split("://", 1)[1].partition("?")[0]
    while path.startswith("//"):  # sqlite:////abs/path, as SQLAlchemy writes it
        path = path[1:]
    if not path or path == "/":
        raise StoreUrlError(url, "expected sqlite:///PATH/TO/FILE.db")
    return path


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


MAX_SHARED = 64
"""Writes one commit covers at most: the file's write lock is held for them
all, and other processes wait that long."""
SHARED_WAIT = 0.05
"""Seconds a write that left the transaction open waits for another to
commit it before it commits itself."""


class _Serial:
    """The store's connection, one user at a time, and the commit its
    threads' writes share (see the module). ``with store._lock`` is a use
    outside any write transaction (a renewal, an autocommit statement,
    ``close``): it commits a transaction left open first. ``reading()`` is a
    read, which may run inside one: it sees the writes of threads that are
    still waiting for their commit, never another process's uncommitted ones."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._mutex = threading.Lock()
        self._committed = threading.Condition(self._mutex)
        self._gate = threading.Lock()
        self.queued = 0
        """Threads waiting for the connection to begin a write."""
        self.open = False
        """A transaction is open that writes have left to be committed."""
        self.members = 0
        """Writes in the open transaction, waiting for its commit."""
        self.epoch = 0
        """Counts the commits of shared transactions (and their failures)."""
        self.failed: dict[int, list[Any]] = {}
        """By epoch: the commit's error and how many writes are yet to raise it."""
        self.nested = False
        """The write going on joined an open transaction (under a savepoint)."""

    def __enter__(self) -> None:
        self._mutex.acquire()
        if self.open:
            try:
                self.commit(member=False)  # its writes' error, if any, is theirs
            except BaseException:
                self._mutex.release()
                raise

    def __exit__(self, *exc: object) -> None:
        self._mutex.release()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        with self._mutex:
            yield

    def begin(self) -> None:
        """Take the connection for a write: the transaction left open, or a new one."""
        with self._gate:
            self.queued += 1
        self._mutex.acquire()
        with self._gate:
            self.queued -= 1
        db = self._store._db
        try:
            # The first write of a transaction fails alone by rolling it
            # back; one that joins an open transaction has a savepoint.
            self.nested = self.open
            if self.open:
                db.execute("SAVEPOINT write")
            else:
                db.execute("BEGIN IMMEDIATE")
                self.open = True
        except BaseException:
            try:
                if self.open and not db.in_transaction:
                    self._lost()
                elif self.open and self.members == 0:
                    db.execute("ROLLBACK")
                    self.open = False
            finally:
                self._mutex.release()
            raise

    def end(self, ok: bool) -> None:
        """The write's statements are done (``ok``) or failed: keep or undo
        them, and return once they are committed (raising if the commit
        failed), or at once when undone."""
        db = self._store._db
        try:
            if not db.in_transaction:  # SQLite rolled the whole transaction back (a full disk, an I/O error)
                error = self._lost()
                if ok:
                    raise error
                return
            if not ok:
                if self.nested:
                    db.execute("ROLLBACK TO write")
                    db.execute("RELEASE write")
                if self.members == 0:
                    db.execute("ROLLBACK")
                    self.open = False
                    return
                with self._gate:
                    others = self.queued
                if not others:
                    self.commit(member=False)
                return
            if self.nested:
                db.execute("RELEASE write")
            self.members += 1
            with self._gate:
                others = self.queued
            if not others or self.members >= MAX_SHARED:
                self.commit()
                return
            mine = self.epoch
            while self.epoch == mine:
                if not self._committed.wait(SHARED_WAIT) and self.epoch == mine:
                    self.commit()
                    return
            failed = self.failed.get(mine)
            if failed is not None:
                failed[1] -= 1
                if failed[1] == 0:
                    del self.failed[mine]
                raise failed[0]
        finally:
            self._mutex.release()

    def commit(self, *, member: bool = True) -> None:
        """Commit the open transaction (the mutex held): every write in it
        returns, or raises the commit's error; so does the caller, a
        ``member`` of it."""
        db = self._store._db
        error: BaseException | None = None
        try:
            db.execute("COMMIT")
        except BaseException as e:
            error = _store_error(self._store.path, e) if isinstance(e, sqlite3.Error) else e
            if db.in_transaction:
                db.execute("ROLLBACK")
        self._settled(error, self.members - 1 if member else self.members)
        if error is not None and member:
            raise error

    def _lost(self) -> StoreUnavailable:
        """The open transaction is gone with its writes: theirs fail (the
        error returned, for the caller's own)."""
        error = StoreUnavailable(f"SQLite store {self._store.path}: the transaction was rolled back")
        self._settled(error, self.members)
        return error

    def _settled(self, error: BaseException | None, others: int) -> None:
        """The open transaction ended: its ``others`` waiting writes are
        woken, to raise ``error`` if there is one."""
        if error is not None and others > 0:
            self.failed[self.epoch] = [error, others]
        self.open = False
        self.members = 0
        self.epoch += 1
        self._committed.notify_all()


class _Transaction:
    """``SqliteStore._tx``: one reusable object (the store's lock serializes
    its users), cheaper than a generator-based context manager per call.
    A write in the transaction the store's threads share (``_Serial``)."""

    __slots__ = ("_store",)

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    def __enter__(self) -> sqlite3.Connection:
        store = self._store
        try:
            store._lock.begin()
        except sqlite3.Error as e:
            raise _store_error(store.path, e) from None
        return store._db

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        store = self._store
        try:
            store._lock.end(exc is None)
        except sqlite3.Error as e:
            if exc is None:
                raise _store_error(store.path, e) from None
        if isinstance(exc, sqlite3.Error):
            raise _store_error(store.path, exc) from None


def _refused(lease: Lease, row: Sequence[Any] | None) -> LeaseLost:
    """Why a renewal matched no row, from the lease's ``(owner, revoked_by)``."""
    if row is not None and row[0] == lease.run_id and row[1] is not None:
        return revocation(lease.key, row[1])
    return LeaseLost(lease.key, "expired or taken by another run")


def _left(expires: float | None, lease_boot: str | None, now: float, boot: str) -> float | None:
    """Seconds left on a lease by the store's clock; an earlier boot's lease
    has expired (every process of that boot is gone)."""
    if expires is None:
        return None
    return expires - now if lease_boot == boot else -1.0


def _lease(start: Start, token: int) -> Lease:
    return Lease(key=start.key, job=start.job, run_id=start.run_id, token=token, ttl=start.ttl)


def _create_private(parent: str, path: str) -> None:
    """The ledger's directories (0700) and file (0600), when cronwarden makes
    them: runs' commands, hosts and events are nobody else's business, and
    SQLite gives the ``-wal`` and ``-shm`` files the database file's mode."""
    os.makedirs(parent, mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return  # another process made it first
    os.close(fd)


def _unwritable(path: str) -> str | None:
    """Why cronwarden cannot write the SQLite file at ``path`` (it needs the
    file and, for the ``-wal`` and ``-shm`` files beside it, its directory),
    or None when it can."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.access(path, os.W_OK) and os.access(parent, os.W_OK):
        return None
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "it is on a read-only filesystem"
    except OSError:
        pass
    return "it is not writable (check the permissions of the file and its directory)"


def _store_error(path: str, e: sqlite3.Error) -> StoreError:
    text = str(e)
    if "locked" in text or "busy" in text:
        return StoreUnavailable(f"SQLite store {path} is locked by another process ({text})")
    if "no such table" in text or "no such column" in text:
        return StoreError(f"{path} is not a usable cronwarden store: its schema is damaged ({text})")
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return StoreError(f"{path} is not a usable cronwarden SQLite database ({text})")
    if "readonly" in text or "unable to open" in text:
        return StoreError(f"cannot write SQLite store {path} ({text}); check its permissions")
    if isinstance(e, sqlite3.IntegrityError):  # a request the ledger refuses: no retry will do
        return StoreError(f"SQLite store {path} refused the write: {text}")
    return StoreUnavailable(f"SQLite store {path}: {text}")
