"""The monitor on every store: statistics from bounded reads, rules raised
once when they become true and resolved once when they stop."""

from __future__ import annotations

import io
import statistics

import pytest

from cronwarden import cli
from cronwarden.cli.monitor import watch
from cronwarden.clock import Clock, FakeClock
from cronwarden.events import Event, EventKind, Outcome
from cronwarden.monitor import RAISED, RESOLVED, Monitor, Severity, Thresholds, quantile
from cronwarden.policy import Policy
from cronwarden.report import Reporter
from cronwarden.stores.base import EventQuery, Refused, Store
from monitor_history import PERIOD, aligned, begin, describe, end, history_clock, lease_of, run

JOB = "reconcile"


@pytest.fixture
def mclock(clock: Clock) -> FakeClock:
    return history_clock(clock)


def findings(store: Store, kind: EventKind, job: str = JOB) -> list[Event]:
    found = store.events(EventQuery(job=job, kinds=[kind], limit=10_000, newest_first=False))
    return [e for e in found if "state" in e.data]


def states(store: Store, kind: EventKind, job: str = JOB) -> list[str]:
    return [e.data["state"] for e in findings(store, kind, job)]


def test_quantile_matches_the_inclusive_method_of_statistics() -> None:
    values = sorted([12.0, 3.0, 7.5, 99.0, 41.0, 8.0, 8.0, 60.0])
    expected = statistics.quantiles(values, n=100, method="inclusive")
    assert quantile(values, 0.95) == pytest.approx(expected[94])
    assert quantile(values, 0.5) == pytest.approx(statistics.median(values))


def test_slow_is_raised_exactly_when_p95_crosses_two_thirds_of_the_period_and_resolved_once(
    store: Store, mclock: FakeClock
) -> None:
    window = 10
    monitor = Monitor(store, clock=mclock, thresholds=Thresholds(runs=window))
    t = aligned(mclock.wall() - 2 * 86400)
    describe(store, JOB, at=t)
    # Durations creep from 4 to 8.5 minutes on a 10-minute period, then fall back to 4.
    durations = [240.0 + 15 * i for i in range(19)] + [240.0] * 12
    expected: list[str] = []
    seen: list[str] = []
    raised = False
    for i, d in enumerate(durations):
        run(store, JOB, t, d)
        mclock.advance(t + d + 1 - mclock.wall())
        recent = sorted(durations[max(0, i + 1 - window) : i + 1])
        over = len(recent) >= 3 and statistics.quantiles(recent, n=100, method="inclusive")[94] >= 400
        if over != raised:
            expected.append(f"{i}:{RAISED if over else RESOLVED}")
            raised = over
        result = monitor.evaluate()
        seen += [
            f"{i}:{e.data['state']}" for e in (*result.raised, *result.resolved) if e.kind is EventKind.SLOW
        ]
        t += PERIOD

    assert len(expected) == 2, "the script must cross the threshold once each way"
    assert seen == expected
    assert states(store, EventKind.SLOW) == [RAISED, RESOLVED]


def test_three_skips_in_a_row_raise_skips_in_a_row_once(store: Store, mclock: FakeClock) -> None:
    monitor = Monitor(store, clock=mclock)
    t = aligned(mclock.wall() - 3600)
    describe(store, JOB, at=t)
    holder = lease_of(begin(store, JOB, t))
    for n in range(1, 6):
        assert isinstance(begin(store, JOB, t + n * PERIOD), Refused)
        mclock.advance(t + n * PERIOD + 1 - mclock.wall())
        monitor.evaluate()
        assert states(store, EventKind.SKIPS_IN_A_ROW) == ([] if n < 3 else [RAISED])

    [raised] = findings(store, EventKind.SKIPS_IN_A_ROW)
    assert raised.data["count"] == 3
    end(store, holder, t + 5 * PERIOD + 30)
    lease_of(begin(store, JOB, t + 6 * PERIOD))
    mclock.advance(t + 6 * PERIOD + 1 - mclock.wall())
    monitor.evaluate()
    monitor.evaluate()
    assert states(store, EventKind.SKIPS_IN_A_ROW) == [RAISED, RESOLVED]


