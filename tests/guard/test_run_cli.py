"""``cronwarden run`` with real processes and real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.contract import assert_one_terminal_per_start, ledger
from tests.processes import alive, kill_quietly, parent_of

from cronwarden.events import EventKind, Outcome
from cronwarden.stores import open_store

CLI = [sys.executable, "-m", "cronwarden"]


def cli(*args: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})}, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def test_two_runs_started_together_run_the_command_once(store_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = f"echo $CRONWARDEN_RUN_ID >> {marker}; sleep 1.5"
    procs = [cli("run", "--job", "pair", "--ttl", "10s", "--store", store_url, "--", "sh", "-c", script)
             for _ in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=30) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    runs = marker.read_text().split()
    assert len(runs) == 1, f"the command ran {len(runs)} times"
    with open_store(store_url) as store:
        skips = ledger(store, kinds=[EventKind.SKIPPED])
        assert len(skips) == 1
        assert skips[0].data["holder_run_id"] == runs[0]
        assert_one_terminal_per_start(store)
    assert any("skipped" in err and runs[0] in err for _, err in outs)


def test_child_gets_run_id_job_and_fencing_token(store_url: str, tmp_path: Path) -> None:
    out = tmp_path / "env"
    script = f'echo "$CRONWARDEN_RUN_ID $CRONWARDEN_JOB $CRONWARDEN_FENCING_TOKEN" > {out}'
    p = cli("run", "--job", "envjob", "--store", store_url, "--", "sh", "-c", script)
    p.communicate(timeout=30)
    run_id, job, token = out.read_text().split()
    with open_store(store_url) as store:
        record = store.run(run_id)
    assert record is not None and job == "envjob" and int(token) == record.token


def test_exit_status_of_the_command_is_passed_through_and_recorded(store_url: str) -> None:
    p = cli("run", "--job", "fails", "--store", store_url, "--", "sh", "-c", "exit 7")
    p.communicate(timeout=30)
    assert p.returncode == 7
    with open_store(store_url) as store:
        (record,) = store.runs("fails")
    assert record.outcome is Outcome.FAILED and record.exit_code == 7


def test_sigterm_to_the_supervisor_reaches_the_child_and_is_recorded(store_url: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    p = cli(
        "run", "--job", "term", "--store", store_url, "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"
    )
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child pid"))
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=10)
    assert p.returncode == 128 + signal.SIGTERM
    assert not alive(child)
    with open_store(store_url) as store:
        (record,) = store.runs("term")
        assert record.outcome is Outcome.INTERRUPTED
        info = store.lease("term")
        assert info is not None and info.owner is None


def test_kill_9_of_the_supervisor_kills_its_child_and_the_next_start_abandons_the_run(
    store_url: str, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    p = cli("run", "--job", "crash", "--ttl", "1s", "--store", store_url, "--",
            "sh", "-c", f"echo $$ > {pidfile}; exec sleep 30")  # fmt: skip
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child pid"))
    p.kill()
    p.wait()
    killed_at = time.monotonic()
    wait_for(lambda: not alive(child), timeout=1.0, what="the child to die with its supervisor")
    assert time.monotonic() - killed_at < 1.0
    with open_store(store_url) as store:
        (old,) = store.runs("crash")
    # From another host, the next start after the lease expired runs, marks
    # the old run abandoned, and gets a larger fencing token. (On this host
    # it would not wait: tests/guard/test_dead_holder.py.)
    deadline = time.monotonic() + 15
    while True:
        q = cli("run", "--job", "crash", "--ttl", "1s", "--store", store_url, "--", "true",
                env={"CRONWARDEN_HOST": "another-host"})  # fmt: skip
        _, err = q.communicate(timeout=30)
        with open_store(store_url) as store:
            runs = store.runs("crash")
        if len(runs) == 2:
            break
        assert "skipped" in err and time.monotonic() < deadline
        time.sleep(0.2)
    assert q.returncode == 0
    with open_store(store_url) as store:
        new = store.runs("crash")[0]
        assert store.run(old.run_id).outcome is Outcome.ABANDONED  # type: ignore[union-attr]
        assert new.outcome is Outcome.SUCCEEDED and new.token > old.token
        (abandoned,) = ledger(store, kinds=[EventKind.ABANDONED])
        assert abandoned.run_id == old.run_id and abandoned.data["found_by"] == new.run_id
        assert_one_terminal_per_start(store)


LOCKER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


def test_locked_store_stops_the_work_before_the_ttl_and_records_lease_lost(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    pidfile = tmp_path / "pid"
    ttl = 2.0
    p = cli("run", "--job", "locked", "--ttl", f"{ttl}s", "--store", url, "--",
            "sh", "-c", f"echo $$ > {pidfile}; exec sleep 30")  # fmt: skip
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child pid"))
    with open_store(url) as store:
        (run,) = store.runs("locked")
    started = time.time()
    # Another process holds the database's write lock for longer than the
    # ttl: every renewal fails.
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(db), str(ttl * 2)], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
    wait_for(lambda: not alive(child), timeout=ttl * 2, what="the child to be stopped")
    stopped_after = time.time() - run.started_at
    assert stopped_after < ttl, f"work ran {stopped_after:.2f}s on a {ttl}s lease"
    _, err = p.communicate(timeout=30)
    locker.wait(timeout=30)
    assert p.returncode == 3, err
    with open_store(url) as store:
        record = store.run(run.run_id)
        assert record is not None and record.outcome is Outcome.LEASE_LOST
        assert_one_terminal_per_start(store)
    assert started > 0


def test_skip_exit_code_is_used_for_a_skipped_start(store_url: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    holder = cli(
        "run", "--job", "held", "--store", store_url, "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"
    )
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="holder")
    p = cli("run", "--job", "held", "--skip-exit-code", "75", "--store", store_url, "--", "true")
    _, err = p.communicate(timeout=30)
    holder.terminate()
    holder.communicate(timeout=10)
    assert p.returncode == 75
    assert "skipped" in err and "this slot did no work" in err


def test_unreachable_store_fails_closed_with_75() -> None:
    p = cli("run", "--job", "x", "--store", "redis://127.0.0.1:1/0", "--", "true")
    _, err = p.communicate(timeout=30)
    assert p.returncode == 75, err
    assert "not running x" in err and "Traceback" not in err


def test_unreachable_store_runs_unguarded_with_opt_in(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    p = cli("run", "--job", "x", "--store", "redis://127.0.0.1:1/0", "--on-store-error", "run", "--",
            "sh", "-c", f"touch {marker}")  # fmt: skip
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0 and marker.exists()
    assert "UNGUARDED" in err


def test_kill_9_of_the_supervisor_also_kills_the_commands_own_children(
    store_url: str, tmp_path: Path
) -> None:
    # A shell script's children are not the supervisor's children: PDEATHSIG
    # alone would leave them running under an expiring lease.
    pidfile = tmp_path / "pid"
    script = f"sleep 30 & echo $! > {pidfile}; wait"
    p = cli("run", "--job", "tree", "--store", store_url, "--", "sh", "-c", script)
    grandchild = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="grandchild"))
    p.kill()
    p.wait()
    wait_for(
        lambda: not alive(grandchild), timeout=1.0, what="the command's child to die with the supervisor"
    )


def test_processes_the_command_left_behind_are_stopped_when_it_ends(store_url: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = f"sleep 30 & echo $! > {pidfile}"
    p = cli("run", "--job", "straggler", "--store", store_url, "--", "sh", "-c", script)
    p.communicate(timeout=30)
    assert p.returncode == 0
    straggler = int(pidfile.read_text())
    wait_for(lambda: not alive(straggler), timeout=1.0, what="the backgrounded child to be stopped")


# A helper that moves out of the command's process group and session and
# writes its pid: started in the background (orphaned when the shell exits),
# or by a double fork (orphaned at once, while the command still runs).
ESCAPES = {
    "setsid": "setsid sh -c 'echo $$ > {pidfile}; exec sleep 30' </dev/null >/dev/null 2>&1 &",
    "double fork": "(setsid sh -c 'echo $$ > {pidfile}; exec sleep 30' </dev/null >/dev/null 2>&1 &);",
}


def escaped_helper(pidfile: Path) -> int:
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the escaped helper"))
    assert os.getsid(pid) == pid, "the helper did not start a session of its own"
    return pid


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_a_process_that_left_the_commands_group_is_stopped_when_the_command_ends(
    store_url: str, tmp_path: Path, escape: str
) -> None:
    pidfile, shell, go = tmp_path / "pid", tmp_path / "shell", tmp_path / "go"
    # The command waits for the test's go (at most ~30 s), then exits.
    script = (f"echo $$ > {shell}; {ESCAPES[escape].format(pidfile=pidfile)} "
              f"i=0; while [ ! -e {go} ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done")  # fmt: skip
    p = cli("run", "--job", "escape", "--store", store_url, "--", "sh", "-c", script)
    helper = 0
    try:
        helper = escaped_helper(pidfile)
        if escape == "double fork":  # orphaned to the keeper while the command still runs
            assert parent_of(helper) != int(shell.read_text())
        go.touch()
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        # Gone by the time `cronwarden run` has exited: the keeper sweeps first.
        assert not alive(helper), f"the {escape} helper outlived its run"
    finally:
        go.touch()
        if p.poll() is None:
            p.kill()
        if helper:
            kill_quietly(helper)


def test_kill_9_of_the_supervisor_also_stops_a_process_that_left_the_commands_group(
    store_url: str, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    script = ESCAPES["setsid"].format(pidfile=pidfile) + " exec sleep 30"
    p = cli("run", "--job", "escape-crash", "--store", store_url, "--", "sh", "-c", script)
    helper = 0
    try:
        helper = escaped_helper(pidfile)
        p.kill()
        p.wait()
        wait_for(lambda: not alive(helper), timeout=1.0, what="the escaped helper to die with the supervisor")
    finally:
        p.kill()
        p.communicate()
        if helper:
            kill_quietly(helper)


SWEEP_PROBE = """
import os, subprocess, sys, builtins
from cronwarden import keeper
child = subprocess.Popen(["sleep", "30"])
real_open = builtins.open
def no_children_file(path, *args, **kwargs):
    if path == "/proc/thread-self/children":
        raise FileNotFoundError(path)
    return real_open(path, *args, **kwargs)
