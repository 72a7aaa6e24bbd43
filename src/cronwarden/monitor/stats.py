"""One job's statistics over the monitor's window, the verdict they give,
and the window and thresholds themselves."""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cronwarden.errors import UsageError
from cronwarden.events import Event, EventKind, JobInfo, Outcome, RunRecord

COMPLETED: frozenset[Outcome] = frozenset({Outcome.SUCCEEDED, Outcome.FAILED, Outcome.TIMED_OUT})
"""Outcomes whose duration is the work's own: a run that was abandoned,
replaced or lost its lease was cut short by something else."""

WINDOW_EVENT_KINDS: tuple[EventKind, ...] = (
    EventKind.SKIPPED,
    EventKind.QUEUED,
    EventKind.QUEUE_FULL,
    EventKind.OVERLAP,
    EventKind.ABANDONED,
    EventKind.TRIGGERED,
)

ATTEMPT_KINDS = frozenset({EventKind.SKIPPED, EventKind.QUEUED, EventKind.QUEUE_FULL})
"""Refused starts: the scheduler did fire, so the slot was not missed."""

BAD_OUTCOMES: frozenset[Outcome] = frozenset(
    {Outcome.FAILED, Outcome.LEASE_LOST, Outcome.TIMED_OUT, Outcome.ABANDONED, Outcome.INTERRUPTED}
)
"""Endings that count toward ``failing``: the work did not get done. Not
``replaced`` (policy replace: a newer start took the work over) and not
``stopped`` (an operator decided it): those neither count nor break a streak."""

GOOD_OUTCOMES: frozenset[Outcome] = frozenset({Outcome.SUCCEEDED})
"""Endings that count toward resolving ``failing``."""


@dataclass(frozen=True, kw_only=True)
class JobRules:
    """A job's own monitoring settings (``[jobs.NAME]`` in the config file;
    the defaults for a job the file does not name)."""

    failure_threshold: int = 1
    """``failing`` is raised after this many bad endings in a row ..."""
    recovery_threshold: int = 1
    """... and resolved after this many successes in a row."""
    maintenance: tuple[Any, ...] = ()
    """Recurring windows (``cronwarden.monitor.snooze.Window``) in which the
    job's findings are recorded but not delivered to alerting sinks."""

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise UsageError(f"failure_threshold must be at least 1, got {self.failure_threshold}")
        if self.recovery_threshold < 1:
            raise UsageError(f"recovery_threshold must be at least 1, got {self.recovery_threshold}")


@dataclass(frozen=True, kw_only=True)
class Failing:
    """A job whose last endings were bad: ``bad`` of them in a row from the
    run that crossed the threshold (``first_run_id``, started ``since``), and
    ``good`` successes since the last bad one (fewer than the recovery
    threshold, or it would not be failing)."""

    since: float
    first_run_id: str
    bad: int
    good: int
    last_run_id: str
    last_outcome: str
    outcomes: tuple[str, ...]
    """The bad endings of the streak, oldest first (at most the last 10)."""


@dataclass(frozen=True)
class FailingTally:
    """The running state ``failing_step`` advances, one ending at a time (a
    rollup keeps it per job and advances it when a run ends)."""

    raised: bool = False
    bad: int = 0
    good: int = 0
    first_run_id: str = ""
    since: float = 0.0
    last_run_id: str = ""
    last_outcome: str = ""
    outcomes: tuple[str, ...] = ()


def failing_step(t: FailingTally, run: RunRecord, rules: JobRules) -> FailingTally:
    """The tally after one more ended run (oldest first). A bad ending adds
    to the streak and raises at the failure threshold; a success adds to the
    good streak and clears the failure at the recovery threshold; any other
    ending (replaced, stopped) changes nothing."""
    if run.outcome in BAD_OUTCOMES:
        assert run.outcome is not None
        first, since = (t.first_run_id, t.since) if t.bad else (run.run_id, run.started_at)
        outcomes = ((*t.outcomes, run.outcome.value) if t.bad else (run.outcome.value,))[-10:]
        bad = t.bad + 1
        raised = t.raised or bad >= rules.failure_threshold
        return FailingTally(raised, bad, 0, first, since, run.run_id, run.outcome.value, outcomes)
    if run.outcome in GOOD_OUTCOMES:
        good = t.good + 1
        if t.raised and good >= rules.recovery_threshold:
            return FailingTally(good=good)
        # Still failing until enough successes; the bad streak that raised it is kept for the summary.
        bad = t.bad if t.raised else 0
        return FailingTally(t.raised, bad, good, t.first_run_id, t.since, t.last_run_id, t.last_outcome,
                            t.outcomes)  # fmt: skip
    return t


