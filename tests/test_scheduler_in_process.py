"""Fires in the scheduler's process: a start queue, bounded workers, the
lease through ``Guard``, the command under the ``Supervisor``, the misfire
grace judged at each fire's own start. Real stores, real commands; the
clock injected where the test needs time to pass."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.processes import alive, kill_quietly

from cronwarden.clock import FakeClock
from cronwarden.config import JobSettings
from cronwarden.events import EventKind, Outcome
from cronwarden.guard import Warden
from cronwarden.keeper import Launcher
from cronwarden.scheduler import Fire, InProcess, ScheduledJob, Scheduler, slot_event_id
from cronwarden.stores import open_store
from cronwarden.stores.base import EventQuery, Store

T0 = 1_800_000_000.0


def job(name: str, command: list[str], **kwargs: object) -> ScheduledJob:
    return ScheduledJob.from_settings(JobSettings(name=name, every=60.0, command=tuple(command), **kwargs))  # type: ignore[arg-type]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=T0)


@pytest.fixture
def sqlite(tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'cw.db'}", clock=clock) as store:
        yield store


def _wait_for(what: object, timeout: float = 20.0) -> None:
    give_up = time.monotonic() + timeout
    while not what():  # type: ignore[operator]
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.01)


def test_a_fire_is_a_guarded_run_of_this_process(sqlite: Store, clock: FakeClock, tmp_path: Path) -> None:
    out = tmp_path / "env"
    show = (
        "import os, sys; "
        "open(sys.argv[1], 'w').write(os.environ['CRONWARDEN_RUN_ID'] + ' ' + str(os.getppid()))"
    )
    lines: list[str] = []
    with Warden(sqlite, clock=clock, quiet=True) as warden:
        fires = InProcess(warden, say=lines.append, instance="me")
        fire = fires(job("tick", [sys.executable, "-c", show, str(out)]), T0, None)
        assert fire.wait(30) == 0
        fires.close()
    (run,) = sqlite.runs("tick")
    assert run.outcome is Outcome.SUCCEEDED and run.slot == T0
    assert run.pid == os.getpid(), "the run is recorded as this process's, no cronwarden run child"
    run_id, parent = out.read_text().split()
    assert run_id == run.run_id
    assert int(parent) == fire.pid, "the command's parent is its keeper, started by the Supervisor"
    assert any("started, pid" in line for line in lines) and any("ended: succeeded" in line for line in lines)


PARENTS = (
    "import os, sys\n"
    "keeper = os.getppid()\n"
    "stat = open(f'/proc/{keeper}/stat').read()\n"
    "open(sys.argv[1], 'w').write(f\"{keeper} {stat.rsplit(')', 1)[1].split()[1]}\")\n"
    "sys.exit(3)"
)
"""Writes the command's parent (its keeper) and the keeper's parent; exits 3."""


def test_a_fire_through_the_launcher_is_kept_by_a_fork_of_the_launcher(sqlite: Store, clock: FakeClock,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    """The scheduler's fires: the keeper is forked by the launcher process,
    not by this one, and the command's exit status comes back through it."""
    out = tmp_path / "parents"
    launcher = Launcher()
    try:
        with Warden(sqlite, clock=clock, quiet=True) as warden:
            fires = InProcess(warden, say=lambda _line: None, launcher=launcher)
            fire = fires(job("tick", [sys.executable, "-c", PARENTS, str(out)]), T0, None)
            assert fire.wait(30) == 3
            fires.close()
        keeper, keepers_parent = map(int, out.read_text().split())
        assert keeper == fire.pid and keepers_parent == launcher.pid != os.getpid()
    finally:
        launcher.close()
    (run,) = sqlite.runs("tick")
    assert run.outcome is Outcome.FAILED and run.exit_code == 3 and run.pid == os.getpid()


