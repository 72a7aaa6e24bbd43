"""The library logs through ``logging.getLogger("cronwarden")``, with the job
and run id as structured fields; it never prints. ``cronwarden run`` keeps its
one-line messages on stderr."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cronwarden import NotStarted
from cronwarden.clock import SYSTEM_CLOCK
from cronwarden.guard import Warden


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cronwarden.db'}"


def test_a_refused_start_is_logged_with_fields_and_never_printed(
    url: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="cronwarden")
    with Warden(url, clock=SYSTEM_CLOCK) as w, w.guard("nightly", ttl=30) as holder:
        with pytest.raises(NotStarted), w.guard("nightly", ttl=30):
            pass

        @w.job("nightly", ttl=30)
        def again() -> None:
            pass

        assert again() is None
    refusals = [r for r in caplog.records if getattr(r, "refusal", None) == "skipped"]
    assert len(refusals) == 2
    for r in refusals:
        assert r.name == "cronwarden" and r.levelno == logging.INFO
        assert r.job == "nightly" and r.holder_run_id == holder.run_id  # type: ignore[attr-defined]
        assert "nightly skipped" in r.getMessage() and holder.run_id in r.getMessage()
    assert capsys.readouterr().err == ""


def test_each_run_logs_its_start_and_end_with_the_run_id(url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="cronwarden")
    with Warden(url, clock=SYSTEM_CLOCK) as w:
        with w.guard("nightly", ttl=30) as ok:
            pass
        with pytest.raises(ZeroDivisionError), w.guard("nightly", ttl=30) as bad:
            1 / 0  # noqa: B018
    mine = [(r.run_id, getattr(r, "outcome", None), r.levelno) for r in caplog.records
            if hasattr(r, "run_id")]  # fmt: skip
    assert mine == [
        (ok.run_id, None, logging.DEBUG),
        (ok.run_id, "succeeded", logging.DEBUG),
        (bad.run_id, None, logging.DEBUG),
        (bad.run_id, "failed", logging.INFO),
    ]
    ended = next(r for r in caplog.records if getattr(r, "outcome", None) == "failed")
    assert ended.job == "nightly" and "ZeroDivisionError" in ended.getMessage()  # type: ignore[attr-defined]


def test_a_json_log_handler_gets_the_fields(url: str, tmp_path: Path) -> None:
    """As a user's JSON logging would: a handler that writes each record's
    extra fields, in a process of its own (no pytest capture in between)."""
    script = tmp_path / "app.py"
    script.write_text(
        "import json, logging, sys\n"
        "from cronwarden import Warden, NotStarted\n"
        "class Json(logging.Formatter):\n"
        "    def format(self, r):\n"
        "        keep = ('job', 'run_id', 'outcome', 'refusal', 'holder_run_id')\n"
        "        return json.dumps({'level': r.levelname, 'msg': r.getMessage(),\n"
        "                           **{k: getattr(r, k) for k in keep if hasattr(r, k)}})\n"
        "h = logging.StreamHandler(sys.stdout); h.setFormatter(Json())\n"
        "logging.getLogger('cronwarden').addHandler(h); logging.getLogger('cronwarden').setLevel('INFO')\n"
        f"with Warden({url!r}) as w, w.guard('nightly', ttl=30):\n"
        "    try:\n"
        "        with w.guard('nightly', ttl=30): pass\n"
        "    except NotStarted: pass\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(x["level"], x["job"], x.get("refusal")) for x in lines] == [("INFO", "nightly", "skipped")]
    assert lines[0]["holder_run_id"]


def test_the_command_line_still_prints_its_one_line_refusal(url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    env["CRONWARDEN_STORE"] = url
    argv = [sys.executable, "-m", "cronwarden", "run", "--job", "nightly", "--"]
    holder = subprocess.Popen([*argv, "sleep", "5"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        import time

        from cronwarden.stores import open_store

        with open_store(url) as store:
            deadline = time.monotonic() + 20
            while not store.open_runs("nightly"):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        second = subprocess.run([*argv, "true"], env=env, capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 0
    lines = second.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cronwarden: nightly skipped: run "), second.stderr
