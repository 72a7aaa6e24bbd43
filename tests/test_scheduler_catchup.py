"""Jitter, catch-up, backfill and reload of the scheduler.

The firing decisions run against a real store with the scheduler's clock
injected and a launcher that records what it would start (as in
test_scheduler.py); backfill and SIGHUP run real ``cronwarden`` processes,
real commands and the ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.processes import kill_quietly
from tests.test_scheduler import T0, Launches, every

from cronwarden.clock import FakeClock
from cronwarden.config import JobSettings
from cronwarden.events import EventKind
from cronwarden.scheduler import ScheduledJob, Scheduler, jitter_offset
from cronwarden.stores import open_store
from cronwarden.stores.base import EventQuery, Store


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'cw.db'}") as store:
        yield store


def scheduler(store: Store, jobs: list[ScheduledJob], clock: FakeClock, instance: str,
              **kwargs: Any) -> tuple[Scheduler, Launches, list[str]]:  # fmt: skip
    lines: list[str] = []
    launches = Launches()
    s = Scheduler(store, jobs, launches, instance=instance, clock=clock, say=lines.append, **kwargs)
    return s, launches, lines


# -- jitter -------------------------------------------------------------------


def test_jitter_offsets_are_stable_across_processes_and_spread_over_the_jitter() -> None:
    names = [f"job-{n}" for n in range(2000)]
    offsets = [jitter_offset(n, 30.0) for n in names]
    assert all(0 <= o < 30 for o in offsets)
    # Spread: each tenth of the jitter holds close to a tenth of the jobs.
    buckets = [0] * 10
    for o in offsets:
        buckets[int(o // 3)] += 1
    assert min(buckets) > 140 and max(buckets) < 260, buckets
    # Stable: another interpreter, with another string hash seed, agrees
    # (every instance of a fleet must start a job at the same offset).
    code = "import json, sys; from cronwarden.scheduler import jitter_offset; " \
           "print(json.dumps([jitter_offset(n, 30.0) for n in sys.argv[1:]]))"  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-c", code, *names[:50]], capture_output=True, text=True,
                          env=env, check=True)  # fmt: skip
    assert json.loads(done.stdout) == offsets[:50]
    assert jitter_offset("job-0", 0.0) == 0.0


def test_a_jittered_job_starts_at_its_offset_and_records_the_scheduled_slot(sqlite_store: Store) -> None:
    job = every("report", 60, jitter=30.0)
    assert job.offset > 1  # this name's offset, as the test above makes it
    # The slot's time passed, its offset not yet (and the slot before is past the grace).
    clock = FakeClock(start=T0 + job.offset - 0.1)
    s, launches, _ = scheduler(sqlite_store, [job], clock, "a", misfire_grace=10)
    assert s.tick() == T0 + job.offset
    assert launches.started == []
    clock.advance(0.1)
    assert s.tick() == T0 + 60 + job.offset
    assert launches.started == [("report", T0, None)]  # the slot is the scheduled time


def test_jitter_as_long_as_the_period_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[jobs.x]\nevery = "1m"\njitter = "1m"\ncommand = ["true"]\n')
    done = subprocess.run([sys.executable, "-m", "cronwarden", "config", "check", "--config", str(path)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2
    assert "jitter must be shorter than the job's period (1m), got 1m" in done.stdout + done.stderr


# -- catch-up -----------------------------------------------------------------


def test_catchup_all_fires_each_missed_slot_once_however_many_instances_start(store_url: str) -> None:
    """Ten slots passed while no instance ran; the first instance up fires
    each of them once, through the slot claims: a second instance, and the
    first one's next ticks, fire none again."""
    job = every("sync", 60, catchup="all", catchup_window=630.0)
    clock = FakeClock(start=T0 + 600 + 5)  # T0 … T0+540 missed (the window reaches T0), T0+600 on time
    with open_store(store_url) as one, open_store(store_url) as two:
        a, started_a, _ = scheduler(one, [job], clock, "a")
        a.tick()
        assert [slot for _, slot, _ in started_a.started] == [T0 + 60 * n for n in range(11)]
        b, started_b, lines_b = scheduler(two, [job], clock, "b")
        b.tick()
        assert started_b.started == []
        assert sum(" fired by a#" in line for line in lines_b) == 11
        clock.advance(30)
        a.tick()
        assert len(started_a.started) == 11


