"""The rules: each looks at one job's statistics and says which findings
hold now. A finding is an event (``slow``, ``missed``, …) whose
``data["state"]`` is ``raised`` or ``resolved``."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cronwarden.durations import format_duration
from cronwarden.errors import UsageError
from cronwarden.events import EventKind
from cronwarden.monitor.stats import JobStats, Overlap, Thresholds, parse_schedule

RAISED = "raised"

RESOLVED = "resolved"

FINDING_KINDS: tuple[EventKind, ...] = (
    EventKind.SLOW,
    EventKind.SKIPS_IN_A_ROW,
    EventKind.MISSED,
    EventKind.GRACE_TOO_WIDE,
    EventKind.STUCK,
    EventKind.OVERLAP,
    EventKind.POLICY_UNDECIDED,
    EventKind.FAILING,
    EventKind.TOO_OFTEN,
)

PER_RUN: frozenset[EventKind] = frozenset({EventKind.STUCK, EventKind.OVERLAP})
"""Rules whose findings are per run id; the others are per job."""


class Severity(enum.IntEnum):
    """Monitoring-plugin levels; the value is ``cronwarden check``'s exit status."""

    OK = 0
    WARNING = 1
    CRITICAL = 2


@dataclass(frozen=True, kw_only=True)
class Condition:
    """A rule that holds now: the finding it raises (or keeps raised)."""

    rule: EventKind
    job: str
    run_id: str | None
    severity: Severity
    summary: str
    data: Mapping[str, Any] = field(default_factory=dict)
    once: bool = False
    """About a run that has ended: it cannot stop and start again, so it is
    raised only if it never was (an acknowledged one stays resolved)."""
    snoozed: bool = False
    """Its job is snoozed or in a maintenance window: recorded and shown, not
    delivered to alerting sinks, and not counted in ``check``'s status."""

    @property
    def key(self) -> tuple[EventKind, str | None]:
        return (self.rule, self.run_id)

    def line(self) -> str:
        snoozed = " (snoozed)" if self.snoozed else ""
        return f"{self.severity.name} {self.job} {self.rule.value}: {self.summary}{snoozed}"


class Rule:
    """One rule: looks at a job's statistics and says which conditions hold."""

    kind: EventKind

    def evaluate(self, stats: JobStats, thresholds: Thresholds) -> list[Condition]:
        raise NotImplementedError


class SlowRule(Rule):
    """p95 ≥ threshold × period, while runs still succeed and nothing else
    complains. Critical once p95 reaches the period itself."""

    kind = EventKind.SLOW

    def evaluate(self, stats: JobStats, thresholds: Thresholds) -> list[Condition]:
        r = stats.ratio
        if r is None or stats.completed < thresholds.min_runs or r < thresholds.slow:
            return []
        assert stats.p95 is not None and stats.period is not None
        sev = Severity.CRITICAL if r >= 1 else Severity.WARNING
        return [
            Condition(
                rule=self.kind, job=stats.job, run_id=None, severity=sev,
                summary=(
                    f"p95 {format_duration(stats.p95)} is {r:.0%} of the {format_duration(stats.period)} "
                    f"period (threshold {thresholds.slow:.0%}) over the last {stats.completed} runs"
                ),
                data={"p95": round(stats.p95, 3), "period": stats.period, "ratio": round(r, 4),
                      "threshold": round(thresholds.slow, 4), "runs": stats.completed},
            )
        ]  # fmt: skip


class SkipsInARowRule(Rule):
    """N consecutive skipped starts with no start between them: the job no
    longer fits its slot, even if the long run's late success keeps the
    absence alert quiet."""

    kind = EventKind.SKIPS_IN_A_ROW

    def evaluate(self, stats: JobStats, thresholds: Thresholds) -> list[Condition]:
        n = stats.skips_in_a_row
        if n < thresholds.skips_in_a_row:
            return []
        return [
            Condition(
                rule=self.kind, job=stats.job, run_id=None, severity=Severity.CRITICAL,
                summary=f"{n} starts in a row skipped since the last run started",
                data={"count": n, "threshold": thresholds.skips_in_a_row},
            )
        ]  # fmt: skip


