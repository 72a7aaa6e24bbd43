"""The scheduler (G8: at most one run per slot, however many instances).

The firing logic runs against a real store with the scheduler's clock
injected and a launcher that records what it would start; the last tests
run real ``cronwarden scheduler`` processes, two at once on one store, with
real runs, signals and the ledger."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import POSTGRES_URL
from tests.processes import kill_quietly, wait_for

from cronwarden.clock import FakeClock
from cronwarden.config import JobSettings
from cronwarden.events import EventKind, Outcome
from cronwarden.policy import Policy
from cronwarden.schedule import Schedule
from cronwarden.scheduler import ScheduledJob, Scheduler
from cronwarden.stores import open_store
from cronwarden.stores.base import EventQuery, Store

T0 = 1_800_000_000.0
"""A fire time of every period used here (a multiple of 10 s and of 60 s)."""


@dataclass
class FakeChild:
    pid: int
    code: int | None = None
    signals: list[int] = field(default_factory=list)

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.code = -sig

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        assert self.code is not None
        return self.code


@dataclass
class Launches:
    """The launcher: records (job, slot, shard) and returns a child that
    runs until the test ends it."""

    started: list[tuple[str, float, str | None]] = field(default_factory=list)
    children: list[FakeChild] = field(default_factory=list)

    def __call__(self, job: ScheduledJob, slot: float, shard: str | None) -> FakeChild:
        self.started.append((job.name, slot, shard))
        self.children.append(FakeChild(pid=1000 + len(self.children)))
        return self.children[-1]


def every(name: str, seconds: float, **kwargs: Any) -> ScheduledJob:
    settings = JobSettings(name=name, every=seconds, command=("/bin/true",), **kwargs)
    return ScheduledJob.from_settings(settings)


def scheduler(
    store: Store, jobs: list[ScheduledJob], clock: FakeClock, instance: str, **kwargs: Any
) -> tuple[Scheduler, Launches, list[str]]:
    lines: list[str] = []
    launches = Launches()
    s = Scheduler(store, jobs, launches, instance=instance, clock=clock, say=lines.append, **kwargs)
    return s, launches, lines


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'cw.db'}") as store:
        yield store


def test_each_slot_fires_once_at_its_time(sqlite_store: Store) -> None:
    clock = FakeClock(start=T0 + 3)  # 3 s after a fire time: still within the grace
    s, launches, _ = scheduler(sqlite_store, [every("tick", 10)], clock, "a")
    assert s.tick() == T0 + 10
    assert launches.started == [("tick", T0, None)]
    clock.advance(6.9)  # T0 + 9.9: nothing due
    s.tick()
    assert len(launches.started) == 1
    for n in (1, 2, 3):
        clock.advance(T0 + 10 * n - clock.wall())
        assert s.tick() == T0 + 10 * (n + 1)
    assert [slot for _, slot, _ in launches.started] == [T0, T0 + 10, T0 + 20, T0 + 30]
    assert s.fired == 4


def test_two_instances_on_one_store_fire_each_slot_once(store_url: str) -> None:
    """G8 on every backend: two instances look at the same slots, in either
    order; each slot starts exactly one run, and the loser names the winner."""
    clock = FakeClock(start=T0)
    with open_store(store_url) as one, open_store(store_url) as two:
        a, started_a, lines_a = scheduler(one, [every("tick", 10)], clock, "host-a:1")
        b, started_b, lines_b = scheduler(two, [every("tick", 10)], clock, "host-b:2")
        for n in range(6):
            clock.advance(T0 + 10 * n - clock.wall())
            first, second = (a, b) if n % 2 == 0 else (b, a)
            first.tick()
            second.tick()
    slots = sorted(slot for _, slot, _ in started_a.started + started_b.started)
    assert slots == [T0 + 10 * n for n in range(6)]
    assert a.fired == b.fired == 3
    assert sum("fired by host-a:1" in line for line in lines_b) == 3
    assert sum("fired by host-b:2" in line for line in lines_a) == 3


def test_a_restarted_instance_does_not_fire_a_slot_again(sqlite_store: Store) -> None:
    clock = FakeClock(start=T0 + 1)
    old, launched_old, _ = scheduler(sqlite_store, [every("tick", 60)], clock, "host:1")
    old.tick()
    assert launched_old.started == [("tick", T0, None)]
    clock.advance(5)  # restarted within the grace: the slot is looked at again, and was fired
    new, launched_new, lines = scheduler(sqlite_store, [every("tick", 60)], clock, "host:2")
    new.tick()
    assert launched_new.started == []
    assert any("fired by host:1" in line for line in lines)


def test_an_instance_restarted_under_the_same_name_does_not_fire_a_slot_again(sqlite_store: Store) -> None:
    """``--id web-1``, or a container's pid 1: the name repeats, the claim's
    owner does not."""
    clock = FakeClock(start=T0 + 1)
    first, launched_first, _ = scheduler(sqlite_store, [every("tick", 60)], clock, "web-1")
    first.tick()
    again, launched_again, lines = scheduler(sqlite_store, [every("tick", 60)], clock, "web-1")
    again.tick()
    assert launched_first.started == [("tick", T0, None)] and launched_again.started == []
    assert any(f"fired by {first.owner}" in line for line in lines)


@pytest.mark.parametrize("period", [0.1, 0.3, 1.1, 1.7, 13.7])
def test_a_period_that_is_no_binary_fraction_fires_each_slot_once(sqlite_store: Store, period: float) -> None:
    """``every = "1.1s"``: float division puts some fire times one period
    off; each slot must still be fired once, and the next one be later."""
    clock = FakeClock(start=T0)
    job = ScheduledJob.from_settings(JobSettings(name="frac", every=period, command=("/bin/true",)))
    s, launches, lines = scheduler(sqlite_store, [job], clock, "a")
    while clock.wall() < T0 + 30 * period:
        s.tick()
        clock.advance(period / 7)
    slots = [slot for _, slot, _ in launches.started]
    assert slots == sorted(set(slots)) and 29 <= len(slots) <= 31, lines
    assert all(b - a == pytest.approx(period, abs=1e-5) for a, b in itertools.pairwise(slots))


def test_daylight_saving_ends_every_fire_of_the_repeated_hour_runs_once(sqlite_store: Store) -> None:
    """Europe/Berlin, 2026-10-25: 02:00-03:00 local happens twice (00:00Z to
    02:00Z). A half-hourly job fires at each of 00:00Z, 00:30Z, 01:00Z,
    01:30Z and 02:00Z once, and never thinks it is late."""
    start = datetime(2026, 10, 24, 23, 50, tzinfo=UTC).timestamp()
    clock = FakeClock(start=start)
    job = ScheduledJob.from_settings(
        JobSettings(name="half", schedule="*/30 * * * *", timezone="Europe/Berlin", command=("/bin/true",))
    )
    s, launches, lines = scheduler(sqlite_store, [job], clock, "a")
    while clock.wall() < start + 2.5 * 3600:
        s.tick()
        clock.advance(20)
    fired = [datetime.fromtimestamp(slot, UTC).strftime("%H:%M") for _, slot, _ in launches.started]
    assert fired == ["00:00", "00:30", "01:00", "01:30", "02:00"]
    assert not [line for line in lines if "not " in line]


def test_a_cron_without_a_time_zone_follows_the_hosts_daylight_saving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Local time with its rules, not today's UTC offset: 02:00 in Berlin is
    00:00Z in summer and 01:00Z in winter, whenever the instance started."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    sched = Schedule.cron_("0 2 * * *")
    t = datetime(2026, 10, 23, 12, tzinfo=UTC).timestamp()
    fires = []
    for _ in range(4):
        t = sched.next_fire(t)
        fires.append(datetime.fromtimestamp(t, UTC).strftime("%m-%d %H:%M"))
    assert fires == ["10-24 00:00", "10-25 00:00", "10-26 01:00", "10-27 01:00"]


@pytest.mark.parametrize(
    ("text", "tz"),
    [("*/30 * * * *", "Europe/Berlin"), ("30 2 * * *", "Europe/Berlin"),
     ("15,45 1-3 * * *", "America/New_York"), ("0 0 * * 0", None), ("every 7m", None), ("every 1.1s", None)],
)  # fmt: skip
def test_fires_walks_the_fire_times_next_fire_gives_one_by_one(text: str, tz: str | None) -> None:
    """Through both of 2026's daylight-saving changes in Europe and America:
    the one walk gives what asking ``next_fire`` again and again gives."""
    sched = Schedule.parse(text, tz)
    for day in (datetime(2026, 3, 8, tzinfo=UTC), datetime(2026, 3, 29, tzinfo=UTC),
                datetime(2026, 10, 25, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)):  # fmt: skip
        after = day.timestamp() - 3 * 3600 + 0.25
        walked = list(itertools.islice(sched.fires(after), 40))
        one_by_one = [t := sched.next_fire(after)]
        while len(one_by_one) < 40:
            one_by_one.append(t := sched.next_fire(t))
        assert walked == one_by_one and walked[0] > after


def test_an_instance_started_in_the_repeated_hour_fires_the_slot_still_in_grace(sqlite_store: Store) -> None:
    """Started at 01:00:30Z on 2026-10-25, the second 03:00 in Berlin: the
    slot within the grace is 01:00Z, not the first pass's 00:00Z."""
    start = datetime(2026, 10, 25, 1, 0, 30, tzinfo=UTC).timestamp()
    clock = FakeClock(start=start)
    job = ScheduledJob.from_settings(
        JobSettings(name="half", schedule="*/30 * * * *", timezone="Europe/Berlin", command=("/bin/true",))
    )
    s, launches, _ = scheduler(sqlite_store, [job], clock, "a")
    s.tick()
    assert [datetime.fromtimestamp(slot, UTC).strftime("%H:%M") for _, slot, _ in launches.started] == [
        "01:00"
    ]