def test_missed_slot_is_raised_after_grace_not_before(store: Store, mclock: FakeClock) -> None:
    monitor = Monitor(store, clock=mclock)
    slot = aligned(mclock.wall() - 3600)
    describe(store, JOB, at=slot - 60, grace=120.0)
    run(store, JOB, slot + 1, 30)
    next_due = slot + PERIOD

    mclock.advance(next_due + 119 - mclock.wall())
    assert not monitor.evaluate().raised
    mclock.advance(2)
    [missed] = monitor.evaluate().raised

    assert (missed.kind, missed.data["slot"]) == (EventKind.MISSED, next_due)
    assert monitor.evaluate().raised == ()
    run(store, JOB, mclock.wall(), 5)
    mclock.advance(10)
    monitor.evaluate()
    assert states(store, EventKind.MISSED) == [RAISED, RESOLVED]


def test_run_whose_lease_expired_is_stuck_even_when_three_later_runs_succeeded(
    store: Store, mclock: FakeClock, lapse
) -> None:
    monitor = Monitor(store, clock=mclock)
    t = mclock.wall() - 3600
    describe(store, JOB, at=t - 60)
    dead = lease_of(begin(store, JOB, t, ttl=lapse.ttl))
    lapse.expire(store, dead)
    for n in range(1, 4):
        run(store, JOB, t + n * PERIOD, 20)
    mclock.advance(t + 4 * PERIOD - mclock.wall())

    result = monitor.evaluate()

    stuck = [c for c in result.active if c.rule is EventKind.STUCK]
    assert [c.run_id for c in stuck] == [dead.run_id]
    assert stuck[0].severity is Severity.CRITICAL
    monitor.evaluate()
    assert [(e.run_id, e.data["state"]) for e in findings(store, EventKind.STUCK)] == [(dead.run_id, RAISED)]


def test_open_run_whose_lease_expired_is_recorded_abandoned_and_stuck(
    store: Store, mclock: FakeClock, lapse
) -> None:
    monitor = Monitor(store, clock=mclock)
    dead = lease_of(begin(store, JOB, mclock.wall() - 60, ttl=lapse.ttl))
    lapse.expire(store, dead)

    result = monitor.evaluate()

    assert result.abandoned == (dead.run_id,)
    found = store.run(dead.run_id)
    assert found is not None and found.outcome is Outcome.ABANDONED
    assert [e.run_id for e in result.raised if e.kind is EventKind.STUCK] == [dead.run_id]
    # The next pass reads the abandoned ending, a bad one: the job is failing (threshold 1).
    assert [e.kind for e in monitor.evaluate().raised] == [EventKind.FAILING]
    assert monitor.evaluate().raised == ()


def test_open_run_past_max_runtime_is_stuck_until_it_ends(store: Store, mclock: FakeClock) -> None:
    monitor = Monitor(store, clock=mclock)
    describe(store, JOB, at=mclock.wall() - 3600, max_runtime=300.0)
    long = lease_of(begin(store, JOB, mclock.wall() - 301, ttl=3600))

    [stuck] = monitor.evaluate().raised
    assert (stuck.kind, stuck.run_id) == (EventKind.STUCK, long.run_id)
    assert "max_runtime" in stuck.data["why"]

    end(store, long, mclock.wall() + 5)
    mclock.advance(10)
    [resolved] = monitor.evaluate().resolved
    assert (resolved.kind, resolved.run_id, resolved.data["state"]) == (
        EventKind.STUCK,
        long.run_id,
        RESOLVED,
    )


def test_acknowledged_stuck_run_is_not_raised_again(store: Store, mclock: FakeClock, lapse) -> None:
    monitor = Monitor(store, clock=mclock)
    dead = lease_of(begin(store, JOB, mclock.wall() - 60, ttl=lapse.ttl))
    lapse.expire(store, dead)
    monitor.evaluate()

    monitor.acknowledge(JOB, EventKind.STUCK, dead.run_id, by="on-call")
    mclock.advance(30)

    # The abandoned ending makes the job failing; the acknowledged stuck finding stays resolved.
    assert [e.kind for e in monitor.evaluate().raised] == [EventKind.FAILING]
    assert states(store, EventKind.STUCK) == [RAISED, RESOLVED]


