"""How long a whole guarded run (supervisor and child) can be frozen without
losing its lease, pinned down with one real ``cronwarden run``.

The supervisor stops the child at ``last renewal + 0.9×ttl − kill grace``
(kill grace = ttl/6), and renewals come every ttl/3. A pause that starts just
before a renewal is due therefore survives only if it ends before
``0.9 − 1/6 = 0.73×ttl`` after the last renewal: a pause of up to about
0.4×ttl in the worst phase. Issue 6 asks that a 0.5×ttl pause never lose the
lease; in the worst phase it does, although the lease is still live in the
store for another 0.2×ttl and a renewal right after the thaw would succeed.
The chaos harness measures the same thing at random phases (about 30% of
0.5×ttl pauses lose the lease; see docs/RELIABILITY.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cronwarden.events import Outcome
from cronwarden.stores import open_store

TTL = 3.0
"""Long enough that process start-up jitter on a loaded machine is small
against the phases below, short enough for a test."""


def frozen_run(tmp_path: Path, *, pause_at: float, pause_for: float) -> tuple[int, Outcome | None]:
    """Start a guarded run whose child works for 1.4×ttl; freeze supervisor
    and child ``pause_at``×ttl after the child started, for ``pause_for``×ttl.
    Returns the supervisor's exit status and the run's recorded outcome."""
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    pidfile = tmp_path / "child.pid"
    script = f"echo $$ > {pidfile}; exec sleep {1.4 * TTL}"
    sup = subprocess.Popen(
        [sys.executable, "-m", "cronwarden", "run", "--job", "budget", "--ttl", f"{TTL:g}s", "--store", url,
         "--", "sh", "-c", script],
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.005)
    child_started = time.monotonic()
    group = os.getpgid(int(pidfile.read_text()))  # the command's process group
    assert group != sup.pid
    # The acquire was sent just before the child started, so the first
    # renewal is due about ttl/3 from now: freeze just before it.
    time.sleep(max(0.0, child_started + pause_at * TTL - time.monotonic()))
    try:
        os.killpg(sup.pid, signal.SIGSTOP)
        os.killpg(group, signal.SIGSTOP)
        time.sleep(pause_for * TTL)
    finally:
        os.killpg(group, signal.SIGCONT)
        os.killpg(sup.pid, signal.SIGCONT)
    _, err = sup.communicate(timeout=60)
    with open_store(url) as store:
        runs = store.runs("budget")
    assert len(runs) == 1, err
    return sup.returncode, runs[0].outcome


def test_a_pause_ending_before_the_stop_threshold_keeps_the_lease(tmp_path: Path) -> None:
    # Frozen from 0.28×ttl to 0.58×ttl after the grant: before 0.73×ttl.
    code, outcome = frozen_run(tmp_path, pause_at=0.28, pause_for=0.3)
    assert (code, outcome) == (0, Outcome.SUCCEEDED)


@pytest.mark.xfail(
    strict=True,
    reason="finding (issue 6): a 0.5×ttl pause just before a renewal ends past the supervisor's stop "
    "threshold (0.9×ttl − ttl/6 after the last renewal), so the run is stopped although its lease is "
    "still live and a renewal after the thaw would succeed",
)
def test_a_pause_of_half_the_ttl_just_before_a_renewal_keeps_the_lease(tmp_path: Path) -> None:
    # Frozen from 0.28×ttl to 0.78×ttl after the grant; the lease lasts to 1.0×ttl.
    code, outcome = frozen_run(tmp_path, pause_at=0.28, pause_for=0.5)
    assert (code, outcome) == (0, Outcome.SUCCEEDED)
