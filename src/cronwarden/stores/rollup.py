"""Each job's rollup: statistics every store keeps as runs start and end, so
the monitor reads one small row per job instead of each job's window of the
ledger.

The stores keep it in the step that writes the ledger (SQLite and
PostgreSQL: triggers in ``schema.sql``/``functions.sql``; Redis: the Lua
scripts that start and end runs and record events). ``fold`` here is the
same computation over a ledger read back, written once in Python: it is
what ``Store.rebuild_rollups`` writes, and the reference the stores' own
arithmetic is tested against (tests/contract/test_rollup.py).

The window is the job's last ``ROLLUP_RUNS`` ended runs, in the order they
ended. A run is *flagged* when it cannot be judged from the numbers alone:
it started before an earlier-ended run of the window ended (it may have
overlapped), it was abandoned, or it ran under another lease key than the
job's own (a shard, policy allow's side lease). The monitor reads the
ledger for a job whose window holds a flagged run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from cronwarden.events import EventKind, Outcome, RunRecord

ROLLUP_RUNS = 50
"""Ended runs in a rollup's window (the monitor's default ``--runs``)."""
ROLLUP_SKIPS = 50
"""Refused starts (``skipped``) whose times a rollup keeps."""
ROLLUP_ATTEMPTS = 16
"""Latest attempts (starts, ``skipped``, ``queue_full``) a rollup keeps with
their slots: what ``monitor.stats.slot_counts`` looks at."""

COMPLETED_OUTCOMES = ("succeeded", "failed", "timed_out")
"""Outcomes whose duration is the work's own (``monitor.stats.COMPLETED``)."""
BAD_OUTCOMES = ("failed", "lease_lost", "timed_out", "abandoned", "interrupted")
"""Endings that lengthen ``bad_in_a_row``; ``succeeded`` ends it; ``replaced``
and ``stopped`` change neither streak."""
REFUSAL_KINDS = (EventKind.SKIPPED, EventKind.QUEUED, EventKind.QUEUE_FULL)
ROLLUP_EVENT_KINDS = (EventKind.STARTED, *REFUSAL_KINDS, EventKind.OVERLAP)
"""The events a rebuild folds (``fold``)."""


class Rollup(NamedTuple):
    """One job's rollup as ``Store.rollups`` returns it. Lifetime counters
    first, then the window (the last ``ROLLUP_RUNS`` ended runs)."""

    job: str
    stale: bool = False
    """The row predates some of the job's ledger (a store upgraded from a
    version without rollups): not to be read until rebuilt."""
    ended: int = 0
    outcomes: Mapping[str, int] = {}
    """Ended runs by outcome, ever."""
    completed: int = 0
    duration_sum: float = 0.0
    """Sum of the completed runs' durations, ever, added in the order they ended."""
    last_start: float | None = None
    last_success: float | None = None
    bad_in_a_row: int = 0
    good_in_a_row: int = 0
    skips: int = 0
    """``skipped`` events, ever."""
    skips_in_a_row: int = 0
    """``skipped`` events at or after the latest start."""
    last_refusal: float | None = None
    """Latest ``skipped``, ``queued`` or ``queue_full``."""
    last_overlap: float | None = None
    """Latest ``overlap`` event."""
    skip_times: tuple[float, ...] = ()
    """The latest ``ROLLUP_SKIPS`` ``skipped`` times, in the order recorded."""
    w_runs: int = 0
    w_oldest: float | None = None
    """Earliest start in the window."""
    w_flagged: int = 0
    w_completed: int = 0
    w_outcomes: Mapping[str, int] = {}
    w_durations: str = "[]"
    """The window's completed durations, ascending, as a JSON array (decoded
    only by readers that want them: ``durations``)."""
    p50: float | None = None
    p95: float | None = None
    w_max: float | None = None
    w_last_success: float | None = None
    attempts: str = "[]"
    """The latest ``ROLLUP_ATTEMPTS`` attempts as a JSON array of [time,
    slot or null], in the order recorded: each start (with its run's slot),
    ``skipped`` and ``queue_full`` (without)."""

    def durations(self) -> tuple[float, ...]:
        return tuple(float(x) for x in json.loads(self.w_durations))


