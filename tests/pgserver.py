"""A private PostgreSQL server for tests that stop, restart, or freeze it.

The shared server on 5432 is never stopped: tests that need a server to go
away get their own, made with ``initdb`` in a temporary directory, listening
on 127.0.0.1 at a free port, with ``fsync=off`` (a crash of the server
process still loses nothing; only an OS crash would). PostgreSQL refuses to
run as root, so as root the binaries run as the ``postgres`` OS user.

    with private_postgres() as pg:
        url = pg.url(schema="cw_x")
        pg.stop(mode="immediate")
        pg.start()

If the server binaries are missing this skips, or fails when
``CRONWARDEN_REQUIRE_BACKENDS=1`` (CI must not pass by skipping).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

BINDIRS = "/usr/lib/postgresql/*/bin"
PORTS = tuple(int(x) for x in os.environ.get("CRONWARDEN_TEST_PORTS", "55432-60999").split("-", 1))
"""Where private servers listen: ``$CRONWARDEN_TEST_PORTS`` (``low-high``)
keeps parallel sessions on one host in separate ranges."""
TIMEOUT = 60
"""Seconds any pg_ctl or initdb step may take on a loaded 2-core machine."""


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CRONWARDEN_REQUIRE_BACKENDS", "") == "1":
        pytest.fail(f"{reason} (CRONWARDEN_REQUIRE_BACKENDS=1)", pytrace=False)
    pytest.skip(reason)


def find_bindir() -> Path | None:
    """``$CRONWARDEN_PG_BINDIR``, else the newest /usr/lib/postgresql/N/bin."""
    configured = os.environ.get("CRONWARDEN_PG_BINDIR")
    candidates = [Path(configured)] if configured else []
    found = sorted(Path("/").glob(BINDIRS.lstrip("/")), key=lambda p: _major(p.parent.name), reverse=True)
    for bindir in candidates + found:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    return None


def _major(name: str) -> int:
    return int(name) if name.isdigit() else -1


def free_port() -> int:
    """A port in PORTS that nothing listens on right now."""
    for _ in range(50):
        port = random.randint(*PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS}")


class PrivatePostgres:
    def __init__(self, bindir: Path, base: Path, port: int) -> None:
        self.bindir = bindir
        self.base = base
        self.data = base / "data"
        self.log = base / "server.log"
        self.port = port
        self.host = "127.0.0.1"
        self._as_postgres = os.geteuid() == 0
        self.max_connections = 40
        """Taken at the next ``start`` (bench/fleet.py raises it)."""

    # -- lifecycle --------------------------------------------------------

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=self.base)
        if done.returncode != 0:
            said = done.stderr.strip() or done.stdout.strip()
            raise RuntimeError(
                f"{Path(args[0]).name} {args[1]} failed ({done.returncode}): {said}"
                f"\n--- server log ---\n{self.server_log()}"
            )
        return done

    def initdb(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )

    def start(self) -> None:
        options = " ".join(
            [
                f"-p {self.port}",
                f"-c listen_addresses={self.host}",
                f"-c unix_socket_directories={self.base}",
                "-c fsync=off",
                "-c full_page_writes=off",
                f"-c max_connections={self.max_connections}",
                "-c shared_buffers=16MB",
                "-c max_wal_senders=0",
                "-c wal_level=minimal",
            ]
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "start",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            str(TIMEOUT),
            "-o",
            options,
        )

    def stop(self, mode: str = "fast") -> None:
        """``fast``: clean shutdown; ``immediate``: like a crash (recovery on
        the next start)."""
        self._run(
            str(self.bindir / "pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w", "-t", str(TIMEOUT)
        )

    def running(self) -> bool:
        return self.postmaster_pid() is not None

    def postmaster_pid(self) -> int | None:
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        pid = int(first)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def destroy(self) -> None:
        """Stop the server if it runs (by its pid if pg_ctl cannot) and
        remove its directory."""
        pid = self.postmaster_pid()
        if pid is not None:
            try:
                self.stop(mode="immediate")
            except (RuntimeError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGQUIT)
        shutil.rmtree(self.base, ignore_errors=True)

    # -- use --------------------------------------------------------------

    def url(self, dbname: str = "postgres", **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://postgres@{self.host}:{self.port}/{dbname}" + (f"?{query}" if query else "")

    def server_log(self) -> str:
        try:
            return self.log.read_text()[-4000:]
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A started private server, stopped and removed afterwards."""
    bindir = find_bindir()
    if bindir is None:
        unavailable(f"PostgreSQL server binaries (initdb, pg_ctl) not found in {BINDIRS}")
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            unavailable("running as root and there is no 'postgres' OS user to run the server as")
        if shutil.which("runuser") is None:
            unavailable("running as root and runuser is missing")
    base = Path(tempfile.mkdtemp(prefix="cw-pg-"))
    if os.geteuid() == 0:
        os.chown(base, owner.pw_uid, owner.pw_gid)
    server = PrivatePostgres(bindir, base, free_port())
    try:
        server.initdb()
        for attempt in range(3):
            try:
                server.start()
                break
            except RuntimeError:
                if attempt == 2 or server.running():
                    raise
                server.port = free_port()  # lost a race for the port
        yield server
    finally:
        server.destroy()
