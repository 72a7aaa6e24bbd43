"""Hostile and absurd input, as an operator meets it: each case is one line
on stderr, its documented exit status, no traceback, and the ledger exactly
as it was (docs/RELIABILITY.md, the bad-input table)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "cronwarden"]


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**base, **(env or {})})  # fmt: skip


def ledger(db: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as c:
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
    store = ["--store", f"sqlite:///{db}"] if argv[0] in ("run", "prune") else []
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
