"""The findings people page on, on every store: ``failing`` at the job's
failure and recovery thresholds, jobs known only through their runs,
``too_often`` for a doubled crontab, and start grace kept apart from the
runtime limit. Histories are scripted on an injected clock."""

from __future__ import annotations

import json

import pytest

from cronwarden import cli
from cronwarden.clock import Clock, FakeClock
from cronwarden.events import Event, EventKind, Outcome
from cronwarden.monitor import RAISED, RESOLVED, JobRules, Monitor, Verdict
from cronwarden.stores.base import EventQuery, Refused, Store
from monitor_history import PERIOD, aligned, begin, describe, end, history_clock, lease_of, run

JOB = "nightly"


@pytest.fixture
def mclock(clock: Clock) -> FakeClock:
    return history_clock(clock)


def findings(store: Store, kind: EventKind, job: str = JOB) -> list[Event]:
    found = store.events(EventQuery(job=job, kinds=[kind], limit=10_000, newest_first=False))
    return [e for e in found if "state" in e.data]


def play(store: Store, mclock: FakeClock, monitor: Monitor, outcomes: list[Outcome], t: float) -> list[str]:
    """One run per slot ending as ``outcomes`` says, a pass after each: the
    ``failing`` changes as "index:state"."""
    seen = []
    for i, outcome in enumerate(outcomes):
        run(store, JOB, t + i * PERIOD, 30.0, outcome)
        mclock.advance(t + i * PERIOD + 31 - mclock.wall())
        result = monitor.evaluate()
        seen += [
            f"{i}:{e.data['state']}"
            for e in (*result.raised, *result.resolved)
            if e.kind is EventKind.FAILING
        ]
    return seen


S, F = Outcome.SUCCEEDED, Outcome.FAILED


def test_failing_is_raised_at_the_failure_threshold_and_resolved_at_the_recovery_threshold(
    store: Store, mclock: FakeClock
) -> None:
    t = aligned(mclock.wall() - 86400)
    describe(store, JOB, at=t)
    monitor = Monitor(
        store, clock=mclock, job_rules={JOB: JobRules(failure_threshold=3, recovery_threshold=2)}
    )
    #          0  1  2  3  4  5  6  7  8  9  10 11 12
    outcomes = [S, F, F, S, F, F, F, S, F, S, S, F, F]

    seen = play(store, mclock, monitor, outcomes, t)

    # Two bad in a row are not enough; the third raises; one success (then a failure) does not
    # recover; two successes in a row do; the last two failures are under the threshold again.
    assert seen == [f"6:{RAISED}", f"10:{RESOLVED}"]
    [raised, resolved] = findings(store, EventKind.FAILING)
    assert (raised.data["count"], raised.data["threshold"], raised.data["last_outcome"]) == (3, 3, "failed")
    assert raised.data["severity"] == "critical" and "3 runs in a row ended badly" in raised.data["summary"]
    assert resolved.data["raised_at"] == raised.at
    assert monitor.evaluate().raised == () and monitor.evaluate().resolved == ()


@pytest.mark.parametrize(
    "outcome", [Outcome.FAILED, Outcome.LEASE_LOST, Outcome.TIMED_OUT, Outcome.ABANDONED, Outcome.INTERRUPTED]
)
def test_each_bad_ending_counts_toward_failing_with_the_default_thresholds(
    store: Store, mclock: FakeClock, outcome: Outcome
) -> None:
    t = aligned(mclock.wall() - 86400)
    describe(store, JOB, at=t)

    seen = play(store, mclock, Monitor(store, clock=mclock), [S, outcome, S], t)

    assert seen == [f"1:{RAISED}", f"2:{RESOLVED}"]


def test_stopped_and_replaced_runs_neither_count_nor_break_a_streak(store: Store, mclock: FakeClock) -> None:
    t = aligned(mclock.wall() - 86400)
    describe(store, JOB, at=t)
    monitor = Monitor(store, clock=mclock, job_rules={JOB: JobRules(failure_threshold=2)})

    seen = play(store, mclock, monitor, [S, Outcome.STOPPED, Outcome.REPLACED, F, Outcome.STOPPED, F], t)

    assert seen == [f"5:{RAISED}"]


