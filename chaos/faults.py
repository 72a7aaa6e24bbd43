"""The faults, with real signals on real processes, and the stores they hit.

Worker faults act on one guarded run: its supervisor (the ``cronwarden run``
process, leader of its own session) and its child (leader of the process
group the supervisor made for it).

Store faults act on a server the harness started for itself
(``tests/pgserver.py``, ``tests/redisserver.py``): the shared servers other
tests use are never touched. SQLite has no server and no connection to kill;
its "store pause" is the nearest thing a local file has: another process
holding the write lock past the ttl.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Fault(enum.StrEnum):
    NONE = "none"
    """No fault: the baseline (contention and skips only)."""
    KILL_SUPERVISOR = "kill_supervisor"
    """kill -9 of the ``cronwarden run`` process; its child must die with it (PDEATHSIG)."""
    KILL_CHILD = "kill_child"
    """kill -9 of the child's process group; the supervisor records ``failed``."""
    PAUSE_SHORT = "pause_short"
    """SIGSTOP of supervisor and child for 0.5×ttl."""
    PAUSE_LONG = "pause_long"
    """SIGSTOP of supervisor and child for 2–3×ttl: the lease expires meanwhile."""
    STALL_SUPERVISOR = "stall_supervisor"
    """SIGSTOP of the supervisor only for 2–3×ttl: its child keeps working
    while nobody renews (the case self-fencing cannot cover)."""
    CONN_KILL = "conn_kill"
    """``pg_terminate_backend`` of cronwarden's sessions / Redis ``CLIENT KILL TYPE normal``."""
    STORE_RESTART = "store_restart"
    """Crash (immediate stop / SIGKILL) of the server, down for 0–1.5×ttl, and
    start again: restarts both within and past the ttl."""
    STORE_PAUSE = "store_pause"
    """SIGSTOP of the server for 1.5×ttl (SQLite: the write lock held by
    another process for 1.5×ttl)."""


PAUSES = (Fault.PAUSE_LONG, Fault.STALL_SUPERVISOR)
"""Cells where the holder itself is frozen past the ttl: only fencing can
keep its late writes out, so the positive control must find violations here."""
KILLS = (Fault.KILL_SUPERVISOR, Fault.KILL_CHILD)
STORE_FAULTS = (Fault.CONN_KILL, Fault.STORE_RESTART, Fault.STORE_PAUSE)


# -- worker faults -----------------------------------------------------------


