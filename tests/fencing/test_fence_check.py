"""``cronwarden fence check``: real ``cronwarden run`` processes on a SQLite
ledger; the check is run from the guarded command, as a shell job would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHECK = f"{sys.executable} -m cronwarden fence check"


def _cw(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cronwarden", *args], capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    env["CRONWARDEN_STORE"] = f"sqlite:///{tmp_path / 'ledger.db'}"
    return env


def test_the_running_commands_token_is_the_newest(tmp_path: Path) -> None:
    env = _env(tmp_path)
    done = _cw("run", "--job", "nightly", "--", "sh", "-c", f"{CHECK}; echo rc=$?", env=env)
    assert done.returncode == 0, done.stderr
    assert "token 1 is the newest for lease 'nightly', held for" in done.stdout
    assert "rc=0" in done.stdout


def test_an_older_token_is_stale_and_a_released_lease_is_not_held(tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert _cw("run", "--job", "nightly", "--", "true", env=env).returncode == 0
    # The second run checks the first run's token: a newer one was granted since.
    done = _cw("run", "--job", "nightly", "--", "sh", "-c", f"{CHECK} --token 1; echo rc=$?", env=env)
    assert "rc=3" in done.stdout
    assert "token 1 is stale: lease 'nightly' was granted token 2 since" in done.stderr
    # After the run, its own token is still the newest, but the lease was released.
    after = _cw("fence", "check", "--token", "2", "--lease-key", "nightly", env=env)
    assert after.returncode == 3
    assert "token 2 is the newest, but lease 'nightly' was released" in after.stderr
    quiet = _cw("fence", "check", "-q", "--token", "2", "--lease-key", "nightly", env=env)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (3, "", "")


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = _env(tmp_path)
    cases = [
        (["fence", "check"], "no --token and $CRONWARDEN_FENCING_TOKEN is not set"),
        (["fence", "check", "--token", "x", "--lease-key", "k"], "a fencing token must be an integer"),
        (["fence", "check", "--token", "3", "--lease-key", "nope"], "the store has no lease 'nope'"),
        (["fence"], "the following arguments are required: ACTION"),
        (["fence", "check", "--bogus"], "unrecognized arguments: --bogus"),
    ]
    for argv, message in cases:
        done = _cw(*argv, env=env)
        assert done.returncode == 2, (argv, done.stderr)
        assert message in done.stderr, (argv, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
