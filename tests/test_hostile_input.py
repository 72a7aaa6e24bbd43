"""Hostile and absurd input, as an operator meets it: each case is one line
on stderr, its documented exit status, no traceback, and the ledger exactly
as it was (docs/RELIABILITY.md, the bad-input table)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "cronwarden"]


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**base, **(env or {})})  # fmt: skip


def ledger(db: Path) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(db)) as c:  # closed: no -wal or -shm file left open
        return (
            c.execute("SELECT run_id, outcome FROM runs ORDER BY run_id").fetchall()
            + c.execute("SELECT event_id FROM events ORDER BY seq").fetchall()
        )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    done = run_cli("run", "--job", "existing", "--store", f"sqlite:///{path}", "--", "true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return path


NESTED = "a = " + "[" * 900 + "]" * 900 + "\n"

CASES = [
    # (config file text or None, extra environment, argv after the store, status, needles)
    (NESTED, {}, ["config", "check"], 2, ["nested too deeply"]),
    (NESTED, {}, ["run", "--job", "x", "--", "true"], 2, ["nested too deeply"]),
    ("# " + "x" * (5 * 1024 * 1024) + "\n", {}, ["config", "check"], 2, ["over 4096 KiB"]),
    (None, {"CRONWARDEN_HOST": "evil\n\x1b[2J"}, ["run", "--job", "x", "--", "true"], 2,
     ["CRONWARDEN_HOST must be a host name"]),
    (None, {}, ["run", "--job", "x", "--ttl", "1ms", "--", "true"], 2, ["--ttl must be at least 1s"]),
    (None, {}, ["run", "--job", "x", "--slot", "1e30", "--", "true"], 2, ["--slot", "year 9999"]),
    ('retention = "soon"\n', {}, ["prune"], 2, ["retention"]),
    ("keep_runs = 0\n", {}, ["prune"], 2, ["keep_runs must be a whole number"]),
    (None, {}, ["prune", "--store-url-suffix", "?retention=soon"], 2, ["retention must be a duration"]),
    (None, {}, ["audit", "--slow", "5"], 2, ["--slow", "at most 1"]),
    (None, {}, ["audit", "--runs", "99999999999"], 2, ["--runs must be a whole number from 1 to 100000"]),
    (None, {}, ["history", "x", "--limit", "99999999999"], 2, ["--limit must be a whole number from 1"]),
    (None, {}, ["run", "--job", "x", "--max-pending", "99999", "--policy", "queue", "--reason", "r", "--",
                "true"], 2, ["max_pending must be a whole number from 1 to 10000"]),
    (None, {"CRONWARDEN_TTL": "1ms"}, ["run", "--job", "x", "--", "true"], 2,
     ["ttl must be at least 1s", "$CRONWARDEN_TTL"]),
    ('[jobs.x]\nttl = "1m"\nrenew_every = "2m"\n', {}, ["config", "check"], 2, ["renew interval"]),
    ('store = "postgresql://u@127.0.0.1:1/db?schema=bad-name"\n', {}, ["config", "check"], 2,
     ["schema must be a plain SQL name"]),
    ('store = "redis://127.0.0.1:1/0?prefix=p:&bogus=1"\n', {}, ["config", "check"], 2,
     ["unknown parameter(s) bogus"]),
    ('[sinks.h]\ntype = "webhook"\nsecret = "s"\nurl = "https://u:pw@example.com/"\n', {},
     ["config", "check"], 2, ["must not hold a user or password"]),
]  # fmt: skip


@pytest.mark.parametrize(("config", "env", "argv", "status", "needles"), CASES,
                         ids=[" ".join(c[2])[:40] + f" #{i}" for i, c in enumerate(CASES)])  # fmt: skip
def test_bad_input_is_one_line_and_leaves_the_ledger_as_it_was(
    tmp_path: Path, db: Path, config: str | None, env: dict[str, str], argv: list[str], status: int,
    needles: list[str],
) -> None:  # fmt: skip
    if config is not None:
        (tmp_path / "cronwarden.toml").write_text(config)
    before = ledger(db)
    suffix = ""
    if "--store-url-suffix" in argv:  # a parameter of the store URL itself
        at = argv.index("--store-url-suffix")
        suffix, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    store = ["--store", f"sqlite:///{db}{suffix}"] if argv[0] in ("run", "prune", "audit", "history") else []
    words = (
        [*argv[: argv.index("--")], *store, *argv[argv.index("--") :]] if "--" in argv else [*argv, *store]
    )
    done = run_cli(*words, env=env, cwd=tmp_path)
    assert done.returncode == status, done
    assert "Traceback" not in done.stderr
    said = done.stdout + done.stderr
    for needle in needles:
        assert needle in said, said
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert ledger(db) == before


def test_an_empty_redis_prefix_is_refused_before_any_write(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    done = run_cli(
        "run", "--job", "x", "--store", "redis://127.0.0.1:1/0?prefix=", "--", "true", cwd=tmp_path
    )
    assert done.returncode == 2 and "prefix must not be empty" in done.stderr, done
    assert done.stderr.count("\n") == 1


def test_a_damaged_schema_is_not_a_usable_store_not_an_outage(tmp_path: Path, db: Path) -> None:
    with sqlite3.connect(db) as c:
        c.execute("DROP TABLE leases")
    done = run_cli("run", "--job", "x", "--on-store-error", "run", "--store", f"sqlite:///{db}", "--",
                   "sh", "-c", "echo RAN", cwd=tmp_path)  # fmt: skip
    # Not 75 (unreachable): --on-store-error=run would run unguarded forever.
    assert done.returncode == 2, done
    assert "not a usable cronwarden store" in done.stderr and "RAN" not in done.stdout
    assert done.stderr.count("\n") == 1


HOSTILE_HOST = "evil\n\x1b[2J"


def test_a_hostile_host_name_already_in_the_store_is_shown_escaped(tmp_path: Path, db: Path) -> None:
    """The other path: a host name no check saw (another writer, an older
    version) is escaped wherever it is shown, never printed raw."""
    from cronwarden.events import Outcome
    from cronwarden.monitor import Monitor
    from cronwarden.stores import open_store
    from cronwarden.stores.base import End, Granted, Start
    from cronwarden.web import Dashboard

    store = open_store(f"sqlite:///{db}")
    try:
        for run_id in ("r-done", "r-open"):
            granted = store.acquire(Start(job="hostile", key="hostile", run_id=run_id, host=HOSTILE_HOST,
                                          pid=4242, ttl=600, at=time.time()))  # fmt: skip
            assert isinstance(granted, Granted)
            if run_id == "r-done":
                store.finish(granted.lease, End(Outcome.SUCCEEDED, time.time(), exit_code=0))
        pages = [Dashboard(Monitor(store)).handle("GET", target).body.decode()
                 for target in ("/jobs/hostile", "/")]  # fmt: skip
    finally:
        store.close()

    status = run_cli("status", "--store", f"sqlite:///{db}", cwd=tmp_path)
    history = run_cli("history", "hostile", "--store", f"sqlite:///{db}", cwd=tmp_path)
    for done, runs in ((status, 1), (history, 2)):
        assert done.returncode == 0, done
        assert "\x1b" not in done.stdout and "evil\\n\\x1b[2J" in done.stdout, done.stdout
        # A header and a line per run: no row broken in two.
        assert len(done.stdout.strip().splitlines()) == 1 + runs, done.stdout
    for page in pages:
        assert "\x1b" not in page and "evil\n" not in page
    assert "evil\\n\\x1b[2J" in pages[0]


@pytest.fixture
def read_only(tmp_path: Path, db: Path) -> Iterator[Path]:
    """``db``'s directory, bind-mounted read-only (root cannot be stopped by
    file modes, only by a read-only mount)."""
    view = tmp_path / "ro"
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(db.parent), str(view)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a read-only store needs a bind mount (root, CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        remounted = subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], capture_output=True,
                                   text=True)  # fmt: skip
        if remounted.returncode != 0:
            pytest.skip(f"cannot remount the bind mount read-only: {remounted.stderr.strip()}")
        yield view / db.name
    finally:
        subprocess.run(["umount", str(view)], check=True)


def test_a_store_on_a_read_only_filesystem_is_inspected_and_run_says_it_cannot_write(
    tmp_path: Path, db: Path, read_only: Path
) -> None:
    before = ledger(db)
    url = f"sqlite:///{read_only}"

    for argv in (["status"], ["history", "existing"], ["audit"], ["history", "existing", "--json"]):
        done = run_cli(*argv, "--store", url, cwd=tmp_path)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done
    assert "succeeded" in run_cli("history", "existing", "--store", url, cwd=tmp_path).stdout

    ran = run_cli("run", "--job", "existing", "--store", url, "--", "sh", "-c", "echo RAN", cwd=tmp_path)
    assert ran.returncode == 2 and "RAN" not in ran.stdout, ran
    assert ran.stderr.count("\n") == 1 and "cannot write" in ran.stderr and "read-only" in ran.stderr
    assert ledger(db) == before
    assert sorted(p.name for p in db.parent.iterdir() if p.name.startswith(db.name)) == [db.name]


def test_another_programs_key_under_the_redis_prefix_is_one_line_and_nothing_written(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    import redis
    from tests.conftest import REDIS_URL, unavailable

    admin = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        admin.ping()
    except redis.exceptions.ConnectionError as e:
        unavailable(f"Redis at {REDIS_URL} does not answer: {e}")
    prefix = f"cw-hostile-{uuid.uuid4().hex[:10]}:"
    admin.set(f"{prefix}open", "another program's")
    try:
        done = run_cli("run", "--job", "x", "--store", f"{REDIS_URL}?prefix={prefix}", "--", "sh", "-c",
                       "echo RAN", cwd=tmp_path)  # fmt: skip
        assert done.returncode == 2 and "RAN" not in done.stdout, done
        assert f"the key {prefix}open holds a string where the store keeps a hash" in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert admin.keys(f"{prefix}*") == [f"{prefix}open"]
    finally:
        for key in admin.scan_iter(match=f"{prefix}*"):
            admin.delete(key)
        admin.close()
