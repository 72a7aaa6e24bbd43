"""examples/fastapi: two uvicorn replicas of a FastAPI service on one store.
A reindex asked of both at once runs in one of them (the other records it
skipped) as a guarded coroutine, while the service keeps answering; the
cache refresh loop runs once across the replicas; shutdown leaves no run
open."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.contract import assert_one_terminal_per_start, ledger
from tests.integrations import EXAMPLES, example_env, spans

from cronwarden.events import EventKind, Outcome
from cronwarden.stores import open_store

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

PORTS = (27141, 27142)


def _wait_ready(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail(f"uvicorn on port {port} did not answer within 20s")


def test_two_replicas_run_the_guarded_background_task_once(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'cronwarden.db'}"
    env = example_env(store_url, REINDEX_SECONDS="1.5", REFRESH_EVERY="600")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "app:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            cwd=EXAMPLES / "fastapi",
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for port in PORTS
    ]
    try:
        for port, proc in zip(PORTS, procs, strict=True):
            _wait_ready(port, proc)
        with httpx.Client(timeout=5) as client:
            t0 = time.monotonic()
            answers = [client.post(f"http://127.0.0.1:{port}/reindex") for port in PORTS]
            assert [a.status_code for a in answers] == [202, 202]
            # The reindex runs in the background of one replica; both still answer meanwhile.
            for port in PORTS:
                assert client.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
            assert time.monotonic() - t0 < 1.2, "a replica stopped answering while it reindexed"
        with open_store(store_url) as store:
            deadline = time.monotonic() + 15
            while not [r for r in store.runs("reindex") if r.outcome is not None]:
                assert time.monotonic() < deadline, "the reindex never ended"
                time.sleep(0.1)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        outputs = [proc.communicate(timeout=30) for proc in procs]
    # uvicorn shuts down (the lifespan's end included), then re-raises the signal.
    assert all(p.returncode in (0, -signal.SIGTERM) for p in procs), outputs
    assert not any("Traceback" in err for _, err in outputs), outputs
    worked = spans("".join(out for out, _ in outputs))
    assert len(worked) == 1 and worked[0][1] - worked[0][0] >= 1.4, outputs
    with open_store(store_url) as store:
        assert [r.outcome for r in store.runs("reindex")] == [Outcome.SUCCEEDED]
        assert len(ledger(store, job="reindex", kinds=[EventKind.SKIPPED])) == 1
        # The refresh loop started with each replica: each start ran (the
        # replicas started apart) or was skipped, and the job's period is known.
        refreshes = ledger(store, job="refresh-cache", kinds=[EventKind.SUCCEEDED, EventKind.SKIPPED])
        assert len(refreshes) == 2
        job = store.job("refresh-cache")
        assert job is not None and job.period == 600.0
        assert store.open_runs() == []
        assert_one_terminal_per_start(store)
