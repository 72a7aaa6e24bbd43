"""examples/celery: a real Celery beat and worker, the local Redis as broker
(under a key prefix of this test's own). Beat sends the task every second,
each delivery works 2.5 s: overlapping deliveries run one at a time, the
others are recorded skipped, and each skip is a line of the worker's log
from the ``cronwarden`` logger at INFO, not a stray print."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from tests.conftest import BackendProbe, _delete_redis_prefix, unavailable
from tests.contract import assert_one_terminal_per_start, ledger
from tests.integrations import EXAMPLES, assert_never_concurrent, example_env, spans

from cronwarden.events import EventKind
from cronwarden.stores import open_store

pytest.importorskip("celery")


def test_beat_and_worker_run_overlapping_deliveries_once_and_log_the_skip(
    tmp_path: Path, request: pytest.FixtureRequest, backend_probe: BackendProbe
) -> None:
    why = backend_probe.why_not("redis")
    if why is not None:
        unavailable(f"celery's broker: {why}")
    prefix = f"cw_test_celery_{uuid.uuid4().hex[:12]}:"
    request.addfinalizer(lambda: _delete_redis_prefix(prefix))
    store_url = f"sqlite:///{tmp_path / 'cronwarden.db'}"
    env = example_env(store_url, CELERY_BROKER_URL="redis://127.0.0.1:6379/0", CELERY_KEY_PREFIX=prefix,
                      REPORT_EVERY="1", REPORT_WORK="2.5")  # fmt: skip
    celery = [sys.executable, "-m", "celery", "-A", "tasks"]
    worker = subprocess.Popen(
        [*celery, "worker", "--pool", "threads", "--concurrency", "2", "--loglevel", "INFO",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "--hostname", f"{prefix}@%h"],
        cwd=EXAMPLES / "celery", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    beat = subprocess.Popen(
        [*celery, "beat", "--loglevel", "INFO", "--schedule", str(tmp_path / "beat-schedule")],
        cwd=EXAMPLES / "celery", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    store = open_store(store_url)
    request.addfinalizer(store.close)
    try:
        # Until a report was built and a delivery skipped while it worked
        # (generous: two interpreters start Celery on a busy machine).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and worker.poll() is None and beat.poll() is None:
            done = ledger(store, job="build-report", kinds=[EventKind.SUCCEEDED, EventKind.SKIPPED])
            if {e.kind for e in done} == {EventKind.SUCCEEDED, EventKind.SKIPPED}:
                break
            time.sleep(0.2)
    finally:
        beat.send_signal(signal.SIGTERM)
        _beat_out, beat_err = beat.communicate(timeout=30)
        worker.send_signal(signal.SIGTERM)  # warm shutdown: a report in progress finishes
        _out, log = worker.communicate(timeout=30)
    assert worker.returncode == 0, log[-3000:]
    assert beat.returncode == 0, beat_err[-3000:]
    assert "Sending due task build-report (tasks.build_report)" in beat_err, beat_err[-3000:]
    worked = spans(log)
    assert worked, log[-3000:]
    assert_never_concurrent(worked)
    succeeded = ledger(store, job="build-report", kinds=[EventKind.SUCCEEDED])
    skipped = ledger(store, job="build-report", kinds=[EventKind.SKIPPED])
    assert len(succeeded) == len(worked) and skipped, log[-3000:]
    started = {e.run_id for e in ledger(store, job="build-report", kinds=[EventKind.STARTED])}
    assert {s.data["holder_run_id"] for s in skipped} <= started
    assert store.open_runs("build-report") == []
    assert_one_terminal_per_start(store)
    # Each skip is the cronwarden logger's INFO line in the worker's log, with
    # the holder; nothing of it reaches the log as redirected output (WARNING).
    refusals = re.findall(r"\[[^]]*: (\w+)/[^]]*\] (\S+): build-report skipped: run ([\w-]+)", log)
    assert len(refusals) == len(skipped), log[-3000:]
    assert {(level, name) for level, name, _ in refusals} == {("INFO", "cronwarden")}
    assert {holder for *_, holder in refusals} == {s.data["holder_run_id"] for s in skipped}
    assert "WARNING" not in log, log[-3000:]
    # What the task declares is known to audit: its period and reason.
    job = store.job("build-report")
    assert job is not None and job.period == 1.0 and "email" in job.reason