builtins.open = no_children_file
found = keeper._children(os.getpid())
builtins.open = real_open
child.kill()
child.wait()
print(found == [child.pid])
"""


def test_the_keeper_finds_its_children_without_the_proc_children_file() -> None:
    # Kernels built without CONFIG_PROC_CHILDREN: the sweep scans /proc for them.
    out = subprocess.run([sys.executable, "-c", SWEEP_PROBE], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "True", out.stderr


def test_status_shows_open_runs_from_every_host(store_url: str, tmp_path: Path) -> None:
    holders = []
    for host in ("host-a", "host-b"):
        pidfile = tmp_path / host
        holders.append(cli("run", "--job", f"job-{host}", "--store", store_url, "--",
                           "sh", "-c", f"echo $$ > {pidfile}; exec sleep 30",
                           env={"CRONWARDEN_HOST": host}))  # fmt: skip
        wait_for(lambda p=pidfile: p.exists() and p.read_text().strip(), what=f"the run on {host}")
    result = subprocess.run([*CLI, "status", "--json", "--store", store_url], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    for p in holders:
        p.terminate()
        p.communicate(timeout=10)
    import json

    rows = json.loads(result.stdout)
    assert {(r["job"], r["host"], r["state"]) for r in rows} == {
        ("job-host-a", "host-a", "running"),
        ("job-host-b", "host-b", "running"),
    }


def test_kill_9_of_the_supervisors_whole_process_group_still_kills_the_command(
    store_url: str, tmp_path: Path
) -> None:
    # timeout -k, kill -9 -PGID: the keeper must not die in the same instant.
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; exec sleep 30"
    p = cli("run", "--job", "group", "--store", store_url, "--", "sh", "-c", script, start_new_session=True)
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child pid"))
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    wait_for(lambda: not alive(child), timeout=1.0, what="the command to die with its supervisor's group")


def test_sigterm_while_the_end_is_being_recorded_does_not_lose_the_terminal_record(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    go = tmp_path / "go"
    p = cli("run", "--job", "late", "--ttl", "10s", "--store", url, "--",
            "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done")  # fmt: skip
    wait_for(lambda: open_store(url).open_runs(), what="the run to start")
    # Another process holds the store's write lock as the command ends, so
    # cronwarden is still recording the end when the signal arrives.
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(db), "2"], stdout=subprocess.PIPE, text=True)
    assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
    go.touch()
    time.sleep(0.3)  # the command has ended; cronwarden waits on the lock
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    locker.wait(timeout=30)
    assert "Traceback" not in err
    with open_store(url) as store:
        (run,) = store.runs("late")
        assert run.outcome is not None, "the run was left with no terminal record"
        info = store.lease("late")
        assert info is not None and info.owner is None
        assert_one_terminal_per_start(store)


def test_status_reads_the_store_named_in_the_config_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'configured.db'}"
    (tmp_path / "cronwarden.toml").write_text(f'store = "{url}"\n')
    pidfile = tmp_path / "pid"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    script = f"echo $$ > {pidfile}; exec sleep 30"
    holder = subprocess.Popen([*CLI, "run", "--job", "cfg", "--", "sh", "-c", script], cwd=tmp_path, env=env,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the run")
    result = subprocess.run([*CLI, "status", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    holder.terminate()
    holder.communicate(timeout=10)
    import json

    assert [r["job"] for r in json.loads(result.stdout)] == ["cfg"]