@pytest.mark.parametrize("tz", ["UTC0", "CET-1CEST,M3.5.0,M10.5.0/3", "Nowhere/Zone", "Europe/Berlin "])
def test_a_tz_that_is_no_zone_name_falls_back_to_the_current_offset(
    monkeypatch: pytest.MonkeyPatch, tz: str
) -> None:
    """libc reads POSIX rules and forgives typos; zoneinfo does not. A cron
    line must still run: the offset in force now, as before zone rules."""
    monkeypatch.setenv("TZ", tz)
    sched = Schedule.cron_("*/5 * * * *")
    now = T0 + 123
    assert sched.slot(now) <= now < sched.next_fire(sched.slot(now))


def test_a_slot_later_than_the_grace_is_not_fired_and_is_said(sqlite_store: Store) -> None:
    clock = FakeClock(start=T0 + 30)
    s, launches, lines = scheduler(sqlite_store, [every("tick", 60)], clock, "a", misfire_grace=10)
    s.tick()  # T0 was 30 s ago, past the 10 s grace: left to the monitor
    assert launches.started == []
    clock.advance(30)  # T0 + 60
    s.tick()
    assert launches.started == [("tick", T0 + 60, None)]
    # Asleep for 10 minutes (a suspended host): the slots in between are not
    # run late, they are said, and the one within the grace is fired.
    clock.advance(600 + 4)
    s.tick()
    assert launches.started[-1] == ("tick", T0 + 660, None)
    assert len(launches.started) == 2
    said = [line for line in lines if "not started late" in line]
    assert len(said) == 1 and "and more" in said[0] and "not fired" not in said[0]