def test_abandoned_run_stays_stuck_after_leaving_the_window_until_acknowledged(
    store: Store, mclock: FakeClock, lapse
) -> None:
    monitor = Monitor(store, clock=mclock, thresholds=Thresholds(runs=3))
    t = mclock.wall() - 6 * PERIOD
    describe(store, JOB, at=t - 60)
    dead = lease_of(begin(store, JOB, t, ttl=lapse.ttl))
    lapse.expire(store, dead)
    run(store, JOB, t + PERIOD, 20)
    monitor.evaluate()
    for n in range(2, 6):
        run(store, JOB, t + n * PERIOD, 20)
    mclock.advance(t + 6 * PERIOD + 60 - mclock.wall())

    result = monitor.evaluate()

    assert [c.run_id for c in result.active if c.rule is EventKind.STUCK] == [dead.run_id]
    assert [e for e in result.resolved if e.kind is EventKind.STUCK] == []
    monitor.acknowledge(JOB, EventKind.STUCK, dead.run_id)
    mclock.advance(1)
    assert [c for c in monitor.evaluate().active if c.rule is EventKind.STUCK] == []


def test_cli_ack_resolves_a_raised_stuck_finding(store: Store, store_url: str, lapse, capsys) -> None:
    describe(store, JOB, at=0.0)
    dead = lease_of(begin(store, JOB, 0.0, ttl=lapse.ttl))
    lapse.expire(store, dead)
    assert cli.main(["check", "--store", store_url]) == 2

    code = cli.main(["ack", "--job", JOB, "--run-id", dead.run_id, "--by", "on-call", "--store", store_url])

    assert code == 0
    assert states(store, EventKind.STUCK) == [RAISED, RESOLVED]
    assert findings(store, EventKind.STUCK)[-1].data["by"] == "on-call"


def test_cli_ack_of_a_finding_that_is_not_raised_exits_2(store_url: str, capsys) -> None:
    assert cli.main(["ack", "--job", JOB, "--run-id", "r1", "--store", store_url]) == 2

    assert capsys.readouterr().err == f"cronwarden: ack: no raised stuck finding for {JOB} run r1\n"


def test_grace_as_wide_as_the_period_raises_grace_too_wide(store: Store, mclock: FakeClock) -> None:
    describe(store, JOB, at=mclock.wall(), grace=PERIOD)
    describe(store, "tight", at=mclock.wall(), grace=PERIOD / 5)

    result = Monitor(store, clock=mclock).evaluate()

    assert [(e.job, e.kind) for e in result.raised] == [(JOB, EventKind.GRACE_TOO_WIDE)]
    assert result.severity is Severity.WARNING


def test_policy_undecided_is_resolved_once_a_reason_is_written(store: Store, mclock: FakeClock) -> None:
    monitor = Monitor(store, clock=mclock)
    t = aligned(mclock.wall() - 3600)
    describe(store, JOB, at=t)
    for n in range(4):
        run(store, JOB, t + n * PERIOD, 330)  # p95 55% of the period: under twice the p95
    mclock.advance(t + 3 * PERIOD + 340 - mclock.wall())

    assert [e.kind for e in monitor.evaluate().raised] == [EventKind.POLICY_UNDECIDED]
    describe(store, JOB, at=t, reason="one snapshot per window: a second start must skip")
    mclock.advance(1)
    assert [e.kind for e in monitor.evaluate().resolved] == [EventKind.POLICY_UNDECIDED]


def test_overlapping_report_only_runs_are_one_finding_resolved_when_the_first_ends(
    store: Store, mclock: FakeClock
) -> None:
    monitor = Monitor(store, clock=mclock)
    reporter = Reporter(store, clock=mclock, host="vendor-box")
    first = reporter.start(JOB).run_id
    mclock.advance(PERIOD)
    second = reporter.start(JOB).run_id
    mclock.advance(1)

    result = monitor.evaluate()

    [active] = [c for c in result.active if c.rule is EventKind.OVERLAP]
    assert (active.run_id, active.data["holder_run_id"]) == (second, first)
    assert result.raised == (), "the reporter's overlap event already raised it"
    assert result.severity is Severity.CRITICAL
    reporter.success(JOB, first)
    mclock.advance(1)
    [resolved] = monitor.evaluate().resolved
    assert (resolved.kind, resolved.run_id) == (EventKind.OVERLAP, second)
    assert monitor.evaluate().resolved == ()