def test_catchup_latest_fires_the_last_slot_within_its_window(sqlite_store: Store) -> None:
    job = every("sync", 60, catchup="latest", catchup_window=600.0)
    clock = FakeClock(start=T0 + 280)  # T0 … T0+240 missed, each past the 30 s grace
    s, launches, lines = scheduler(sqlite_store, [job], clock, "a", misfire_grace=30)
    s.tick()
    assert launches.started == [("sync", T0 + 240, None)]
    clock.advance(600 - 280 + 1)  # a stall past T0+300 … T0+600: again only the latest
    s.tick()
    assert launches.started[1:] == [("sync", T0 + 600, None)]
    (said,) = [line for line in lines if "not started late" in line]
    assert "a later slot is due" in said


def test_catchup_skip_fires_no_slot_past_the_grace(sqlite_store: Store) -> None:
    job = every("sync", 60, catchup="skip", catchup_window=600.0)  # a window means nothing to skip
    clock = FakeClock(start=T0 + 280)
    s, launches, _ = scheduler(sqlite_store, [job], clock, "a", misfire_grace=30)
    s.tick()
    assert launches.started == []
    clock.advance(20)  # T0 + 300, on time
    s.tick()
    assert launches.started == [("sync", T0 + 300, None)]


def test_catchup_all_after_a_stalled_tick_fires_the_slots_within_the_window(sqlite_store: Store) -> None:
    job = every("sync", 60, catchup="all", catchup_window=150.0)
    clock = FakeClock(start=T0)
    s, launches, lines = scheduler(sqlite_store, [job], clock, "a")
    s.tick()
    clock.advance(600 + 1)  # a suspended host: T0+60 … T0+600 passed unticked
    s.tick()
    slots = [slot for _, slot, _ in launches.started]
    assert slots == [T0 - 120, T0 - 60, T0, T0 + 480, T0 + 540, T0 + 600]  # at start, then after the stall
    (said,) = [line for line in lines if "not started late" in line]
    assert "and more" in said


# -- reload -------------------------------------------------------------------


def test_reload_adds_removes_and_keeps_next_slots(sqlite_store: Store) -> None:
    clock = FakeClock(start=T0)
    a, b, c = every("a", 60), every("b", 60), every("c", 60)
    s, launches, _ = scheduler(sqlite_store, [a, b], clock, "x")
    s.tick()
    assert sorted(j for j, _, _ in launches.started) == ["a", "b"]
    clock.advance(30)
    changed_a = ScheduledJob.from_settings(a.settings._replace(ttl=120.0))
    assert s.reload([changed_a, c]) == (["c"], ["b"], ["a"])
    clock.advance(30)  # T0 + 60
    s.tick()
    assert sorted((j, t) for j, t, _ in launches.started[2:]) == [("a", T0 + 60), ("c", T0 + 60)]
    # The same config again, just after: nothing fires twice, nothing is lost.
    clock.advance(1)
    s.reload([changed_a, c])
    s.tick()
    assert len(launches.started) == 4
    clock.advance(59)
    s.tick()
    assert sorted((j, t) for j, t, _ in launches.started[4:]) == [("a", T0 + 120), ("c", T0 + 120)]


def test_a_job_added_by_reload_starts_at_its_next_slot_not_a_passed_one(sqlite_store: Store) -> None:
    clock = FakeClock(start=T0 + 10)  # T0 passed 10 s ago, within the grace
    s, launches, _ = scheduler(sqlite_store, [every("a", 60)], clock, "x")
    s.tick()
    s.reload([every("a", 60), every("late", 60)])
    s.tick()
    assert [j for j, _, _ in launches.started] == ["a"]
    assert s.next_fire() == T0 + 60


# -- real processes -----------------------------------------------------------

WRITE_SLOT = "import os, sys; open(sys.argv[1], 'a').write(os.environ['CRONWARDEN_SLOT'] + '\\n')"