def quantile(ordered: Sequence[float], q: float) -> float:
    """As ``monitor.stats.quantile`` (and, operation for operation, as the
    stores compute it)."""
    h = (len(ordered) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (h - lo)


def window_of(recent: Sequence[tuple[float, float, str, int]]) -> dict[str, Any]:
    """The window's fields of a rollup from its entries (start, end,
    outcome, flagged), oldest ending first."""
    durations = sorted(e - s for s, e, o, _ in recent if o in COMPLETED_OUTCOMES)
    outcomes: dict[str, int] = {}
    for _, _, o, _ in recent:
        outcomes[o] = outcomes.get(o, 0) + 1
    successes = [e for _, e, o, _ in recent if o == "succeeded"]
    return {
        "w_runs": len(recent),
        "w_oldest": min((s for s, *_ in recent), default=None),
        "w_flagged": sum(f for *_, f in recent),
        "w_completed": len(durations),
        "w_outcomes": outcomes,
        "w_durations": json.dumps(durations),
        "p50": quantile(durations, 0.5) if durations else None,
        "p95": quantile(durations, 0.95) if durations else None,
        "w_max": durations[-1] if durations else None,
        "w_last_success": max(successes, default=None),
    }


def entry(run: RunRecord, recent: Sequence[tuple[float, float, str, int]]) -> tuple[float, float, str, int]:
    """A window entry for ``run`` as it ends, after ``recent`` (the window's
    entries that stay: the oldest has made room when the window was full)."""
    assert run.ended_at is not None and run.outcome is not None
    flagged = (
        run.outcome is Outcome.ABANDONED
        or run.key != run.job
        or any(e > run.started_at for _, e, _, _ in recent)
    )
    return (run.started_at, run.ended_at, run.outcome.value, int(flagged))


Entry = tuple[float, float, str, int]
"""A window entry: a run's start, end, outcome, and 1 if flagged."""


def fold(
    job: str, runs: Iterable[RunRecord], ended: Iterable[RunRecord], events: Iterable[Any]
) -> tuple[Rollup, list[Entry]]:
    """The rollup of a ledger read back: ``ended`` runs in the order they
    ended (runs that ended at the same instant: in the order they started;
    the store folded them in the order their ends were written), ``runs``
    every run, ``events`` the job's ``started``, ``skipped``, ``queued``,
    ``queue_full`` and ``overlap`` events (``ROLLUP_EVENT_KINDS``), each with
    its ``seq``: they are folded in the order recorded. Starts and refusals
    interleave only through ``skips_in_a_row``, which counts the skips at or
    after the latest start, whenever written.
    Returns the rollup and its window's entries."""
    outcomes: dict[str, int] = {}
    recent: list[Entry] = []
    completed = n = bad = good = 0
    total = 0.0
    last_success: float | None = None
    for r in ended:
        assert r.outcome is not None and r.ended_at is not None
        o = r.outcome.value
        n += 1
        outcomes[o] = outcomes.get(o, 0) + 1
        if o in COMPLETED_OUTCOMES:
            completed += 1
            total += r.ended_at - r.started_at
        if o == "succeeded":
            last_success = r.ended_at if last_success is None else max(last_success, r.ended_at)
            bad, good = 0, good + 1
        elif o in BAD_OUTCOMES:
            bad, good = bad + 1, 0
        kept = recent[len(recent) - ROLLUP_RUNS + 1 :] if len(recent) >= ROLLUP_RUNS else recent
        recent = [*kept, entry(r, kept)]
    by_id = {r.run_id: r for r in runs}
    last_start = max((r.started_at for r in by_id.values()), default=None)
    attempts: list[tuple[float, float | None]] = []
    skips = 0
    skip_times: list[float] = []
    last_refusal: float | None = None
    last_overlap: float | None = None
    for e in sorted(events, key=lambda e: e.seq or 0):
        if e.kind is EventKind.STARTED:
            run = by_id.get(e.run_id or "")
            if run is not None:
                attempts.append((run.started_at, run.slot))
            continue
        if e.kind in (EventKind.SKIPPED, EventKind.QUEUE_FULL):
            attempts.append((e.at, None))
        if e.kind is EventKind.OVERLAP:
            last_overlap = e.at if last_overlap is None else max(last_overlap, e.at)
            continue
        last_refusal = e.at if last_refusal is None else max(last_refusal, e.at)
        if e.kind is EventKind.SKIPPED:
            skips += 1
            skip_times.append(e.at)
    in_a_row = sum(1 for t in skip_times if last_start is None or t >= last_start)
    rollup = Rollup(
        job=job, ended=n, outcomes=outcomes, completed=completed, duration_sum=total, last_start=last_start,
        last_success=last_success, bad_in_a_row=bad, good_in_a_row=good, skips=skips,
        skips_in_a_row=in_a_row, last_refusal=last_refusal, last_overlap=last_overlap,
        skip_times=tuple(skip_times[-ROLLUP_SKIPS:]), **window_of(recent),
        attempts=json.dumps([list(a) for a in attempts[-ROLLUP_ATTEMPTS:]]),
    )  # fmt: skip
    return rollup, recent


def row_of(rollup: Rollup, recent: Sequence[Entry]) -> tuple[Any, ...]:
    """The stored row of a rollup (the columns of ``rollups`` in Rollup's
    order, then the window's entries), JSON columns as text."""
    values: list[Any] = list(rollup)
    fields = Rollup._fields
    values[fields.index("stale")] = int(rollup.stale)
    values[fields.index("outcomes")] = json.dumps(dict(rollup.outcomes))
    values[fields.index("w_outcomes")] = json.dumps(dict(rollup.w_outcomes))
    values[fields.index("skip_times")] = json.dumps(list(rollup.skip_times))
    return (*values, json.dumps([list(e) for e in recent]))


def from_rows(rows: Sequence[Sequence[Any]]) -> dict[str, Rollup]:
    """Rollups by job from the ``rollups`` query's rows (Rollup's columns in
    its order, JSON ones as text). The JSON columns the readers want decoded
    (``outcomes``, ``skip_times``, ``w_outcomes``) are decoded for every row
    in one ``json.loads``: at thousands of jobs, three calls per row cost
    more than the parsing."""
    fields = Rollup._fields
    stale, outcomes, skip_times = fields.index("stale"), fields.index("outcomes"), fields.index("skip_times")
    w_flagged, w_outcomes = fields.index("w_flagged"), fields.index("w_outcomes")
    decoded = json.loads(
        "[" + ",".join(f"[{r[outcomes]},{r[skip_times]},{r[w_outcomes]}]" for r in rows) + "]"
    )
    out = {}
    for row, (ever, skips, window) in zip(rows, decoded, strict=True):
        values = list(row)
        values[stale] = bool(row[stale])
        values[outcomes], values[skip_times], values[w_outcomes] = ever, tuple(skips), window
        values[w_flagged] = row[w_flagged] or 0
        out[row[0]] = Rollup._make(values)
    return out


def summary_json(rollup: Rollup) -> str:
    """The Redis store's summary of a rollup (``redis/rollup.lua``): every
    field but the job (the hash field) and the window's durations (a hash
    of their own)."""
    fields = rollup._asdict()
    del fields["job"], fields["w_durations"]
    fields["outcomes"], fields["w_outcomes"] = dict(rollup.outcomes), dict(rollup.w_outcomes)
    fields["skip_times"] = list(rollup.skip_times)
    fields["attempts"] = json.loads(rollup.attempts)
    return json.dumps(fields, separators=(",", ":"))
