"""Retention as an operator meets it: ``retention``/``keep_runs`` in the
config file or the store URL, ``cronwarden prune [--dry-run]``, a little at
the end of every ``cronwarden run`` and a step per monitoring pass. (What is
pruned and what never is: tests/contract/test_retention.py, every store.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from cronwarden.events import Event, EventKind, Outcome, new_id
from cronwarden.stores import open_store
from cronwarden.stores.base import End, EventQuery, Granted, Start

CLI = [sys.executable, "-m", "cronwarden"]
DAY = 86_400.0


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def _old_runs(url: str, job: str, n: int, days_ago: float) -> None:
    with open_store(url) as store:
        for i in range(n):
            at = time.time() - days_ago * DAY + i
            granted = store.acquire(Start(job=job, key=job, run_id=new_id(), host="h", pid=1, ttl=60, at=at))
            assert isinstance(granted, Granted)
            store.finish(granted.lease, End(Outcome.SUCCEEDED, at=at + 1, exit_code=0))


def test_prune_without_retention_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = cli("prune", "--store", f"sqlite:///{tmp_path / 'l.db'}", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "no retention configured" in done.stderr


def test_prune_by_the_config_file_with_a_dry_run_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    (tmp_path / "cronwarden.toml").write_text(f'store = "{url}"\nretention = "30d"\n')
    _old_runs(url, "old", 30, days_ago=60)
    _old_runs(url, "new", 3, days_ago=1)
    with open_store(url) as store:
        store.record(Event(kind=EventKind.STUCK, job="old", at=time.time() - 90 * DAY,
                           data={"state": "raised", "summary": "kept"}))  # fmt: skip

    dry = cli("prune", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip() == "due: 30 runs and 60 events (older than 30d)"
    done = cli("prune", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pruned: 30 runs and 60 events (older than 30d)"
    with open_store(url) as store:
        assert store.runs("old") == [] and len(store.runs("new")) == 3
        assert [e.kind for e in store.events(EventQuery(job="old"))] == [EventKind.STUCK]
    assert cli("prune", cwd=tmp_path).stdout.strip() == "pruned: 0 runs and 0 events (older than 30d)"


def test_a_runs_end_prunes_a_little_by_the_store_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}?keep_runs=2"
    for _ in range(4):
        done = cli("run", "--job", "j", "--store", url, "--", "true", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    with open_store(url) as store:
        assert len(store.runs("j")) == 2


def test_a_monitoring_pass_prunes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    (tmp_path / "cronwarden.toml").write_text(f'store = "{url}"\nretention = "7d"\n')
    _old_runs(url, "old", 5, days_ago=8)
    done = cli("monitor", "--once", "--store", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with open_store(url) as store:
        assert store.runs("old") == []


def test_bad_retention_settings_are_one_line(tmp_path: Path) -> None:
    for config, needle in (('retention = "30"\n', "retention must be a duration"),
                           ("keep_runs = 0\n", "keep_runs must be a whole number")):  # fmt: skip
        (tmp_path / "cronwarden.toml").write_text(config)
        done = cli("config", "check", cwd=tmp_path)
        assert done.returncode == 2 and needle in done.stdout, done
    (tmp_path / "cronwarden.toml").unlink()
    done = cli("prune", "--store", f"sqlite:///{tmp_path / 'l.db'}?retention=soon", cwd=tmp_path)
    assert done.returncode == 2 and "retention must be a duration" in done.stderr, done
    assert done.stderr.count("\n") == 1
