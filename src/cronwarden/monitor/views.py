"""Read models of the ledger, shared by the command line and the dashboard:
one job's audit line, a finding that holds, a job's history, the runs open
now, and how times and durations are written."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cronwarden.durations import format_duration
from cronwarden.events import EventKind, JobInfo, Outcome, RunRecord
from cronwarden.stores.base import EventQuery

if TYPE_CHECKING:
    from cronwarden.monitor import Condition, JobStats, Thresholds
    from cronwarden.monitor.slots import SlotDecision
    from cronwarden.stores.base import Store


def when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def dur(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def strict_failures(stats: JobStats, thresholds: Thresholds) -> list[str]:
    """Why ``audit --strict`` fails for one job (empty: it passes)."""
    from cronwarden.monitor import Verdict

    verdict = stats.verdict(thresholds)
    decided = stats.policy == "allow" and stats.reason.strip()
    why = []
    if verdict is Verdict.FAILING:
        why.append("failing")
    if verdict is Verdict.AT_RISK:
        why.append("at risk")
    if verdict is Verdict.OVERLAPPING and not decided:
        why.append("overlapping")
    if stats.undecided(thresholds):
        why.append("undecided")
    return why


def audit_item(stats: JobStats, thresholds: Thresholds) -> dict[str, Any]:
    """One job as ``audit --json`` (and the dashboard's ``/api/jobs``) shows it."""
    return {**stats.as_dict(thresholds), "strict": strict_failures(stats, thresholds)}


def condition_item(c: Condition) -> dict[str, Any]:
    """A finding that holds, as ``check --json`` (and the dashboard's ``/api/jobs``) shows it."""
    return {"severity": c.severity.name.lower(), "job": c.job, "rule": c.rule.value, "run_id": c.run_id,
            "summary": c.summary, "data": dict(c.data), "snoozed": c.snoozed}  # fmt: skip


REFUSALS = (EventKind.SKIPPED, EventKind.QUEUED, EventKind.QUEUE_FULL, EventKind.OVERLAP)
"""The starts that met an open run, shown between a job's runs."""


REFUSAL_SLACK = 60.0
"""Seconds before the oldest shown run's start in which refusals are read:
a refusal is stamped by its writer's clock, its holder's start by another
host's, so a skip can be stamped just before the start of the run that
refused it."""


def history_items(store: Store, job: str, limit: int) -> list[dict[str, Any]]:
    """A job's last ``limit`` runs and the refused or overlapping starts
    since the oldest of them, newest first, as ``history --json`` and the
    dashboard show them. A refusal by one of the shown runs is shown even
    when stamped before that run's start (clocks differ)."""
    runs = store.runs(job, limit)
    since = runs[-1].started_at if runs else None
    shown = {r.run_id for r in runs}
    read_since = None if since is None else since - REFUSAL_SLACK
    refusals = [
        e
        for e in store.events(EventQuery(job=job, kinds=REFUSALS, since=read_since, limit=10_000))
        if since is None or e.at >= since or e.data.get("holder_run_id") in shown or e.run_id in shown
    ]
    backfills = {
        e.data.get("run_id"): e.data.get("slot")
        for e in store.events(
            EventQuery(job=job, kinds=[EventKind.BACKFILLED], since=read_since, limit=10_000)
        )
    }
    manual = _manual(store, job, read_since)
    # What the end events of interrupted and stopped runs hold besides the
    # run's record: the signal; who asked for the stop and why (one read,
    # only when a shown run ended so).
    told = [o.event for o in (Outcome.INTERRUPTED, Outcome.STOPPED) if any(r.outcome is o for r in runs)]
    ends: dict[str | None, Any] = {}
    if told:
        query = EventQuery(job=job, kinds=told, since=read_since, limit=10_000)
        ends = {e.run_id: e.data for e in store.events(query) if e.run_id in shown}
    items: list[tuple[float, dict[str, Any]]] = []
    for r in runs:
        item = {
            "type": "run", "run_id": r.run_id, "started_at": r.started_at, "host": r.host, "pid": r.pid,
            "token": r.token, "outcome": r.outcome.value if r.outcome else "running",
            "duration": r.duration, "exit_code": r.exit_code, "detail": r.detail,
            "backfill_of": backfills.get(r.run_id), "manual": manual.get(r.run_id),
        }  # fmt: skip
        end = ends.get(r.run_id, {})
        if "signal" in end:
            item["signal"] = end["signal"]
        if r.outcome is Outcome.STOPPED and "by" in end:
            item["stopped"] = {"by": end["by"], "reason": end.get("reason", "")}
        items.append((r.started_at, item))
    for e in refusals:
        item = {"type": e.kind.value, "run_id": e.run_id, "at": e.at, **dict(e.data)}
        if e.run_id in manual:
            item["manual"] = manual[e.run_id]
        items.append((e.at, item))
    items.sort(key=lambda item: item[0], reverse=True)
    return [i for _, i in items]


def _manual(store: Store, job: str, since: float | None) -> dict[str, dict[str, Any]]:
    """The job's manual starts (``cronwarden trigger``) since ``since``:
    run id -> who started it and why."""
    query = EventQuery(job=job, kinds=[EventKind.TRIGGERED], since=since, limit=10_000)
    return {e.run_id: {"by": e.data.get("by"), "reason": e.data.get("reason")}
            for e in store.events(query) if e.run_id}  # fmt: skip


def slot_items(
    store: Store, job: str, info: JobInfo | None, now: float, *, limit: int = 20, since: float | None = None
) -> list[dict[str, Any]]:
    """The job's slot ledger (``monitor.slots``), newest slot first: the
    slots after ``since`` (epoch seconds), else its last ``limit`` slots, as
    ``history --slots`` shows them. Raises UsageError when the job has no
    schedule known."""
    from cronwarden.errors import UsageError
    from cronwarden.monitor.slots import MOST_SLOTS, SLOT_EVENT_KINDS, decide, expected_slots
    from cronwarden.monitor.stats import Thresholds, parse_schedule

    schedule = info.schedule if info is not None else None
    if not schedule:
        raise UsageError(
            f"history --slots: no schedule known for {job}; run it with --every/--schedule, describe it "
            "(cronwarden report describe), or give --config with its [jobs.NAME] table"
        )
    period = float(parse_schedule(schedule).period(now))
    grace = Thresholds().grace(info, period) or 0.0
    start = since if since is not None else now - (limit + 1) * period
    slots = expected_slots(schedule, start, now, MOST_SLOTS if since is not None else limit)
    if not slots:
        return []
    early = min(60.0, period / 10)
    runs = [r for r in store.runs(job, 4 * len(slots) + 50) if r.started_at >= slots[0] - early]
    events = store.events(
        EventQuery(job=job, kinds=SLOT_EVENT_KINDS, since=slots[0] - early, limit=8 * len(slots) + 100)
    )
    decided = decide(slots, schedule, period, grace, now, runs, events)
    return [d.as_dict() for d in reversed(decided)]


def history_note(item: dict[str, Any]) -> str:
    """What a ``history_items`` item's NOTE says: a run's detail or exit
    status; a refused start's holder and how long it had held."""
    if item["type"] == "run":
        note = str(item["detail"] or ("" if item["exit_code"] in (None, 0) else f"exit {item['exit_code']}"))
        slot = item.get("backfill_of")
        if isinstance(slot, int | float):
            note = "; ".join(filter(None, [f"backfill of the {when(slot)} slot", note]))
        return "; ".join(filter(None, [_manual_note(item), note]))
    age = item.get("holder_age")
    held = f" for {format_duration(age)}" if isinstance(age, int | float) else ""
    return "; ".join(filter(None, [_manual_note(item), f"held by {item.get('holder_run_id', '?')}{held}"]))


def _manual_note(item: dict[str, Any]) -> str:
    """``manual by alice@ops-1: why`` for a manual start's item, else ""."""
    manual = item.get("manual")
    if not isinstance(manual, dict):
        return ""
    why = f": {manual['reason']}" if manual.get("reason") else ""
    return f"manual by {manual.get('by') or 'someone'}{why}"


def state(run: RunRecord) -> str:
    if run.expires_in is None:
        return "lease gone"
    if run.expires_in <= 0:
        return "expired (abandoned at next start)"
    return "running"


def open_runs(
    store: Store, job: str | None = None, runs: Sequence[RunRecord] | None = None
) -> list[tuple[RunRecord, int]]:
    """The runs open now (or ``runs``, read already), each with its lease's
    pending (queued) starts."""
    out = []
    for r in store.open_runs(job) if runs is None else runs:
        info = store.lease(r.key)
        out.append((r, info.pending if info else 0))
    return out


def open_run_item(r: RunRecord, pending: int, now: float) -> dict[str, Any]:
    """An open run as ``status --json`` and the dashboard's API show it."""
    return {
        "type": "run", "job": r.job, "run_id": r.run_id, "key": r.key, "host": r.host, "pid": r.pid,
        "started_at": r.started_at, "age": round(now - r.started_at, 3), "token": r.token,
        "lease_expires_in": None if r.expires_in is None else round(r.expires_in, 3),
        "state": state(r).split(" ")[0], "pending": pending,
    }  # fmt: skip


STRIP_SLOTS = 20
"""Cells in a job's strip on the dashboard's front page."""

_RUN_CELL = {"succeeded": "ok", "running": "run", "replaced": "other", "stopped": "other"}
"""A run's cell by its outcome; every other ending (failed, timed out, lease
lost, abandoned, interrupted) is ``bad``, as it counts toward ``failing``."""


@dataclass(frozen=True)
class Cell:
    """One cell of a job's strip: ``kind`` (ok, bad, run, other, late,
    queued, skipped, paused, misfired, missed, due) and what happened."""

    kind: str
    at: float
    what: str


def strip_runs(n: int = STRIP_SLOTS) -> int:
    """How many of a job's latest runs its strip of ``n`` slots reads at
    most: a page of jobs reads them for every row at once
    (``Store.latest_runs``) and hands each row its own (``strip_cells``)."""
    return 2 * n + 4


def strip_cells(
    store: Store, stats: JobStats, n: int = STRIP_SLOTS, runs: Sequence[RunRecord] | None = None
) -> list[Cell]:
    """The job's last ``n`` slots, oldest first, one cell each: what the slot
    ledger (``monitor.slots.decide``) decided for it, a run's cell coloured
    by how it ended. A job without a schedule has its last ``n`` runs
    instead. Two bounded reads (see ``slot_decisions``), so a page of jobs
    costs what its rows cost, whatever the size of the ledger; ``runs``: the
    job's latest ``strip_runs(n)`` runs (newest first), if the caller read
    them, which spares one."""
    if not (stats.schedule and stats.period and stats.schedule_error is None):
        latest = store.runs(stats.job, n) if runs is None else runs[:n]
        return [_run_cell(r.started_at, r.outcome.value if r.outcome else "running", r.run_id)
                for r in reversed(latest)]  # fmt: skip
    cells = []
    for d in slot_decisions(store, stats, stats.now - (n + 1) * stats.period, n, runs):
        if d.decision in ("ran", "late") and d.outcome is not None:
            cell = _run_cell(d.slot, d.outcome, d.run_id or "")
            if d.decision == "late" and cell.kind == "ok":
                cell = Cell("late", d.slot, f"started {format_duration(d.late_by or 0.0)} late, succeeded")
            cells.append(cell)
            continue
        holder = f" (held by {d.run_id})" if d.run_id and d.decision in ("queued", "skipped") else ""
        cells.append(Cell(d.decision, d.slot, f"{d.decision}{holder}"))
    return cells


def slot_decisions(
    store: Store, stats: JobStats, since: float, most: int, runs: Sequence[RunRecord] | None = None
) -> list[SlotDecision]:
    """The slot ledger's decisions (oldest first) for the job's last ``most``
    slots after ``since``; empty for a job without a schedule. Two reads,
    bounded by ``most``: the job's latest runs (or the first of ``runs``,
    its latest ``strip_runs(most)`` if the caller read them) and its
    refusals and scheduler decisions since the first slot. A slot older
    than what the reads reached (many extra starts) is left out rather than
    called missed."""
    from cronwarden.monitor.slots import SLOT_EVENT_KINDS, decide, expected_slots

    if not (stats.schedule and stats.period and stats.schedule_error is None):
        return []
    period, grace = stats.period, stats.grace or 0.0
    slots = expected_slots(stats.schedule, since, stats.now, most)
    if not slots:
        return []
    early = min(60.0, period / 10)
    read = strip_runs(len(slots))  # a crowded slot's extra starts, within reason
    runs = store.runs(stats.job, read) if runs is None else list(runs[:read])
    events = store.events(
        EventQuery(job=stats.job, kinds=SLOT_EVENT_KINDS, since=slots[0] - early, limit=4 * read)
    )
    reached = max(
        runs[-1].started_at if len(runs) >= read else -math.inf,
        events[-1].at if len(events) >= 4 * read else -math.inf,
    )
    slots = [s for s in slots if s + early > reached]
    return decide(slots, stats.schedule, period, grace, stats.now, runs, events)


def _run_cell(at: float, outcome: str, run_id: str) -> Cell:
    return Cell(_RUN_CELL.get(outcome, "bad"), at, f"{outcome} ({run_id})" if run_id else outcome)
