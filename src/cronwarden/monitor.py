"""The monitor: job statistics from the ledger, rules that turn them into
findings, and the verdicts ``cronwarden audit`` prints.

Reads are bounded and indexed, whatever the size of the ledger. Per job, one
evaluation reads:

- ``runs(job, limit=N)``: the last N runs (newest first);
- ``events(EventQuery(job, kinds=[skipped, queued, queue_full, overlap,
  abandoned], since=<start of the window>, limit=1000))``: refusals and
  overlaps in the window (the last N runs, within D days);
- and, for ``check``/``monitor`` only, the job's latest finding events, from
  which the current state of every finding is derived.

``open_runs()`` and ``jobs()`` are read once per pass for all jobs. So the
cost of a pass grows with the number of jobs, not with the number of runs.

Findings are events (``slow``, ``skips_in_a_row``, ``missed``,
``grace_too_wide``, ``stuck``, ``overlap``, ``policy_undecided``) with
``data["state"]`` ``"raised"`` or ``"resolved"``. A finding is identified by
(job, rule) or, for ``stuck`` and ``overlap``, by (job, rule, run id). Its
current state is the state of its last event in the ledger, so a finding is
recorded once when it becomes true and once when it stops, however many
monitors or ``check`` passes look at it (no alert storms). An ``overlap``
event without a state (recorded by the store under policy allow, or by a
report-only start) counts as raised: the monitor resolves it once the runs no
longer overlap.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.durations import format_duration
from cronwarden.errors import UsageError
from cronwarden.events import Event, EventKind, JobInfo, Outcome, RunRecord
from cronwarden.stores.base import EventQuery, Store, abandon_expired

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
)
PER_RUN: frozenset[EventKind] = frozenset({EventKind.STUCK, EventKind.OVERLAP})
"""Rules whose findings are per run id; the others are per job."""

COMPLETED: frozenset[Outcome] = frozenset({Outcome.SUCCEEDED, Outcome.FAILED, Outcome.TIMED_OUT})
"""Outcomes whose duration is the work's own: a run that was abandoned,
replaced or lost its lease was cut short by something else."""

WINDOW_EVENT_KINDS: tuple[EventKind, ...] = (
    EventKind.SKIPPED,
    EventKind.QUEUED,
    EventKind.QUEUE_FULL,
    EventKind.OVERLAP,
    EventKind.ABANDONED,
)
ATTEMPT_KINDS = frozenset({EventKind.SKIPPED, EventKind.QUEUED, EventKind.QUEUE_FULL})
"""Refused starts: the scheduler did fire, so the slot was not missed."""


class Severity(enum.IntEnum):
    """Monitoring-plugin levels; the value is ``cronwarden check``'s exit status."""

    OK = 0
    WARNING = 1
    CRITICAL = 2


class Verdict(enum.StrEnum):
    """What ``audit`` says of a job, from its statistics (worst first)."""

    OVERLAPPING = "overlapping"
    """Two runs of the same job (same partition) were open at once in the window."""
    AT_RISK = "at risk"
    """p95 ≥ the slow threshold of the period (default 2/3), N skips in a row, or a stuck run:
    one slow night away from an overlap, or already not fitting its slot."""
    WATCH = "watch"
    """The period is under twice the p95: write down what a second start does."""
    OK = "ok"
    UNKNOWN = "unknown"
    """No period (no schedule known) or no completed run in the window."""


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """The window and the thresholds of the rules. Every field has a flag on
    ``audit``, ``check`` and ``monitor`` (see docs/monitoring.md)."""

    runs: int = 50
    """Statistics cover at most the last ``runs`` runs ..."""
    days: float = 7.0
    """... started in the last ``days`` days."""
    slow: float = 2 / 3
    """``slow`` when p95 ≥ ``slow`` × period."""
    skips_in_a_row: int = 3
    min_runs: int = 3
    """Completed runs needed before ``slow`` and ``policy_undecided`` are judged."""
    grace_fraction: float = 0.5
    grace_cap: float = 3600.0
    """A job without a grace gets min(period × grace_fraction, grace_cap)."""
    event_limit: int = 1000
    """Most refusal/overlap events read per job per pass (counts cap here)."""
    finding_limit: int = 500
    """Most finding events read per job to derive the current states."""

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise UsageError(f"--runs must be at least 1, got {self.runs}")
        if not self.days > 0:
            raise UsageError(f"--days must be greater than zero, got {self.days:g}")
        if not 0 < self.slow <= 10:
            raise UsageError(f"--slow must be a fraction of the period like 0.67 or 2/3, got {self.slow:g}")
        if self.skips_in_a_row < 1:
            raise UsageError(f"--skips must be at least 1, got {self.skips_in_a_row}")
        if self.min_runs < 1:
            raise UsageError(f"--min-runs must be at least 1, got {self.min_runs}")

    def grace(self, info: JobInfo | None, period: float | None) -> float | None:
        if info is not None and info.grace is not None:
            return info.grace
        if period is None:
            return None
        return min(period * self.grace_fraction, self.grace_cap)


