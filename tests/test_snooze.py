"""Snoozes and maintenance windows: a snoozed job's findings are recorded
and shown, marked snoozed, and not delivered to alerting sinks; the snooze
is an event saying who and why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from tests.receivers import Receiver

from cronwarden import cli
from cronwarden.clock import FakeClock
from cronwarden.config.windows import Window
from cronwarden.errors import UsageError
from cronwarden.events import Event, EventKind, Outcome
from cronwarden.monitor import JobRules, Monitor
from cronwarden.stores.base import EventQuery, Store
from monitor_history import aligned, run

JOB = "nightly"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def failing_events(store: Store) -> list[Event]:
    return store.events(EventQuery(job=JOB, kinds=[EventKind.FAILING], limit=100, newest_first=False))


def test_a_snoozed_jobs_findings_are_recorded_and_not_delivered_to_a_webhook(
    store: Store, store_url: str, receiver: Receiver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "cronwarden.toml"
    config.write_text(
        f'[sinks.pager]\ntype = "webhook"\nurl = "{receiver.url()}"\nsecret = "s3cret"\n'
        'kinds = ["findings"]\n'
    )
    base = ["--store", store_url]
    monitor = ["monitor", "--once", "--quiet", "--config", str(config), *base]
    why = "vendor API down until tonight"
    assert cli.main(["snooze", JOB, "--for", "2h", "--reason", why, "--by", "alice", *base]) == 0
    assert cli.main(["run", "--job", JOB, "--config", str(config), *base, "--", "false"]) == 1
    assert cli.main(monitor) == 0
    out = capsys.readouterr().out
    assert f"snoozed {JOB} until " in out and "(2h) by alice: vendor API down until tonight" in out

    [snoozed] = store.events(EventQuery(job=JOB, kinds=[EventKind.SNOOZED], limit=10))
    assert (snoozed.data["by"], snoozed.data["reason"]) == ("alice", "vendor API down until tonight")
    [raised] = failing_events(store)
    assert raised.data["state"] == "raised" and raised.data["snoozed"] is True
    assert raised.data["snooze"]["by"] == "alice" and raised.data["snooze"]["until"] == snoozed.data["until"]
    assert receiver.requests == []  # recorded, not delivered

    # check shows it, marked, and does not page for it.
    assert cli.main(["check", *base]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "CRONWARDEN OK - 1 job, no problems (1 snoozed)", lines
    assert lines[1].startswith(f"CRITICAL {JOB} failing: ") and lines[1].endswith("(snoozed)")

    # The resolution of a finding nobody was told of is not news either.
    assert cli.main(["unsnooze", JOB, "--by", "alice", "--reason", "vendor is back", *base]) == 0
    assert cli.main(["run", "--job", JOB, "--config", str(config), *base, "--", "true"]) == 0
    assert cli.main(monitor) == 0
    assert [e.data["state"] for e in failing_events(store)] == ["raised", "resolved"]
    assert failing_events(store)[1].data["snoozed"] is True
    assert receiver.requests == []

    # Unsnoozed: the next failure pages.
    assert cli.main(["run", "--job", JOB, "--config", str(config), *base, "--", "false"]) == 1
    assert cli.main(monitor) == 0
    third = failing_events(store)[2]
    assert "snoozed" not in third.data
    delivered = [json.loads(r.body) for r in receiver.requests]
    assert [(e["kind"], e["event_id"]) for e in delivered] == [("failing", third.event_id)]
    [unsnoozed] = store.events(EventQuery(job=JOB, kinds=[EventKind.UNSNOOZED], limit=10))
    assert (unsnoozed.data["by"], unsnoozed.data["reason"]) == ("alice", "vendor is back")


def test_snooze_refuses_bad_input_in_one_line(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["snooze", JOB, "--for", "2h", "--reason", " "], "--reason must be one sentence saying why"),
        (["snooze", JOB, "--for", "soon", "--reason", "x"], "--for must be a duration like"),
        (["snooze", JOB, "--for", "800d", "--reason", "x"], "--for must be at most a year"),
        (["snooze", "no/such", "--for", "1h", "--reason", "x"], "job name must be 1-128 characters"),
        (["unsnooze", JOB], f"unsnooze: {JOB} is not snoozed"),
    ]:
        assert cli.main([*argv, "--store", store_url]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], (argv, err)


def at_berlin(y: int, mo: int, d: int, h: int, mi: int) -> float:
    return datetime(y, mo, d, h, mi, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()


def test_maintenance_windows_recur_weekly_in_their_time_zone() -> None:
    w = Window.parse("Sun 02:00-04:00 Europe/Berlin")
    # 2026-11-29 is a Sunday.
    assert w.end_of(at_berlin(2026, 11, 29, 1, 59)) is None
    assert w.end_of(at_berlin(2026, 11, 29, 2, 0)) == at_berlin(2026, 11, 29, 4, 0)
    assert w.end_of(at_berlin(2026, 11, 29, 3, 59)) == at_berlin(2026, 11, 29, 4, 0)
    assert w.end_of(at_berlin(2026, 11, 29, 4, 0)) is None
    assert w.end_of(at_berlin(2026, 11, 22, 3, 0)) == at_berlin(2026, 11, 22, 4, 0)  # a week earlier
    assert w.end_of(at_berlin(2026, 11, 30, 3, 0)) is None  # Monday
    night = Window.parse("Mon-Fri 23:00-01:00 Europe/Berlin")  # across midnight
    assert night.end_of(at_berlin(2026, 11, 28, 0, 30)) == at_berlin(2026, 11, 28, 1, 0)  # Friday's, on Sat
    assert night.end_of(at_berlin(2026, 11, 29, 0, 30)) is None  # Saturday's does not exist
    assert Window.parse("daily 00:00-00:00 UTC").end_of(at_berlin(2026, 11, 29, 12, 0)) is not None
    for bad, says in [
        ("Sunday at two", "maintenance windows look like"),
        ("Sun 02:00-25:00 UTC", "times must be HH:MM from 00:00 to 24:00"),
        ("Sn 02:00-04:00", "days must be like Sun, Mon-Fri"),
        ("Sun 02:00-04:00 Mars/Olympus", "time zone must be an IANA name"),
    ]:
        with pytest.raises(UsageError, match=says):
            Window.parse(bad)


def test_findings_in_a_maintenance_window_are_marked_snoozed_and_outside_it_are_not(store: Store) -> None:
    window = Window.parse("Sun 02:00-04:00 Europe/Berlin")
    sunday = at_berlin(2026, 11, 29, 2, 30)
    clock = FakeClock(start=sunday)
    monitor = Monitor(store, clock=clock, job_rules={JOB: JobRules(maintenance=(window,))})
    run(store, JOB, aligned(sunday - 3600), 30.0, Outcome.FAILED)

    [raised] = monitor.evaluate().raised
    assert raised.kind is EventKind.FAILING and raised.data["snoozed"] is True
    assert raised.data["snooze"] == {"until": at_berlin(2026, 11, 29, 4, 0), "by": "", "reason": "",
                                     "window": "Sun 02:00-04:00 Europe/Berlin"}  # fmt: skip
    assert monitor.evaluate().severity == 0  # shown, but pages no one

    clock.advance(at_berlin(2026, 11, 29, 4, 5) - clock.wall())
    run(store, JOB, clock.wall() - 60, 20.0, Outcome.TIMED_OUT)
    run(store, "other", clock.wall() - 30, 20.0, Outcome.FAILED)
    result = monitor.evaluate()
    [other] = [e for e in result.raised if e.job == "other"]
    assert "snoozed" not in other.data and result.severity == 2


def test_config_maintenance_windows_are_checked_with_their_line(tmp_path: Path, capsys) -> None:
    config = tmp_path / "cronwarden.toml"
    config.write_text('[jobs.nightly]\nevery = "1d"\nmaintenance = ["Sun 02:00-04:00 Europe/Berlin"]\n')
    assert cli.main(["config", "check", "--config", str(config)]) == 0
    capsys.readouterr()
    config.write_text('[jobs.nightly]\nevery = "1d"\nmaintenance = ["Sun 2-4"]\n')
    assert cli.main(["config", "check", "--config", str(config)]) == 2
    said = capsys.readouterr()
    text = said.out + said.err
    assert f"{config}:3:" in text and "maintenance windows look like" in text, text
