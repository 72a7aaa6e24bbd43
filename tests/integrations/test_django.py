"""examples/django: a management command, run by two hosts' crontabs at the
same minute: one sends the reports, the other is recorded skipped and exits
0; the job's schedule and reason are known to audit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.contract import assert_one_terminal_per_start, ledger
from tests.integrations import EXAMPLES, example_env, spans

from cronwarden.events import EventKind, Outcome
from cronwarden.stores import open_store

pytest.importorskip("django")


def test_the_management_command_runs_once_when_two_hosts_start_it(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'cronwarden.db'}"
    env = example_env(store_url)
    argv = [sys.executable, "manage.py", "send_reports", "--work", "2"]
    first = subprocess.Popen(argv, cwd=EXAMPLES / "django", env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        with open_store(store_url) as store:
            deadline = time.monotonic() + 20
            while not store.open_runs("send-reports"):
                assert first.poll() is None, first.communicate()
                assert time.monotonic() < deadline, "the first command never started its run"
                time.sleep(0.05)
        second = subprocess.run(argv, cwd=EXAMPLES / "django", env=env, capture_output=True, text=True,
                                timeout=60)  # fmt: skip
        out, err = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 0 and second.returncode == 0, (err, second.stderr)
    assert second.stdout == "" and "send_reports: skipped, run " in second.stderr
    worked = spans(out + second.stdout)
    assert len(worked) == 1 and worked[0][1] - worked[0][0] >= 1.9
    with open_store(store_url) as store:
        assert [r.outcome for r in store.runs("send-reports")] == [Outcome.SUCCEEDED]
        skipped = ledger(store, job="send-reports", kinds=[EventKind.SKIPPED])
        assert len(skipped) == 1 and skipped[0].data["holder_run_id"] in second.stderr
        assert_one_terminal_per_start(store)
    audit = subprocess.run([sys.executable, "-m", "cronwarden", "audit"], env=env, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert "send-reports  CRON_TZ=Europe/Berlin 0 7 * * *" in audit.stdout, audit.stdout
    assert "each customer gets each report once" in audit.stdout
