"""A private PgBouncer in transaction mode in front of the shared PostgreSQL
test server, for the tests: started on its own port, stopped by its pid.

Debian's ``pgbouncer`` (``.ci/apt-packages``). It runs as the ``postgres``
OS user when the tests run as root (PgBouncer refuses to run as root).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

PORTS = range(27181, 27190)
"""This suite's private ports (the lowest, 27180, is left to benches)."""


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PgBouncer:
    def __init__(self, base: Path, port: int, upstream: str) -> None:
        self.base = base
        self.port = port
        parts = urlsplit(upstream)
        self.dbname = parts.path.lstrip("/") or "postgres"
        self.user = parts.username or "postgres"
        self.pid: int | None = None
        ini = base / "pgbouncer.ini"
        upstream_host = f"host={parts.hostname or '127.0.0.1'} port={parts.port or 5432}"
        ini.write_text(
            "[databases]\n"
            f"{self.dbname} = {upstream_host} dbname={self.dbname}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {base / 'users.txt'}\n"
            "pool_mode = transaction\n"
            "default_pool_size = 4\n"
            "max_client_conn = 200\n"
            # psycopg sends extra_float_digits; nothing else of ours is a startup parameter.
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {base / 'pgbouncer.log'}\n"
            f"pidfile = {base / 'pgbouncer.pid'}\n"
        )
        (base / "users.txt").write_text(f'"{self.user}" ""\n')
        self.ini = ini

    def url(self, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"pooler": "transaction", **params}.items())
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.dbname}?{query}"

    def start(self) -> None:
        cmd = ["pgbouncer", "-d", str(self.ini)]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)
        pidfile = self.base / "pgbouncer.pid"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if pidfile.exists() and pidfile.read_text().strip() and not _free(self.port):
                self.pid = int(pidfile.read_text().strip())
                return
            time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not start on port {self.port}: {self.log()}")

    def stop(self) -> None:
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                os.kill(self.pid, 0)
                time.sleep(0.05)
            os.kill(self.pid, signal.SIGKILL)
        self.pid = None

    def log(self) -> str:
        try:
            return (self.base / "pgbouncer.log").read_text()[-3000:]
        except OSError:
            return "(no log)"


def why_not() -> str | None:
    """Why a PgBouncer cannot be started here, or None."""
    if shutil.which("pgbouncer") is None:
        return "pgbouncer is not installed (Debian package pgbouncer, .ci/apt-packages)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' OS user to run pgbouncer as"
    if not any(_free(p) for p in PORTS):
        return f"no free port in {PORTS.start}-{PORTS.stop - 1} for pgbouncer"
    return None


@contextlib.contextmanager
def pgbouncer(upstream: str) -> Iterator[PgBouncer]:
    """A started PgBouncer in front of ``upstream``, stopped and removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="cw-pgbouncer-"))
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(base, owner.pw_uid, owner.pw_gid)
    bouncer = None
    try:
        for port in PORTS:
            if not _free(port):
                continue
            bouncer = PgBouncer(base, port, upstream)
            try:
                bouncer.start()
                break
            except (RuntimeError, subprocess.CalledProcessError):
                bouncer.stop()
                bouncer = None
        if bouncer is None:
            raise RuntimeError(f"pgbouncer could not start on any port in {PORTS.start}-{PORTS.stop - 1}")
        yield bouncer
    finally:
        if bouncer is not None:
            bouncer.stop()
        shutil.rmtree(base, ignore_errors=True)
