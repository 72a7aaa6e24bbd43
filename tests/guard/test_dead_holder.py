"""A dead holder on this host is dead now: after ``kill -9`` of a
supervisor, the next start on the same host records the old run
``abandoned`` and runs at once; a start from another host id still waits
for the lease to expire. On every store."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.contract import assert_one_terminal_per_start, ledger
from tests.guard.test_run_cli import cli, wait_for
from tests.processes import alive, kill_quietly, parent_of

from cronwarden.events import EventKind, Outcome
from cronwarden.stores import open_store


def _crash(store_url: str, tmp_path: Path, job: str, ttl: str, script: str = "") -> tuple[str, int]:
    """Start ``job``, kill -9 its supervisor once the command runs, wait
    for the command to die with it; the dead run's id and the command's pid."""
    pidfile = tmp_path / f"{job}.pid"
    p = cli("run", "--job", job, "--ttl", ttl, "--store", store_url, "--",
            "sh", "-c", f"{script} echo $$ > {pidfile}; exec sleep 60")  # fmt: skip
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child pid"))
    keeper = parent_of(child)
    p.kill()
    p.wait()
    wait_for(lambda: not alive(child) and not alive(keeper), timeout=5, what="the run's processes to die")
    with open_store(store_url) as store:
        (old,) = store.runs(job)
    assert old.outcome is None
    return old.run_id, child


def _time_to_start(store_url: str, job: str) -> float:
    """Seconds from launching ``cronwarden run --job JOB -- true`` to its
    run's start in the ledger."""
    began = time.time()
    q = cli("run", "--job", job, "--ttl", "60s", "--store", store_url, "--", "true")
    _, err = q.communicate(timeout=30)
    assert q.returncode == 0 and "skipped" not in err, err
    with open_store(store_url) as store:
        return store.runs(job)[0].started_at - began


def test_after_kill_9_the_next_start_on_this_host_runs_at_once(store_url: str, tmp_path: Path) -> None:
    old_id, _ = _crash(store_url, tmp_path, "crash", "60s")
    waited = _time_to_start(store_url, "crash")
    # Against an uncontended start: the interpreter's own start is most of
    # either, and slow on a busy machine.
    usual = _time_to_start(store_url, "control")
    assert waited - usual < 1.0, f"started {waited:.2f}s after its launch (uncontended: {usual:.2f}s)"
    with open_store(store_url) as store:
        new = store.runs("crash")[0]
        assert new.run_id != old_id and new.outcome is Outcome.SUCCEEDED
        old = store.run(old_id)
        assert old is not None and old.outcome is Outcome.ABANDONED
        assert new.run_id in old.detail and "no process of the run is left" in old.detail
        (abandoned,) = ledger(store, kinds=[EventKind.ABANDONED])
        assert abandoned.run_id == old_id
        assert not ledger(store, kinds=[EventKind.SKIPPED])
        assert new.token > old.token
        info = store.lease("crash")
        assert info is not None and info.owner is None
        assert_one_terminal_per_start(store)


def test_a_start_from_another_host_id_waits_for_the_ttl(store_url: str, tmp_path: Path) -> None:
    old_id, _ = _crash(store_url, tmp_path, "remote", "3s")
    killed = time.monotonic()
    elsewhere = {"CRONWARDEN_HOST": "another-host"}
    q = cli("run", "--job", "remote", "--ttl", "3s", "--store", store_url, "--", "true", env=elsewhere)
    _, err = q.communicate(timeout=30)
    assert "skipped" in err and old_id in err
    while True:  # until the lease expires
        q = cli("run", "--job", "remote", "--ttl", "3s", "--store", store_url, "--", "true", env=elsewhere)
        _, err = q.communicate(timeout=30)
        if "skipped" not in err:
            break
        assert time.monotonic() - killed < 20, "the lease never expired"
        time.sleep(0.2)
    waited = time.monotonic() - killed
    # The last renewal was at most a renew interval (1 s) before the kill.
    assert waited >= 3.0 - 1.0 - 0.1, f"took the lease {waited:.2f}s after the kill, within its 3s ttl"
    with open_store(store_url) as store:
        old = store.run(old_id)
        assert old is not None and old.outcome is Outcome.ABANDONED
        (abandoned,) = ledger(store, kinds=[EventKind.ABANDONED])
        assert abandoned.data["found_by"] == store.runs("remote")[0].run_id
        assert_one_terminal_per_start(store)


def test_a_process_of_the_dead_run_still_running_keeps_its_lease(store_url: str, tmp_path: Path) -> None:
    # A process that left the command's group survives a kill -9 of the
    # keeper too (a documented limit of the sweep): while it runs, the run
    # is not dead, and the next start here must not take its lease.
    escaped = tmp_path / "escaped"
    pidfile = tmp_path / "pid"
    p = cli("run", "--job", "lingering", "--ttl", "60s", "--store", store_url, "--", "sh", "-c",
            f"setsid sleep 60 & echo $! > {escaped}; echo $$ > {pidfile}; exec sleep 60")  # fmt: skip
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child pid"))
    stray = int(wait_for(lambda: escaped.exists() and escaped.read_text().strip(), what="stray pid"))
    keeper = parent_of(child)
    try:
        # Both die at once (the supervisor stopped first, so it cannot
        # record the end when its keeper dies): nothing sweeps the stray.
        p.send_signal(signal.SIGSTOP)
        os.kill(keeper, signal.SIGKILL)
        p.kill()
        p.wait()
        wait_for(lambda: not alive(child), timeout=5, what="the command to die with its keeper")
        assert alive(stray)
        q = cli("run", "--job", "lingering", "--ttl", "60s", "--store", store_url, "--", "true")
        _, err = q.communicate(timeout=30)
        assert "skipped" in err
        with open_store(store_url) as store:
            assert [r.outcome for r in store.runs("lingering")] == [None]
        kill_quietly(stray)
        wait_for(lambda: not alive(stray), timeout=5, what="the stray process to die")
        q = cli("run", "--job", "lingering", "--ttl", "60s", "--store", store_url, "--", "true")
        _, err = q.communicate(timeout=30)
        assert q.returncode == 0 and "skipped" not in err, err
        with open_store(store_url) as store:
            assert [r.outcome for r in store.runs("lingering")] == [Outcome.SUCCEEDED, Outcome.ABANDONED]
    finally:
        kill_quietly(stray)