def signal_group(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


# -- stores --------------------------------------------------------------------


class Backend:
    """A store the harness owns: its URL and the faults it supports."""

    name = "?"
    supports: tuple[Fault, ...] = ()

    def url(self, namespace: str) -> str:
        raise NotImplementedError

    def watch_url(self, namespace: str) -> str:
        """A URL for the harness's own observer connection."""
        return self.url(namespace)

    def conn_kill(self) -> int:
        raise NotImplementedError

    def restart(self, down: float = 0.0) -> None:
        """Crash the server, keep it down ``down`` seconds, start it again."""
        raise NotImplementedError

    def pause(self, seconds: float, namespace: str, before_resume: Callable[[], None] | None = None) -> None:
        """Freeze the store for ``seconds``. ``before_resume``, where the
        store can run it, reads the store while it is still frozen to every
        session but the harness's observer."""
        raise NotImplementedError

    def close(self) -> None:
        pass


WORKER_FAULTS = (
    Fault.NONE,
    Fault.KILL_SUPERVISOR,
    Fault.KILL_CHILD,
    Fault.PAUSE_SHORT,
    Fault.PAUSE_LONG,
    Fault.STALL_SUPERVISOR,
)


class SqliteBackend(Backend):
    name = "sqlite"
    supports = (*WORKER_FAULTS, Fault.STORE_PAUSE)

    def __init__(self, directory: Path | None = None) -> None:
        self._tmp = None if directory is not None else tempfile.TemporaryDirectory(prefix="cw-chaos-")
        self.directory = Path(directory or self._tmp.name)  # type: ignore[union-attr]

    def url(self, namespace: str) -> str:
        return f"sqlite:///{self.directory / f'{namespace}.db'}"

    def pause(self, seconds: float, namespace: str, before_resume: Callable[[], None] | None = None) -> None:
        """Hold the database's write lock for ``seconds``, from another
        connection, as a long transaction or a backup tool would. (Readers
        go on meanwhile, the observer among them: ``before_resume`` is not
        needed.)"""
        db = sqlite3.connect(self.directory / f"{namespace}.db", timeout=30, isolation_level=None)
        try:
            db.execute("BEGIN EXCLUSIVE")
            time.sleep(seconds)
            db.execute("ROLLBACK")
        finally:
            db.close()

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


class PostgresBackend(Backend):
    name = "postgres"
    supports = (*WORKER_FAULTS, Fault.CONN_KILL, Fault.STORE_RESTART, Fault.STORE_PAUSE)

    def __init__(self) -> None:
        from tests.pgserver import private_postgres

        self._cm = private_postgres()
        self.server = self._cm.__enter__()

    def url(self, namespace: str) -> str:
        return self.server.url(schema=namespace.replace("-", "_"))

    def watch_url(self, namespace: str) -> str:
        return self.server.url(schema=namespace.replace("-", "_"), application_name="cw-chaos-watch")

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.server.url(), autocommit=True, connect_timeout=10)

    def conn_kill(self) -> int:
        with self._admin() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'cronwarden' AND pid <> pg_backend_pid()"
            ).fetchall()
        return len(rows)

    def restart(self, down: float = 0.0) -> None:
        self.server.stop(mode="immediate")
        time.sleep(down)
        self.server.start()

    @staticmethod
    def _children(top: int) -> list[int]:
        """Every process ``top`` forked: from its ``children`` file (one
        read), else by scanning /proc (slow on a busy host)."""
        try:
            with open(f"/proc/{top}/task/{top}/children") as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return [int(e) for e in os.listdir("/proc") if e.isdigit() and parent_of(int(e)) == top]

    def _observers(self) -> list[int]:
        with self._admin() as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'cw-chaos-watch'"
            ).fetchall()
        return [int(r[0]) for r in rows]

    def pause(self, seconds: float, namespace: str, before_resume: Callable[[], None] | None = None) -> None:
        """SIGSTOP of the postmaster (first, so it forks nothing new) and of
        every process it forked; SIGCONT after ``seconds``.

        The harness judges a holder's stop against its lease's expiry as the
        observer saw it, so the observer must see the holder's last renewal
        before the freeze. Read just before the freeze, it can miss one made
        in between (a renewal every ttl/3); read after the thaw, the lease
        may already have moved to the next run. So the observer's own
        backend is thawed first and ``before_resume`` reads while every
        other session is still frozen: the lease exactly as the freeze left
        it. (A backend frozen holding a lock the read needs would block it:
        after 2 s the rest are thawed anyway.)"""
        observers = self._observers() if before_resume is not None else []
        top = self.server.postmaster_pid()
        if top is None:
            return
        stopped = [top]
        with contextlib.suppress(ProcessLookupError):
            os.kill(top, signal.SIGSTOP)
        for pid in self._children(top):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        try:
            time.sleep(seconds)
        finally:
            first = [pid for pid in stopped if pid in observers]
            for pid in first:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            if before_resume is not None and first:
                reading = threading.Thread(target=before_resume, daemon=True)
                reading.start()
                reading.join(timeout=2.0)
            for pid in reversed(stopped):
                if pid not in first:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


