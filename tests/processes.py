"""Helpers for tests that watch real processes."""

from __future__ import annotations


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
