"""Private ``redis-server`` processes for fault tests.

Each server gets a free port and its own directory, runs in the foreground
as a child process with persistence off, and is stopped, paused and resumed
by its pid. Tests that kill connections, pause or restart a server use one of
these, never the shared server on 6379.

Without a ``redis-server`` binary the test is skipped; with
``CRONWARDEN_REQUIRE_BACKENDS=1`` it fails instead.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # redis is imported when used, so a missing driver skips instead of failing to collect
    import redis

START_TIMEOUT = 10.0


def redis_server_binary() -> str:
    """The path of ``redis-server``, or skip (fail when backends are required)."""
    found = shutil.which("redis-server")
    if found is None:
        reason = "redis-server is not installed; the Redis fault tests need a private server"
        if os.environ.get("CRONWARDEN_REQUIRE_BACKENDS", "") == "1":
            pytest.fail(f"{reason} (CRONWARDEN_REQUIRE_BACKENDS=1)", pytrace=False)
        pytest.skip(reason)
    return found


def free_port() -> int:
    """A free port: in ``$CRONWARDEN_TEST_PORTS`` (``low-high``) when set,
    else any the kernel gives."""
    wanted = os.environ.get("CRONWARDEN_TEST_PORTS")
    if wanted:
        low, high = (int(x) for x in wanted.split("-", 1))
        for port in random.sample(range(low, high + 1), min(50, high - low + 1)):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
        raise RuntimeError(f"no free port in {wanted}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` child process on 127.0.0.1:``port``."""

    def __init__(self, directory: Path, *, port: int | None = None, args: tuple[str, ...] = ()) -> None:
        self.binary = redis_server_binary()
        self.directory = directory
        self.port = free_port() if port is None else port
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.log = directory / "redis.log"

    @property
    def pid(self) -> int:
        assert self.process is not None, "server not started"
        return self.process.pid

    def url(self, prefix: str = "cw_fault:", **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"prefix": prefix, **params}.items())
        return f"redis://127.0.0.1:{self.port}/0?{query}"

    def admin(self) -> redis.Redis:
        """A plain client for the test to inspect or disturb the server."""
        import redis

        return redis.Redis(port=self.port, socket_timeout=5, decode_responses=True)

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        command = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self.directory),
            *self.args,
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        deadline = time.monotonic() + START_TIMEOUT
        # No retries: redis-py would retry a refused AUTH with backoff for seconds.
        probe = redis.Redis(
            port=self.port, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        try:
            while True:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"redis-server exited with {self.process.returncode}: {self._log_tail()}"
                    )
                try:
                    probe.ping()
                    return
                except redis.exceptions.AuthenticationError:
                    return  # up, and asking for a password
                except redis.exceptions.ResponseError as e:
                    if "NOAUTH" in str(e):
                        return
                    raise
                except redis.exceptions.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} not ready: {self._log_tail()}")
                time.sleep(0.01)
        finally:
            probe.close()

    def _log_tail(self) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return "(no log)"

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL: no shutdown work at all."""
        if self.process is not None and self.process.poll() is None:
            if self.paused:
                self.resume()
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            if self.paused:
                self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        """Stop and start again on the same port and directory. With
        persistence off and no manual SAVE, the new server starts empty."""
        self.stop()
        self.start()


@contextmanager
def private_redis(directory: Path, *, args: tuple[str, ...] = ()) -> Iterator[RedisServer]:
    server = RedisServer(directory, args=args)
    server.start()
    try:
        yield server
    finally:
        server.stop()
