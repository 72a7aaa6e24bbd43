"""The store contract suite (``cronwarden.stores.base``), run against every
backend through the ``store`` fixture. Helpers shared by its modules live
here."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Sequence

from cronwarden.events import TERMINAL_KINDS, Event, EventKind, Outcome, new_id
from cronwarden.policy import Policy
from cronwarden.stores.base import End, EventQuery, Granted, Refused, Start, Store

LONG_TTL = 60.0
"""Ttl of a lease a test needs to stay live throughout."""

ALL_EVENTS = 100_000
HOLDER_FIELDS = (
    "holder_run_id",
    "holder_host",
    "holder_pid",
    "holder_started_at",
    "holder_age",
    "holder_token",
)


def start(
    job: str = "nightly",
    *,
    key: str | None = None,
    ttl: float = LONG_TTL,
    policy: Policy = Policy.SKIP,
    at: float | None = None,
    host: str = "host-a",
    pid: int = 4242,
    slot: float | None = None,
    max_pending: int = 1,
    run_id: str | None = None,
) -> Start:
    return Start(
        job=job,
        key=job if key is None else key,
        run_id=new_id() if run_id is None else run_id,
        host=host,
        pid=pid,
        ttl=ttl,
        at=time.time() if at is None else at,
        policy=policy,
        slot=slot,
        max_pending=max_pending,
    )


def end(
    outcome: Outcome = Outcome.SUCCEEDED,
    *,
    at: float | None = None,
    exit_code: int | None = 0,
    detail: str = "",
    replaced_by: str | None = None,
) -> End:
    return End(
        outcome=outcome,
        at=time.time() if at is None else at,
        exit_code=exit_code,
        detail=detail,
        replaced_by=replaced_by,
    )


def granted(result: Granted | Refused) -> Granted:
    assert isinstance(result, Granted), f"expected a grant, got {result}"
    return result


def refused(result: Granted | Refused) -> Refused:
    assert isinstance(result, Refused), f"expected a refusal, got {result}"
    return result


def ledger(
    store: Store,
    *,
    job: str | None = None,
    kinds: Sequence[EventKind] | None = None,
    run_id: str | None = None,
) -> list[Event]:
    """The whole ledger, or the part matching the filters, oldest first."""
    return store.events(EventQuery(job=job, kinds=kinds, run_id=run_id, limit=ALL_EVENTS, newest_first=False))


def assert_one_terminal_per_start(store: Store, *, still_open: frozenset[str] = frozenset()) -> None:
    """G6 over the whole ledger: every ``started`` run has exactly one terminal
    event (none if it is in ``still_open``), no terminal event lacks a
    ``started``, and each run record's outcome agrees with its terminal event."""
    events = ledger(store)
    started = Counter(e.run_id for e in events if e.kind is EventKind.STARTED)
    terminals: dict[str | None, list[EventKind]] = defaultdict(list)
    for e in events:
        if e.kind in TERMINAL_KINDS:
            terminals[e.run_id].append(e.kind)
    twice = {rid: n for rid, n in started.items() if n != 1}
    assert not twice, f"runs started more than once: {twice}"
    orphans = set(terminals) - set(started)
    assert not orphans, f"terminal events without a start: {orphans}"
    for run_id in started:
        kinds = terminals.get(run_id, [])
        if run_id in still_open:
            assert kinds == [], f"run {run_id} should still be open, has {kinds}"
            continue
        assert len(kinds) == 1, f"run {run_id} has {len(kinds)} terminal events: {kinds}"
        assert run_id is not None
        record = store.run(run_id)
        assert record is not None, f"run {run_id} started but has no run record"
        assert record.outcome is not None and record.outcome.event is kinds[0], (
            f"run {run_id}: record says {record.outcome}, ledger says {kinds[0]}"
        )
