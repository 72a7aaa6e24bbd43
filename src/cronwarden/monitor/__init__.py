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

Every job the ledger has runs or events of is a job (``Store.ledger_jobs``),
described or not; a job with no schedule is judged for what needs no period.

Findings are events (``slow``, ``skips_in_a_row``, ``missed``,
``grace_too_wide``, ``stuck``, ``overlap``, ``policy_undecided``,
``failing``, ``too_often``) with
``data["state"]`` ``"raised"`` or ``"resolved"``. A finding is identified by
(job, rule) or, for ``stuck`` and ``overlap``, by (job, rule, run id). Its
current state is the state of its last event in the ledger, so a finding is
recorded once when it becomes true and once when it stops, however many
monitors or ``check`` passes look at it (no alert storms). While the job is
snoozed (``Monitor.snooze``) or in a maintenance window, findings are still
recorded, with ``data["snoozed"] = true``, and alerting sinks are not sent
them (``cronwarden.sinks.route``). An ``overlap``
event without a state (recorded by the store under policy allow, or by a
report-only start) counts as raised: the monitor resolves it once the runs no
longer overlap.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.durations import format_duration
from cronwarden.errors import UsageError
from cronwarden.events import Event, EventKind, JobInfo, Outcome, RunRecord
from cronwarden.monitor.rules import (
    DEFAULT_RULES,
    FINDING_KINDS,
    PER_RUN,
    RAISED,
    RESOLVED,
    Condition,
    FailingRule,
    GraceTooWideRule,
    MissedRule,
    OverlapRule,
    PolicyUndecidedRule,
    Rule,
    Severity,
    SkipsInARowRule,
    SlowRule,
    StuckRule,
    TooOftenRule,
)
from cronwarden.monitor.snooze import SNOOZE_KINDS, Snooze, snooze_at, snooze_event, unsnooze_event
from cronwarden.monitor.stats import (
    ATTEMPT_KINDS,
    BAD_OUTCOMES,
    COMPLETED,
    WINDOW_EVENT_KINDS,
    Failing,
    JobRules,
    JobStats,
    LazyDurations,
    Overlap,
    Stuck,
    Thresholds,
    Verdict,
    failing_of,
    find_overlaps,
    manual_starts,
    newest_slot,
    parse_schedule,
    partition,
    quantile,
    slot_counts,
)
from cronwarden.stores.base import EventQuery, Store, abandon_expired
from cronwarden.stores.rollup import BAD_OUTCOMES as ROLLUP_BAD_OUTCOMES
from cronwarden.stores.rollup import ROLLUP_RUNS, Rollup

STATE_KINDS: tuple[EventKind, ...] = (*FINDING_KINDS, *SNOOZE_KINDS)
"""The events a job's finding states and snoozes are derived from."""
PAUSE_KINDS: tuple[EventKind, ...] = (EventKind.PAUSED, EventKind.JOB_PAUSED, EventKind.JOB_RESUMED)
"""The events whose newest says whether a job is paused (``_with_pause``)."""

__all__ = [
    "BAD_OUTCOMES",
    "DEFAULT_RULES",
    "FINDING_KINDS",
    "PER_RUN",
    "RAISED",
    "RESOLVED",
    "Condition",
    "Failing",
    "FailingRule",
    "GraceTooWideRule",
    "JobRules",
    "JobStats",
    "MissedRule",
    "Monitor",
    "Overlap",
    "OverlapRule",
    "Pass",
    "PolicyUndecidedRule",
    "Rule",
    "Severity",
    "SkipsInARowRule",
    "SlowRule",
    "Snooze",
    "Stuck",
    "StuckRule",
    "Thresholds",
    "TooOftenRule",
    "Verdict",
    "find_overlaps",
    "parse_schedule",
    "partition",
    "quantile",
]


