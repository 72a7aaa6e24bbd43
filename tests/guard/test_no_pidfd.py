"""``cronwarden run`` where the kernel has no ``pidfd_open``: kernels before
5.3, seccomp sandboxes that refuse it (EPERM), valgrind (ENOSYS).

The supervisor process is a real ``python -m cronwarden run`` whose
``os.pidfd_open`` fails as such a kernel's would: a ``sitecustomize`` on its
``PYTHONPATH`` replaces it (or removes it) before cronwarden is imported, and
logs each call, so every test also shows that the refusal happened. The
last test runs the supervisor under valgrind, whose ENOSYS is the real one.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.contract import assert_one_terminal_per_start
from tests.guard.test_run_cli import CLI, LOCKER, cli, wait_for
from tests.processes import alive

from cronwarden.events import Outcome
from cronwarden.stores import open_store

REFUSING = """
import errno, os

def pidfd_open(pid, flags=0):
    with open({log!r}, "a") as f:
        f.write("refused %d\\n" % pid)
    raise OSError(errno.{name}, os.strerror(errno.{name}))

os.pidfd_open = pidfd_open
"""
REMOVING = """
import os

del os.pidfd_open
with open({log!r}, "a") as f:
    f.write("removed\\n")
"""
KERNELS = ("ENOSYS", "EPERM", "missing")
"""How a kernel or a sandbox lacks pidfd_open: it fails with ENOSYS or EPERM,
or this interpreter's ``os`` has no such function."""


def without_pidfd(tmp_path: Path, how: str = "ENOSYS") -> tuple[dict[str, str], Path]:
    """The environment of a Python process whose ``os.pidfd_open`` fails
    ``how``, and the file where that process logs each refusal."""
    site = tmp_path / f"site-{how}"
    site.mkdir()
    log = tmp_path / f"pidfd-{how}.log"
    code = REMOVING.format(log=str(log)) if how == "missing" else REFUSING.format(log=str(log), name=how)
    (site / "sitecustomize.py").write_text(code)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}, log


def refusals(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("how", KERNELS)
def test_without_pidfd_open_the_command_runs_and_its_exit_status_is_the_runs(
    tmp_path: Path, how: str
) -> None:
    env, log = without_pidfd(tmp_path, how)
    url = f"sqlite:///{tmp_path / 's.db'}"
    marker = tmp_path / "ran"
    p = cli("run", "--job", "nopidfd", "--store", url, "--", "sh", "-c", f"touch {marker}; exit 7", env=env)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 7, err
    assert "Traceback" not in err
    assert marker.exists()
    # The supervisor asked once, for its one keeper, and was refused (or
    # found no such function).
    (line,) = refusals(log)
    assert line == "removed" if how == "missing" else line.startswith("refused "), line
    with open_store(url) as store:
        (record,) = store.runs("nopidfd")
        assert record.outcome is Outcome.FAILED and record.exit_code == 7
        assert_one_terminal_per_start(store)


def test_without_pidfd_open_a_lost_lease_stops_a_command_that_ignores_sigterm_before_the_ttl(
    tmp_path: Path,
) -> None:
    env, log = without_pidfd(tmp_path)
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    pidfile, termed = tmp_path / "pid", tmp_path / "termed"
    ttl = 2.0
    # SIGTERM is noted and ignored (the group's sleep dies of it, the shell
    # goes on): the command is gone only by the SIGKILL at the end of the
    # kill grace, the wake-up that is timed on the keeper's descriptor.
    script = f"trap 'echo term >> {termed}' TERM; echo $$ > {pidfile}; while :; do sleep 0.05; done"
    p = cli("run", "--job", "locked", "--ttl", f"{ttl:g}s", "--store", url, "--", "sh", "-c", script, env=env)
    try:
        child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child pid"))
        with open_store(url) as store:
            (run,) = store.runs("locked")
        # Another process holds the database's write lock for longer than
        # the ttl: every renewal fails.
        locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(db), str(ttl * 2)],
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        wait_for(lambda: not alive(child), timeout=ttl * 2, what="the child to be stopped")
        stopped_after = time.time() - run.started_at
        assert stopped_after < ttl, f"work ran {stopped_after:.2f}s on a {ttl}s lease"
        _, err = p.communicate(timeout=30)
        locker.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 3, err
    assert termed.exists(), "the command was killed without a SIGTERM first"
    assert len(refusals(log)) == 1
    with open_store(url) as store:
        record = store.run(run.run_id)
        assert record is not None and record.outcome is Outcome.LEASE_LOST
        assert_one_terminal_per_start(store)


def test_without_pidfd_open_sigterm_to_the_supervisor_reaches_the_command(tmp_path: Path) -> None:
    env, log = without_pidfd(tmp_path)
    url = f"sqlite:///{tmp_path / 's.db'}"
    pidfile = tmp_path / "pid"
    p = cli("run", "--job", "term", "--store", url, "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 30",
            env=env)  # fmt: skip
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child pid"))
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=10)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert not alive(child)
    assert len(refusals(log)) == 1
    with open_store(url) as store:
        (record,) = store.runs("term")
        assert record.outcome is Outcome.INTERRUPTED
        info = store.lease("term")
        assert info is not None and info.owner is None


def test_without_pidfd_open_the_supervisor_waits_for_the_command_without_spinning(tmp_path: Path) -> None:
    env, log = without_pidfd(tmp_path)
    url = f"sqlite:///{tmp_path / 's.db'}"
    command = 3.0
    p = cli("run", "--job", "idle", "--store", url, "--", "sleep", f"{command:g}", env=env)
    # The supervisor's CPU and its keeper's (which it reaps): start-up and two
    # ledger writes take ~0.1 s here; a loop that polled the keeper instead of
    # sleeping on its descriptor would burn most of the 3 s, even on a busy
    # machine.
    _, raw, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(raw)
    _, err = p.communicate(timeout=10)
    assert p.returncode == 0, err
    cpu = usage.ru_utime + usage.ru_stime
    assert cpu < command / 5, f"{cpu:.2f}s of CPU to wait {command:g}s for the command"
    assert len(refusals(log)) == 1


VALGRIND_NO_PIDFD = "-linux syscall: 434"
"""The end of what valgrind says ("unhandled amd64-linux syscall: 434") when
the program calls pidfd_open (434 on every Linux architecture), which it
answers with ENOSYS."""


def test_under_valgrind_which_lacks_pidfd_open_the_command_runs_and_its_exit_status_is_the_runs(
    tmp_path: Path,
) -> None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    with open(sys.executable, "rb") as f:
        if f.read(2) == b"#!":
            pytest.skip(f"{sys.executable} is a script; valgrind needs the interpreter binary")
    url = f"sqlite:///{tmp_path / 's.db'}"
    # --tool=none: valgrind's syscall layer without instrumentation (~2 s
    # here); the command is exec'd, so not traced.
    result = subprocess.run([valgrind, "--tool=none", "-q", *CLI, "run", "--job", "grind", "--store", url,
                             "--", "sh", "-c", "exit 7"], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    if VALGRIND_NO_PIDFD not in result.stderr:
        pytest.skip("this valgrind implements pidfd_open: the test no longer reaches the fallback")
    assert result.returncode == 7, result.stderr
    assert "Traceback" not in result.stderr and os.strerror(errno.ENOSYS) not in result.stderr
    with open_store(url) as store:
        (record,) = store.runs("grind")
        assert record.outcome is Outcome.FAILED and record.exit_code == 7