def test_a_job_with_shards_starts_one_run_per_shard(sqlite_store: Store) -> None:
    clock = FakeClock(start=T0)
    job = every("ingest", 60, policy=Policy.ALLOW, shards=("eu", "us"), reason="shards are disjoint")
    s, launches, _ = scheduler(sqlite_store, [job], clock, "a")
    s.tick()
    assert launches.started == [("ingest", T0, "eu"), ("ingest", T0, "us")]
    assert s.fired == 1


def test_an_unreachable_store_fires_nothing_and_says_why() -> None:
    """Fail closed, like a run: no claim, no run; the next slot tries again."""
    clock = FakeClock(start=T0)
    with open_store("redis://127.0.0.1:1/0?connect_timeout=200ms") as store:
        s, launches, lines = scheduler(store, [every("tick", 10)], clock, "a")
        s.tick()
    assert launches.started == []
    assert len(lines) == 1 and "not fired" in lines[0] and "127.0.0.1:1" in lines[0]


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_connection_closed_while_idle_does_not_cost_a_slot(store_url: str) -> None:
    """A daemon's store connection sits idle between fires, and the server
    may end the session meanwhile (here pg_terminate_backend): the next
    claim goes out on a new connection, and the slot still fires. (A
    connection that died silently fails the first claim after its timeout;
    the scheduler then asks once more, on a new one.)"""
    from tests.stores.test_postgres_faults import admin, terminate

    name = f"cw-sched-{uuid.uuid4().hex[:8]}"
    clock = FakeClock(start=T0)
    with open_store(f"{store_url}&application_name={name}") as store, admin(POSTGRES_URL) as pg:
        s, launches, lines = scheduler(store, [every("tick", 60)], clock, "a")
        s.tick()
        terminate(pg, name)
        clock.advance(60)
        s.tick()
    assert [slot for _, slot, _ in launches.started] == [T0, T0 + 60], lines