def test_sharded_runs_open_at_once_are_not_overlaps(store: Store, mclock: FakeClock) -> None:
    t = mclock.wall() - 60
    lease_of(begin(store, JOB, t, key=f"{JOB}:eu", policy=Policy.ALLOW))
    lease_of(begin(store, JOB, t + 1, key=f"{JOB}:us", policy=Policy.ALLOW))

    result = Monitor(store, clock=mclock).evaluate()

    assert [c for c in result.active if c.rule is EventKind.OVERLAP] == []


def test_repeated_passes_record_nothing_new_while_nothing_changes(store: Store, mclock: FakeClock) -> None:
    monitor = Monitor(store, clock=mclock)
    t = aligned(mclock.wall() - 3600)
    describe(store, JOB, at=t, grace=2 * PERIOD)
    for n in range(4):
        run(store, JOB, t + n * PERIOD, 500)
    mclock.advance(t + 3 * PERIOD + 501 - mclock.wall())
    first = monitor.evaluate()
    assert {e.kind for e in first.raised} == {EventKind.SLOW, EventKind.GRACE_TOO_WIDE,
                                              EventKind.POLICY_UNDECIDED}  # fmt: skip

    for _ in range(3):
        mclock.advance(5)
        again = monitor.evaluate()
        assert (again.raised, again.resolved) == ((), ())
        assert {c.rule for c in again.active} == {e.kind for e in first.raised}


def test_stats_cover_only_the_last_n_runs(store: Store, mclock: FakeClock) -> None:
    t = aligned(mclock.wall() - 86400)
    describe(store, JOB, at=t)
    durations = [500.0] * 5 + [10.0, 20.0, 30.0, 40.0]
    for n, d in enumerate(durations):
        run(store, JOB, t + n * PERIOD, d)

    stats = Monitor(store, clock=mclock, thresholds=Thresholds(runs=4)).stats(JOB)

    assert (stats.completed, stats.p50, stats.max) == (4, 25.0, 40.0)
    assert stats.ratio == pytest.approx(quantile([10.0, 20.0, 30.0, 40.0], 0.95) / PERIOD)


def test_watch_runs_passes_on_the_injected_clock_and_flushes_after_each(
    store: Store, mclock: FakeClock
) -> None:
    describe(store, JOB, at=mclock.wall(), grace=PERIOD)
    flushed: list[float] = []
    out = io.StringIO()
    began = mclock.wall()

    code = watch(Monitor(store, clock=mclock), interval=30.0, passes=3, out=out,
                 flush=lambda: flushed.append(mclock.wall()) or 0)  # fmt: skip

    assert code == 0
    assert flushed == [began, began + 30, began + 60]
    assert out.getvalue().count("grace_too_wide") == 1