def quantile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, interpolated linearly between closest
    ranks (numpy's default; ``statistics.quantiles(method="inclusive")``)."""
    if not ordered:
        raise ValueError("quantile of no values")
    h = (len(ordered) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (h - lo)


def parse_schedule(text: str) -> Any:
    """``Schedule`` from what a ``JobInfo`` keeps (``CRON_TZ=Zone expr`` too)."""
    from cronwarden.schedule import Schedule

    t = text.strip()
    tz = None
    if t.upper().startswith("CRON_TZ="):
        head, _, t = t.partition(" ")
        tz = head.split("=", 1)[1]
    return Schedule.parse(t, tz)


def partition(run: RunRecord) -> str:
    """Runs that may not overlap share a partition: the lease key without the
    side-lease suffix (``job+run_id`` of policy allow and of report-only
    runs). Shards (``job:shard``) are separate partitions by design."""
    return run.key.partition("+")[0]


@dataclass(frozen=True, kw_only=True)
class Overlap:
    """Run ``run_id`` started while the earlier runs ``earlier`` of the same
    partition were open."""

    run_id: str
    earlier: tuple[str, ...]
    at: float
    live: bool
    """True while ``run_id`` and at least one of ``earlier`` are still open."""


def find_overlaps(runs: Iterable[RunRecord]) -> list[Overlap]:
    """Every start that arrived while an earlier run of its partition was
    open. One sweep in start order per partition: the runs still open at each
    start are the few whose end is later, so this is linear in practice."""
    by_part: dict[str, list[RunRecord]] = {}
    for r in runs:
        by_part.setdefault(partition(r), []).append(r)
    found: list[Overlap] = []
    for part in by_part.values():
        part.sort(key=lambda r: (r.started_at, r.run_id))
        still_open: list[RunRecord] = []
        for later in part:
            at = later.started_at
            still_open = [r for r in still_open if r.ended_at is None or r.ended_at > at]
            if still_open:
                live = later.outcome is None and any(r.outcome is None for r in still_open)
                earlier = tuple(r.run_id for r in still_open)
                found.append(Overlap(run_id=later.run_id, earlier=earlier, at=at, live=live))
            still_open.append(later)
    return found


@dataclass(frozen=True, kw_only=True)
class Stuck:
    run: RunRecord
    why: str


@dataclass(frozen=True, kw_only=True)
class JobStats:
    """One job's statistics over the window (last N runs, last D days)."""

    job: str
    info: JobInfo | None
    now: float
    window_start: float
    schedule: str | None
    period: float | None
    grace: float | None
    runs: int
    """Runs started in the window (open ones included)."""
    completed: int
    durations: tuple[float, ...] = ()
    """Durations of the completed runs in the window, ascending."""
    p50: float | None = None
    p95: float | None = None
    max: float | None = None
    outcomes: Mapping[str, int] = field(default_factory=dict)
    """Runs in the window by outcome (``running`` for open ones)."""
    failures: int = 0
    lease_losses: int = 0
    skips: int = 0
    skips_in_a_row: int = 0
    overlaps: int = 0
    open_runs: int = 0
    last_start: float | None = None
    last_attempt: float | None = None
    """Latest start or refused start: when the scheduler last fired."""
    last_success: float | None = None
    overlap_list: tuple[Overlap, ...] = ()
    stuck: tuple[Stuck, ...] = ()
    events_truncated: bool = False
    schedule_error: str | None = None

    @property
    def ratio(self) -> float | None:
        """p95 as a share of the period."""
        if self.p95 is None or not self.period:
            return None
        return self.p95 / self.period

    @property
    def policy(self) -> str:
        return self.info.policy if self.info else "skip"

    @property
    def reason(self) -> str:
        return self.info.reason if self.info else ""

    def undecided(self, thresholds: Thresholds) -> bool:
        """Period under twice the p95 (over enough runs) and no written reason
        for the policy."""
        r = self.ratio
        enough = self.completed >= thresholds.min_runs
        return enough and r is not None and r > 0.5 and not self.reason.strip()

    def verdict(self, thresholds: Thresholds) -> Verdict:
        if self.overlaps:
            return Verdict.OVERLAPPING
        r = self.ratio
        enough = self.completed >= thresholds.min_runs
        if (
            (enough and r is not None and r >= thresholds.slow)
            or self.skips_in_a_row >= thresholds.skips_in_a_row
            or self.stuck
        ):
            return Verdict.AT_RISK
        if r is None or not enough:
            return Verdict.UNKNOWN
        if r > 0.5:
            return Verdict.WATCH
        return Verdict.OK

    def notes(self, thresholds: Thresholds) -> list[str]:
        out: list[str] = []
        if self.schedule_error:
            out.append(self.schedule_error)
        elif self.period is None:
            out.append("no schedule known")
        if self.completed < thresholds.min_runs:
            out.append(f"{self.completed} completed run{'s' * (self.completed != 1)}")
        if self.overlaps:
            out.append(f"{self.overlaps} overlap{'s' * (self.overlaps != 1)}")
        if self.skips_in_a_row:
            out.append(f"{self.skips_in_a_row} skips in a row")
        elif self.skips:
            out.append(f"{self.skips} skip{'s' * (self.skips != 1)}")
        if self.stuck:
            out.append(f"{len(self.stuck)} stuck")
        if self.failures:
            out.append(f"{self.failures} failed")
        if self.lease_losses:
            out.append(f"{self.lease_losses} lease lost")
        if self.undecided(thresholds):
            out.append("policy has no written reason")
        return out

    def as_dict(self, thresholds: Thresholds) -> dict[str, Any]:
        r = self.ratio
        return {
            "job": self.job,
            "schedule": self.schedule,
            "period": self.period,
            "grace": self.grace,
            "runs": self.runs,
            "completed": self.completed,
            "p50": self.p50,
            "p95": self.p95,
            "max": self.max,
            "p95_share_of_period": None if r is None else round(r, 4),
            "policy": self.policy,
            "reason": self.reason,
            "undecided": self.undecided(thresholds),
            "verdict": self.verdict(thresholds).value,
            "outcomes": dict(self.outcomes),
            "failures": self.failures,
            "lease_losses": self.lease_losses,
            "skips": self.skips,
            "skips_in_a_row": self.skips_in_a_row,
            "overlaps": self.overlaps,
            "open_runs": self.open_runs,
            "stuck": [s.run.run_id for s in self.stuck],
            "last_start": self.last_start,
            "last_success": self.last_success,
            "notes": self.notes(thresholds),
        }


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

    @property
    def key(self) -> tuple[EventKind, str | None]:
        return (self.rule, self.run_id)

    def line(self) -> str:
        return f"{self.severity.name} {self.job} {self.rule.value}: {self.summary}"


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
        if stats.schedule is None or stats.period is None or stats.grace is None:
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


DEFAULT_RULES: tuple[Rule, ...] = (
    SlowRule(),
    SkipsInARowRule(),
    MissedRule(),
    GraceTooWideRule(),
    StuckRule(),
    OverlapRule(),
    PolicyUndecidedRule(),
)


@dataclass(frozen=True, kw_only=True)
class Pass:
    """What one evaluation pass found and recorded."""

    at: float
    stats: tuple[JobStats, ...]
    active: tuple[Condition, ...]
    """Every condition that holds now (raised earlier or in this pass)."""
    raised: tuple[Event, ...]
    resolved: tuple[Event, ...]
    abandoned: tuple[str, ...] = ()
    """Runs this pass recorded ``abandoned`` (lease expired, no terminal record)."""
    open_runs: tuple[RunRecord, ...] = ()
    """The runs open when the pass began, on every host (``Store.open_runs``)."""

    @property
    def severity(self) -> Severity:
        return max((c.severity for c in self.active), default=Severity.OK)


class Monitor:
    """Statistics, rules and findings over one store.

    ``store`` is a ``Store`` the caller owns. ``clock.wall()`` is read once per
    pass. ``extra_jobs`` adds jobs known from elsewhere (the config file) to
    those the store knows; they win over the store's record of the same name.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock = SYSTEM_CLOCK,
        thresholds: Thresholds | None = None,
        rules: Sequence[Rule] = DEFAULT_RULES,
        extra_jobs: Sequence[JobInfo] = (),
    ) -> None:
        self.store = store
        self.clock = clock
        self.thresholds = thresholds or Thresholds()
        self.rules = tuple(rules)
        self.extra_jobs = tuple(extra_jobs)
        self._schedules: dict[str, tuple[float | None, str | None]] = {}

    # -- statistics -------------------------------------------------------

    def _period(self, info: JobInfo | None, now: float) -> tuple[float | None, str | None]:
        """(period, error). Cached per schedule text: cron periods cost ~1 ms."""
        if info is None:
            return None, None
        if info.schedule:
            if info.schedule not in self._schedules:
                try:
                    self._schedules[info.schedule] = (float(parse_schedule(info.schedule).period(now)), None)
                except UsageError as e:
                    self._schedules[info.schedule] = (info.period, f"bad schedule: {e}")
            return self._schedules[info.schedule]
        return info.period, None

    def known_jobs(self, open_runs: Sequence[RunRecord] = ()) -> dict[str, JobInfo | None]:
        """Jobs the store describes, plus ``extra_jobs``, plus jobs with open runs."""
        jobs: dict[str, JobInfo | None] = {j.name: j for j in self.store.jobs()}
        for j in self.extra_jobs:
            known = jobs.get(j.name)
            if known is not None and not j.updated_at:  # keep when the store first heard of it
                j = j._replace(updated_at=known.updated_at)
            jobs[j.name] = j
        for r in open_runs:
            jobs.setdefault(r.job, None)
        return dict(sorted(jobs.items()))

    def stats(self, job: str) -> JobStats:
        """Statistics of one job, now."""
        info = self.store.job(job) or next((j for j in self.extra_jobs if j.name == job), None)
        now = self.clock.wall()
        return self._read(job, info, now, self.store.open_runs(job))

    def _read(self, job: str, info: JobInfo | None, now: float, opened: Sequence[RunRecord]) -> JobStats:
        """The bounded reads of one job, then its statistics."""
        t = self.thresholds
        since = now - t.days * 86400
        recent = [r for r in self.store.runs(job, t.runs) if r.started_at >= since]
        window_start = recent[-1].started_at if len(recent) >= t.runs else since
        # Bounded by the window, not by D days: the read must not grow with the runs per job.
        events = self.store.events(
            EventQuery(job=job, kinds=WINDOW_EVENT_KINDS, since=window_start, limit=t.event_limit)
        )
        return self._stats(job, info, now, window_start, recent, list(opened), events)

    def _stats(
        self,
        job: str,
        info: JobInfo | None,
        now: float,
        window_start: float,
        recent: list[RunRecord],
        opened: list[RunRecord],
        events: list[Event],
    ) -> JobStats:
        t = self.thresholds
        period, schedule_error = self._period(info, now)
        # Open runs older than the window still count: a stuck run never ages out while open.
        seen = {r.run_id for r in recent}
        window = recent + [r for r in opened if r.run_id not in seen]
        live = {r.run_id: r for r in opened}
        outcomes: dict[str, int] = {}
        for r in window:
            name = "running" if r.outcome is None and r.run_id in live else (r.outcome or "running")
            outcomes[name] = outcomes.get(name, 0) + 1
        durations = sorted(
            r.duration for r in recent if r.outcome in COMPLETED and r.duration is not None
        )  # fmt: skip
        last_start = max((r.started_at for r in window), default=None)
        last_success = next(
            (r.ended_at for r in recent if r.outcome is Outcome.SUCCEEDED and r.ended_at is not None), None
        )
        # Events come newest first; a tie in time keeps ledger order, hence the stable sort.
        events = sorted(events, key=lambda e: (e.at, e.seq or 0), reverse=True)
        skips = sum(1 for e in events if e.kind is EventKind.SKIPPED and e.at >= window_start)
        in_a_row = 0
        for e in events:
            if e.kind is not EventKind.SKIPPED:
                continue
            if last_start is not None and e.at < last_start:
                break
            in_a_row += 1
        last_refusal = next((e.at for e in events if e.kind in ATTEMPT_KINDS), None)
        last_attempt = max((x for x in (last_start, last_refusal) if x is not None), default=None)

        overlap_list = find_overlaps(window)
        overlapped = {o.run_id for o in overlap_list}
        overlapped.update(
            e.run_id
            for e in events
            if e.kind is EventKind.OVERLAP and e.run_id and e.at >= window_start and "state" not in e.data
        )

        stuck: list[Stuck] = []
        max_runtime = info.max_runtime if info else None
        for r in opened:
            if r.expires_in is None:
                stuck.append(Stuck(run=r, why="its lease is gone and it has no terminal record"))
            elif r.expires_in <= 0:
                stuck.append(Stuck(run=r, why="its lease expired with no terminal record"))
            elif max_runtime is not None and now - r.started_at > max_runtime:
                stuck.append(Stuck(run=r, why=f"open past max_runtime {format_duration(max_runtime)}"))
        stuck_ids = {s.run.run_id for s in stuck}
        for r in recent:
            if r.outcome is Outcome.ABANDONED and r.run_id not in stuck_ids:
                stuck.append(Stuck(run=r, why=r.detail or "its lease expired with no terminal record"))
                stuck_ids.add(r.run_id)
        for e in events:  # a run that started before the window and was abandoned inside it
            if e.kind is EventKind.ABANDONED and e.run_id and e.run_id not in stuck_ids:
                found = self.store.run(e.run_id)
                if found is not None:
                    stuck.append(Stuck(run=found, why=found.detail or "lease expired, no terminal record"))
                    stuck_ids.add(e.run_id)

        return JobStats(
            job=job, info=info, now=now, window_start=window_start,
            schedule=info.schedule if info and info.schedule else (
                f"every {format_duration(period)}" if period else None),
            period=period, grace=t.grace(info, period), schedule_error=schedule_error,
            runs=len(window), completed=len(durations), durations=tuple(durations),
            p50=quantile(durations, 0.5) if durations else None,
            p95=quantile(durations, 0.95) if durations else None,
            max=durations[-1] if durations else None,
            outcomes=outcomes,
            failures=outcomes.get(Outcome.FAILED, 0) + outcomes.get(Outcome.TIMED_OUT, 0),
            lease_losses=outcomes.get(Outcome.LEASE_LOST, 0),
            skips=skips, skips_in_a_row=in_a_row, overlaps=len(overlapped), open_runs=len(opened),
            last_start=last_start, last_attempt=last_attempt, last_success=last_success,
            overlap_list=tuple(overlap_list), stuck=tuple(stuck),
            events_truncated=len(events) >= t.event_limit,
        )  # fmt: skip

    def audit(self) -> list[JobStats]:
        """Every known job's statistics. Read-only."""
        now = self.clock.wall()
        opened = self.store.open_runs()
        by_job: dict[str, list[RunRecord]] = {}
        for r in opened:
            by_job.setdefault(r.job, []).append(r)
        return [
            self._read(name, info, now, by_job.get(name, []))
            for name, info in self.known_jobs(opened).items()
        ]

    # -- findings ---------------------------------------------------------

    def states(self, job: str) -> dict[tuple[EventKind, str | None], Event]:
        """The last finding event of each (rule, run id) of ``job``: its state."""
        found = self.store.events(
            EventQuery(job=job, kinds=FINDING_KINDS, limit=self.thresholds.finding_limit)
        )
        found.sort(key=lambda e: (e.at, e.seq or 0))
        last: dict[tuple[EventKind, str | None], Event] = {}
        for e in found:
            if "state" not in e.data and e.kind is not EventKind.OVERLAP:
                continue  # a fact (e.g. a scheduler's missed slot), not a finding
            last[(e.kind, e.run_id if e.kind in PER_RUN else None)] = e
        return last

    def evaluate(self, *, record: bool = True) -> Pass:
        """One pass over every job: statistics, rules, and the findings that
        changed state recorded as events (unless ``record`` is false). Open
        runs whose lease expired are recorded ``abandoned`` (G6)."""
        now = self.clock.wall()
        opened = self.store.open_runs()
        by_job: dict[str, list[RunRecord]] = {}
        for r in opened:
            by_job.setdefault(r.job, []).append(r)
        all_stats: list[JobStats] = []
        active: list[Condition] = []
        raised: list[Event] = []
        resolved: list[Event] = []
        abandoned: list[str] = []
        for name, info in self.known_jobs(opened).items():
            stats = self._read(name, info, now, by_job.get(name, []))
            all_stats.append(stats)
            conditions = [c for rule in self.rules for c in rule.evaluate(stats, self.thresholds)]
            if record:
                abandoned.extend(self._abandon_expired(stats, now))
            states = self.states(name)
            # An ended run's finding that was resolved (acknowledged) stays resolved.
            conditions = [
                c for c in conditions
                if not (c.once and c.key in states and states[c.key].data.get("state", RAISED) != RAISED)
            ]  # fmt: skip
            active.extend(conditions)
            holding = {c.key for c in conditions}
            for c in conditions:
                last = states.get(c.key)
                if last is not None and (c.once or last.data.get("state", RAISED) == RAISED):
                    continue
                event = Event(
                    kind=c.rule, job=name, run_id=c.run_id, at=now,
                    data={"state": RAISED, "severity": c.severity.name.lower(), "summary": c.summary,
                          **c.data},
                )  # fmt: skip
                raised.append(event)
            for o in stats.overlap_list:
                if not o.live and (EventKind.OVERLAP, o.run_id) not in states:
                    # Both runs ended before any pass saw them: record the fact, raised and resolved.
                    c = OverlapRule.condition(name, o)
                    fact = {
                        "state": RAISED,
                        "severity": c.severity.name.lower(),
                        "summary": c.summary,
                        **c.data,
                    }
                    raised.append(Event(kind=c.rule, job=name, run_id=c.run_id, at=now, data=fact))
                    states[c.key] = raised[-1]
            for key, last in states.items():
                if key in holding or last.data.get("state", RAISED) != RAISED:
                    continue
                rule, run_id = key
                if rule is EventKind.STUCK and run_id is not None and self._still_abandoned(run_id):
                    # Out of the window, but nobody has looked at it: later successes do not
                    # hide a run that died mid-work. ``acknowledge`` resolves it.
                    active.append(_kept(last))
                    continue
                gone: dict[str, Any] = {"state": RESOLVED, "raised_at": last.at,
                                        "summary": _resolution(rule, run_id)}  # fmt: skip
                gone.update({k: last.data[k] for k in ("holder_run_id", "run_ids") if k in last.data})
                resolved.append(Event(kind=rule, job=name, run_id=run_id, at=now, data=gone))
        if record:
            for event in (*raised, *resolved):
                self.store.record(event)
        return Pass(
            at=now, stats=tuple(all_stats), active=tuple(active), raised=tuple(raised),
            resolved=tuple(resolved), abandoned=tuple(abandoned), open_runs=tuple(opened),
        )  # fmt: skip

    def _still_abandoned(self, run_id: str) -> bool:
        run = self.store.run(run_id)
        return run is not None and run.outcome is Outcome.ABANDONED

    def _abandon_expired(self, stats: JobStats, now: float) -> list[str]:
        return abandon_expired(self.store, [s.run for s in stats.stuck], now, "the monitor")

    def acknowledge(self, job: str, rule: EventKind, run_id: str | None = None, *, by: str = "") -> Event:
        """Resolve a raised finding by hand (e.g. a stuck, abandoned run someone
        has looked at). It is raised again only if its condition starts anew."""
        event = Event(
            kind=rule, job=job, run_id=run_id if rule in PER_RUN else None, at=self.clock.wall(),
            data={"state": RESOLVED, "acknowledged": True, "by": by,
                  "summary": f"acknowledged{f' by {by}' if by else ''}"},
        )  # fmt: skip
        self.store.record(event)
        return event


def _kept(last: Event) -> Condition:
    """A raised finding whose condition is out of sight but still stands."""
    return Condition(
        rule=last.kind, job=last.job, run_id=last.run_id, severity=Severity.CRITICAL,
        summary=str(last.data.get("summary", "")) + " (not acknowledged)", data=dict(last.data),
    )  # fmt: skip


def _resolution(rule: EventKind, run_id: str | None) -> str:
    return {
        EventKind.SLOW: "p95 is back under the threshold",
        EventKind.SKIPS_IN_A_ROW: "a run started",
        EventKind.MISSED: "a start arrived",
        EventKind.GRACE_TOO_WIDE: "grace is now under the period",
        EventKind.STUCK: f"run {run_id} ended",
        EventKind.OVERLAP: f"run {run_id} no longer overlaps an earlier run",
        EventKind.POLICY_UNDECIDED: "the policy has a reason, or the period is over twice the p95",
    }.get(rule, "no longer holds")


def _when(t: float | None) -> str:
    import time

    return "never" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