@dataclass(frozen=True, kw_only=True)
class _Reads:
    """What a pass reads once for every job (``Monitor._reads``)."""

    rollups: Mapping[str, Rollup]
    pauses: Mapping[str, list[Event]]
    """Each job's newest pause event (``Monitor._pauses``)."""
    attempts: Mapping[str, list[Any]]
    """Each rollup's ``attempts``, decoded."""
    windows: Mapping[str, list[RunRecord]]
    """The window's runs (``Store.runs``) of each job whose ``failing`` its
    rollup cannot decide (``Monitor._window_decides``)."""


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
        """The worst finding that holds, snoozed ones left out: a snoozed
        job pages no one, ``check`` included."""
        return max((c.severity for c in self.active if not c.snoozed), default=Severity.OK)


class Monitor:
    """Statistics, rules and findings over one store.

    ``store`` is a ``Store`` the caller owns. ``clock.wall()`` is read once per
    pass. ``extra_jobs`` adds jobs known from elsewhere (the config file) to
    those the store knows; they win over the store's record of the same name.
    ``job_rules`` holds jobs' own monitoring settings (failure and recovery
    thresholds, maintenance windows); other jobs get ``default_rules``.
    ``use_rollups``: read each job's statistics from the store's rollup where
    it answers them exactly (see ``_from_rollup``), the ledger otherwise;
    False reads the ledger for every job.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock = SYSTEM_CLOCK,
        thresholds: Thresholds | None = None,
        rules: Sequence[Rule] = DEFAULT_RULES,
        extra_jobs: Sequence[JobInfo] = (),
        job_rules: Mapping[str, JobRules] | None = None,
        default_rules: JobRules | None = None,
        use_rollups: bool = True,
    ) -> None:
        self.store = store
        self.use_rollups = use_rollups
        self.clock = clock
        self.thresholds = thresholds or Thresholds()
        self.rules = tuple(rules)
        self.extra_jobs = tuple(extra_jobs)
        self.job_rules = dict(job_rules or {})
        self.default_rules = default_rules or JobRules()
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

    def rules_of(self, job: str) -> JobRules:
        return self.job_rules.get(job, self.default_rules)

    def known_jobs(self, open_runs: Sequence[RunRecord] = ()) -> dict[str, JobInfo | None]:
        """Jobs the store describes, plus ``extra_jobs``, plus every job the
        ledger has runs or events of (described or not: None), plus jobs with
        open runs."""
        jobs: dict[str, JobInfo | None] = dict.fromkeys(self.store.ledger_jobs())
        jobs.update({j.name: j for j in self.store.jobs()})
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
        return self._with_pause(self._read(job, info, now, self.store.open_runs(job)))

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
        rules = self.rules_of(job)
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
        # The last attempt at a slot (for missed): a manual start and its refusal are none.
        manual = manual_starts(events)
        scheduled = [r for r in window if r.run_id not in manual]
        refused = [e for e in events if e.kind in ATTEMPT_KINDS and e.run_id not in manual]
        last_scheduled = max((r.started_at for r in scheduled), default=None)
        last_refusal = next((e.at for e in refused), None)
        last_attempt = max((x for x in (last_scheduled, last_refusal) if x is not None), default=None)

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

        failing = _failing(recent, rules)
        schedule = _schedule_text(info, period)
        slots: tuple[tuple[float, int], ...] = ()
        if schedule is not None and period and schedule_error is None:
            # Queued starts are not counted: each one is counted when it starts.
            attempts = [(r.started_at, r.slot) for r in scheduled]
            attempts += [(e.at, None) for e in refused if e.kind in (EventKind.SKIPPED, EventKind.QUEUE_FULL)]
            slots = slot_counts(attempts, schedule, period)

        return JobStats(
            job=job, info=info, now=now, window_start=window_start,
            schedule=schedule,
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
            rules=rules, failing=failing, slots=slots,
        )  # fmt: skip

    def _rollups(self) -> dict[str, Rollup]:
        """The store's rollups, when this monitor's window is theirs."""
        if not self.use_rollups or self.thresholds.runs != ROLLUP_RUNS:
            return {}
        return self.store.rollups() or {}

    def _all_stats(
        self,
        known: Mapping[str, JobInfo | None],
        now: float,
        by_job: Mapping[str, list[RunRecord]],
        reads: _Reads,
    ) -> dict[str, JobStats]:
        """Every known job's statistics: from its rollup where that answers
        them, else from the ledger. ``reads``: what the pass read once for
        every job. A rollup counts every start, a manual one too, which is no
        slot's attempt: a job with a manual start (``triggered``) since the
        time its numbers from the rollup depend on is read from the ledger,
        all jobs' manual starts in one read."""
        found: dict[str, JobStats] = {}
        since: dict[str, float] = {}
        for job, info in known.items():
            opened = by_job.get(job, [])
            rollup = reads.rollups.get(job)
            fast = (
                self._from_rollup(job, info, now, rollup, reads)
                if rollup is not None and not opened
                else None
            )
            if fast is None:
                found[job] = self._read(job, info, now, opened)
            else:
                found[job], since[job] = fast
        for job in self.store.latest_since(since, (EventKind.TRIGGERED,)) if since else ():
            found[job] = self._read(job, known[job], now, by_job.get(job, []))
        return {job: self._with_pause(stats, reads.pauses) for job, stats in found.items()}

    def _reads(
        self, known: Mapping[str, JobInfo | None], rollups: dict[str, Rollup], opened: Mapping[str, Any]
    ) -> _Reads:
        """What a pass over ``known`` reads once for every job rather than
        once per job (``opened``: the jobs with open runs, which are read
        from the ledger)."""
        # Every rollup's attempts decoded in one json.loads: one call per job costs more than the parsing.
        decoded = json.loads("[" + ",".join(r.attempts for r in rollups.values()) + "]")
        ordered = [job for job, r in rollups.items() if job in known and job not in opened
                   and self._window_decides(r, self.rules_of(job))]  # fmt: skip
        return _Reads(
            rollups=rollups,
            pauses=self._pauses(list(known)),
            attempts=dict(zip(rollups, decoded, strict=True)),
            windows=self.store.latest_runs(ordered, self.thresholds.runs) if ordered else {},
        )

    @staticmethod
    def _window_decides(r: Rollup, rules: JobRules) -> bool:
        """Whether ``failing`` depends on the order of the window's runs: a
        bad ending in it, not followed by enough successes for the rollup's
        counts alone to say it is over."""
        outcomes = r.w_outcomes
        need = rules.recovery_threshold
        return any(outcomes.get(o, 0) for o in ROLLUP_BAD_OUTCOMES) and (
            r.good_in_a_row < need or outcomes.get(Outcome.SUCCEEDED, 0) < need
        )

    def _pauses(self, jobs: Sequence[str]) -> Mapping[str, list[Event]]:
        """Each job's newest pause event, in one read for a pass."""
        return self.store.latest_events(jobs, PAUSE_KINDS, 1)

    def _with_pause(self, stats: JobStats, pauses: Mapping[str, list[Event]] | None = None) -> JobStats:
        """A scheduled job's pause (``cronwarden pause``), one indexed read:
        while paused it is not expected to start, and a slot recorded
        ``paused`` or a resume counts as the scheduler's last attempt, so
        neither the pause nor the slots it held back are reported missed."""
        if stats.schedule is None:
            return stats
        import dataclasses

        # The newest of the pause's three kinds says both: paused (a pause,
        # or a slot held back by one) or not (a resume), and since when.
        if pauses is not None:
            newest = pauses.get(stats.job, [])
        else:
            newest = self.store.events(EventQuery(job=stats.job, kinds=PAUSE_KINDS, limit=1))
        if not newest:
            return stats
        last = newest[0]
        attempt = max(last.at, stats.last_attempt or last.at)
        return dataclasses.replace(stats, paused=last.kind is not EventKind.JOB_RESUMED, last_attempt=attempt)

    def _from_rollup(
        self, job: str, info: JobInfo | None, now: float, r: Rollup, reads: _Reads | None = None
    ) -> tuple[JobStats, float] | None:
        """The statistics ``_read`` would compute, from the job's rollup, or
        None where the rollup cannot say (the ledger is read then): a stale
        row, a window with a flagged run (an abandoned run, another lease
        key, a start before an earlier end: an overlap to find), a window
        older than ``days``, skips or overlap events the row does not hold.
        With the statistics, the time from which a manual start (its
        ``triggered`` event is written after its start or refusal) would
        change them: the newest attempt, or the oldest of those counted
        when the newest slot had more than one; the caller reads the ledger
        if there is one (``_all_stats``).
        A window with a bad ending that enough successes have not followed
        reads the window's runs (not its events) for ``failing``, whose
        streaks depend on their order. ``reads``: the pass's reads for every
        job (``_reads``), if the caller has them. The job has no open run
        (the caller checks)."""
        t = self.thresholds
        since = now - t.days * 86400
        if r.stale or r.w_flagged or not r.w_runs or r.w_oldest is None or r.w_oldest < since:
            return None
        decoded = json.loads(r.attempts) if reads is None else reads.attempts[job]
        window_start = r.w_oldest if r.w_runs >= t.runs else since
        times = r.skip_times
        if len(times) < r.skips and (not times or times[0] >= window_start):
            return None  # skips older than the row keeps may be in the window
        if r.last_overlap is not None and r.last_overlap >= window_start:
            return None
        skips = sum(1 for x in times if x >= window_start)
        if skips >= t.event_limit:
            return None
        rules = self.rules_of(job)
        outcomes = dict(r.w_outcomes)
        # The window's runs, in order, where they decide failing: one bounded read, no events
        # (or read already, for every such job, by the pass: ``_reads``).
        if reads is not None:
            recent = reads.windows.get(job)
        else:
            recent = self.store.runs(job, t.runs) if self._window_decides(r, rules) else None
        failing = None if recent is None else _failing([x for x in recent if x.started_at >= since], rules)
        period, schedule_error = self._period(info, now)
        schedule = _schedule_text(info, period)
        slots: tuple[tuple[float, int], ...] = ()
        attempts = [(a[0], a[1]) for a in decoded if a[0] >= window_start]
        refusal = r.last_refusal if r.last_refusal is not None and r.last_refusal >= window_start else None
        last_attempt = max((x for x in (r.last_start, refusal) if x is not None), default=None)
        # A manual start changes what follows from the newest attempt on (its slot, the last
        # attempt); from the oldest attempt on when every counted slot's attempts matter.
        newest = max((a[0] for a in attempts), default=window_start if last_attempt is None else last_attempt)
        manual_since = newest
        if schedule is not None and period and schedule_error is None:
            slots = newest_slot(attempts, schedule, period)
            if slots and slots[0][1] > 1:  # crowded, maybe: every slot's count, as the ledger gives them
                slots = slot_counts(attempts, schedule, period)
                manual_since = min(a[0] for a in attempts)
        stats = JobStats(
            job=job, info=info, now=now, window_start=window_start,
            schedule=schedule,
            period=period, grace=t.grace(info, period), schedule_error=schedule_error,
            runs=r.w_runs, completed=r.w_completed, durations=LazyDurations(r),
            p50=r.p50, p95=r.p95, max=r.w_max, outcomes=outcomes,
            failures=outcomes.get(Outcome.FAILED, 0) + outcomes.get(Outcome.TIMED_OUT, 0),
            lease_losses=outcomes.get(Outcome.LEASE_LOST, 0),
            skips=skips, skips_in_a_row=r.skips_in_a_row, overlaps=0, open_runs=0,
            last_start=r.last_start, last_attempt=last_attempt, last_success=r.w_last_success,
            rules=rules, failing=failing, slots=slots,
        )  # fmt: skip
        return stats, manual_since

    def audit(self) -> list[JobStats]:
        """Every known job's statistics. Read-only."""
        now = self.clock.wall()
        opened = self.store.open_runs()
        by_job: dict[str, list[RunRecord]] = {}
        for r in opened:
            by_job.setdefault(r.job, []).append(r)
        known = self.known_jobs(opened)
        reads = self._reads(known, self._rollups(), by_job)
        return list(self._all_stats(known, now, by_job, reads).values())

    # -- findings ---------------------------------------------------------

    def states(self, job: str) -> dict[tuple[EventKind, str | None], Event]:
        """The last finding event of each (rule, run id) of ``job``: its state."""
        return self._states(job)[0]

    def _states(
        self, job: str, read: list[Event] | None = None
    ) -> tuple[dict[tuple[EventKind, str | None], Event], list[Event]]:
        """The finding states of ``job`` and its snooze events, in one read
        (or from ``read``, the job's share of ``_all_states``)."""
        found = list(read) if read is not None else self.store.events(
            EventQuery(job=job, kinds=STATE_KINDS, limit=self.thresholds.finding_limit)
        )  # fmt: skip
        found.sort(key=lambda e: (e.at, e.seq or 0))
        last: dict[tuple[EventKind, str | None], Event] = {}
        snoozes = [e for e in found if e.kind in SNOOZE_KINDS]
        for e in found:
            if e.kind in SNOOZE_KINDS:
                continue
            if "state" not in e.data and e.kind is not EventKind.OVERLAP:
                continue  # a fact (e.g. a scheduler's missed slot), not a finding
            last[(e.kind, e.run_id if e.kind in PER_RUN else None)] = e
        return last, snoozes

    def snooze_of(self, job: str) -> Snooze | None:
        """The job's snooze or maintenance window now, if any."""
        return snooze_at(self.clock.wall(), self._states(job)[1], self.rules_of(job).maintenance)

    def snooze(self, job: str, seconds: float, *, by: str = "", reason: str = "") -> Event:
        """Record that ``job``'s findings are not delivered to alerting sinks
        for ``seconds`` from now (they are still recorded and shown)."""
        event = snooze_event(job, self.clock.wall(), seconds, by=by, reason=reason)
        self.store.record(event)
        return event

    def unsnooze(self, job: str, *, by: str = "", reason: str = "") -> Event:
        """End ``job``'s snooze now (a maintenance window still holds in its hours)."""
        event = unsnooze_event(job, self.clock.wall(), by=by, reason=reason)
        self.store.record(event)
        return event

    def evaluate(self, *, record: bool = True) -> Pass:
        """One pass over every job: statistics, rules, and the findings that
        changed state recorded as events (unless ``record`` is false). Open
        runs whose lease expired are recorded ``abandoned``."""
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
        rollups = self._rollups()
        stale = [job for job, r in rollups.items() if r.stale]
        if record and stale:  # a store upgraded from a version without rollups: once
            self.store.rebuild_rollups(stale)
            rollups = self._rollups()
        known = self.known_jobs(opened)
        # Every job's finding states in one read, not one per job.
        read = self.store.latest_events(list(known), STATE_KINDS, self.thresholds.finding_limit)
        every = self._all_stats(known, now, by_job, self._reads(known, rollups, by_job))
        for name, stats in every.items():
            all_stats.append(stats)
            conditions = [c for rule in self.rules for c in rule.evaluate(stats, self.thresholds)]
            if record:
                abandoned.extend(self._abandon_expired(stats, now))
            states, snoozes = self._states(name, read.get(name, []))
            snoozed = snooze_at(now, snoozes, stats.rules.maintenance)
            if snoozed is not None:
                stats = dataclasses.replace(stats, snooze=snoozed)
                all_stats[-1] = stats
                conditions = [dataclasses.replace(c, snoozed=True) for c in conditions]
            mark: dict[str, Any] = {} if snoozed is None else {"snoozed": True, "snooze": snoozed.as_dict()}
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
                          **c.data, **mark},
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
                        **mark,
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
                if mark or last.data.get("snoozed") is True:
                    # Now snoozed, or raised while snoozed (never delivered): the resolution
                    # alone would be news of something nobody was told.
                    gone.update(mark or {"snoozed": True})
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


@functools.lru_cache(maxsize=256)
def _every(period: float) -> str:
    return f"every {format_duration(period)}"


def _schedule_text(info: JobInfo | None, period: float | None) -> str | None:
    """The schedule a job's statistics show: its own text, else its period
    as ``every …`` (formatted once per period: a pass asks thousands of times)."""
    if info is not None and info.schedule:
        return info.schedule
    return _every(period) if period else None


def _failing(recent: Sequence[RunRecord], rules: JobRules) -> Failing | None:
    """``failing`` over a window's runs (newest first, as ``Store.runs``)."""
    return failing_of((r for r in reversed(recent) if r.outcome is not None), rules)


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
        EventKind.FAILING: "runs succeed again (the recovery threshold in a row)",
        EventKind.TOO_OFTEN: "a slot had one start",
    }.get(rule, "no longer holds")