def test_a_killed_launcher_takes_its_commands_with_it_and_is_started_again(
    sqlite: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """kill -9 of the launcher: the running command's keeper kills its group
    (the command is gone, its run ends); the next fire gets a new launcher."""
    pidfile = tmp_path / "pid"
    nap = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    launcher = Launcher()
    try:
        with Warden(sqlite, clock=clock, quiet=True) as warden:
            fires = InProcess(warden, say=lambda _line: None, launcher=launcher)
            long = fires(job("nap", [sys.executable, "-c", nap], ttl=3600.0), T0, None)
            # Said started while its command runs: the command holds none of
            # the pipes the keeper reports through.
            _wait_for(lambda: long.pid != 0 and pidfile.exists() and pidfile.read_text())
            command = int(pidfile.read_text())
            first = launcher.pid
            os.kill(first, signal.SIGKILL)
            assert long.wait(30) == 128 + signal.SIGKILL
            _wait_for(lambda: not alive(command), timeout=10)
            after = fires(job("after", ["true"]), T0, None)
            assert after.wait(30) == 0
            fires.close()
            assert launcher.pid != first
    finally:
        launcher.close()
    assert [r.outcome for r in sqlite.runs("after")] == [Outcome.SUCCEEDED]
    (run,) = sqlite.runs("nap")
    assert run.outcome is Outcome.FAILED and run.exit_code == 128 + signal.SIGKILL


def test_a_killed_keeper_of_the_launcher_takes_its_command_group_with_it(
    sqlite: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """kill -9 of one run's keeper (the launcher spawned its command, so the
    command has no parent death signal of its own): the command, what it
    started in its group and what that started out of it are killed by the
    launcher, their subreaper, and the run ends."""
    pidfile, escaped = tmp_path / "pids", tmp_path / "escaped"
    # The shell's child starts one of its own out of the group: handed to
    # the launcher when its parent dies, it is killed in turn.
    script = (f"sh -c 'setsid sleep 120 & echo $! > {escaped}; wait' & sleep 120 & echo $$ $! > {pidfile}; "
              "wait")  # fmt: skip
    launcher = Launcher()
    try:
        with Warden(sqlite, clock=clock, quiet=True) as warden:
            fires = InProcess(warden, say=lambda _line: None, launcher=launcher)
            long = fires(job("nap", ["sh", "-c", script], ttl=3600.0), T0, None)
            _wait_for(lambda: long.pid != 0 and pidfile.exists() and len(pidfile.read_text().split()) == 2)
            _wait_for(lambda: escaped.exists() and escaped.read_text().strip())
            shell, sleeper = map(int, pidfile.read_text().split())
            away = int(escaped.read_text())
            os.kill(long.pid, signal.SIGKILL)
            assert long.wait(30) == 128 + signal.SIGKILL
            _wait_for(lambda: not alive(shell) and not alive(sleeper) and not alive(away), timeout=10)
            fires.close()
    finally:
        launcher.close()
    (run,) = sqlite.runs("nap")
    assert run.outcome is Outcome.FAILED and run.exit_code == 128 + signal.SIGKILL


def test_a_command_not_on_the_path_is_said_not_found_through_the_launcher(
    sqlite: Store, clock: FakeClock
) -> None:
    lines: list[str] = []
    launcher = Launcher()
    try:
        with Warden(sqlite, clock=clock, quiet=True) as warden:
            fires = InProcess(warden, say=lines.append, launcher=launcher)
            missing = fires(job("missing", ["no-such-command-cw"]), T0, None)
            assert missing.wait(30) == 127
            found = fires(job("found", ["true"]), T0, None)  # looked up in PATH
            assert found.wait(30) == 0
            fires.close()
    finally:
        launcher.close()
    assert any("command not found: 'no-such-command-cw'" in line for line in lines), lines


def test_a_fire_reaching_its_start_past_the_grace_is_recorded_misfired(sqlite: Store, clock: FakeClock,
                                                                       tmp_path: Path) -> None:  # fmt: skip
    """One worker: the second fire waits in the queue behind a long one. By
    the time it could start its slot is older than the grace: it is not
    started, and recorded ``misfired`` once."""
    gate = tmp_path / "gate"
    wait = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.01)"
    lines: list[str] = []
    with Warden(sqlite, clock=clock, quiet=True) as warden:
        fires = InProcess(warden, concurrency=1, misfire_grace=60, say=lines.append, instance="me")
        long = fires(job("long", [sys.executable, "-c", wait, str(gate)], ttl=3600.0), T0, None)
        late = fires(job("late", ["true"]), T0, None)
        _wait_for(lambda: long.pid != 0)
        clock.advance(61)
        gate.write_text("go")
        assert long.wait(30) == 0 and late.wait(30) == 0
        fires.close()
    assert [r.outcome for r in sqlite.runs("long")] == [Outcome.SUCCEEDED]
    assert sqlite.runs("late") == []
    (misfired,) = sqlite.events(EventQuery(job="late", kinds=[EventKind.MISFIRED]))
    assert misfired.data["slot"] == T0 and misfired.data["late_by"] == pytest.approx(61, abs=1)
    assert misfired.event_id == slot_event_id(EventKind.MISFIRED, "late", T0)
    assert any("late: slot" in line and "past the misfire grace" in line for line in lines)


def test_starts_are_paced_by_the_concurrency(sqlite: Store, clock: FakeClock) -> None:
    """Six fires, two workers: never more than two commands at once, and
    every fire runs."""
    nap = [sys.executable, "-c", "import time; time.sleep(0.3)"]
    running: list[int] = []
    with Warden(sqlite, clock=clock, quiet=True) as warden:
        fires = InProcess(warden, concurrency=2, say=lambda _line: None)
        started = [fires(job(f"j{n}", nap), T0, None) for n in range(6)]
        while any(f.poll() is None for f in started):
            running.append(sum(f.pid != 0 and f.poll() is None for f in started))
            time.sleep(0.01)
        fires.close()
    assert max(running) == 2
    assert [sqlite.runs(f"j{n}")[0].outcome for n in range(6)] == [Outcome.SUCCEEDED] * 6


def test_a_queued_fire_signalled_to_stop_never_starts(
    sqlite: Store, clock: FakeClock, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    wait = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.01)"
    with Warden(sqlite, clock=clock, quiet=True) as warden:
        fires = InProcess(warden, concurrency=1, say=lambda _line: None)
        first = fires(job("first", [sys.executable, "-c", wait, str(gate)], ttl=3600.0), T0, None)
        queued = fires(job("queued", ["true"]), T0, None)
        _wait_for(lambda: first.pid != 0)
        queued.send_signal(signal.SIGTERM)
        gate.write_text("go")
        assert queued.wait(30) == 0 and first.wait(30) == 0
        fires.close()
    assert sqlite.runs("queued") == []


def test_the_scheduler_stops_its_in_process_runs_and_records_them(sqlite: Store, clock: FakeClock) -> None:
    with Warden(sqlite, clock=clock, quiet=True) as warden:
        fires = InProcess(warden, say=lambda _line: None)
        sched = Scheduler(sqlite, [job("nap", ["sleep", "60"])], fires, clock=clock, say=lambda _line: None)
        sched.tick()
        (started,) = sched.running
        fire = started.child
        assert isinstance(fire, Fire)
        _wait_for(lambda: fire.pid != 0)
        sched.stop_runs(20, time.sleep, lambda: 0)
        assert sched.running == []
        fires.close()
    (run,) = sqlite.runs("nap")
    assert run.outcome is Outcome.INTERRUPTED and run.exit_code == 128 + signal.SIGTERM


def test_kill_9_of_the_scheduler_takes_its_in_process_commands_with_it(tmp_path: Path) -> None:
    """In-process runs end with their scheduler: the keeper of each command
    dies with it and kills the command's group; the run's lease expires."""
    pidfile = tmp_path / "pid"
    command = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
    config = tmp_path / "cronwarden.toml"
    config.write_text(
        textwrap.dedent(f"""\
        [jobs.nap]
        every = "1m"
        ttl = "30s"
        command = ["{sys.executable}", "-c", "{command}", "{pidfile}"]
        """)
    )
    url = f"sqlite:///{tmp_path / 'cw.db'}"
    argv = [sys.executable, "-m", "cronwarden", "scheduler", "--config", str(config), "--store", url]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: pidfile.exists() and pidfile.read_text())
        pid = int(pidfile.read_text())
        assert alive(pid)
        proc.kill()
        proc.wait(timeout=10)
        _wait_for(lambda: not alive(pid), timeout=10)
    finally:
        kill_quietly(proc.pid)
        proc.communicate()
    with open_store(url) as store:
        (run,) = store.open_runs("nap")
    assert run.pid == proc.pid


def test_a_detached_job_is_left_running_when_the_scheduler_stops(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    command = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(4)"
    config = tmp_path / "cronwarden.toml"
    config.write_text(
        textwrap.dedent(f"""\
        [jobs.nap]
        every = "1m"
        ttl = "30s"
        detach = true
        command = ["{sys.executable}", "-c", "{command}", "{pidfile}"]
        """)
    )
    url = f"sqlite:///{tmp_path / 'cw.db'}"
    argv = [sys.executable, "-m", "cronwarden", "scheduler", "--config", str(config), "--store", url]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: pidfile.exists() and pidfile.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout is not None
        # Not communicate(): the detached run holds the same stdout open.
        out = ""
        for line in proc.stdout:
            out += line
            if "stopped; fired" in line:
                break
        assert proc.wait(timeout=20) == 0
        assert "left running" in out and "(detach)" in out
        assert alive(int(pidfile.read_text())), "the detached run outlived its scheduler"
        with open_store(url) as store:
            _wait_for(lambda: store.open_runs("nap") == [] and store.runs("nap") != [])
            (run,) = store.runs("nap")
        assert run.outcome is Outcome.SUCCEEDED
    finally:
        kill_quietly(proc.pid)