class MissedRule(Rule):
    """No start (or refused start) within slot + grace: the scheduler did not
    fire at all."""

    kind = EventKind.MISSED

    def evaluate(self, stats: JobStats, thresholds: Thresholds) -> list[Condition]:
        if stats.schedule is None or stats.period is None or stats.grace is None or stats.paused:
            return []
        reference = stats.last_attempt
        if reference is None:
            if stats.info is None or not stats.info.updated_at:
                return []
            reference = stats.info.updated_at  # never ran: expect the first slot after it was declared
        else:
            # A start a little before its slot (clock skew) still counts for that slot.
            reference += min(60.0, stats.period / 10)
        try:
            due = parse_schedule(stats.schedule).next_fire(reference)
        except UsageError:
            return []
        if stats.now < due + stats.grace:
            return []
        return [
            Condition(
                rule=self.kind, job=stats.job, run_id=None, severity=Severity.CRITICAL,
                summary=(
                    f"no start for the slot due at {_when(due)} (grace {format_duration(stats.grace)}); "
                    f"last start {_when(stats.last_attempt)}"
                ),
                data={"slot": due, "grace": stats.grace, "last_start": stats.last_attempt},
            )
        ]  # fmt: skip


class GraceTooWideRule(Rule):
    """A grace at least as long as the period hides a skipped slot."""

    kind = EventKind.GRACE_TOO_WIDE

    def evaluate(self, stats: JobStats, thresholds: Thresholds) -> list[Condition]:
        info = stats.info
        if info is None or info.grace is None or stats.period is None or info.grace < stats.period:
            return []
        return [
            Condition(
                rule=self.kind, job=stats.job, run_id=None, severity=Severity.WARNING,
                summary=(
                    f"grace {format_duration(info.grace)} ≥ period {format_duration(stats.period)}: "
                    "a skipped slot or an overlapping start can hide inside it"
                ),
                data={"grace": info.grace, "period": stats.period},
            )
        ]  # fmt: skip


class StuckRule(Rule):
    """Per run id: open past ``max_runtime``, or its lease expired (or is
    gone) with no terminal record from the run itself (``abandoned``). Later
    successes never resolve it: an open run's finding resolves when the run
    ends; an abandoned run's stays raised, even after it leaves the window,
    until someone acknowledges it (``Monitor.acknowledge``, ``cronwarden
    ack``)."""

    kind = EventKind.STUCK

    def evaluate(self, stats: JobStats, thresholds: Thresholds) -> list[Condition]:
        return [
            Condition(
                rule=self.kind, job=stats.job, run_id=s.run.run_id, severity=Severity.CRITICAL,
                summary=f"run {s.run.run_id} (host {s.run.host}, started {_when(s.run.started_at)}): {s.why}",
                data={"host": s.run.host, "pid": s.run.pid, "started_at": s.run.started_at, "why": s.why,
                      "token": s.run.token},
                once=s.run.outcome is not None,
            )
            for s in stats.stuck
        ]  # fmt: skip


class OverlapRule(Rule):
    """Per run id: a start while an earlier run id of the same job (and
    partition) was open, reported-only runs included."""

    kind = EventKind.OVERLAP

    def evaluate(self, stats: JobStats, thresholds: Thresholds) -> list[Condition]:
        return [self.condition(stats.job, o) for o in stats.overlap_list if o.live]

    @classmethod
    def condition(cls, job: str, o: Overlap) -> Condition:
        return Condition(
            rule=cls.kind, job=job, run_id=o.run_id, severity=Severity.CRITICAL,
            summary=(
                f"run {o.run_id} started at {_when(o.at)} while {', '.join(o.earlier)} "
                f"{'was' if len(o.earlier) == 1 else 'were'} still open"
            ),
            data={"holder_run_id": o.earlier[0], "run_ids": [*o.earlier, o.run_id], "at": o.at},
        )  # fmt: skip


