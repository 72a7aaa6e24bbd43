"""Operators' controls on every store, with real processes: ``cronwarden
trigger`` under policy skip while another run holds the lease; ``pause``
across two scheduler instances (no fire while paused, every paused slot
recorded once, the slot ledger says ``paused``, the monitor reports none
missed); ``stop`` of a run on another host id (its command gone within the
grace and one renew interval, recorded ``stopped`` with who asked)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.contract import granted, start
from tests.processes import alive, kill_quietly

from cronwarden.clock import FakeClock
from cronwarden.config import JobSettings
from cronwarden.control import pause, request_stop, resume
from cronwarden.events import EventKind, JobInfo, Outcome
from cronwarden.guard import Warden
from cronwarden.monitor import Monitor
from cronwarden.scheduler import InProcess, ScheduledJob, Scheduler, slot_event_id
from cronwarden.stores import open_store
from cronwarden.stores.base import EventQuery, Store


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cronwarden", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)  # fmt: skip


def _wait_for(what: object, timeout: float = 30.0) -> None:
    give_up = time.monotonic() + timeout
    while not what():  # type: ignore[operator]
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.02)


@pytest.fixture
def env(store_url: str) -> dict[str, str]:
    out = {**os.environ, "CRONWARDEN_STORE": store_url}
    out.pop("CRONWARDEN_HOST", None)
    return out


def _config(tmp_path: Path, command: list[str], *, ttl: str = "3s") -> Path:
    path = tmp_path / "cronwarden.toml"
    path.write_text(f'[jobs.held]\ncommand = {json.dumps(command)}\nevery = "1h"\nttl = "{ttl}"\n')
    return path


@pytest.fixture
def holder(
    tmp_path: Path, env: dict[str, str], store_url: str
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """``cronwarden run`` of job ``held`` as host ``other``: a command that
    ignores SIGTERM (so a stop needs its SIGKILL) and writes its pid."""
    pidfile = tmp_path / "command.pid"
    code = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)")  # fmt: skip
    config = _config(tmp_path, [sys.executable, "-c", code, str(pidfile)])
    argv = [sys.executable, "-m", "cronwarden", "run", "--job", "held", "--config", str(config)]
    proc = subprocess.Popen(argv, env={**env, "CRONWARDEN_HOST": "other"}, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: pidfile.exists() and pidfile.read_text())
        yield proc, pidfile
    finally:
        kill_quietly(proc.pid)
        if pidfile.exists() and pidfile.read_text():
            kill_quietly(int(pidfile.read_text()))
        proc.wait()


def test_trigger_under_skip_while_held_records_the_manual_start_skipped_with_the_holder(
    holder: tuple[subprocess.Popen[str], Path], tmp_path: Path, env: dict[str, str], store_url: str
) -> None:
    with open_store(store_url) as store:
        [held] = store.open_runs("held")

    done = cli("trigger", "held", "--reason", "the nightly export is needed now",
               "--config", str(tmp_path / "cronwarden.toml"), env=env)  # fmt: skip

    assert done.returncode == 1, done.stderr
    said = done.stderr.strip()
    assert said.startswith(f"cronwarden: manual start of held refused because run {held.run_id} holds the "
                           "lease (host other, pid "), said  # fmt: skip
    assert said.endswith("; per policy skip, recorded as skipped"), said
    assert "slot" not in said, "a manual start serves no slot"
    with open_store(store_url) as store:
        [skipped] = store.events(EventQuery(job="held", kinds=[EventKind.SKIPPED]))
        [manual] = store.events(EventQuery(job="held", kinds=[EventKind.TRIGGERED]))
        assert [r.run_id for r in store.open_runs("held")] == [held.run_id]
    assert skipped.data["holder_run_id"] == held.run_id and skipped.data["holder_host"] == "other"
    assert skipped.data["slot"] is None, "a manual start serves no slot"
    assert manual.run_id == skipped.run_id
    assert manual.data["reason"] == "the nightly export is needed now"
    assert manual.data["by"].endswith("@" + os.uname().nodename)


def test_trigger_runs_the_configured_command_recorded_manual_with_no_slot(
    tmp_path: Path, env: dict[str, str], store_url: str
) -> None:
    out = tmp_path / "ran"
    config = _config(tmp_path, [sys.executable, "-c", f"open({str(out)!r}, 'w').write('yes')"])

    done = cli("trigger", "held", "--config", str(config), env=env)

    assert done.returncode == 0, done.stderr
    assert out.read_text() == "yes"
    with open_store(store_url) as store:
        [run] = store.runs("held")
        [manual] = store.events(EventQuery(job="held", kinds=[EventKind.TRIGGERED]))
    assert run.outcome is Outcome.SUCCEEDED and run.slot is None
    assert manual.run_id == run.run_id
    history = cli("history", "held", env=env)
    assert "manual by " in next(x for x in history.stdout.splitlines() if run.run_id in x)
    slots = cli("history", "held", "--slots", "--limit", "1", "--json", "--config", str(config), env=env)
    [current] = json.loads(slots.stdout)
    assert current["decision"] not in ("ran", "late"), "a manual run serves no slot"


def test_stop_of_a_run_on_another_host_kills_its_command_within_grace_and_a_renewal(
    holder: tuple[subprocess.Popen[str], Path], env: dict[str, str], store_url: str
) -> None:
    proc, pidfile = holder
    command = int(pidfile.read_text())
    with open_store(store_url) as store:
        [held] = store.open_runs("held")
    grace, renew_every = 1.0, 1.0  # ttl 3s: renewed every second

    done = cli("stop", held.run_id, "--reason", "it holds the warehouse lock", "--grace", "1s", env=env)
    asked = time.monotonic()  # the request is in the store once stop has returned

    assert done.returncode == 0, done.stderr
    assert "stop requested" in done.stdout and "host other" in done.stdout
    _wait_for(lambda: not alive(command), timeout=30)
    gone = time.monotonic() - asked
    # Grace plus one renew interval, with room for a loaded machine's late wake-ups.
    assert gone <= grace + renew_every + 4.0, f"the command lived {gone:.1f}s after the stop"
    assert proc.wait(30) == 128 + signal.SIGKILL, "the command ignored SIGTERM: SIGKILL after the grace"
    with open_store(store_url) as store:
        run = store.run(held.run_id)
        [request] = store.events(EventQuery(job="held", kinds=[EventKind.STOP_REQUESTED]))
        [stopped] = store.events(EventQuery(job="held", kinds=[EventKind.STOPPED]))
    assert run is not None and run.outcome is Outcome.STOPPED
    who = request.data["by"]
    assert who.endswith("@" + os.uname().nodename)
    assert run.detail == f"stopped by {who}: it holds the warehouse lock"
    assert stopped.run_id == held.run_id and stopped.data["detail"] == run.detail
    # Who asked and why are fields of the stopped event, as of the request (and of a trigger).
    assert (stopped.data["by"], stopped.data["reason"]) == (who, "it holds the warehouse lock")
    [item] = json.loads(cli("history", "held", "--json", env=env).stdout)
    assert item["stopped"] == {"by": who, "reason": "it holds the warehouse lock"}
    shown = cli("history", "held", env=env).stdout
    assert f"stopped by {who}: it holds the warehouse lock" in next(
        x for x in shown.splitlines() if held.run_id in x
    )


def test_status_shows_a_stop_in_progress(tmp_path: Path, env: dict[str, str], store_url: str) -> None:
    """A run whose heartbeat has not seen the request yet: status says who asked and when."""
    with open_store(store_url) as store:
        lease = granted(store.acquire(start("held", host="other"))).lease
        [run] = store.open_runs("held")
        assert request_stop(store, run, by="alice@ops-1", reason="hung", grace=5.0, at=time.time())

        shown = cli("status", env=env)

        assert shown.returncode == 0, shown.stderr
        line = next(x for x in shown.stdout.splitlines() if lease.run_id in x)
        assert "stop requested by alice@ops-1 at " in line


def test_status_lists_paused_jobs_with_who_why_and_since_in_text_and_json(
    env: dict[str, str], store_url: str
) -> None:
    at = time.time() - 60
    with open_store(store_url) as store:
        pause(store, "export", by="alice@ops-1", reason="the warehouse is migrating", at=at)
        pause(store, "sync", by="bob@ops-2", reason="", at=at)
        resume(store, "sync", by="bob@ops-2", reason="", at=at + 1)
        lease = granted(store.acquire(start("held", host="other"))).lease

    text = cli("status", env=env)
    as_json = cli("status", "--json", env=env)

    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    assert (f"export: paused by alice@ops-1 at {since}: the warehouse is migrating (cronwarden resume "
            "export)") in text.stdout.splitlines()  # fmt: skip
    assert "sync" not in text.stdout, "resumed"
    items = json.loads(as_json.stdout)
    assert [(i["type"], i["job"]) for i in items] == [("run", "held"), ("paused", "export")]
    assert items[0]["run_id"] == lease.run_id
    assert items[1] == {"type": "paused", "job": "export", "by": "alice@ops-1",
                        "reason": "the warehouse is migrating", "since": at}  # fmt: skip
    only = json.loads(cli("status", "--json", "--job", "export", env=env).stdout)
    assert [(i["type"], i["job"]) for i in only] == [("paused", "export")]


def _instance(
    store: Store, clock: FakeClock, name: str, jobs: list[ScheduledJob]
) -> tuple[Scheduler, InProcess]:
    warden = Warden(store, clock=clock, quiet=True)
    fires = InProcess(warden, say=lambda _line: None, instance=name)
    return Scheduler(store, jobs, fires, instance=name, clock=clock, say=lambda _line: None), fires


def _tick(*schedulers: Scheduler) -> None:
    for s in schedulers:
        s.tick()
        for started in s.running:
            assert started.child.wait(30) == 0
        s.reap()


def test_pause_across_two_schedulers_fires_nothing_and_records_each_slot_paused_once(
    store_url: str, env: dict[str, str], tmp_path: Path
) -> None:
    t0 = (time.time() // 60) * 60 - 300  # five minutes ago: the slot ledger lists the slots as past
    clock = FakeClock(start=t0)
    tick = ScheduledJob.from_settings(JobSettings(name="tick", every=60.0, command=("true",)))
    with open_store(store_url) as one, open_store(store_url) as two:
        a, fires_a = _instance(one, clock, "a", [tick])
        b, fires_b = _instance(two, clock, "b", [tick])
        _tick(a, b)
        assert cli("pause", "tick", "--reason", "the warehouse is migrating", env=env).returncode == 0
        for _ in range(2):
            clock.advance(60)
            _tick(a, b)
            _tick(b, a)
        shown = cli("status", env=env)
        assert cli("resume", "tick", env=env).returncode == 0
        clock.advance(60)
        _tick(b, a)
        fires_a.close()
        fires_b.close()

        runs = sorted(one.runs("tick"), key=lambda r: r.started_at)
        paused = one.events(EventQuery(job="tick", kinds=[EventKind.PAUSED], newest_first=False))
    assert [r.slot for r in runs] == [t0, t0 + 180], "one run per slot, none while paused"
    assert [e.data["slot"] for e in paused] == [t0 + 60, t0 + 120], "each paused slot recorded once"
    assert all(e.event_id == slot_event_id(EventKind.PAUSED, "tick", e.data["slot"]) for e in paused)
    assert paused[0].data["reason"] == "the warehouse is migrating"
    assert "tick: paused by " in shown.stdout and "the warehouse is migrating" in shown.stdout

    config = tmp_path / "cronwarden.toml"
    config.write_text('[jobs.tick]\ncommand = ["true"]\nevery = "1m"\n')
    slots = cli("history", "tick", "--slots", "--since", "10m", "--json", "--config", str(config), env=env)
    assert slots.returncode == 0, slots.stderr
    decisions = {i["slot"]: i["decision"] for i in json.loads(slots.stdout)}
    assert [decisions[t0 + 60 * n] for n in range(4)] == ["ran", "paused", "paused", "ran"]


def test_cronwarden_run_of_a_paused_job_is_refused_recorded_and_exits_5(
    tmp_path: Path, env: dict[str, str], store_url: str
) -> None:
    out = tmp_path / "ran"
    with open_store(store_url) as store:
        pause(store, "held", by="alice@ops-1", reason="the warehouse is migrating", at=time.time())

    done = cli("run", "--job", "held", "--slot", "1800000000", "--", "touch", str(out), env=env)

    assert done.returncode == 5
    assert "paused by alice@ops-1" in done.stderr and "the warehouse is migrating" in done.stderr
    assert not out.exists()
    with open_store(store_url) as store:
        [paused] = store.events(EventQuery(job="held", kinds=[EventKind.PAUSED]))
        assert store.runs("held") == []
    assert paused.data["slot"] == 1_800_000_000
    assert paused.event_id == slot_event_id(EventKind.PAUSED, "held", 1_800_000_000.0)


def test_the_monitor_reports_no_missed_slot_while_paused_nor_for_the_slots_it_held_back(
    tmp_path: Path,
) -> None:
    t0 = 1_800_000_000.0
    clock = FakeClock(start=t0)
    with open_store(f"sqlite:///{tmp_path / 'cw.db'}", clock=clock) as store:
        store.save_job(JobInfo(name="tick", schedule="every 1m", period=60.0, grace=30.0, updated_at=t0 - 1))
        pause(store, "tick", by="alice@ops-1", reason="migrating", at=t0)
        clock.advance(600)  # ten slots pass with no scheduler running at all
        monitor = Monitor(store, clock=clock)
        assert [c for c in monitor.evaluate(record=False).active if c.rule is EventKind.MISSED] == []

        resume(store, "tick", by="alice@ops-1", reason="", at=clock.wall())
        clock.advance(45)  # the first slot after the resume is not yet past its grace
        assert [c for c in monitor.evaluate(record=False).active if c.rule is EventKind.MISSED] == []
        clock.advance(60)  # ... and now it is, with nothing started: missed
        assert [c.rule for c in monitor.evaluate(record=False).active if c.rule is EventKind.MISSED] == [
            EventKind.MISSED
        ]


def test_a_scheduler_fire_in_process_is_stopped_and_recorded_stopped(tmp_path: Path) -> None:
    """The scheduler's own fires stop the same way: the request reaches the
    fire's heartbeat, its Supervisor stops the command."""
    sleepy = ScheduledJob.from_settings(JobSettings(name="sleepy", every=3600.0, ttl=3.0,
                                                    command=("sleep", "60")))  # fmt: skip
    with open_store(f"sqlite:///{tmp_path / 'cw.db'}") as store, Warden(store, quiet=True) as warden:
        fires = InProcess(warden, say=lambda _line: None, instance="me")
        fire = fires(sleepy, time.time(), None)
        _wait_for(lambda: fire.pid != 0)
        [run] = store.open_runs("sleepy")
        assert request_stop(store, run, by="alice@ops-1", reason="wrong input", grace=1.0, at=time.time())
        assert fire.wait(30) == 128 + signal.SIGTERM
        fires.close()
        ended = store.run(run.run_id)
    assert ended is not None and ended.outcome is Outcome.STOPPED
    assert ended.detail == "stopped by alice@ops-1: wrong input"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["pause", "export"], "the following arguments are required: --reason"),
        (["pause", "export", "--reason", "  "], "--reason must be one sentence"),
        (["pause", "bad name!", "--reason", "why"], "job name"),
        (["resume", "export"], "export is not paused"),
        (["stop", "export"], "no open run has the id or job name 'export'"),
        (["stop", "export", "--grace", "soon"], "--grace"),
        (["trigger", "export"], "no command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, argv: list[str], said: str) -> None:
    env = {**os.environ, "CRONWARDEN_STORE": f"sqlite:///{tmp_path / 'cw.db'}", "HOME": str(tmp_path)}
    env.pop("CRONWARDEN_CONFIG", None)
    done = subprocess.run([sys.executable, "-m", "cronwarden", *argv], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_backfill_of_a_paused_job_runs_nothing_and_exits_5(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cw.db'}"
    out = tmp_path / "ran"
    config = tmp_path / "cronwarden.toml"
    config.write_text(f'[jobs.sync]\nevery = "1m"\ncommand = ["touch", "{out}"]\n')
    with open_store(url) as store:
        pause(store, "sync", by="alice@ops-1", reason="the warehouse is migrating", at=time.time())
    last = int(time.time() // 60 * 60) - 60

    done = cli("backfill", "sync", "--from", str(last - 120), "--to", str(last), "--config", str(config),
               "--store", url)  # fmt: skip

    assert done.returncode == 5, done
    assert "paused by alice@ops-1" in done.stderr
    assert not out.exists()
    with open_store(url) as store:
        assert store.runs("sync") == []