def test_check_exits_with_the_worst_severity(store: Store, store_url: str, mclock: FakeClock, capsys) -> None:
    assert cli.main(["check", "--store", store_url]) == 0
    describe(store, "lenient", at=mclock.wall(), grace=PERIOD)
    assert cli.main(["check", "--store", store_url]) == 1
    for _ in range(2):  # through the CLI: the same (system) clock as the check
        assert cli.main(["report", "start", "--job", JOB, "--store", store_url]) == 0
    capsys.readouterr()

    assert cli.main(["check", "--store", store_url]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "CRONWARDEN CRITICAL - 1 critical, 1 warning in 2 jobs", lines
    assert lines[1].startswith(f"CRITICAL {JOB} overlap: run ")


def test_metrics_expose_the_window_statistics_per_job(store: Store, store_url: str, capsys) -> None:
    pytest.importorskip("prometheus_client")
    import time

    t = aligned(time.time() - 3600)
    describe(store, JOB, at=t)
    for n in range(4):
        run(store, JOB, t + n * PERIOD, 300)
    run(store, JOB, t + 4 * PERIOD, 10, Outcome.FAILED)

    assert cli.main(["metrics", "--store", store_url]) == 0

    text = capsys.readouterr().out
    assert f'cronwarden_job_runs{{job="{JOB}",outcome="succeeded"}} 4.0' in text
    assert f'cronwarden_job_runs{{job="{JOB}",outcome="failed"}} 1.0' in text
    assert f'cronwarden_job_p95_period_ratio{{job="{JOB}"}} 0.5' in text
    assert f'cronwarden_job_duration_seconds_bucket{{job="{JOB}",le="300.0"}} 5.0' in text
    assert f'cronwarden_job_queue_depth{{job="{JOB}"}} 0.0' in text
    [last] = [line for line in text.splitlines() if line.startswith("cronwarden_job_last_success_timestamp")]
    assert float(last.split()[-1]) == t + 3 * PERIOD + 300


def test_monitor_pass_delivers_its_findings_to_the_configured_sinks(
    store: Store, mclock: FakeClock, tmp_path
) -> None:
    if type(store).undelivered is Store.undelivered:
        pytest.skip(f"{type(store).__name__} has no outbox yet")
    from types import SimpleNamespace

    from cronwarden.cli.monitor import outbox_flusher

    log = tmp_path / "events.jsonl"
    config = tmp_path / "cronwarden.toml"
    config.write_text(f'[sinks.log]\ntype = "log"\npath = "{log}"\n')
    describe(store, JOB, at=mclock.wall(), grace=PERIOD)
    flush = outbox_flusher(store, SimpleNamespace(config=str(config)), mclock)
    assert flush is not None

    watch(Monitor(store, clock=mclock), interval=30.0, once=True, flush=flush, out=io.StringIO())

    import json

    delivered = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["kind"], e["job"]) for e in delivered] == [("grace_too_wide", JOB)]


def test_cli_monitor_once_prints_each_raised_finding_and_records_it(
    store: Store, store_url: str, mclock: FakeClock, capsys
) -> None:
    describe(store, JOB, at=mclock.wall(), grace=PERIOD)

    assert cli.main(["monitor", "--once", "--store", store_url]) == 0
    assert cli.main(["monitor", "--once", "--store", store_url]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    assert f" raised {JOB} grace_too_wide: grace 10m ≥ period 10m" in lines[0]
    assert states(store, EventKind.GRACE_TOO_WIDE) == [RAISED]


@pytest.mark.parametrize("use_rollups", [True, False], ids=["rollup", "ledger"])
def test_a_manual_run_is_no_attempt_at_a_slot_for_missed_nor_for_the_slot_ledger(
    store: Store, mclock: FakeClock, use_rollups: bool
) -> None:
    """A run started by hand (cronwarden trigger) after a slot nothing
    started does not stand in for it: the monitor reports the slot missed,
    and the slot ledger (history --slots, the dashboard's strip) says missed."""
    from cronwarden.control import triggered
    from cronwarden.events import new_id
    from cronwarden.monitor.views import slot_decisions, slot_items
    from cronwarden.stores.base import Start

    monitor = Monitor(store, clock=mclock, use_rollups=use_rollups)
    slot = aligned(mclock.wall() - 3600)
    info = describe(store, JOB, at=slot - 60, grace=120.0)
    run(store, JOB, slot + 1, 30)
    next_due = slot + PERIOD
    by_hand = Start(job=JOB, key=JOB, run_id=new_id(), host="host-a", pid=4242, ttl=3600.0,
                    at=next_due + 60, policy=Policy.SKIP, slot=None)  # fmt: skip
    lease = lease_of(store.acquire(by_hand))
    store.record(triggered(JOB, by_hand.run_id, by="alice@ops-1", reason="needed now", at=by_hand.at + 0.01))
    end(store, lease, by_hand.at + 5)

    mclock.advance(next_due + 121 - mclock.wall())
    [missed] = [c for c in monitor.evaluate(record=False).active if c.rule is EventKind.MISSED]

    assert missed.data["slot"] == next_due and missed.data["last_start"] == slot + 1
    ledger = {i["slot"]: i["decision"] for i in slot_items(store, JOB, info, mclock.wall())}
    assert (ledger[slot], ledger[next_due]) == ("ran", "missed")
    strip = slot_decisions(store, monitor.stats(JOB), slot - 1, 10)
    assert [(d.slot, d.decision) for d in strip] == [(slot, "ran"), (next_due, "missed")]
