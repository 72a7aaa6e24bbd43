"""The slot ledger: for a job with a schedule, every expected fire time (a
slot) in a span gets exactly one decision, derived from the ledger.

Each attempt on record is counted for one slot (a manual start, by
``cronwarden trigger``, is none: it serves no slot): a run for the slot it was
started for (``RunRecord.slot``), a scheduler's decision (``paused``,
``misfired``, ``missed``) for the slot in its data, any other (a skip, a
queued start, a run with no slot) for the fire at or before it, where a start
up to min(60 s, period/10) early counts for the next fire (clock skew), as for
the monitor's ``missed``. A slot's decision is its best attempt, in this
order; the other attempts of the slot are its ``extra`` (``too_often``):

- ``ran``: a run started by slot + grace (its run id, outcome);
- ``backfilled``: a run started later by ``cronwarden backfill`` (how late);
- ``late``: a run started after slot + grace (how late);
- ``queued``: a start queued behind a holder (it runs when the holder ends);
- ``skipped``: a start refused by a holder (the holder's run id), or
  ``queue_full``;
- ``paused``: the scheduler did not start it, the job was paused;
- ``misfired``: the scheduler did not start it late (how late it was);
- ``missed``: nothing by slot + grace;
- ``due``: nothing yet, and slot + grace has not passed.

So no slot is without a decision, by construction: every slot of the span
is listed, and one with no attempt is ``missed`` or ``due``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cronwarden.events import Event, EventKind, RunRecord
from cronwarden.monitor.stats import manual_starts, parse_schedule

SLOT_EVENT_KINDS: tuple[EventKind, ...] = (
    EventKind.SKIPPED,
    EventKind.QUEUED,
    EventKind.QUEUE_FULL,
    EventKind.PAUSED,
    EventKind.MISFIRED,
    EventKind.MISSED,
    EventKind.BACKFILLED,
    EventKind.TRIGGERED,
)
"""The events a slot's decision is read from, besides the runs (and the
manual starts, which ``decide`` leaves out)."""

RANK = ("ran", "backfilled", "late", "queued", "skipped", "paused", "misfired", "missed", "due")
"""Decisions, best first: a slot's decision is its best attempt."""

_RANK = {decision: i for i, decision in enumerate(RANK)}

MOST_SLOTS = 10_000
"""The longest span listed at once (a week of one-minute slots)."""


@dataclass(frozen=True, kw_only=True)
class SlotDecision:
    slot: float
    decision: str
    """One of ``RANK``."""
    run_id: str | None = None
    """The run (ran, late), or the holder that refused or queued the start."""
    at: float | None = None
    """When the deciding attempt happened (a start, a refusal, a scheduler's decision)."""
    outcome: str | None = None
    """How the run ended (``running`` while open)."""
    late_by: float | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)
    """Other attempts counted for the slot, as ``decision:run id``."""

    def as_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "decision": self.decision, "run_id": self.run_id, "at": self.at,
                "outcome": self.outcome, "late_by": self.late_by, "extra": list(self.extra)}  # fmt: skip


def expected_slots(schedule: str, since: float, until: float, most: int = MOST_SLOTS) -> list[float]:
    """The fire times in (since, until], oldest first, at most the newest ``most``."""
    out: list[float] = []
    for t in parse_schedule(schedule).fires(since):
        if t > until:
            break
        out.append(t)
    return out[-most:]


def decide(
    slots: Sequence[float],
    schedule: str,
    period: float,
    grace: float,
    now: float,
    runs: Iterable[RunRecord],
    events: Iterable[Event],
) -> list[SlotDecision]:
    """One decision per slot of ``slots`` (oldest first), from the runs and
    the ``SLOT_EVENT_KINDS`` events around them. Attempts that belong to no
    listed slot are left out, and so are the manual starts (``cronwarden
    trigger``: a run, or its refusal, with a ``triggered`` event among
    ``events``): they serve no slot, as for the monitor's ``missed``."""
    sched = parse_schedule(schedule)
    early = min(60.0, period / 10)
    listed = set(slots)
    events = list(events)
    manual = manual_starts(events)
    runs = [r for r in runs if r.run_id not in manual]
    events = [e for e in events if e.kind is not EventKind.TRIGGERED and e.run_id not in manual]
    backfilled = {e.data.get("run_id") for e in events if e.kind is EventKind.BACKFILLED}
    # Per slot, its attempts as (rank, at, decision, run id, outcome, late by): the best of
    # them becomes the slot's decision, the others its ``extra``.
    attempts: dict[float, list[tuple[int, float, str, str | None, str | None, float | None]]] = {}

    def slot_of(at: float, recorded: Any) -> float:
        return float(recorded) if isinstance(recorded, int | float) else float(sched.slot(at + early))

    for r in runs:
        s = slot_of(r.started_at, r.slot)
        if s not in listed:
            continue
        late = r.started_at - s
        kind = "ran" if late <= grace else "backfilled" if r.run_id in backfilled else "late"
        outcome = r.outcome.value if r.outcome is not None else "running"
        late_by = round(late, 3) if kind != "ran" else None
        attempts.setdefault(s, []).append((_RANK[kind], r.started_at, kind, r.run_id, outcome, late_by))
    for e in events:
        if (e.kind is EventKind.MISSED and "state" in e.data) or e.kind is EventKind.BACKFILLED:
            continue  # the monitor's finding, or what a run (counted above) was
        s = slot_of(e.at, e.data.get("slot"))
        if s not in listed:
            continue
        kind = {EventKind.QUEUE_FULL: "skipped"}.get(e.kind, e.kind.value)
        said = e.data.get("late_by")
        late_by = float(said) if isinstance(said, int | float) else None
        holder = e.data.get("holder_run_id")
        attempts.setdefault(s, []).append((_RANK[kind], e.at, kind, holder, None, late_by))

    out: list[SlotDecision] = []
    for s in slots:
        found = sorted(attempts.get(s, []), key=lambda a: (a[0], a[1]))
        if not found:
            out.append(SlotDecision(slot=s, decision="missed" if now >= s + grace else "due"))
            continue
        _, at, decision, run_id, ended, late_by = found[0]
        extra = tuple(f"{a[2]}:{a[3] or '-'}" for a in found[1:])
        out.append(SlotDecision(slot=s, decision=decision, run_id=run_id, at=at, outcome=ended,
                                late_by=late_by, extra=extra))  # fmt: skip
    return out
