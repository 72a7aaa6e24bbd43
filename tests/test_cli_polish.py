"""What a new user meets first: misspelt flags, cron shorthands, a
six-field line, the time zone flag, ``renew_every``, a configured command,
read commands on a store that is not there, and a demo that shows its
timeline as it happens."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cronwarden import cli
from cronwarden.errors import UsageError
from cronwarden.schedule import Schedule
from cronwarden.stores import open_store

CW = [sys.executable, "-m", "cronwarden"]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    return subprocess.run([*CW, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["run", "--job", "x", "--ttll", "5s", "--", "true"], "did you mean --ttl?"),
        (["run", "--job", "x", "--polcy=skip", "--", "true"], "did you mean --policy?"),
        (["history", "x", "--limt", "3"], "did you mean --limit?"),
        (["stauts"], "did you mean status?"),
    ],
)
def test_a_misspelt_flag_or_command_gets_a_suggestion(argv: list[str], hint: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert hint in err and err.count("\n") == 1, err


def test_a_flag_nothing_is_close_to_gets_no_suggestion(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["run", "--job", "x", "--frobnicate", "--", "true"]) == 2
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("macro", "expression"),
    [("@hourly", "0 * * * *"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"), ("@weekly", "0 0 * * 0"),
     ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *")],
)  # fmt: skip
def test_cron_shorthands_fire_as_their_expressions(macro: str, expression: str) -> None:
    t = datetime(2026, 3, 14, 15, 9, 26, tzinfo=UTC).timestamp()
    short, long = Schedule.cron_(macro, "UTC"), Schedule.cron_(expression, "UTC")
    assert short.text == macro
    assert short.next_fire(t) == long.next_fire(t) and short.slot(t) == long.slot(t)
    assert short.period(t) == long.period(t)


def test_a_shorthand_schedule_is_accepted_by_run_and_the_config_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    done = run_cli(
        "run", "--job", "nightly", "--schedule", "@daily", "--timezone", "UTC", "--store", url, "--", "true"
    )
    assert done.returncode == 0, done.stderr
    with open_store(url) as store:
        info = store.job("nightly")
        assert info is not None and info.schedule == "CRON_TZ=UTC @daily" and info.period == 86400
    (tmp_path / "cronwarden.toml").write_text('[jobs.weekly]\nschedule = "@weekly"\ncommand = ["true"]\n')
    assert run_cli("config", "check", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize(
    ("schedule", "said"),
    [("0 0 * * * *", "has six fields; cron has five"), ("*/30 * * * * *", "use --every"),
     ("@reboot", "@reboot has no fire times"), ("@fortnightly", "not a cron macro")],
)  # fmt: skip
def test_a_schedule_cron_cannot_mean_is_refused_in_one_line(schedule: str, said: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=said):
        Schedule.cron_(schedule)
    done = run_cli(
        "run", "--job", "x", "--schedule", schedule, "--store", f"sqlite:///{tmp_path}/s.db", "--", "true"
    )
    assert done.returncode == 2 and said in done.stderr and done.stderr.count("\n") == 1, done.stderr
    (tmp_path / "cronwarden.toml").write_text(f'[jobs.x]\nschedule = "{schedule}"\ncommand = ["true"]\n')
    checked = run_cli("config", "check", cwd=tmp_path)
    assert checked.returncode == 2 and said in checked.stderr + checked.stdout


def test_timezone_is_the_flag_and_tz_its_alias(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    for flag in ("--timezone", "--tz"):
        done = run_cli("run", "--job", "zoned", "--schedule", "0 3 * * *", flag, "Europe/Berlin",
                       "--store", url, "--", "true")  # fmt: skip
        assert done.returncode == 0, done.stderr
    with open_store(url) as store:
        info = store.job("zoned")
        assert info is not None and info.schedule == "CRON_TZ=Europe/Berlin 0 3 * * *"
    both = run_cli("run", "--job", "zoned", "--schedule", "0 3 * * *", "--timezone", "UTC", "--tz", "UTC",
                   "--store", url, "--", "true")  # fmt: skip
    assert both.returncode == 2 and "not allowed with" in both.stderr
    alone = run_cli("run", "--job", "zoned", "--timezone", "UTC", "--store", url, "--", "true")
    assert alone.returncode == 2 and "--timezone applies to a cron schedule" in alone.stderr


def test_renew_every_is_a_config_key(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    (tmp_path / "cronwarden.toml").write_text('[jobs.beat]\nttl = "6s"\nrenew_every = "5s"\n')
    # Read and checked against the ttl: 5s leaves no room for two renewals of a 6s lease.
    too_slow = run_cli("run", "--job", "beat", "--store", url, "--", "true", cwd=tmp_path)
    assert too_slow.returncode == 2 and "renew interval" in too_slow.stderr and "got 5s" in too_slow.stderr
    (tmp_path / "cronwarden.toml").write_text('[jobs.beat]\nttl = "6s"\nrenew_every = "500ms"\n')
    assert run_cli("run", "--job", "beat", "--store", url, "--", "true", cwd=tmp_path).returncode == 0
    shown = run_cli("config", "show", cwd=tmp_path)
    assert "renew_every" in shown.stdout and "cronwarden.toml:3" in shown.stdout
    (tmp_path / "cronwarden.toml").write_text('[jobs.beat]\nrenew_every = "0s"\n')
    assert run_cli("config", "check", cwd=tmp_path).returncode == 2


def test_run_job_without_a_command_runs_the_configured_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    marker = tmp_path / "ran"
    (tmp_path / "cronwarden.toml").write_text(
        f'[jobs.hello]\nevery = "1h"\ncommand = ["sh", "-c", "echo $CRONWARDEN_JOB > {marker}"]\n'
    )
    done = run_cli("run", "--job", "hello", "--store", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert marker.read_text().strip() == "hello"
    with open_store(url) as store:
        (run,) = store.runs("hello")
        assert run.exit_code == 0
    unknown = run_cli("run", "--job", "other", "--store", url, cwd=tmp_path)
    assert unknown.returncode == 2 and "no command" in unknown.stderr and unknown.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["history", "nightly"],
        ["audit"],
        ["check"],
        ["metrics"],
        ["dashboard", "--listen", "127.0.0.1:0"],
    ],
)
def test_a_read_command_on_a_missing_sqlite_store_says_so_and_creates_nothing(
    argv: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "typo" / "cronwarden.db"
    done = run_cli(*argv, "--store", f"sqlite:///{path}")
    assert done.returncode == 2, done.stderr
    assert f"no ledger at {path}" in done.stderr and done.stderr.count("\n") == 1
    assert not path.exists() and not path.parent.exists()


def test_the_demo_prints_its_timeline_as_it_happens() -> None:
    p = subprocess.Popen([*CW, "demo"], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    arrivals = []
    for line in p.stdout:
        arrivals.append((time.monotonic(), line))
    p.wait(timeout=120)
    end = arrivals[-1][0]
    first_slot = next(t for t, line in arrivals if "slot 00" in line)
    assert end - first_slot > 5, "the timeline came out all at once at the end"
    started = [t for t, line in arrivals if " started, fencing token" in line]
    assert started and end - started[0] > 1


def test_the_demo_shows_a_progress_line_on_a_terminal() -> None:
    controller, terminal = pty.openpty()
    p = subprocess.Popen([*CW, "demo"], stdout=terminal, stderr=subprocess.DEVNULL)
    os.close(terminal)
    seen = b""
    while True:
        ready, _, _ = select.select([controller], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closed: the demo exited
            break
        if not chunk:
            break
        seen += chunk
    p.wait(timeout=60)
    os.close(controller)
    assert b"\r\x1b[K   [plain cron] t=" in seen and b"\r\x1b[K   [cronwarden] t=" in seen
    assert b"fired, " in seen and b"summary" in seen


INTERNAL = re.compile(r"\bG[1-9]\b|the seed|the brief|DESIGN\.md", re.IGNORECASE)


def test_sources_docs_and_help_carry_no_internal_references() -> None:
    # Guarantee numbers and planning documents mean nothing to a user reading
    # a docstring, a SQL comment, a guide or --help: say what is meant instead.
    root = Path(__file__).resolve().parent.parent
    files = [p for d in ("src", "docs", "examples") for p in (root / d).rglob("*") if p.is_file()]
    files = [p for p in files if p.suffix not in {".pyc", ".db"}] + [root / "README.md"]
    found = [
        f"{p.relative_to(root)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if INTERNAL.search(line)
    ]
    top = run_cli("--help")
    listing = top.stdout.split("commands:")[1].split("\n\n")[0]
    commands = [line.split()[0] for line in listing.splitlines()[1:]]
    assert "run" in commands and "unsnooze" in commands
    for command in [None, *commands]:
        done = run_cli(*([command] if command else []), "--help")
        assert done.returncode == 0, done.stderr
        found += [f"{command or 'cronwarden'} --help: {m.group()}" for m in INTERNAL.finditer(done.stdout)]
    assert not found, "\n".join(found)
