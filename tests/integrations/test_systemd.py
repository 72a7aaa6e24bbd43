"""``examples/systemd``: the unit files pass ``systemd-analyze verify``
with no warning, and the service's ``ExecStart`` behaves under
``systemctl stop`` as the unit promises (``KillMode=mixed``: SIGTERM to
cronwarden alone, within ``TimeoutStopSec``, an exit status the unit counts
as success, the run recorded ``interrupted``). systemd itself is not PID 1
here, so the stop is played by the test, as systemd would send it."""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tests.docs.runner import cronwarden_command
from tests.guard.test_run_cli import wait_for

from cronwarden.durations import parse_duration
from cronwarden.events import Outcome
from cronwarden.stores import open_store

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "systemd"


def unit(name: str) -> dict[str, str]:
    """The example unit's settings."""
    return unit_of(EXAMPLES / name)


def _installed(tmp_path: Path) -> tuple[Path, Path]:
    """The units with the example's paths replaced by real ones."""
    job = tmp_path / "reconcile"
    job.write_text(f"#!/bin/sh\ntouch {tmp_path}/ready\nwhile :; do sleep 0.05; done\n")
    job.chmod(0o755)
    service = tmp_path / "reconcile.service"
    text = (EXAMPLES / "reconcile.service").read_text()
    paths = {"/usr/local/bin/cronwarden": str(cronwarden_command()), "/opt/bin/reconcile": str(job)}
    for old, new in paths.items():
        assert old in text
        text = text.replace(old, new)
    service.write_text(text)
    timer = tmp_path / "reconcile.timer"
    shutil.copy(EXAMPLES / "reconcile.timer", timer)
    return service, timer


def test_systemd_analyze_verifies_the_units_without_a_warning(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze here")
    service, timer = _installed(tmp_path)
    done = subprocess.run(["systemd-analyze", "verify", str(service), str(timer)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    # It exits 0 on a setting it ignores (a misspelt KillMode): its output must be empty.
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr
    calendar = subprocess.run(["systemd-analyze", "calendar", unit("reconcile.timer")["OnCalendar"]],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert calendar.returncode == 0 and "*-*-* *:00/10:00" in calendar.stdout, calendar.stdout


def test_systemctl_stop_of_the_service_records_interrupted_within_its_timeout(tmp_path: Path) -> None:
    service, _ = _installed(tmp_path)
    settings = unit("reconcile.service")
    assert settings["KillMode"] == "mixed"
    argv = shlex.split(unit_of(service)["ExecStart"])
    name, _, url = settings["Environment"].partition("=")
    assert name == "CRONWARDEN_STORE" and url.startswith("postgresql://")
    url = f"sqlite:///{tmp_path}/ops.db"  # the unit's store, here
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "CRONWARDEN_STORE": url}  # systemd's bare environment
    main = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    wait_for((tmp_path / "ready").exists, what="the command to start")
    stopped = time.monotonic()
    main.send_signal(signal.SIGTERM)  # KillMode=mixed: the main process only
    timeout = parse_duration(settings["TimeoutStopSec"], what="TimeoutStopSec")
    try:
        _, err = main.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        main.kill()
        pytest.fail(f"running after TimeoutStopSec={settings['TimeoutStopSec']}: systemd would SIGKILL it")
    took = time.monotonic() - stopped
    assert str(main.returncode) in settings["SuccessExitStatus"].split(), (main.returncode, err)
    ttl = parse_duration(argv[argv.index("--ttl") + 1], what="--ttl")
    assert timeout >= min(10.0, ttl / 6) + 5, "TimeoutStopSec must outlast the kill grace and the record"
    with open_store(url) as store:
        (run,) = store.runs("reconcile")
        assert run.outcome is Outcome.INTERRUPTED
    assert took < timeout


def unit_of(path: Path) -> dict[str, str]:
    """A unit file's settings (``Key=value`` lines; later ones win)."""
    found = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found[key] = value
    return found