def failing_of(ended: Iterable[RunRecord], rules: JobRules) -> Failing | None:
    """Whether the job is failing after these ended runs (oldest first)."""
    t = FailingTally()
    for r in ended:
        t = failing_step(t, r, rules)
    if not t.raised:
        return None
    return Failing(since=t.since, first_run_id=t.first_run_id, bad=t.bad, good=t.good,
                   last_run_id=t.last_run_id, last_outcome=t.last_outcome, outcomes=t.outcomes)  # fmt: skip


class Verdict(enum.StrEnum):
    """What ``audit`` says of a job, from its statistics (worst first)."""

    FAILING = "failing"
    """Its last runs ended badly (the job's failure threshold in a row)."""
    OVERLAPPING = "overlapping"
    """Two runs of the same job (same partition) were open at once in the window."""
    AT_RISK = "at risk"
    """p95 ≥ the slow threshold of the period (default 2/3), N skips in a row, or a stuck run:
    one slow night away from an overlap, or already not fitting its slot."""
    WATCH = "watch"
    """The period is under twice the p95: write down what a second start does."""
    OK = "ok"
    UNSCHEDULED = "unscheduled"
    """No schedule known (a job seen only through its runs): nothing to judge
    durations, misses or crowding against; failing, stuck and overlaps still are."""
    UNKNOWN = "unknown"
    """Too few completed runs in the window to judge durations."""


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
    crowded_slots: int = 2
    """``too_often`` when this many of the newest slots in a row each had more than one start."""

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise UsageError(f"--runs must be at least 1, got {self.runs}")
        if not self.days > 0:
            raise UsageError(f"--days must be greater than zero, got {self.days:g}")
        if not 0 < self.slow <= 1:
            raise UsageError(f"slow must be a fraction of the period like 0.67 or 2/3, greater than 0 and at "
                             f"most 1, got {self.slow:g}")  # fmt: skip
        if self.skips_in_a_row < 1:
            raise UsageError(f"--skips must be at least 1, got {self.skips_in_a_row}")
        if self.min_runs < 1:
            raise UsageError(f"--min-runs must be at least 1, got {self.min_runs}")
        if self.crowded_slots < 1:
            raise UsageError(f"crowded_slots must be at least 1, got {self.crowded_slots}")

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


def manual_starts(events: Iterable[Event]) -> frozenset[str]:
    """The run ids of the manual starts (``cronwarden trigger``) among
    ``events``, from their ``triggered`` events. A manual start serves no
    slot: it is no attempt at one, neither for the monitor's ``missed`` and
    ``too_often`` nor for the slot ledger (``monitor.slots.decide``)."""
    return frozenset(e.run_id for e in events if e.kind is EventKind.TRIGGERED and e.run_id)


def slot_counts(
    attempts: Iterable[tuple[float, float | None]], schedule: str, period: float, most: int = 4
) -> tuple[tuple[float, int], ...]:
    """The newest ``most`` slots that had attempts (start time, and the slot
    the start was recorded for, if any), each with how many, newest first. A
    start up to min(60 s, period/10) before a fire counts for that fire (clock
    skew), as for ``missed``. Only the newest attempts are looked at: cron
    slots cost a cron walk each."""
    try:
        sched = parse_schedule(schedule)
    except UsageError:
        return ()
    early = min(60.0, period / 10)
    counts: dict[float, int] = {}
    for at, slot in sorted(attempts, key=lambda a: a[0], reverse=True)[: 4 * most]:
        s = float(slot) if slot is not None else float(sched.slot(at + early))
        if s not in counts and len(counts) >= most:
            break
        counts[s] = counts.get(s, 0) + 1
    return tuple(sorted(counts.items(), reverse=True))


