"""``cronwarden run`` delivers its events to the configured sinks at the end
of the run, and a broken sink never changes the run's outcome."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cronwarden.events import Outcome
from cronwarden.stores import open_store


def _run(tmp_path: Path, config: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "cronwarden.toml").write_text(config)
    return subprocess.run(
        [sys.executable, "-m", "cronwarden", "run", "--job", "nightly", *args, "--", "true"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")},
    )  # fmt: skip


def test_run_delivers_its_start_and_end_to_a_log_sink(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    store = f"sqlite:///{tmp_path / 's.db'}"
    result = _run(tmp_path, f'store = "{store}"\n[sinks.file]\ntype = "log"\npath = "{out}"\n')
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["kind"] for e in events] == ["started", "succeeded"]
    assert events[0]["run_id"] == events[1]["run_id"]


def test_a_bad_sink_table_does_not_stop_the_run(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 's.db'}"
    result = _run(tmp_path, f'store = "{store}"\n[sinks.bad]\ntype = "carrier-pigeon"\n')
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    with open_store(store) as s:
        (run,) = s.runs("nightly")
    assert run.outcome is Outcome.SUCCEEDED


def test_a_down_webhook_does_not_change_the_exit_status(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 's.db'}"
    config = (f'store = "{store}"\n[sinks.hook]\ntype = "webhook"\nurl = "http://127.0.0.1:1/hook"\n'
              'secret = "s3cret"\n')  # fmt: skip
    result = _run(tmp_path, config)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
