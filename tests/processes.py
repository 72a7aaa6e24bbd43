"""Helpers for tests that watch real processes."""

from __future__ import annotations

import os
import signal
from pathlib import Path


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