def newest_slot(
    attempts: Iterable[tuple[float, float | None]], schedule: str, period: float
) -> tuple[tuple[float, int], ...]:
    """The first of ``slot_counts``: the newest slot that had attempts, with
    an upper bound of how many (exact when the slots were recorded, or when
    it is 1), for one cron walk instead of one per attempt. A count of 1
    means the slot is not crowded: what ``crowded`` needs to know."""
    newest = list(attempts)
    if len(newest) > 16:
        newest = sorted(newest, key=lambda a: a[0], reverse=True)[:16]
    if not newest:
        return ()
    try:
        sched = parse_schedule(schedule)
    except UsageError:
        return ()
    early = min(60.0, period / 10)
    at, slot = max(newest, key=lambda a: a[0])  # the first of the latest, as a stable sort gives
    first = float(slot) if slot is not None else float(sched.slot(at + early))
    # A computed slot is the latest fire at or before at + early: every later
    # attempt at or after that fire (less early) is in it.
    n = sum(1 for a, s in newest if (float(s) == first if s is not None else a + early >= first))
    return ((first, n),)


@functools.lru_cache(maxsize=4096)
def parse_schedule(text: str) -> Any:
    """``Schedule`` from what a ``JobInfo`` keeps (``CRON_TZ=Zone expr`` too).
    Kept per text (a ``Schedule`` is immutable): a pass over 2,000 jobs
    asks for the same few schedules thousands of times."""
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


class LazyDurations(Sequence[float]):
    """A rollup's window durations, decoded on first use: most readers of
    the statistics want p50 and p95 only, which the rollup has already."""

    def __init__(self, rollup: Any) -> None:
        self._rollup = rollup
        self._values: tuple[float, ...] | None = None

    def _all(self) -> tuple[float, ...]:
        if self._values is None:
            self._values = self._rollup.durations()
        return self._values

    def __len__(self) -> int:
        return int(self._rollup.w_completed)

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __iter__(self) -> Any:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


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
    durations: Sequence[float] = ()
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
    """Latest start or refused start: when the scheduler last fired (or
    decided a slot ``paused``, or the job was resumed)."""
    paused: bool = False
    """The job is paused (``cronwarden pause``): no start is expected."""
    last_success: float | None = None
    overlap_list: tuple[Overlap, ...] = ()
    stuck: tuple[Stuck, ...] = ()
    events_truncated: bool = False
    schedule_error: str | None = None
    rules: JobRules = field(default_factory=JobRules)
    """The job's own monitoring settings."""
    failing: Failing | None = None
    """Set when the job's last endings were bad (see ``failing_of``)."""
    slots: tuple[tuple[float, int], ...] = ()
    """The newest slots that had starts (refused ones included), each with how
    many, newest first (``slot_counts``); empty for an unscheduled job."""
    snooze: Any = None
    """The job's snooze or maintenance window now (``cronwarden.monitor.snooze.Snooze``), or None."""

    @property
    def crowded(self) -> int:
        """How many of the newest slots in a row had more than one start."""
        n = 0
        for _, count in self.slots:
            if count < 2:
                break
            n += 1
        return n

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
        if self.failing is not None:
            return Verdict.FAILING
        if self.overlaps:
            return Verdict.OVERLAPPING
        r = self.ratio
        enough = self.completed >= thresholds.min_runs
        if (
            (enough and r is not None and r >= thresholds.slow)
            or self.skips_in_a_row >= thresholds.skips_in_a_row
            or self.stuck
            or self.crowded >= thresholds.crowded_slots
        ):
            return Verdict.AT_RISK
        if self.period is None:
            return Verdict.UNSCHEDULED
        if r is None or not enough:
            return Verdict.UNKNOWN
        if r > 0.5:
            return Verdict.WATCH
        return Verdict.OK

    def notes(self, thresholds: Thresholds) -> list[str]:
        out: list[str] = []
        if self.failing is not None:
            f = self.failing
            out.append(f"failing: {f.bad} bad ending{'s' * (f.bad != 1)} in a row")
        if self.schedule_error:
            out.append(self.schedule_error)
        elif self.period is None:
            out.append("no schedule known")
        if self.crowded >= thresholds.crowded_slots:
            out.append(f"{self.slots[0][1]} starts in the last slot")
        if self.snooze is not None:
            out.append(str(self.snooze))
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
            "failing": None
            if self.failing is None
            else {
                "since": self.failing.since,
                "bad": self.failing.bad,
                "good": self.failing.good,
                "first_run_id": self.failing.first_run_id,
                "last_run_id": self.failing.last_run_id,
                "outcomes": list(self.failing.outcomes),
            },
            "snoozed": None if self.snooze is None else self.snooze.as_dict(),
            "notes": self.notes(thresholds),
        }
