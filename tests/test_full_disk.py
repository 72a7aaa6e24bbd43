"""An end that cannot be recorded is not a success: a run whose command
succeeded but whose terminal record the store refused (its disk full) exits
75 and says so; once the disk has room again, the monitor finds the run's
lease expired and records it ``abandoned``, raising a ``stuck`` finding.

The disk is a 1 MB tmpfs the test mounts, which needs root (or
CAP_SYS_ADMIN): elsewhere the test is skipped with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cronwarden.events import Outcome
from cronwarden.stores import open_store

CLI = [sys.executable, "-m", "cronwarden"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(disk)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_run_whose_end_cannot_be_recorded_exits_75_and_the_monitor_sets_it_right(small_disk: Path) -> None:
    url = f"sqlite:///{small_disk / 'cronwarden.db'}"
    fill = small_disk / "fill"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    # The command succeeds after filling the disk: its end is the next write.
    command = ["sh", "-c", f"dd if=/dev/zero of={fill} bs=4k 2>/dev/null; exit 0"]
    started = time.monotonic()
    done = subprocess.run([*CLI, "run", "--job", "full", "--ttl", "2s", "--store", url, "--", *command],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert done.returncode == 75, done
    assert "Traceback" not in done.stderr
    assert "the command exited 0 but the store did not record it" in done.stderr
    assert "disk is full" in done.stderr
    fill.unlink()
    # The ledger still says running until the lease expires (2 s from the
    # last renewal); then one monitoring pass sets it right.
    with open_store(url) as store:
        [run] = store.runs("full")
        assert run.outcome is None
    while time.monotonic() < started + 30:
        check = subprocess.run([*CLI, "check", "--store", url], capture_output=True, text=True, timeout=60,
                               env=env)  # fmt: skip
        if "stuck" in check.stdout:
            break
        time.sleep(0.5)  # the store's own clock (CLOCK_BOOTTIME) must pass the ttl
    assert check.returncode == 2 and "its lease expired with no terminal record" in check.stdout, check
    with open_store(url) as store:
        [run] = store.runs("full")
        assert run.outcome is Outcome.ABANDONED