class PgBouncerBackend(PostgresBackend):
    """PostgreSQL through a private PgBouncer in transaction mode: the
    workers' store URL points at the pooler; the harness's observer and the
    faults reach the server itself (``tests/pgbouncer.py`` starts the pooler
    and stops it by its pid)."""

    name = "postgres-pgbouncer"
    supports = (*WORKER_FAULTS, Fault.CONN_KILL, Fault.STORE_PAUSE)

    def __init__(self) -> None:
        from tests.pgbouncer import pgbouncer, why_not

        why = why_not()
        if why is not None:
            raise RuntimeError(f"cannot start a PgBouncer: {why}")
        super().__init__()
        try:
            self._bouncer_cm = pgbouncer(self.server.url())
            self.bouncer = self._bouncer_cm.__enter__()
        except BaseException:
            super().close()
            raise

    def url(self, namespace: str) -> str:
        return str(self.bouncer.url(schema=namespace.replace("-", "_")))

    def conn_kill(self) -> int:
        # The pooler's server connections carry no application name of ours
        # for certain (it is set per client), so every client backend but the
        # harness's observer and this one goes.
        with self._admin() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND application_name <> 'cw-chaos-watch' "
                "AND pid <> pg_backend_pid()"
            ).fetchall()
        return len(rows)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._bouncer_cm.__exit__(None, None, None)
        super().close()


class RedisBackend(Backend):
    name = "redis"
    supports = (*WORKER_FAULTS, Fault.CONN_KILL, Fault.STORE_RESTART, Fault.STORE_PAUSE)

    def __init__(self) -> None:
        from tests.redisserver import private_redis

        self._tmp = tempfile.TemporaryDirectory(prefix="cw-chaos-redis-")
        # appendfsync always: a crash loses no acknowledged write, so the
        # ledger (and the checkers that read it) survive a restart. Without
        # persistence the fencing tokens still go up (server TIME), but the
        # ledger would be gone.
        persist = ("--appendonly", "yes", "--appendfsync", "always")
        self._cm = private_redis(Path(self._tmp.name), args=persist)
        self.server = self._cm.__enter__()

    def url(self, namespace: str) -> str:
        # Keep the whole ledger of a round: the checkers read all of it.
        return self.server.url(prefix=f"{namespace}:", runs_per_job="1000000", events_per_job="10000000")

    def conn_kill(self) -> int:
        admin = self.server.admin()
        try:
            return int(admin.execute_command("CLIENT", "KILL", "TYPE", "normal"))
        finally:
            admin.close()

    def restart(self, down: float = 0.0) -> None:
        self.server.kill()
        time.sleep(down)
        self.server.start()

    def pause(self, seconds: float, namespace: str, before_resume: Callable[[], None] | None = None) -> None:
        # One process: nothing can run while the rest stay frozen.
        self.server.pause()
        try:
            time.sleep(seconds)
        finally:
            self.server.resume()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._cm.__exit__(None, None, None)
        self._tmp.cleanup()


def open_backend(name: str) -> Backend:
    if name == "sqlite":
        return SqliteBackend()
    if name == "postgres":
        return PostgresBackend()
    if name == "redis":
        return RedisBackend()
    if name == "postgres-pgbouncer":
        return PgBouncerBackend()
    raise ValueError(f"unknown store {name!r}; expected sqlite, postgres, postgres-pgbouncer or redis")


@contextlib.contextmanager
def backend(name: str) -> Iterator[Backend]:
    b = open_backend(name)
    try:
        yield b
    finally:
        b.close()


@dataclass
class Injection:
    """One fault as it happened, on the harness's clocks."""

    fault: Fault
    at: float
    """time.monotonic() when the fault began."""
    wall: float
    target_run: str | None = None
    supervisor: int | None = None
    child: int | None = None
    """The process group of the run's command (led by the supervisor's child)."""
    resumed: float | None = None
    """monotonic time the frozen processes (or server) were resumed."""
    took_over: str | None = None
    """For pauses: the run that acted on the referee while the target was frozen."""
    note: str = ""


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def background(fn: Any, *args: Any) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t
