"""A password in the store URL stays secret: it is in no command's
environment, on no cronwarden process's command line (``/proc/*/cmdline`` is
world-readable) nor in their environment, and in no output; the SQLite
ledger cronwarden creates is its owner's alone.

PostgreSQL here trusts local connections, so any password is accepted: the
runs really use the URL with the password in it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cronwarden.errors import mask_password
from cronwarden.events import Outcome
from cronwarden.stores import open_store

PASSWORD = "S3CRETPW"
CLI = [sys.executable, "-m", "cronwarden"]

# Run as the job's command, while cronwarden's supervisor and keeper are
# alive: every process's command line and environment, and this command's
# own environment, searched for the password (read from a file, so that it
# is not on this script's own command line).
SCAN = r"""
import json, os, sys
needle = open(sys.argv[1]).read().strip().encode()
found = []
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    for part in ("cmdline", "environ"):
        try:
            data = open(f"/proc/{pid}/{part}", "rb").read()
        except OSError:
            continue
        if needle in data:
            shown = data.replace(bytes(1), b" ")[:300]
            found.append(f"{pid} {part}: {shown!r}")
own = [k for k, v in os.environ.items() if needle.decode() in v]
json.dump({"found": found, "own": own, "env": sorted(k for k in os.environ if k.startswith("CRONWARDEN_"))},
          open(sys.argv[2], "w"))
"""


def _secret_url(store_url: str) -> str:
    url = store_url.replace("postgresql://postgres@", f"postgresql://postgres:{PASSWORD}@")
    assert PASSWORD in url
    return url


def _scan(tmp_path: Path) -> list[str]:
    (tmp_path / "needle").write_text(PASSWORD)
    (tmp_path / "scan.py").write_text(SCAN)
    return [sys.executable, str(tmp_path / "scan.py"), str(tmp_path / "needle"), str(tmp_path / "seen.json")]


def _seen(tmp_path: Path) -> dict[str, list[str]]:
    path = tmp_path / "seen.json"
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # a detached run may outlive its scheduler
    seen: dict[str, list[str]] = json.loads(path.read_text())
    return seen


def _no_password_in(done: subprocess.CompletedProcess[str]) -> None:
    assert PASSWORD not in done.stdout and PASSWORD not in done.stderr, done


postgres_only = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


@postgres_only
@pytest.mark.parametrize("given", ["environment", "flag"])
def test_the_password_is_in_no_environment_command_line_or_output_of_a_run(
    store_url: str, tmp_path: Path, given: str
) -> None:
    url = _secret_url(store_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    argv = [*CLI, "run", "--job", "secret", "--every", "1m"]
    if given == "environment":
        env["CRONWARDEN_STORE"] = url
    else:
        argv += ["--store", url]
    argv += ["--", *_scan(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    _no_password_in(done)
    seen = _seen(tmp_path)
    # With the variable set, the supervisor's (and the keeper's) first
    # environment holds it: /proc/PID/environ is only the owner's to read.
    others = [f for f in seen["found"] if not (given == "environment" and f.split()[1] == "environ:")]
    assert others == [] and seen["own"] == []
    assert "CRONWARDEN_STORE" not in seen["env"]
    given_to_command = {"CRONWARDEN_RUN_ID", "CRONWARDEN_JOB", "CRONWARDEN_FENCING_TOKEN", "CRONWARDEN_SLOT"}
    assert given_to_command <= set(seen["env"])
    with open_store(store_url) as store:
        assert [r.outcome for r in store.runs("secret")] == [Outcome.SUCCEEDED]


@postgres_only
def test_pass_store_gives_the_command_the_store(store_url: str, tmp_path: Path) -> None:
    url = _secret_url(store_url)
    env = {**os.environ, "CRONWARDEN_STORE": url}
    show = "import os; print(os.environ.get('CRONWARDEN_STORE', 'none'))"
    argv = [*CLI, "run", "--job", "asked", "--pass-store", "--", sys.executable, "-c", show]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == url


@postgres_only
@pytest.mark.parametrize("detach", [False, True])
def test_a_scheduled_runs_command_sees_no_password(store_url: str, tmp_path: Path, detach: bool) -> None:
    """In the scheduler's process, or detached (a ``cronwarden run`` child,
    given the store through an inherited pipe)."""
    url = _secret_url(store_url)
    config = tmp_path / "cronwarden.toml"
    config.write_text(f'[jobs.tick]\nevery = "1m"\nttl = "30s"\ndetach = {str(detach).lower()}\n'
                      f'command = {json.dumps(_scan(tmp_path))}\n')  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    argv = [*CLI, "scheduler", "--config", str(config), "--store", url, "--for", "1s"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    _no_password_in(done)
    seen = _seen(tmp_path)
    assert seen["found"] == [] and seen["own"] == [], seen
    assert not any("STORE" in k for k in seen["env"])
    with open_store(store_url) as store:
        deadline = time.monotonic() + 30
        while store.open_runs("tick") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [r.outcome for r in store.runs("tick")] == [Outcome.SUCCEEDED]


def test_config_check_and_show_mask_the_password(tmp_path: Path) -> None:
    config = tmp_path / "cronwarden.toml"
    config.write_text(f'store = "redis://default:{PASSWORD}@127.0.0.1:1/0"\n[jobs.a]\nevery = "1m"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    for action in (["check"], ["show"], ["show", "--json"]):
        done = subprocess.run([*CLI, "config", *action, "--config", str(config)], capture_output=True,
                              text=True, timeout=60, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        _no_password_in(done)
        assert "redis://default:***@127.0.0.1:1/0" in done.stdout
    env["CRONWARDEN_STORE"] = f"postgresql://u@127.0.0.1:1/x?password={PASSWORD}"
    done = subprocess.run([*CLI, "config", "show", "--config", str(config)], capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip
    _no_password_in(done)
    assert "password=***" in done.stdout


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://default:pw@h:6379/0", "redis://default:***@h:6379/0"),
        ("rediss://:p@ss@h/0", "rediss://:***@h/0"),
        ("postgresql://u:pw@h/db?sslmode=require", "postgresql://u:***@h/db?sslmode=require"),
        (
            "postgresql://u@h/db?sslmode=require&password=pw",
            "postgresql://u@h/db?sslmode=require&password=***",
        ),
        ("sqlite:///var/lib/a@b.db", "sqlite:///var/lib/a@b.db"),
        ("redis://127.0.0.1:notaport/0", "redis://127.0.0.1:notaport/0"),
        ("bad store URL 'redis://u:pw@h:x/0': a bad port", "bad store URL 'redis://u:***@h:x/0': a bad port"),
    ],
)
def test_one_function_masks_every_password(url: str, masked: str) -> None:
    assert mask_password(url) == masked


def test_the_sqlite_ledger_cronwarden_creates_is_its_owners_alone(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    done = subprocess.run([*CLI, "run", "--job", "x", "--", "true"], capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    directory = tmp_path / "state" / "cronwarden"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = list(directory.iterdir())
    assert any(f.name == "cronwarden.db" for f in files)
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f