def test_finished_runs_are_reaped_with_their_status_and_stop_signals_the_rest(sqlite_store: Store) -> None:
    clock = FakeClock(start=T0)
    s, launches, lines = scheduler(sqlite_store, [every("a", 10), every("b", 10)], clock, "x")
    s.tick()
    first, second = launches.children
    first.code = 3
    s.tick()
    assert [r.job for r in s.running] == ["b"]
    assert any(line.endswith("a: slot 2027-01-15T08:00:00Z ended, exit status 3") for line in lines)
    s.stop_runs(1.0, sleep=lambda _: None, stop=lambda: 0)
    assert second.signals == [signal.SIGTERM] and s.running == []
    assert any("exit status signal 15" in line for line in lines)


# -- real processes --------------------------------------------------------------------

WRITE_SLOT = "import os, sys; open(sys.argv[1], 'a').write(os.environ['CRONWARDEN_RUN_ID'] + '\\n')"


def _config(tmp_path: Path, command: list[str], every: str = "1s", extra: str = "") -> Path:
    path = tmp_path / "cronwarden.toml"
    path.write_text(
        textwrap.dedent(f"""\
        [jobs.tick]
        every = "{every}"
        ttl = "30s"
        command = {json.dumps(command)}
    """)
        + extra
    )
    return path


