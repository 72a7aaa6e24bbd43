"""Helpers for tests that watch real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent


def spawn_python(call: str) -> subprocess.Popen[str]:
    """A new interpreter running ``call`` (e.g. ``from contract.test_x import
    worker; worker(...)``) with the tests directory importable, its stdin,
    stdout and stderr piped as text: workers that a test releases through
    stdin and that answer on stdout."""
    code = f"import sys; sys.path[:0] = [{str(TESTS_DIR)!r}, {str(TESTS_DIR.parent)!r}]; {call}"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped counts as gone).

    A process can be reaped between ``open`` and ``read`` of its stat file;
    the read then fails with ESRCH (ProcessLookupError), which means gone too.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def parent_of(pid: int) -> int:
    """``pid``'s parent, from its stat file (after the command name, which
    may hold spaces and parentheses: state, then ppid)."""
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def kill_quietly(pid: int) -> None:
    """SIGKILL ``pid`` if it is still there (test cleanup)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_for(what: str, check: Callable[[], bool], timeout: float, every: float = 0.01) -> None:
    """Poll ``check`` until true, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        pause.wait(every)
