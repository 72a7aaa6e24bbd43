"""``examples/crontab`` under a real cron daemon (Debian's ``cron``), for
two minutes, with a job that runs longer than its period: one run, one
recorded skip. The daemon is a private one, in the foreground, stopped by
its pid."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from tests.docs.runner import cronwarden_command

from cronwarden.events import EventKind, Outcome
from cronwarden.stores import open_store
from cronwarden.stores.base import EventQuery

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "crontab"
CRON_D = Path("/etc/cron.d")
PIDFILE = Path("/run/crond.pid")


def _cron_or_skip() -> str:
    cron = shutil.which("cron") or ("/usr/sbin/cron" if os.path.exists("/usr/sbin/cron") else None)
    if cron is None:
        pytest.skip("no cron daemon: apt-get install cron (listed in .ci/apt-packages)")
    if os.geteuid() != 0:
        pytest.skip("a cron daemon with a system crontab needs root")
    if PIDFILE.exists():
        try:
            os.kill(int(PIDFILE.read_text().split()[0]), 0)
            pytest.skip(f"a cron daemon already runs ({PIDFILE})")
        except (ValueError, ProcessLookupError, IndexError):
            pass
    return cron


def _crontab(tmp_path: Path, store: str) -> str:
    """The example as written, made to fire every minute with a job that
    runs 75 s, on a store of the test's own."""
    job = tmp_path / "reconcile"
    job.write_text(f'#!/bin/sh\necho "$CRONWARDEN_RUN_ID" >> {tmp_path}/ran\nsleep 75\n')
    job.chmod(0o755)
    text = EXAMPLE.read_text()
    for old, new in [
        ("*/10  *", "*     *"),
        ("--every 10m", "--every 1m"),
        ("    app   ", "    root  "),
        ("/usr/local/bin/cronwarden", str(cronwarden_command())),
        ("/opt/bin/reconcile", str(job)),
        ("postgresql://cronwarden@db.internal/ops", store),
        ("MAILTO=ops@example.com", 'MAILTO=""'),  # no mail system here
    ]:
        assert old in text, f"examples/crontab no longer has {old!r}"
        text = text.replace(old, new)
    return text


def test_the_example_crontab_under_a_real_cron_runs_once_and_records_the_overlap(tmp_path: Path) -> None:
    cron = _cron_or_skip()
    tmp_path.chmod(0o755)
    store = f"sqlite:///{tmp_path}/ops.db"
    # cron.d names hold no dot; the file must be root's and not writable by others.
    entry = CRON_D / f"cronwarden-test-{uuid.uuid4().hex[:8]}"
    entry.write_text(_crontab(tmp_path, store))
    entry.chmod(0o644)
    daemon = subprocess.Popen([cron, "-f"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # The first fire starts the 75 s run; the next, a minute later, finds
        # it still holding the lease and is skipped; the run then ends.
        deadline = time.monotonic() + 60 + 60 + 75 + 20
        while True:
            runs, skips = [], []
            if (tmp_path / "ops.db").exists():  # cron's first run made it
                with open_store(store) as s:
                    runs = s.runs("reconcile")
                    skips = s.events(EventQuery(job="reconcile", kinds=(EventKind.SKIPPED,)))
            if runs and skips and all(r.outcome is not None for r in runs):
                break
            assert daemon.poll() is None, f"cron exited: {daemon.communicate()[0]}"
            assert time.monotonic() < deadline, f"runs {runs}, skips {skips}"
            time.sleep(1)
    finally:
        entry.unlink()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)
    (run,) = runs
    assert run.outcome is Outcome.SUCCEEDED, run
    assert len(skips) == 1 and skips[0].data["holder_run_id"] == run.run_id
    assert (tmp_path / "ran").read_text().split() == [run.run_id]
