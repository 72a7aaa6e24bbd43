"""The slot ledger on every store: over a scripted week (injected clock),
every expected slot of a scheduled job is listed exactly once with the one
decision it got; the monitor's ``missed`` names its slot; ``history`` shows
every refusal of the runs it shows."""

from __future__ import annotations

import json

import pytest

from cronwarden import cli
from cronwarden.cli.status import main_history
from cronwarden.clock import Clock, FakeClock
from cronwarden.events import Event, EventKind, Outcome, new_id
from cronwarden.monitor import Monitor
from cronwarden.monitor.slots import RANK
from cronwarden.monitor.views import history_items
from cronwarden.stores.base import End, Granted, Refused, Start, Store
from monitor_history import describe, history_clock

JOB = "hourly"
HOUR = 3600.0
GRACE = 600.0


@pytest.fixture
def mclock(clock: Clock) -> FakeClock:
    return history_clock(clock)


def start(store: Store, at: float, slot: float | None) -> Granted | Refused:
    return store.acquire(
        Start(job=JOB, key=JOB, run_id=new_id(), host="h", pid=1, ttl=3 * 86400.0, at=at, slot=slot)
    )


def finish(store: Store, started: Granted | Refused, at: float) -> str:
    assert isinstance(started, Granted), started
    assert store.finish(started.lease, End(outcome=Outcome.SUCCEEDED, at=at, exit_code=0)).recorded
    return started.lease.run_id


def test_history_slots_over_a_scripted_week_lists_every_slot_once_with_its_decision(
    store: Store, mclock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    week_start = (mclock.wall() // HOUR) * HOUR - 7 * 86400
    describe(store, JOB, period=HOUR, at=week_start - 60, grace=GRACE)
    slots = [week_start + n * HOUR for n in range(1, 169)]  # (now - 7d, now]
    expected: dict[float, tuple[str, str | None]] = {}
    monitor = Monitor(store, clock=mclock)
    missed_named: list[float] = []
    n = 0
    while n < len(slots) - 1:
        s = slots[n]
        if n == 10:  # a run of 2.5 h: the next two slots are refused by it
            long_run = start(store, s + 5, s)
            assert isinstance(long_run, Granted)
            holder = long_run.lease.run_id
            expected[s] = ("ran", holder)
            for k in (1, 2):
                assert isinstance(start(store, slots[n + k] + 3, slots[n + k]), Refused)
                expected[slots[n + k]] = ("skipped", holder)
            finish(store, long_run, s + 2.5 * HOUR)
            n += 3
            continue
        if n in (30, 31):  # the scheduler's host was down
            expected[s] = ("missed", None)
            mclock.advance(max(0.0, s + GRACE + 1 - mclock.wall()))
            missed_named += [e.data["slot"] for e in monitor.evaluate().raised if e.kind is EventKind.MISSED]
        elif n == 50:  # started 25 minutes late
            expected[s] = ("late", finish(store, start(store, s + 1500, s), s + 1600))
        elif n == 70:  # a second crontab line: its start is the slot's extra
            first = start(store, s + 1, s)
            assert isinstance(start(store, s + 1.5, s), Refused)
            expected[s] = ("ran", finish(store, first, s + 60))
        elif n == 90:
            store.record(Event(kind=EventKind.PAUSED, job=JOB, at=s, data={"slot": s, "by": "ops"}))
            expected[s] = ("paused", None)
        elif n == 100:
            store.record(
                Event(kind=EventKind.MISFIRED, job=JOB, at=s + 900, data={"slot": s, "late_by": 900})
            )
            expected[s] = ("misfired", None)
        else:
            expected[s] = ("ran", finish(store, start(store, s + 5, s), s + 1200))
        n += 1
    expected[slots[-1]] = ("due", None)  # its grace has not passed
    mclock.advance(slots[-1] + 300 - mclock.wall())

    args = cli.command_parser("history").parse_args(
        [JOB, "--slots", "--since", "7d", "--json", "--store", store.url]
    )
    assert main_history(args, clock=mclock) == 0
    items = json.loads(capsys.readouterr().out)

    assert [i["slot"] for i in items] == sorted(slots, reverse=True)  # every slot, once, newest first
    got = {i["slot"]: (i["decision"], i["run_id"] if i["decision"] in ("ran", "late", "skipped") else None)
           for i in items}  # fmt: skip
    assert got == expected
    assert all(i["decision"] in RANK for i in items)
    [doubled] = [i for i in items if i["slot"] == slots[70]]
    assert [x.split(":")[0] for x in doubled["extra"]] == ["skipped"]
    [late] = [i for i in items if i["decision"] == "late"]
    assert late["late_by"] == 1500
    # The monitor's missed finding names the first slot nothing started for.
    assert missed_named == [slots[30]]

    args = cli.command_parser("history").parse_args([JOB, "--slots", "--limit", "3", "--store", store.url])
    assert main_history(args, clock=mclock) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines[1:]] == ["due", "ran", "ran"], lines


def test_history_slots_of_a_job_with_no_schedule_says_so_in_one_line(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["history", "adhoc", "--slots", "--store", store.url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no schedule known for adhoc" in err[0], err
    assert cli.main(["history", "adhoc", "--since", "7d", "--store", store.url]) == 2
    assert "--since is the span of --slots" in capsys.readouterr().err


def test_history_shows_a_skip_stamped_just_before_its_holders_start(store: Store, mclock: FakeClock) -> None:
    """The refusal's writer and the holder's host have different clocks:
    the skip can be stamped before the start of the run that refused it."""
    t = mclock.wall() - 3600
    holder = start(store, t, None)
    assert isinstance(holder, Granted)
    refused = start(store, t - 0.00075, None)
    assert isinstance(refused, Refused)
    finish(store, holder, t + 60)

    items = history_items(store, JOB, 20)

    assert [(i["type"], i.get("holder_run_id")) for i in items] == [
        ("run", None),
        ("skipped", holder.lease.run_id),
    ]
