"""Report-only runs on every store: written with the existing contract
(acquire on the run's own key, finish), never refused, overlaps named."""

from __future__ import annotations

import re

import pytest

from cronwarden import cli
from cronwarden.clock import Clock, FakeClock
from cronwarden.errors import UsageError
from cronwarden.events import EventKind, Outcome
from cronwarden.report import Reporter
from cronwarden.stores.base import EventQuery, Store
from monitor_history import PERIOD, begin, describe, history_clock, lease_of

JOB = "vendor-export"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


@pytest.fixture
def mclock(clock: Clock) -> FakeClock:
    return history_clock(clock)


@pytest.fixture
def reporter(store: Store, mclock: FakeClock) -> Reporter:
    return Reporter(store, clock=mclock, host="vendor-box")


def overlaps(store: Store, job: str = JOB) -> list[tuple[str | None, dict[str, object]]]:
    found = store.events(EventQuery(job=job, kinds=[EventKind.OVERLAP], limit=100, newest_first=False))
    return [(e.run_id, dict(e.data)) for e in found]


def test_two_report_only_starts_with_no_finish_between_record_overlap_naming_both(
    store: Store, reporter: Reporter, mclock: FakeClock
) -> None:
    first = reporter.start(JOB, "11111111-1111-4111-8111-111111111111")
    mclock.advance(60)
    second = reporter.start(JOB, "22222222-2222-4222-8222-222222222222")

    assert (first.overlapped, second.overlapped) == ((), (first.run_id,))
    [(run_id, data)] = overlaps(store)
    assert run_id == second.run_id
    assert data["holder_run_id"] == first.run_id
    assert data["run_ids"] == [first.run_id, second.run_id]


def test_report_start_after_the_previous_run_ended_records_no_overlap(
    store: Store, reporter: Reporter, mclock: FakeClock
) -> None:
    first = reporter.start(JOB).run_id
    mclock.advance(30)
    reporter.success(JOB, first)
    mclock.advance(PERIOD)

    assert reporter.start(JOB).overlapped == ()
    assert overlaps(store) == []


def test_reported_run_records_its_duration_and_outcome(
    store: Store, reporter: Reporter, mclock: FakeClock
) -> None:
    run_id = reporter.start(JOB).run_id
    mclock.advance(95)

    assert reporter.fail(JOB, run_id, exit_code=3)

    run = store.run(run_id)
    assert run is not None
    assert (run.outcome, run.exit_code, run.duration, run.host) == (Outcome.FAILED, 3, 95.0, "vendor-box")
    assert store.open_runs(JOB) == []


def test_report_only_run_holds_no_lease_on_the_job_key(store: Store, reporter: Reporter) -> None:
    reporter.start(JOB)

    assert store.lease(JOB) is None
    lease_of(begin(store, JOB, reporter.clock.wall()))  # a guarded start is not refused


def test_report_start_while_a_guarded_run_is_open_records_overlap(
    store: Store, reporter: Reporter, mclock: FakeClock
) -> None:
    guarded = lease_of(begin(store, JOB, mclock.wall()))
    mclock.advance(5)

    reported = reporter.start(JOB)

    assert reported.overlapped == (guarded.run_id,)


def test_a_second_end_for_the_same_run_records_nothing(store: Store, reporter: Reporter) -> None:
    run_id = reporter.start(JOB).run_id

    assert reporter.success(JOB, run_id) is True
    assert reporter.fail(JOB, run_id, exit_code=1) is False
    run = store.run(run_id)
    assert run is not None and run.outcome is Outcome.SUCCEEDED


def test_starting_the_same_run_id_twice_records_one_run(store: Store, reporter: Reporter) -> None:
    run_id = reporter.start(JOB).run_id

    again = reporter.start(JOB, run_id)

    assert again.already_started and again.overlapped == ()
    assert [r.run_id for r in store.open_runs(JOB)] == [run_id]


def test_end_without_a_recorded_start_is_a_usage_error(reporter: Reporter) -> None:
    with pytest.raises(UsageError, match="no start recorded"):
        reporter.success(JOB, "33333333-3333-4333-8333-333333333333")


