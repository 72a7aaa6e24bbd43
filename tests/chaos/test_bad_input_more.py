"""Bad input that tests/guard/test_bad_input.py and tests/test_config.py do
not cover: config files as ``cronwarden run`` and ``config check`` read them,
database files that are locked, read-only, foreign or from the future,
``CRONWARDEN_*`` environment variables given to ``cronwarden run``, and
property tests of schedule parsing.

Each case expects what the CLI promises for bad input: one line on stderr
starting ``cronwarden:``, naming what was wrong, a documented exit status
(2 bad input, 75 store unreachable or locked), no traceback, the command not
run, and the store left as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronwarden.durations import MAX_DURATION, parse_duration
from cronwarden.errors import UsageError
from cronwarden.schedule import Schedule

CLI = [sys.executable, "-m", "cronwarden"]
RAN = "COMMAND-RAN"
COMMAND = ["--", "sh", "-c", f"echo {RAN}"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    env.update(extra)
    return env


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=env if env is not None else clean_env())  # fmt: skip


def one_line(done: subprocess.CompletedProcess[str], status: int, *needles: str) -> str:
    """The promise for bad input; returns the line."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == status, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got {done.stderr!r}"
    assert lines[0].startswith("cronwarden: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert RAN not in done.stdout, "the command ran"
    return lines[0]


def snapshot(db: Path) -> bytes:
    return db.read_bytes() if db.exists() else b""


# -- config files ------------------------------------------------------------------

CONFIGS: list[tuple[str, bytes, str]] = [
    ("binary garbage", bytes(range(256)) * 8, "not UTF-8 text"),
    ("invalid UTF-8", b'\xff\xfe[jobs.job]\nevery = "1m"\n', "not UTF-8 text"),
    ("a UTF-8 byte order mark", b'\xef\xbb\xbf[jobs.job]\nevery = "1m"\n', "TOML syntax"),
    ("unterminated string", b'[jobs.job]\nevery = "1m\n', "TOML syntax"),
    ("jobs is a number", b"jobs = 3\n", "jobs must be tables"),
    ("jobs is a list of tables", b'[[jobs]]\nname = "job"\n', "jobs must be tables"),
    ("the job is not a table", b"[jobs]\njob = 3\n", "[jobs.job] must be a table"),
    ("store is a number", b"store = 5\n", "store must be a URL string"),
    ("store has an unknown scheme", b'store = "ftp://x"\n[jobs.job]\nevery = "1m"\n', "scheme"),
    ("every is zero", b'[jobs.job]\nevery = "0s"\n', "greater than zero"),
    ("ttl in scientific notation", b'[jobs.job]\nevery = "1m"\nttl = "1e400s"\n', "ttl must be a duration"),
    ("ttl of a million years", b'[jobs.job]\nevery = "1m"\nttl = "365000000d"\n', "at most"),
    ("cron with eight fields", b'[jobs.job]\nschedule = "* * * * * * * *"\n', "cron expression"),
]


@pytest.mark.parametrize(("content", "needle"), [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_a_bad_config_file_stops_cronwarden_run_with_one_line(
    tmp_path: Path, content: bytes, needle: str
) -> None:
    config = tmp_path / "cronwarden.toml"
    config.write_bytes(content)
    db = tmp_path / "store.db"
    done = cli("run", "--job", "job", "--config", str(config), "--store", f"sqlite:///{db}", *COMMAND)
    one_line(done, 2, str(config), needle)
    assert not db.exists(), "bad config, yet the store was opened"


@pytest.mark.parametrize(("content", "needle"), [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_config_check_lists_the_problem_of_a_bad_file(tmp_path: Path, content: bytes, needle: str) -> None:
    config = tmp_path / "cronwarden.toml"
    config.write_bytes(content)
    done = cli("config", "check", "--config", str(config))
    assert "Traceback" not in done.stderr
    assert done.returncode == 2
    problems = done.stdout.strip().splitlines()
    assert problems and all(p.startswith(f"{config}") for p in problems), done.stdout
    assert any(needle in p for p in problems), done.stdout
    assert done.stderr.strip().startswith("cronwarden: ") and len(done.stderr.strip().splitlines()) == 1


def test_a_directory_given_as_the_config_file_is_one_line(tmp_path: Path) -> None:
    done = cli("run", "--job", "job", "--config", str(tmp_path), "--store", f"sqlite:///{tmp_path / 's.db'}",
               *COMMAND)  # fmt: skip
    one_line(done, 2, "--config", str(tmp_path))


def test_an_empty_config_file_is_a_valid_config_with_no_jobs(tmp_path: Path) -> None:
    config = tmp_path / "cronwarden.toml"
    config.write_text("")
    assert cli("config", "check", "--config", str(config)).stdout.strip() == f"{config}: ok: 0 jobs"
    done = cli("run", "--job", "job", "--config", str(config), "--store", f"sqlite:///{tmp_path / 's.db'}",
               *COMMAND)  # fmt: skip
    assert done.returncode == 0 and RAN in done.stdout, done.stderr


# -- database files ------------------------------------------------------------------


@pytest.fixture
def store_db(tmp_path: Path) -> Path:
    """A store file that already holds one run."""
    db = tmp_path / "store.db"
    assert cli("run", "--job", "job", "--store", f"sqlite:///{db}", "--", "true").returncode == 0
    return db


@contextlib.contextmanager
def locked(db: Path) -> Iterator[None]:
    """Another process holds the database's write lock until the block ends."""
    hold = (
        "import sqlite3, sys; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "db.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); sys.stdin.read(); db.execute('ROLLBACK')"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


def test_a_locked_store_fails_closed_with_75_and_runs_nothing(store_db: Path) -> None:
    url = f"sqlite:///{store_db}?busy_timeout=200ms"
    with locked(store_db):
        done = cli("run", "--job", "job", "--store", url, *COMMAND)
    one_line(done, 75, str(store_db), "locked", "fail closed")
    assert [line.split()[2] for line in history(store_db)] == ["succeeded"]


def test_a_locked_store_with_on_store_error_run_runs_unguarded_and_says_so(store_db: Path) -> None:
    url = f"sqlite:///{store_db}?busy_timeout=200ms"
    with locked(store_db):
        done = cli("run", "--job", "job", "--store", url, "--on-store-error=run", *COMMAND)
    assert done.returncode == 0 and RAN in done.stdout
    assert done.stderr.count("\n") == 1 and "UNGUARDED" in done.stderr


def history(db: Path) -> list[str]:
    done = cli("history", "job", "--store", f"sqlite:///{db}")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[1:]


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``chattr +i``: unwritable even by root (file modes are not, for root)."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip(f"cannot make {path} immutable on this filesystem")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_read_only_store_file_refuses_to_run_but_can_still_be_read(store_db: Path) -> None:
    before = history(store_db)
    with immutable(store_db):
        done = cli("run", "--job", "job", "--store", f"sqlite:///{store_db}", *COMMAND)
        one_line(done, 2, str(store_db), "permissions")
        assert history(store_db) == before


def test_a_store_in_a_read_only_directory_is_one_line(store_db: Path) -> None:
    for leftover in store_db.parent.glob("store.db-*"):
        leftover.unlink()  # no WAL files: opening must create them in the directory
    before = snapshot(store_db)
    with immutable(store_db.parent):
        done = cli("run", "--job", "job", "--store", f"sqlite:///{store_db}", *COMMAND)
    one_line(done, 2, str(store_db))
    assert snapshot(store_db) == before


def test_a_store_path_under_a_regular_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory")
    done = cli("run", "--job", "job", "--store", f"sqlite:///{tmp_path / 'afile' / 'store.db'}", *COMMAND)
    one_line(done, 2, "cannot open SQLite store")


def test_a_store_from_a_newer_cronwarden_is_refused_by_name(store_db: Path) -> None:
    with contextlib.closing(sqlite3.connect(store_db)) as db:
        db.execute("PRAGMA user_version = 99")
        db.commit()
    before = snapshot(store_db)
    done = cli("run", "--job", "job", "--store", f"sqlite:///{store_db}", *COMMAND)
    one_line(done, 2, str(store_db), "schema version 99", "Upgrade cronwarden")
    assert snapshot(store_db) == before


@pytest.mark.parametrize("table", ["leases", "cars"])
def test_a_foreign_database_is_bad_input_not_an_outage_and_is_left_as_it_was(
    tmp_path: Path, table: str
) -> None:
    """Once a finding (issue 6): a table named like one of cronwarden's made
    the first open fail with 'table leases already exists' and exit 75
    (retry later)."""
    db = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute(f"CREATE TABLE {table} (car TEXT, customer TEXT)")
        conn.execute(f"INSERT INTO {table} VALUES ('tesla', 'ada')")
        conn.commit()
    before = snapshot(db)
    done = cli("run", "--job", "job", "--store", f"sqlite:///{db}", *COMMAND)
    one_line(done, 2, str(db), "not a cronwarden store", table)
    assert snapshot(db) == before


# -- environment ---------------------------------------------------------------------

ENVIRONMENT = [
    ({"CRONWARDEN_STORE": "ftp://example"}, 2, ["unknown scheme"]),
    ({"CRONWARDEN_STORE": "sqlite://"}, 2, ["sqlite:///PATH"]),
    ({"CRONWARDEN_STORE": " sqlite:///tmp/x.db"}, 2, ["bad store URL"]),
    ({"CRONWARDEN_STORE": "redis://127.0.0.1:notaport/0"}, 2, ["bad store URL", "notaport"]),
    ({"CRONWARDEN_STORE": "redis://127.0.0.1:6379/zero"}, 2, ["database must be a number"]),
    ({"CRONWARDEN_STORE": "postgresql://[::1"}, 2, ["bad store URL", "[::1"]),
    ({"CRONWARDEN_STORE": "postgresql://postgres@127.0.0.1:5432/test?colour=red"}, 2, ["unknown parameter"]),
    ({"CRONWARDEN_STORE": "redis://127.0.0.1:1/0"}, 75, ["unreachable", "fail closed"]),
    ({"CRONWARDEN_STORE": "postgresql://postgres@127.0.0.1:1/test"}, 75, ["unavailable", "fail closed"]),
    ({"CRONWARDEN_TTL": "ten"}, 2, ["$CRONWARDEN_TTL", "'ten'"]),
    ({"CRONWARDEN_TTL": "0s"}, 2, ["$CRONWARDEN_TTL", "greater than zero"]),
    ({"CRONWARDEN_TTL": "999999999d"}, 2, ["$CRONWARDEN_TTL", "at most"]),
    ({"CRONWARDEN_MAX_RUNTIME": "1x"}, 2, ["$CRONWARDEN_MAX_RUNTIME"]),
    ({"CRONWARDEN_GRACE": "-1s"}, 2, ["$CRONWARDEN_GRACE"]),
    ({"CRONWARDEN_MAX_PENDING": "many"}, 2, ["$CRONWARDEN_MAX_PENDING"]),
    ({"CRONWARDEN_CONFIG": "/nonexistent/cronwarden.toml"}, 2, ["$CRONWARDEN_CONFIG", "no config file"]),
]


ENV_IDS = [" ".join(f"{k}={v}" for k, v in e.items())[:70] for e, _, _ in ENVIRONMENT]


@pytest.mark.parametrize(("env", "status", "needles"), ENVIRONMENT, ids=ENV_IDS)
def test_bad_environment_for_cronwarden_run_is_one_line(
    tmp_path: Path, env: dict[str, str], status: int, needles: list[str]
) -> None:
    if any(v.startswith(("redis://", "postgresql://")) for v in env.values()):
        pytest.importorskip("redis" if "redis" in str(env) else "psycopg")
    env = {"CRONWARDEN_STORE": f"sqlite:///{tmp_path / 'store.db'}", **env}
    done = cli("run", "--job", "job", *COMMAND, env=clean_env(**env), cwd=tmp_path)
    one_line(done, status, *needles)


def test_a_huge_ttl_flag_is_refused_before_any_run_starts(store_db: Path) -> None:
    before = history(store_db)
    done = cli("run", "--job", "job", "--ttl", "999999999d", "--store", f"sqlite:///{store_db}", *COMMAND)
    one_line(done, 2, "--ttl", "at most")
    assert history(store_db) == before


# -- schedules and durations, property-based ----------------------------------------

T = st.floats(min_value=1_600_000_000, max_value=2_200_000_000, allow_nan=False)
"""Instants from 2020 to 2039."""

CRON_FIELD = {
    "minute": (0, 59),
    "hour": (0, 23),
    "day": (1, 28),
    "month": (1, 12),
    "weekday": (0, 6),
}


@st.composite
def cron_field(draw: st.DrawFn, lo: int, hi: int) -> str:
    kind = draw(st.sampled_from(["*", "n", "range", "step", "list"]))
    n = st.integers(lo, hi)
    if kind == "*":
        return "*"
    if kind == "n":
        return str(draw(n))
    if kind == "range":
        a, b = sorted((draw(n), draw(n)))
        return f"{a}-{b}"
    if kind == "step":
        return f"*/{draw(st.integers(1, hi - lo + 1))}"
    return ",".join(str(x) for x in sorted(draw(st.sets(n, min_size=1, max_size=4))))


@st.composite
def cron(draw: st.DrawFn) -> str:
    return " ".join(draw(cron_field(lo, hi)) for lo, hi in CRON_FIELD.values())


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.one_of(st.text(max_size=30), st.from_regex(r"(@?every )?[0-9*/,\- a-z]{0,24}", fullmatch=True)))
def test_parse_schedule_gives_a_schedule_or_a_usage_error_naming_the_input(text: str) -> None:
    try:
        schedule = Schedule.parse(text, tz="UTC")
    except UsageError as e:
        assert str(e) and "\n" not in str(e)
        return
    t = 1_800_000_000.0
    assert schedule.slot(t) <= t < schedule.next_fire(t)


@PROPERTY
@given(cron(), T)
def test_a_cron_schedules_slot_and_next_fire_bracket_every_instant(expr: str, t: float) -> None:
    schedule = Schedule.parse(expr, tz="UTC")
    slot, nxt = schedule.slot(t), schedule.next_fire(t)
    assert slot <= t < nxt
    assert slot % 60 == 0 and nxt % 60 == 0  # cron fires on whole minutes
    assert schedule.next_fire(slot) == nxt  # no fire between the slot and the next one
    assert schedule.slot(nxt) == nxt
    assert 0 < schedule.period(t) <= schedule.next_fire(nxt) - nxt


@PROPERTY
@given(st.integers(1, 36500), st.sampled_from(["s", "m", "h", "d"]), T)
def test_an_every_schedule_fires_on_multiples_of_its_period(n: int, unit: str, t: float) -> None:
    schedule = Schedule.parse(f"every {n}{unit}")
    period = parse_duration(f"{n}{unit}")
    assert schedule.period() == period
    slot, nxt = schedule.slot(t), schedule.next_fire(t)
    assert slot <= t < nxt
    assert nxt - slot == period


@PROPERTY
@given(st.from_regex(r"([0-9]{1,25}(\.[0-9]{1,3})?(ms|s|m|h|d)){1,3}", fullmatch=True))
def test_every_duration_that_parses_is_at_most_the_cap(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except UsageError as e:
        assert "at most" in str(e) and repr(text) in str(e)
    else:
        assert 0 <= seconds <= MAX_DURATION
