"""Checkers on a recorded history: the referee's log, the store's ledger, and
what the harness saw (launches, injections, the watcher's lease readings).

Each safety checker returns a list of violations (strings a person can act
on); an empty list means the property held on this history.

(a) no write accepted with a token lower than a write accepted before it;
(b) no two runs' accepted writes interleaved;
(c) every acknowledged write present in the document at the end;
(d) every ``started`` has exactly one terminal record, and every run that did
    work has a ``started`` record;
(g) every grant's token is larger than every earlier grant's (G2).

And two measurements, with a bound each:

(e) takeover: after a kill, how long until the next run started;
(f) stop margin: when a holder lost its lease, how long before the lease's
    expiry in the store its work had stopped.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cronwarden.events import TERMINAL_KINDS, Event, EventKind, RunRecord

ROOT = "-"

Entry = Mapping[str, Any]


def accepted_writes(log: Sequence[Entry]) -> list[Entry]:
    return [e for e in log if e["op"] == "write" and e["ok"]]


def run_tokens(events: Iterable[Event]) -> dict[str, int]:
    """run id → the token the store granted it (from ``started``)."""
    return {
        e.run_id: int(e.data["token"])
        for e in events
        if e.kind is EventKind.STARTED and e.run_id and "token" in e.data
    }


def check_a_token_order(log: Sequence[Entry], tokens: Mapping[str, int]) -> list[str]:
    """(a) Judged with the token the *store* granted the run, not the one the
    worker sent, so a worker (or a positive control) cannot hide a stale write."""
    out: list[str] = []
    best, best_run = -math.inf, None
    for e in accepted_writes(log):
        token = tokens.get(e["run"], e["token"])
        if token < best:
            out.append(
                f"(a) write {e['id']} accepted with token {token} after run {best_run} wrote with token "
                f"{best:g} (referee t={e['t']:.3f})"
            )
        if token > best:
            best, best_run = token, e["run"]
    return out


def check_b_no_interleaving(log: Sequence[Entry]) -> list[str]:
    """(b) The accepted writes, in the referee's order, come in one block per run."""
    out: list[str] = []
    finished: set[str] = set()
    current: str | None = None
    for e in accepted_writes(log):
        run = e["run"]
        if run == current:
            continue
        if run in finished:
            out.append(f"(b) run {run} wrote {e['id']} after run {current} had written (t={e['t']:.3f})")
        if current is not None:
            finished.add(current)
        current = run
    return out


def check_c_acknowledged_present(log: Sequence[Entry], head: str) -> list[str]:
    """(c) The document at the end is the chain from the final head back to
    the root; every write the referee acknowledged must be on it."""
    prev = {e["id"]: e["prev"] for e in accepted_writes(log)}
    present: set[str] = set()
    node = head
    while node != ROOT:
        if node in present or node not in prev:
            return [f"(c) the document's chain is broken at {node!r}"]
        present.add(node)
        node = prev[node]
    lost = [w for w in prev if w not in present]
    return [f"(c) acknowledged write {w} is not in the final document (overwritten by a stale write)"
            for w in lost]  # fmt: skip


def check_d_one_terminal(events: Sequence[Event], runs: Mapping[str, RunRecord | None],
                         log: Sequence[Entry]) -> list[str]:  # fmt: skip
    """(d) G6 over the round's ledger, plus: no child did work for a run the
    ledger never started."""
    out: list[str] = []
    started = Counter(e.run_id for e in events if e.kind is EventKind.STARTED)
    terminals: dict[str | None, list[EventKind]] = defaultdict(list)
    for e in events:
        if e.kind in TERMINAL_KINDS:
            terminals[e.run_id].append(e.kind)
    for run_id, n in started.items():
        if n != 1:
            out.append(f"(d) run {run_id} has {n} started records")
    for run_id in set(terminals) - set(started):
        out.append(f"(d) run {run_id} has terminal {terminals[run_id]} but no started record")
    for run_id in started:
        kinds = terminals.get(run_id, [])
        if len(kinds) != 1:
            out.append(f"(d) run {run_id} has {len(kinds)} terminal records: {[str(k) for k in kinds]}")
            continue
        record = runs.get(run_id) if run_id else None
        if record is None or record.outcome is None or record.outcome.event is not kinds[0]:
            said = None if record is None else record.outcome
            out.append(f"(d) run {run_id}: run record says {said}, ledger says {kinds[0]}")
    worked = {e["run"] for e in log if e["op"] == "hello"}
    for run_id in sorted(worked - {r for r in started if r}):
        out.append(f"(d) a child worked for run {run_id}, which the ledger never started")
    return out


def check_g_grant_order(events: Sequence[Event]) -> list[str]:
    """(g) In ledger order, every grant's token exceeds all earlier ones."""
    starts = sorted((e for e in events if e.kind is EventKind.STARTED), key=lambda e: e.seq or 0)
    out: list[str] = []
    best = -math.inf
    for e in starts:
        token = int(e.data.get("token", -1))
        if token <= best:
            out.append(f"(g) run {e.run_id} was granted token {token} after token {best:g} had been granted")
        best = max(best, token)
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class Distribution:
    values: list[float] = field(default_factory=list)

    def add(self, v: float) -> None:
        self.values.append(v)

    def extend(self, other: Distribution) -> None:
        self.values.extend(other.values)

    def p(self, q: float) -> float | None:
        return percentile(self.values, q)

    def summary(self, unit: float = 1.0) -> str:
        if not self.values:
            return "-"
        p50, p99 = self.p(50), self.p(99)
        assert p50 is not None and p99 is not None
        lo, hi = min(self.values), max(self.values)
        return f"{p50 / unit:.2f}/{p99 / unit:.2f}/{lo / unit:.2f}/{hi / unit:.2f}"
