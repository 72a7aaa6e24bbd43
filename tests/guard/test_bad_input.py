"""Bad input gets one line saying what was wrong and what is expected, a
documented exit status, no traceback, and leaves the ledger as it was."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.contract import ledger

from cronwarden.durations import format_duration, parse_duration
from cronwarden.errors import UsageError
from cronwarden.stores import open_store

CLI = [sys.executable, "-m", "cronwarden"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})  # fmt: skip


def assert_one_line_error(result: subprocess.CompletedProcess[str], status: int, *needles: str) -> None:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got: {result.stderr!r}"
    assert lines[0].startswith("cronwarden: ")
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A store that already holds one run: bad input must not change it."""
    u = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert run_cli("run", "--job", "existing", "--store", u, "--", "true").returncode == 0
    return u


BAD = [
    (["run", "--job", "x", "--colour", "red", "--", "true"], 2, ["unrecognized arguments", "--colour"]),
    (["run", "--job", "x", "true"], 2, ["put the command after --"]),
    (["run", "--job", "x", "--"], 2, ["no command; put it after --"]),
    (["run", "--", "true"], 2, ["--job"]),
    (["run", "--job", "x", "--ttl", "ten", "--", "true"], 2, ["--ttl", "90s", "'ten'"]),
    (["run", "--job", "x", "--ttl", "0s", "--", "true"], 2, ["--ttl", "greater than zero"]),
    (["run", "--job", "x", "--ttl", "-5s", "--", "true"], 2, ["--ttl"]),
    (
        ["run", "--job", "x", "--ttl", "10s", "--renew-every", "10s", "--", "true"],
        2,
        ["renew interval", "at most"],
    ),
    (["run", "--job", "x", "--ttl", "10s", "--renew-every", "1m", "--", "true"], 2, ["renew interval"]),
    (["run", "--job", "", "--", "true"], 2, ["job name", "''"]),
    (["run", "--job", "x" * 200, "--", "true"], 2, ["job name", "1-128"]),
    (["run", "--job", "a b", "--", "true"], 2, ["job name"]),
    (["run", "--job", "x", "--every", "often", "--", "true"], 2, ["--every"]),
    (["run", "--job", "x", "--schedule", "61 * * * *", "--", "true"], 2, ["cron expression"]),
    (["run", "--job", "x", "--schedule", "* * *", "--", "true"], 2, ["cron expression"]),
    (["run", "--job", "x", "--schedule", "* * * * *", "--tz", "Mars/Base", "--", "true"], 2, ["time zone"]),
    (
        ["run", "--job", "x", "--every", "1m", "--schedule", "* * * * *", "--", "true"],
        2,
        ["not allowed with"],
    ),
    (["run", "--job", "x", "--policy", "sometimes", "--", "true"], 2, ["--policy", "invalid choice"]),
    (["run", "--job", "x", "--skip-exit-code", "300", "--", "true"], 2, ["--skip-exit-code", "0 to 255"]),
    (["run", "--job", "x", "--policy", "allow", "--", "true"], 2, ["needs a partition"]),
    (["run", "--job", "x", "--", "/no/such/command"], 127, ["command not found"]),
    (["run", "--job", "x", "--", "no-such-command-anywhere"], 127, ["command not found"]),
    (["run", "--job", "x", "--store", "mysql://h/db", "--", "true"], 2, ["unknown scheme", "sqlite"]),
    (["run", "--job", "x", "--store", "no-scheme-here", "--", "true"], 2, ["bad store URL"]),
    (["run", "--job", "x", "--store", "sqlite://", "--", "true"], 2, ["sqlite:///PATH"]),
    (
        ["run", "--job", "x", "--store", "sqlite:///tmp/x.db?colour=red", "--", "true"],
        2,
        ["unknown parameter"],
    ),
    (
        ["run", "--job", "x", "--store", "sqlite:///tmp/x.db?synchronous=off", "--", "true"],
        2,
        ["synchronous"],
    ),
    (["history", "bad name"], 2, ["job name"]),
    (["history", "x", "--limit", "0"], 2, ["--limit"]),
    (["bogus"], 2, ["unknown command", "run"]),
]


@pytest.mark.parametrize(("args", "status", "needles"), BAD, ids=[" ".join(a)[:60] for a, _, _ in BAD])
def test_bad_cli_input_is_one_line_with_its_status(url: str, args: list[str], status: int,
                                                     needles: list[str]) -> None:  # fmt: skip
    args = [a for a in args]
    before = ledger(open_store(url))
    result = run_cli(*args, env={"CRONWARDEN_STORE": url})
    assert_one_line_error(result, status, *needles)
    assert ledger(open_store(url)) == before


def test_command_not_executable_is_126(url: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    before = ledger(open_store(url))
    result = run_cli("run", "--job", "x", "--store", url, "--", str(script))
    assert_one_line_error(result, 126, "not executable")
    assert ledger(open_store(url)) == before


def test_corrupt_store_file_is_named_and_left_untouched(tmp_path: Path) -> None:
    db = tmp_path / "corrupt.db"
    garbage = b"this is not a database, it is a shopping list\n" * 200
    db.write_bytes(garbage)
    result = run_cli("run", "--job", "x", "--store", f"sqlite:///{db}", "--", "true")
    assert_one_line_error(result, 2, str(db), "not a usable cronwarden SQLite database")
    assert db.read_bytes() == garbage


def test_store_path_that_is_a_directory_is_an_error(tmp_path: Path) -> None:
    result = run_cli("run", "--job", "x", "--store", f"sqlite:///{tmp_path}", "--", "true")
    assert_one_line_error(result, 2, "SQLite store", "is a directory")


def test_store_path_that_is_a_device_is_an_error_not_a_retry() -> None:
    # /dev/null used to fail with "disk I/O error", exit 75: "try again later".
    result = run_cli("status", "--store", "sqlite:////dev/null")
    assert_one_line_error(result, 2, "/dev/null", "not a regular file")


@pytest.mark.parametrize(
    "url",
    [
        "mysql://root:hunter2@db.example/x",  # unknown scheme
        "redis://:hunter2@127.0.0.1:6379/x",  # bad database
        "redis://app:hunter2@127.0.0.1:99999999/0",  # bad port: urlsplit refuses it
    ],
)
def test_a_bad_store_url_is_named_without_its_password(url: str) -> None:
    result = run_cli("status", "--store", url)
    assert_one_line_error(result, 2, "bad store URL", ":***@")
    assert "hunter2" not in result.stderr


def test_store_from_environment_is_validated_like_the_flag(tmp_path: Path) -> None:
    result = run_cli("status", env={"CRONWARDEN_STORE": "ftp://example"})
    assert_one_line_error(result, 2, "unknown scheme")


@given(st.text(max_size=12))
def test_parse_duration_accepts_only_unit_durations(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except UsageError as e:
        assert repr(text) in str(e)
    else:
        assert seconds >= 0
        assert any(u in text.lower() for u in ("ms", "s", "m", "h", "d"))


@given(st.integers(min_value=0, max_value=10**7))
def test_formatted_whole_seconds_parse_back_close(seconds: int) -> None:
    text = format_duration(seconds)
    assert abs(parse_duration(text) - seconds) <= max(1.0, seconds * 0.02) or seconds >= 86400