class PolicyUndecidedRule(Rule):
    """Period under twice the p95 and no written reason for the policy: the
    seed's "this week" list."""

    kind = EventKind.POLICY_UNDECIDED

    def evaluate(self, stats: JobStats, thresholds: Thresholds) -> list[Condition]:
        if not stats.undecided(thresholds):
            return []
        assert stats.p95 is not None and stats.period is not None
        return [
            Condition(
                rule=self.kind, job=stats.job, run_id=None, severity=Severity.WARNING,
                summary=(
                    f"period {format_duration(stats.period)} is under twice the p95 "
                    f"{format_duration(stats.p95)}; policy {stats.policy} has no written reason"
                ),
                data={"p95": round(stats.p95, 3), "period": stats.period, "policy": stats.policy},
            )
        ]  # fmt: skip


class FailingRule(Rule):
    """The job's last ``failure_threshold`` endings (its own setting, default
    1) were bad: failed, lease_lost, timed_out, abandoned or interrupted
    (``stats.BAD_OUTCOMES``). Resolved after ``recovery_threshold`` successes
    in a row (default 1). Replaced and stopped runs neither count nor break a
    streak: another start, or an operator, ended them."""

    kind = EventKind.FAILING

    def evaluate(self, stats: JobStats, thresholds: Thresholds) -> list[Condition]:
        f = stats.failing
        if f is None:
            return []
        n = stats.rules.failure_threshold
        ended = ", ".join(f.outcomes)
        recovering = f" ({f.good} of {stats.rules.recovery_threshold} successes to recover)" if f.good else ""
        return [
            Condition(
                rule=self.kind, job=stats.job, run_id=None, severity=Severity.CRITICAL,
                summary=(
                    f"{f.bad} run{'s' * (f.bad != 1)} in a row ended badly ({ended}; threshold {n}), "
                    f"the last {f.last_run_id}{recovering}"
                ),
                data={"count": f.bad, "threshold": n, "recovery_threshold": stats.rules.recovery_threshold,
                      "first_run_id": f.first_run_id, "last_run_id": f.last_run_id,
                      "last_outcome": f.last_outcome, "since": f.since},
            )
        ]  # fmt: skip


class TooOftenRule(Rule):
    """Starts arrive faster than the schedule allows: each of the newest
    ``thresholds.crowded_slots`` slots (default 2) had more than one start,
    refused starts included (a second scheduler, a duplicated crontab line).
    One slot with two starts (someone ran it by hand) is not enough."""

    kind = EventKind.TOO_OFTEN

    def evaluate(self, stats: JobStats, thresholds: Thresholds) -> list[Condition]:
        if stats.period is None or stats.crowded < thresholds.crowded_slots:
            return []
        counts = [n for _, n in stats.slots[: stats.crowded]]
        return [
            Condition(
                rule=self.kind, job=stats.job, run_id=None, severity=Severity.WARNING,
                summary=(
                    f"{' and '.join(map(str, counts))} starts in each of the last {len(counts)} slots "
                    f"(schedule {stats.schedule}): a second scheduler or a duplicated crontab line?"
                ),
                data={"slots": [slot for slot, _ in stats.slots[: stats.crowded]], "starts": counts,
                      "period": stats.period},
            )
        ]  # fmt: skip


DEFAULT_RULES: tuple[Rule, ...] = (
    SlowRule(),
    SkipsInARowRule(),
    MissedRule(),
    GraceTooWideRule(),
    StuckRule(),
    OverlapRule(),
    PolicyUndecidedRule(),
    FailingRule(),
    TooOftenRule(),
)


def _when(t: float | None) -> str:

    return "never" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