def _job(name: str, out: Path, every_: str = "1m", extra: str = "") -> str:
    command = [sys.executable, "-c", WRITE_SLOT, str(out)]
    return (
        textwrap.dedent(f"""\
        [jobs.{name}]
        every = "{every_}"
        ttl = "30s"
        command = {json.dumps(command)}
        """)
        + extra
    )


def test_backfill_runs_each_missed_slot_once_and_a_second_backfill_none(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cw.db'}"
    out = tmp_path / "ran"
    config = tmp_path / "cronwarden.toml"
    config.write_text(_job("sync", out, extra='catchup = "all"\ncatchup_window = "1h"\n'))
    last = int(time.time() // 60 * 60) - 60
    first = last - 9 * 60
    argv = [sys.executable, "-m", "cronwarden", "backfill", "sync", "--from", str(first), "--to", str(last),
            "--config", str(config), "--store", url, "--by", "ops"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done
    assert "10 slot(s): 10 run, 0 failed" in done.stdout
    assert sorted(float(x) for x in out.read_text().split()) == [float(first + 60 * n) for n in range(10)]
    with open_store(url) as store:
        runs = store.runs("sync", limit=100)
        backfilled = store.events(EventQuery(job="sync", kinds=[EventKind.BACKFILLED]))
    assert sorted(r.slot or 0 for r in runs) == [float(first + 60 * n) for n in range(10)]
    assert {e.data["run_id"] for e in backfilled} == {r.run_id for r in runs}
    assert {e.data["asked_by"] for e in backfilled} == {"ops"}
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again
    assert "0 run, 0 failed or not started, 10 ran already" in again.stdout
    assert len(out.read_text().split()) == 10
    # history and history --slots say which runs were backfills.
    hist = subprocess.run([sys.executable, "-m", "cronwarden", "history", "sync", "--store", url,
                           "--slots", "--config", str(config), "--limit", "12"],
                          capture_output=True, text=True)  # fmt: skip
    assert hist.stdout.count(" backfilled ") == 10, hist


def test_backfill_leaves_a_slot_a_scheduler_claimed_alone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cw.db'}"
    out = tmp_path / "ran"
    config = tmp_path / "cronwarden.toml"
    config.write_text(_job("sync", out))
    slot = float(int(time.time() // 60 * 60) - 120)
    with open_store(url) as store:
        assert store.claim_slot("sync", slot, "host-a:1#00", 86400) == "host-a:1#00"
    done = subprocess.run([sys.executable, "-m", "cronwarden", "backfill", "sync", "--from", str(slot),
                           "--to", str(slot), "--config", str(config), "--store", url],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done
    assert "left alone: claimed by host-a:1#00" in done.stdout and not out.exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--from", "yesterday", "--to", "1"), "--from must be a time like"),
        (("--from", "2", "--to", "1"), "--to is before --from"),
        (("--from", "1", "--to", "9999999999"), "--to is in the future"),
        (("--from", "1", "--to", "2", "--job-typo"), "unrecognized arguments"),
    ],
)
def test_backfill_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], expected: str
) -> None:
    config = tmp_path / "cronwarden.toml"
    config.write_text(_job("sync", tmp_path / "ran"))
    done = subprocess.run([sys.executable, "-m", "cronwarden", "backfill", "sync", *args, "--config",
                           str(config), "--store", f"sqlite:///{tmp_path / 'cw.db'}"],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr


def _wait_for(proc: subprocess.Popen[str], seen: list[str], *texts: str, timeout: float = 60.0) -> str:
    """The scheduler's next output line holding each of ``texts`` (each
    line read is kept in ``seen``): an event to wait on, not a sleep."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if all(t in line for t in texts):
            return line
        assert time.monotonic() < deadline, f"no {texts!r} in {seen}"
    raise AssertionError(f"the scheduler ended before {texts!r}: {seen}")


KEEP_ALL = 'catchup = "all"\n'
"""A loaded machine may stall a tick past a one-second slot: with
catch-up all, such a slot is fired late, not passed over."""


def test_sighup_reloads_the_jobs_without_losing_or_doubling_a_slot(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cw.db'}"
    old_out, new_out, kept_out = tmp_path / "old", tmp_path / "new", tmp_path / "kept"
    config = tmp_path / "cronwarden.toml"
    config.write_text(_job("kept", kept_out, "1s", KEEP_ALL) + _job("old", old_out, "1s"))
    argv = [sys.executable, "-m", "cronwarden", "scheduler", "--config", str(config), "--store", url]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        _wait_for(proc, seen, " old: slot ", " started, ")
        config.write_text(_job("kept", kept_out, "1s", KEEP_ALL) + _job("new", new_out, "1s"))
        proc.send_signal(signal.SIGHUP)
        said = _wait_for(proc, seen, "SIGHUP: reload")
        assert "added new; removed old" in said, said
        reloaded_at = len(seen)
        _wait_for(proc, seen, " new: slot ", " started, ")
        _wait_for(proc, seen, " kept: slot ", " started, ")
        # A config with a problem: the running one stays, one line says why.
        config.write_text(_job("kept", kept_out, "1s", KEEP_ALL) + 'jitter = "oops"\n')
        proc.send_signal(signal.SIGHUP)
        said = _wait_for(proc, seen, "SIGHUP: reload")
        assert "refused, the running config stays" in said and "jitter" in said, said
        _wait_for(proc, seen, " new: slot ", " started, ")  # the running config still fires
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        kill_quietly(proc.pid)
    assert proc.returncode == 0, err
    seen += rest.splitlines(keepends=True)
    assert not any("old: slot " in line and " started," in line for line in seen[reloaded_at:])
    with open_store(url) as store:
        for job in ("kept", "old", "new"):
            slots = [r.slot for r in store.runs(job, limit=1000)]
            assert len(set(slots)) == len(slots), f"{job}: a slot ran twice"
        kept = sorted(r.slot or 0 for r in store.runs("kept", limit=1000))
        skipped = {e.data["slot"] for e in store.events(EventQuery(job="kept", kinds=[EventKind.SKIPPED]))}
        # kept: every second from its first slot to its last has a run or a
        # skip (its previous run still held the lease): none lost over two reloads.
        covered = set(kept) | skipped
        assert covered >= {float(t) for t in range(int(kept[0]), int(kept[-1]) + 1)}, sorted(covered)
        assert len(store.runs("new", limit=1000)) >= 2 and store.runs("old", limit=1000)
    # Their commands ran (the last run may have been stopped before it wrote).
    assert old_out.read_text() and new_out.read_text()


def test_the_config_reads_jitter_and_catchup(tmp_path: Path) -> None:
    from cronwarden.config import load

    path = tmp_path / "c.toml"
    path.write_text('[jobs.x]\nevery = "1m"\njitter = "20s"\ncatchup = "all"\ncatchup_window = "2h"\n'
                    'command = ["true"]\n')  # fmt: skip
    (job,) = load(str(path)).jobs
    assert (job.jitter, job.catchup, job.catchup_window) == (20.0, "all", 7200.0)
    path.write_text('[jobs.x]\nevery = "1m"\ncatchup = "most"\ncommand = ["true"]\n')
    with pytest.raises(Exception, match="catchup must be one of skip, latest, all, got 'most'"):
        load(str(path))
    assert JobSettings(name="y").catchup == "latest"


def test_a_fire_claims_its_slot_as_it_leaves_the_queue_so_a_dead_queue_loses_none(
    sqlite_store: Store,
) -> None:
    """With the claim taken at start (in-process fires), slots an instance
    had queued but not reached when it died are still unclaimed: another
    instance fires them."""
    clock = FakeClock(start=T0)
    job = every("tick", 60)
    queued, queued_launches, _ = scheduler(sqlite_store, [job], clock, "queued")
    queued.claims_at_start = lambda _job: True
    queued.tick()
    assert queued_launches.started == [("tick", T0, None)]  # in its queue, not claimed yet
    other, other_launches, _ = scheduler(sqlite_store, [job], clock, "other")
    other.tick()
    assert other_launches.started == [("tick", T0, None)] and other.fired == 1
    said = queued.claim_at_start(job, T0, None)
    assert said is not None and said.startswith("fired by other#") and queued.fired == 0
    clock.advance(60)
    queued.tick()
    assert queued.claim_at_start(job, T0 + 60, None) is None and queued.fired == 1
