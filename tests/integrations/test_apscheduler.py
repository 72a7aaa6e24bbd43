"""examples/apscheduler: two APScheduler processes on one store fire the same
job every second; its runs are never concurrent, and each slot one process
does not run is recorded skipped."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.contract import assert_one_terminal_per_start, ledger
from tests.integrations import EXAMPLES, assert_never_concurrent, example_env, spans

from cronwarden.events import EventKind
from cronwarden.stores import open_store

pytest.importorskip("apscheduler")


def test_two_apscheduler_processes_never_run_the_job_at_once(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # One store on one host: the stores' own tests cover the others.
    store_url = f"sqlite:///{tmp_path / 'cronwarden.db'}"
    argv = [sys.executable, str(EXAMPLES / "apscheduler" / "app.py"), "--every", "1", "--work", "0.6"]
    env = example_env(store_url)
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    try:
        time.sleep(5)  # five fires of each process: real time is what APScheduler keeps
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=30) for p in procs]
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err  # a run in progress finished first: SIGTERM is a clean stop
    store = open_store(store_url)
    request.addfinalizer(store.close)
    worked = spans("".join(out for out, _ in outputs))
    assert len(worked) >= 3, outputs
    assert_never_concurrent(worked)
    succeeded = ledger(store, job="refresh-prices", kinds=[EventKind.SUCCEEDED])
    skipped = ledger(store, job="refresh-prices", kinds=[EventKind.SKIPPED])
    assert len(succeeded) == len(worked) and len(skipped) >= 1
    started = {e.run_id for e in ledger(store, job="refresh-prices", kinds=[EventKind.STARTED])}
    assert {s.data["holder_run_id"] for s in skipped} <= started
    assert store.open_runs("refresh-prices") == []
    assert_one_terminal_per_start(store)
    # What the example declares is known to audit: its period and reason.
    job = store.job("refresh-prices")
    assert job is not None and job.period == 1.0 and "double-write" in job.reason