def test_report_only_run_past_its_ttl_is_abandoned_by_the_next_report_start(
    store: Store, reporter: Reporter, lapse
) -> None:
    silent = reporter.start(JOB, ttl=lapse.ttl).run_id
    [opened] = store.open_runs(JOB)
    from cronwarden.lease import Lease

    lapse.expire(store, Lease(key=opened.key, job=JOB, run_id=silent, token=opened.token, ttl=lapse.ttl))

    nxt = reporter.start(JOB)

    assert (nxt.abandoned, nxt.overlapped) == ((silent,), ())
    run = store.run(silent)
    assert run is not None and run.outcome is Outcome.ABANDONED


def test_report_ttl_defaults_to_three_periods_of_the_described_job(
    store: Store, reporter: Reporter, mclock: FakeClock
) -> None:
    describe(store, JOB, at=mclock.wall())
    run_id = reporter.start(JOB).run_id

    info = store.lease(f"{JOB}+{run_id}")

    assert info is not None and info.expires_in is not None
    assert 3 * PERIOD - 30 < info.expires_in <= 3 * PERIOD


def test_cli_report_start_prints_a_new_uuid_and_success_ends_that_run(
    store: Store, store_url: str, capsys
) -> None:
    assert cli.main(["report", "start", "--job", JOB, "--store", store_url]) == 0
    run_id = capsys.readouterr().out.strip()
    assert UUID.fullmatch(run_id)

    assert cli.main(["report", "success", "--job", JOB, "--run-id", run_id, "--store", store_url]) == 0

    run = store.run(run_id)
    assert run is not None and (run.outcome, run.exit_code) == (Outcome.SUCCEEDED, 0)


def test_cli_report_second_open_start_warns_of_the_overlap_on_stderr(store_url: str, capsys) -> None:
    args = ["report", "start", "--job", JOB, "--store", store_url]
    assert cli.main([*args, "--run-id", "a1"]) == 0
    assert cli.main([*args, "--run-id", "b2"]) == 0

    err = capsys.readouterr().err
    assert err.strip() == f"cronwarden: {JOB}: run b2 started while a1 still open; recorded overlap"


def test_cli_report_fail_without_run_id_exits_2_with_one_line(store_url: str, capsys) -> None:
    assert cli.main(["report", "fail", "--job", JOB, "--store", store_url]) == 2

    assert capsys.readouterr().err == "cronwarden: report fail: give --run-id, the id report start printed\n"


def test_cli_report_describe_saves_schedule_policy_and_reason(store: Store, store_url: str) -> None:
    code = cli.main(["report", "describe", "--job", JOB, "--schedule", "*/15 * * * *", "--tz", "UTC",
                     "--grace", "5m", "--policy", "skip", "--reason", "one file per window",
                     "--store", store_url])  # fmt: skip

    assert code == 0
    [info] = store.jobs()
    assert (info.name, info.schedule, info.grace, info.policy, info.reason) == (
        JOB, "CRON_TZ=UTC */15 * * * *", 300.0, "skip", "one file per window",
    )  # fmt: skip


def test_a_start_that_loses_a_race_for_its_run_id_reports_already_started(
    store: Store, reporter: Reporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``report start --run-id X`` at once: both find no run X, one
    acquires, the other's acquire is refused by the store (SQLite,
    PostgreSQL: the run row exists) or lands on the same lease (Redis).
    Either way the second answers "already started", exit 0."""
    first = reporter.start("export", "11111111-2222-3333-4444-555555555555")
    real_run = store.run
    calls = []

    def not_yet(run_id: str) -> object:  # the second start's check ran before the first wrote
        calls.append(run_id)
        return None if len(calls) == 1 else real_run(run_id)

    monkeypatch.setattr(store, "run", not_yet)
    second = reporter.start("export", first.run_id)
    assert second.already_started
    [run] = [r for r in store.runs("export", 10) if r.run_id == first.run_id]
    assert run.outcome is None