def _scheduler(config: Path, store_url: str, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "cronwarden", "scheduler", "--config", str(config), "--store", store_url]
    return subprocess.Popen([*argv, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_scheduler_processes_run_each_slot_once(store_url: str, tmp_path: Path) -> None:
    out = tmp_path / "ran"
    config = _config(tmp_path, [sys.executable, "-c", WRITE_SLOT, str(out)])
    procs = [_scheduler(config, store_url, "--for", "3500ms", "--id", f"inst-{n}") for n in (1, 2)]
    try:
        results = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            kill_quietly(p.pid)
    assert [p.returncode for p in procs] == [0, 0], results
    with open_store(store_url) as store:
        runs = store.runs("tick", limit=100)
    assert len(runs) >= 2, results
    slots = [r.slot for r in runs]
    assert len(set(slots)) == len(slots), f"a slot ran twice: {sorted(s for s in slots if s is not None)}"
    assert all(r.outcome is Outcome.SUCCEEDED for r in runs)
    # Every run the ledger has ran its command once, and each was started by one instance.
    assert sorted(out.read_text().split()) == sorted(r.run_id for r in runs)
    # Each start line is a run; a start the job's policy skipped because the
    # previous slot's run still held the lease (a loaded machine) is said and recorded.
    lines = [line for out, _ in results for line in out.splitlines()]
    with open_store(store_url) as store:
        skipped = store.events(EventQuery(job="tick", kinds=[EventKind.SKIPPED]))
    assert sum(" started, pid " in line for line in lines) == len(runs)
    assert sum(" skipped: run " in line for line in lines) == len(skipped)


def test_when_one_instance_is_killed_the_other_fires_every_later_slot(store_url: str, tmp_path: Path) -> None:
    """No leader to lose: after kill -9 of one instance, the other fires
    every slot from then on; a run the dead instance started finishes and is
    recorded (detach = true: it is its own process, guarded by its own lease)."""
    out = tmp_path / "ran"
    config = _config(tmp_path, [sys.executable, "-c", WRITE_SLOT, str(out)], extra="detach = true\n")
    doomed = _scheduler(config, store_url, "--id", "doomed")
    survivor = None
    try:
        assert doomed.stdout is not None
        for line in doomed.stdout:  # alone, it fires the slot of its start
            if " started, pid " in line:
                doomed_slot = datetime.strptime(line.split(" slot ")[1].split()[0], "%Y-%m-%dT%H:%M:%S%z")
                break
        # Its run holds the lease once its command has written: started
        # sooner, the survivor's first fire could take the lease before the
        # doomed instance's child (a new interpreter, slow on a loaded host)
        # asked for it, and that run would be recorded skipped. The run is
        # known by the id its command wrote, not by the first slot the
        # instance fired: on a loaded host that slot's child can ask for the
        # lease after the next slot's child took it, and be skipped.
        wait_for("the doomed instance's first run", lambda: out.exists() and out.read_text() != "", 30)
        doomed_run = out.read_text().split()[0]
        survivor = _scheduler(config, store_url, "--for", "6s", "--id", "survivor")
        assert survivor.stdout is not None
        assert "cronwarden scheduler survivor" in survivor.stdout.readline()  # it is up
        doomed.kill()
        killed_at = time.time()
        doomed.wait(timeout=10)
        survivor_out, _ = survivor.communicate(timeout=60)
        ended_at = time.time()
    finally:
        kill_quietly(doomed.pid)
        if survivor is not None:
            kill_quietly(survivor.pid)
    assert survivor.returncode == 0
    with open_store(store_url) as store:
        runs = store.runs("tick", limit=100)
        skipped = store.events(EventQuery(job="tick", kinds=[EventKind.SKIPPED]))
        assert store.open_runs("tick") == []
    slots = [r.slot for r in runs]
    assert len(set(slots)) == len(slots)
    doomed_runs = [r for r in runs if r.run_id == doomed_run]
    assert [r.outcome for r in doomed_runs] == [Outcome.SUCCEEDED], "the doomed instance's run is recorded"
    covered = {s for s in slots if s is not None} | {float(e.data["slot"]) for e in skipped}
    assert doomed_slot.timestamp() in covered, "the doomed instance's first fire is a run or a recorded skip"
    # Every whole second after the kill (and before the survivor stopped
    # firing) is a slot the survivor fired: a run, or a start its policy skipped.
    expected = {float(t) for t in range(int(killed_at) + 1, int(ended_at) - 1)}
    assert expected and expected <= covered, (sorted(expected - covered), survivor_out)


def test_sigterm_stops_the_scheduler_and_its_runs_are_recorded(store_url: str, tmp_path: Path) -> None:
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    command = "import sys, time; open(sys.argv[1], 'w').write('up\\n'); time.sleep(60)"
    # Every minute: the slot of this minute is fired at start (it is within
    # the grace) and the next is at least a second away.
    config = _config(tmp_path, [sys.executable, "-c", command, str(fifo)], every="1m")
    proc = _scheduler(config, store_url, "--stop-timeout", "20s")
    try:
        with open(fifo) as started:  # blocks until the run's command is up
            assert started.readline() == "up\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        kill_quietly(proc.pid)
    assert proc.returncode == 0, err
    assert "stopping 1 run(s) still going" in out and "stopped; fired 1 slot(s)" in out
    with open_store(store_url) as store:
        assert store.open_runs("tick") == []
        (run,) = store.runs("tick")
    assert run.outcome is Outcome.INTERRUPTED and run.exit_code == 128 + signal.SIGTERM


@pytest.mark.parametrize(
    ("args", "config", "expected"),
    [
        ((), None, "no config file"),
        ((), '[jobs.x]\nevery = "1m"\n', "no job in"),
        (("--misfire-grace", "soon"), "ok", "--misfire-grace"),
        (("--keep", "30s"), "ok", "--keep must be longer than --misfire-grace"),
        (("--id", ""), "ok", "--id must be"),
        (("--for", "0s"), "ok", "--for"),
        ((), '[jobs.x]\ncommand = ["/bin/true"]\n', "no schedule or every"),
        ((), '[jobs.x]\nevery = "1m"\ncommand = ["true", "a\\u0000b"]\n', "NUL character"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], config: str | None,
                                          expected: str) -> None:  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    argv = [
        sys.executable,
        "-m",
        "cronwarden",
        "scheduler",
        "--store",
        f"sqlite:///{tmp_path / 'cw.db'}",
        *args,
    ]
    if config is not None:
        path = tmp_path / "c.toml"
        path.write_text('[jobs.x]\nevery = "1m"\ncommand = ["/bin/true"]\n' if config == "ok" else config)
        argv += ["--config", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=30)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_run_slot_flag_is_recorded_and_checked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cw.db'}"
    base = [sys.executable, "-m", "cronwarden", "run", "--job", "x", "--store", url]
    done = subprocess.run([*base, "--slot", "1764583800", "--", "true"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with open_store(url) as store:
        (run,) = store.runs("x")
    assert run.slot == 1764583800.0
    bad = subprocess.run([*base, "--slot", "yesterday", "--", "true"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--slot must be a time in epoch seconds" in bad.stderr


def test_an_unreachable_store_at_start_is_exit_75_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[jobs.x]\nevery = "1m"\ncommand = ["/bin/true"]\n')
    argv = [sys.executable, "-m", "cronwarden", "scheduler", "--config", str(path),
            "--store", "redis://127.0.0.1:1/0?connect_timeout=200ms"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 75, done
    assert done.stderr.count("\n") == 1 and "127.0.0.1:1" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_the_store_password_is_not_on_the_runs_command_line(store_url: str, tmp_path: Path) -> None:
    """``ps`` shows every local user a process's arguments: the run gets the
    store in its environment. (PostgreSQL here trusts local connections, so
    any password is accepted.)"""
    url = store_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
    assert "s3cret" in url
    show = (
        "import os; print(open(f'/proc/{os.getppid()}/cmdline').read().replace(chr(0), ' ')); "
        "print('env:', sorted(k for k in os.environ if k.startswith('CRONWARDEN_')), "
        "[v for v in os.environ.values() if 's3' + 'cret' in v])"
    )
    config = _config(tmp_path, [sys.executable, "-c", show], every="1m", extra="detach = true\n")
    argv = [sys.executable, "-m", "cronwarden", "scheduler", "--config", str(config), "--store", url]
    done = subprocess.run([*argv, "--for", "1s"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    run_line = next(line for line in done.stdout.splitlines() if " run --job tick --slot " in line)
    assert "s3cret" not in run_line and "s3cret" not in done.stdout
    # Nor in the command's environment (nor a store URL that would override
    # the store of a cronwarden the command runs).
    env_line = next(line for line in done.stdout.splitlines() if line.startswith("env:"))
    assert "STORE" not in env_line and env_line.endswith("[]")
    with open_store(store_url) as store:
        # One run, or two when a minute boundary falls within --for: each succeeded.
        outcomes = [r.outcome for r in store.runs("tick")]
        assert outcomes and set(outcomes) == {Outcome.SUCCEEDED}, outcomes


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_store_that_refuses_writes_is_refused_at_start(store_url: str, tmp_path: Path) -> None:
    """A replica, a read-only user: reads work, every claim would fail. Said
    at start (exit 2, one line), not at the first fire."""
    with open_store(store_url):
        pass  # the schema exists; from here on the sessions are read-only
    read_only = f"{store_url}&options=-c%20default_transaction_read_only%3Don"
    path = tmp_path / "c.toml"
    path.write_text('[jobs.x]\nevery = "1m"\ncommand = ["/bin/true"]\n')
    argv = [sys.executable, "-m", "cronwarden", "scheduler", "--config", str(path), "--store", read_only]
    done = subprocess.run([*argv, "--for", "1s"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and "read-only" in done.stderr and "CONTEXT" not in done.stderr


def test_a_second_signal_kills_the_runs_at_once(tmp_path: Path) -> None:
    """The first SIGTERM asks the runs to stop and waits; a run whose command
    ignores SIGTERM would hold the scheduler for the run's kill grace. A
    second SIGTERM SIGKILLs the runs and the scheduler ends."""
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    command = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').write('up\\n'); time.sleep(120)"
    )
    config = _config(tmp_path, [sys.executable, "-c", command, str(fifo)], every="1m")
    config.write_text(config.read_text().replace('ttl = "30s"', 'ttl = "120s"'))  # kill grace 10 s
    proc = _scheduler(config, f"sqlite:///{tmp_path / 'cw.db'}", "--stop-timeout", "60s")
    try:
        assert proc.stdout is not None
        with open(fifo) as started:
            assert started.readline() == "up\n"
        proc.send_signal(signal.SIGTERM)
        for line in proc.stdout:
            if "stopping 1 run(s) still going" in line:
                break
        second = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        took = time.monotonic() - second
    finally:
        kill_quietly(proc.pid)
    assert proc.returncode == 0
    assert took < 5.0, f"the runs were not killed at once: {took:.1f}s (their kill grace is 10 s)"