def test_a_job_seen_only_through_its_runs_is_judged_failing_by_check_and_audit(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(2):
        assert cli.main(["run", "--job", "plainfail", "--store", store_url, "--", "false"]) == 1
    assert cli.main(["run", "--job", "plainok", "--store", store_url, "--", "true"]) == 0
    capsys.readouterr()

    assert cli.main(["check", "--store", store_url]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "CRONWARDEN CRITICAL - 1 critical in 2 jobs", lines
    assert lines[1].startswith("CRITICAL plainfail failing: 2 runs in a row ended badly (failed, failed;")

    assert cli.main(["audit", "--json", "--store", store_url]) == 0
    verdicts = {j["job"]: j["verdict"] for j in json.loads(capsys.readouterr().out)}
    assert verdicts == {"plainfail": Verdict.FAILING.value, "plainok": Verdict.UNSCHEDULED.value}

    assert cli.main(["run", "--job", "plainfail", "--store", store_url, "--", "true"]) == 0
    capsys.readouterr()
    assert cli.main(["check", "--store", store_url]) == 0
    assert capsys.readouterr().out.splitlines() == ["CRONWARDEN OK - 2 jobs, no problems"]


def test_an_unscheduled_job_is_judged_for_overlap_and_stuck_but_never_missed(
    store: Store, mclock: FakeClock
) -> None:
    monitor = Monitor(store, clock=mclock)
    t = mclock.wall() - 7 * 86400
    run(store, "adhoc", t, 5.0)
    mclock.advance(60)

    result = monitor.evaluate()

    [stats] = result.stats
    assert (stats.job, stats.verdict(monitor.thresholds)) == ("adhoc", Verdict.UNSCHEDULED)
    assert result.active == ()
    open_run = lease_of(begin(store, "adhoc", mclock.wall() - 30, key="adhoc+a"))
    lease_of(begin(store, "adhoc", mclock.wall() - 10, key="adhoc+b"))
    assert [c.rule for c in monitor.evaluate().active] == [EventKind.OVERLAP]
    end(store, open_run, mclock.wall())


def test_a_doubled_crontab_raises_too_often_and_a_single_extra_start_does_not(
    store: Store, mclock: FakeClock
) -> None:
    t = aligned(mclock.wall() - 86400)
    describe(store, JOB, at=t)
    monitor = Monitor(store, clock=mclock)

    def slot(n: int, starts: int) -> list[str]:
        at = t + n * PERIOD
        lease = lease_of(begin(store, JOB, at + 0.2))
        for k in range(1, starts):
            assert isinstance(begin(store, JOB, at + 0.2 + k * 0.01), Refused)  # the other line, skipped
        end(store, lease, at + 40)
        mclock.advance(at + 41 - mclock.wall())
        result = monitor.evaluate()
        return [e.data["state"] for e in (*result.raised, *result.resolved) if e.kind is EventKind.TOO_OFTEN]

    assert slot(0, 1) == []
    assert slot(1, 2) == []  # someone ran it by hand once: not a pattern
    assert slot(2, 1) == []
    assert slot(3, 2) == []
    assert slot(4, 2) == [RAISED]  # the crontab line was doubled
    assert slot(5, 2) == []
    assert slot(6, 1) == [RESOLVED]
    [raised] = [e for e in findings(store, EventKind.TOO_OFTEN) if e.data["state"] == RAISED]
    assert raised.data["starts"] == [2, 2] and raised.data["slots"] == [t + 4 * PERIOD, t + 3 * PERIOD]
    assert raised.data["severity"] == "warning"


def test_start_grace_and_max_runtime_are_separate_settings(store: Store, mclock: FakeClock) -> None:
    """A run that takes long but started on time is not a missed slot; a
    run that started late is not stuck: grace judges starts, max_runtime
    judges runs."""
    t = aligned(mclock.wall() - 86400)
    describe(store, JOB, at=t - 60, grace=120.0, max_runtime=1800.0)
    monitor = Monitor(store, clock=mclock)
    long_run = lease_of(begin(store, JOB, t + 1))
    for n in (1, 2):  # the next slots fire on time and are skipped: the scheduler is alive
        assert isinstance(begin(store, JOB, t + n * PERIOD + 1), Refused)
    mclock.advance(t + 1790 - mclock.wall())
    assert {c.rule for c in monitor.evaluate().active} == set()  # 29m50s open, slots all started

    mclock.advance(20)
    assert {c.rule for c in monitor.evaluate().active} == {EventKind.STUCK}  # past max_runtime 30m
    end(store, long_run, mclock.wall())
    late = t + 4 * PERIOD + 121  # 2m1s after its slot: the grace is over
    mclock.advance(late - mclock.wall())
    assert {c.rule for c in monitor.evaluate().active} == {EventKind.MISSED}
    lease_of(begin(store, JOB, late))
    mclock.advance(1)
    assert {c.rule for c in monitor.evaluate().active} == set()


def test_config_thresholds_are_per_job_and_bad_ones_are_one_line_exit_2(
    store: Store, store_url: str, mclock: FakeClock, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    t = aligned(time.time() - 3600)
    config = tmp_path / "cronwarden.toml"
    config.write_text("[defaults]\nfailure_threshold = 2\n\n[jobs.lenient]\n"
                      "failure_threshold = 3\n")  # fmt: skip
    for job in ("lenient", "other"):
        for n in range(2):
            run(store, job, t + n * PERIOD, 5.0, F)

    assert cli.main(["check", "--json", "--dry-run", "--config", str(config), "--store", store_url]) == 2
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert [(p["job"], p["rule"]) for p in problems] == [("other", "failing")]

    config.write_text("[jobs.lenient]\nfailure_threshold = 0\n")
    assert cli.main(["check", "--config", str(config), "--store", store_url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "failure_threshold must be a whole number of at least 1" in err[0], err
