"""A signal to ``cronwarden run`` (a pod shutdown, ``systemctl stop``,
Ctrl-C) stops the command and records ``interrupted``, not ``failed``; as
PID 1 of a PID namespace (a container) it also reaps orphaned zombies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.contract import assert_one_terminal_per_start, ledger
from tests.guard.test_run_cli import cli, wait_for

from cronwarden.clock import SYSTEM_CLOCK
from cronwarden.events import EventKind, Outcome
from cronwarden.guard import Warden
from cronwarden.stores import open_store

CW = [sys.executable, "-m", "cronwarden"]


def _unshare_works() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare binary"
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return None if done.returncode == 0 else f"unshare --pid refused: {done.stderr.decode().strip()}"


def as_pid_1(*args: str) -> tuple[subprocess.Popen[str], int]:
    """``cronwarden ARGS`` as PID 1 of a new PID namespace (with its own
    /proc, as a container has), and its pid as seen from here."""
    why = _unshare_works()
    if why is not None:
        pytest.skip(why)
    p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", *CW, *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

    def init() -> int | None:
        kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
        return int(kids[0]) if kids else None

    return p, int(wait_for(init, what="unshare's child"))


def _status(pid: int) -> tuple[str, int]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0], int(fields[1])


def test_sigterm_to_pid_1_stops_the_command_and_records_interrupted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    ready, stopped = tmp_path / "ready", tmp_path / "stopped"
    script = f"trap 'echo $$ > {stopped}; exit 0' TERM; touch {ready}; while :; do sleep 0.05; done"
    p, init = as_pid_1("run", "--job", "pod", "--store", url, "--", "sh", "-c", script)
    wait_for(ready.exists, what="the command to start")
    status = Path(f"/proc/{init}/status").read_text().splitlines()
    (nspid,) = [line for line in status if line.startswith("NSpid:")]
    assert nspid.split()[-1] == "1", f"cronwarden is not PID 1 of its namespace: {nspid}"
    os.kill(init, signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143, err
    assert stopped.exists(), "the command was not given SIGTERM"
    with open_store(url) as store:
        (run,) = store.runs("pod")
        assert run.outcome is Outcome.INTERRUPTED
        assert run.exit_code == 0 and "SIGTERM" in run.detail
        (end,) = ledger(store, kinds=[EventKind.INTERRUPTED])
        assert end.run_id == run.run_id and "SIGTERM" in end.data["detail"]
        # Sent from outside its pid namespace, as a container runtime does:
        # the kernel names no sender, and none is guessed.
        said = end.data["signal"]
        assert (said["name"], said["sender_pid"], said["grace"], said["sigkill"]) == (
            "SIGTERM",
            None,
            10.0,
            False,
        )
        assert "sender" not in said and "from pid" not in run.detail
        assert not ledger(store, kinds=[EventKind.FAILED])
        info = store.lease("pod")
        assert info is not None and info.owner is None
        assert_one_terminal_per_start(store)


def test_a_command_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    ready = tmp_path / "ready"
    # ttl 6s: the kill grace is ttl/6 = 1s, far before the lease could end.
    script = f"trap '' TERM; touch {ready}; while :; do sleep 0.05; done"
    p, init = as_pid_1("run", "--job", "stubborn", "--ttl", "6s", "--store", url, "--", "sh", "-c", script)
    wait_for(ready.exists, what="the command to start")
    sent = time.monotonic()
    os.kill(init, signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    took = time.monotonic() - sent
    assert p.returncode == 143, err
    assert 1.0 <= took < 4.0, f"stopped {took:.2f}s after SIGTERM; the grace is 1s"
    with open_store(url) as store:
        (run,) = store.runs("stubborn")
        assert run.outcome is Outcome.INTERRUPTED
        assert run.exit_code == 128 + signal.SIGKILL
        assert "killed after its 1s grace" in run.detail
        (end,) = ledger(store, kinds=[EventKind.INTERRUPTED])
        said = end.data["signal"]
        assert (said["name"], said["grace"], said["sigkill"]) == ("SIGTERM", 1.0, True)
        assert 1.0 <= said["waited"] < took


def test_pid_1_reaps_orphans_reparented_to_it(tmp_path: Path) -> None:
    if shutil.which("nsenter") is None:
        pytest.skip("no nsenter binary")
    url = f"sqlite:///{tmp_path}/s.db"
    ready = tmp_path / "ready"
    p, init = as_pid_1("run", "--job", "reaper", "--store", url, "--", "sh", "-c",
                       f"touch {ready}; exec sleep 30")  # fmt: skip
    try:
        wait_for(ready.exists, what="the command to start")
        # As `kubectl exec` does: a process entering the container's PID
        # namespace, whose own child outlives it and is handed to PID 1.
        subprocess.run(["nsenter", "--target", str(init), "--pid", "--", "sh", "-c", "sleep 0.2 & exit 0"],
                       check=True, timeout=10)  # fmt: skip

        def children() -> list[int]:
            kids: list[int] = []
            for tid in os.listdir(f"/proc/{init}/task"):
                kids += [int(x) for x in Path(f"/proc/{init}/task/{tid}/children").read_text().split()]
            return kids

        wait_for(lambda: len(children()) == 2, what="the orphan to be reparented to PID 1")
        time.sleep(0.6)  # the orphan has exited
        states = {pid: _status(pid)[0] for pid in children()}
        assert "Z" not in states.values(), f"PID 1 left a zombie: {states}"
        assert len(states) == 1  # the keeper alone
    finally:
        os.kill(init, signal.SIGTERM)
        p.communicate(timeout=30)
    assert p.returncode == 143


def test_the_end_names_the_signal_and_who_sent_it(store_url: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    p = cli("run", "--job", "stopped", "--store", store_url, "--", "sh", "-c",
            f"echo $$ > {pidfile}; exec sleep 30")  # fmt: skip
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child pid")
    os.kill(p.pid, signal.SIGTERM)  # from this process: the kernel tells cronwarden our pid
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143, err
    me = Path("/proc/self/comm").read_text().strip()
    assert f"SIGTERM from pid {os.getpid()} ({me}) received" in err
    with open_store(store_url) as store:
        (run,) = store.runs("stopped")
        assert run.outcome is Outcome.INTERRUPTED
        assert run.detail.startswith(f"SIGTERM from pid {os.getpid()} ({me}) to the supervisor")
        (end,) = ledger(store, kinds=[EventKind.INTERRUPTED])
        said = end.data["signal"]
        assert (said["name"], said["sender_pid"], said["sender"]) == ("SIGTERM", os.getpid(), me)
        assert (said["grace"], said["sigkill"]) == (10.0, False) and 0 <= said["waited"] < 10
        assert_one_terminal_per_start(store)
    # history shows it: the note in its table, the fields in --json.
    shown = subprocess.run([*CW, "history", "stopped", "--store", store_url], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert f"SIGTERM from pid {os.getpid()} ({me})" in shown.stdout
    listed = subprocess.run([*CW, "history", "stopped", "--json", "--store", store_url], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    (item,) = json.loads(listed.stdout)
    assert item["signal"] == said


def test_sigint_records_interrupted_and_exits_130(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    pidfile = tmp_path / "pid"
    p = cli("run", "--job", "ctrlc", "--store", url, "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 30")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child pid")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    with open_store(url) as store:
        (run,) = store.runs("ctrlc")
        assert run.outcome is Outcome.INTERRUPTED and "SIGINT" in run.detail


def test_keyboard_interrupt_in_a_guarded_block_records_interrupted(store_url: str) -> None:
    with Warden(store_url, clock=SYSTEM_CLOCK, host="test-host") as warden:
        with pytest.raises(KeyboardInterrupt), warden.guard("ctrl_c", ttl=30) as run:
            raise KeyboardInterrupt
        record = warden.store.run(run.run_id)
        assert record is not None and record.outcome is Outcome.INTERRUPTED
        (end,) = ledger(warden.store, kinds=[EventKind.INTERRUPTED])
        assert end.run_id == run.run_id
