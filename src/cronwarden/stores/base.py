"""The store contract, written once. Every backend (SQLite, PostgreSQL,
Redis) implements exactly this; the contract suite in ``tests/contract``
checks each against a real server.

Each method is one atomic step in the store (one transaction or one Lua
script) and, on the network backends, one round trip:

``acquire(start)``
    Judge the lease on ``start.key`` by the *store's* clock (G4).
    1. If a previous owner's lease has expired and its run has no terminal
       record, record ``abandoned`` for that run (G6) and name it in
       ``Granted.abandoned``.
    2. If the lease is free or expired: grant it to ``start.run_id`` with a
       fencing token greater than every earlier grant of the key, and exactly
       one greater while the store keeps its counter (G2: the counter
       survives release and, on durable stores, restarts; Redis without
       persistence jumps to the server's microsecond clock when it finds its
       counter lost), expiry
       ``now + ttl``, no revocation; write the run row and ``started``.
       Return ``Granted``.
    3. If it is live, act by ``start.policy`` and return ``Refused``:
       - skip: record ``skipped`` naming the holder (G7).
       - queue: if the key's pending count < ``max_pending``, add one and
         record ``queued``, else record ``queue_full``.
       - replace: mark the lease revoked by ``start.run_id`` (the holder's
         next renew raises ``LeaseRevoked``); no event — the holder records
         ``replaced``. The caller polls ``acquire`` until granted.
       - allow: record ``overlap`` naming both runs, and grant a side lease
         on ``key + "+" + run_id`` so the run still has a lease to renew
         (returned as ``Granted`` with ``overlapped`` set).

``renew(lease)``
    Extend expiry to ``now + ttl`` iff ``lease.run_id`` still owns the key and
    it has not expired (G1). Raise ``LeaseRevoked`` if revoked, ``LeaseLost``
    otherwise. Transient failures raise ``StoreError``.

``finish(lease, end, then=None)``
    Record the run's terminal outcome unless it already has one (G6: exactly
    one), and release the lease iff still owned (a stale release is a no-op,
    never a deletion of another's lease; G1). The fencing counter stays.
    If ``then`` is given, the lease is still owned and the key has pending
    starts (policy queue): take one from pending and, in the same step, start
    ``then`` on the same lease with the next token; return its lease.
    Returns ``Finished``.

``record(event)``
    Append an event to the ledger, once per ``event_id``: recording again
    an event ``record`` wrote changes nothing and is no error, so a call
    retried after its reply was lost cannot write it twice (G9: the sinks
    deduplicate by the same id). On SQLite and PostgreSQL this holds for
    any id in the ledger; on Redis for the ids ``record`` wrote within
    ``RECORDED_IDS_KEPT`` seconds (a day), the time a retry could take.

The bare lock: a fenced lease with no ledger, one round trip per call, for
what must not write a run per renewal (the scheduler's leader lease) and
callers that only need a fenced mutex. Locks live in their own namespace: a
lock named like a job's lease key is a different lease. Same G1, G2, G4.

``lock(key, owner, ttl)``
    If ``key`` is free, or expired by the store's clock, grant it to
    ``owner`` until ``now + ttl`` and return its fencing token (greater than
    every earlier grant of the key; the counter survives ``unlock``).
    Otherwise return None and change nothing.

``renew_lock(key, owner, ttl)``
    Extend the expiry to ``now + ttl`` iff ``owner`` holds the key and it has
    not expired. Returns whether it did.

``unlock(key, owner)``
    Release iff ``owner`` still holds the key and it has not expired (a stale
    unlock, or one after the ttl even if nobody took the key since, changes
    nothing). Returns whether it did.

The scheduler's slot claim (G8): at most one run per scheduled fire, however
many scheduler instances fire it.

``claim_slot(job, slot, owner, keep)``
    Claim the fire time ``slot`` (epoch seconds) of ``job`` for ``owner`` (a
    scheduler instance), atomically: the first caller for a ``(job, slot)``
    gets it, and every caller, the first included, is answered with the
    owner of that first claim; the caller fires iff the answer is its own
    ``owner`` (so a retry after a lost reply fires once). A claim is kept
    at least ``keep`` seconds after it was made and may be forgotten after:
    the caller must not claim a slot it could have claimed more than
    ``keep`` seconds earlier (the scheduler claims only within its misfire
    grace, far less). Writes nothing to the ledger: the run it fires does.

The read side (``open_runs``, ``runs``, ``events``, ``jobs``, ``job``)
returns frozen records; it never changes the ledger. ``job(name)`` reads the
one job's saved settings (``None`` if never saved), without reading the
others: every scheduled ``cronwarden run`` asks for its own.

The outbox (G9). Each sink's outbox is the ledger minus what that sink has
acknowledged: no copy of the events, no separate queue. Delivery is at least
once: the caller delivers, then acknowledges; a crash in between delivers
again, so receivers deduplicate by ``event_id``.

``undelivered(sink, limit, *, backfill=NEW_SINK_BACKFILL)``
    Up to ``limit`` events the sink has not acknowledged, across all jobs,
    oldest first (ascending ``seq``, each with ``seq`` set). The first call
    for a sink name registers it: its outbox starts just before the first
    event, in ledger order, whose ``at`` is within ``backfill`` seconds of
    now, so a new sink sees the run that is ending (``cronwarden run`` flushes
    after its terminal record) but not years of history. Later calls ignore
    ``backfill``; registration is durable like the ledger.
    It must never miss an event that becomes visible *after* later events
    were acknowledged (PostgreSQL sequence values commit out of order). Keep
    per sink a low-water mark below which everything is acknowledged, plus
    the set of acknowledged events above it; move the mark only over events
    that no transaction still in flight could precede.

``mark_delivered(sink, event_ids)``
    Acknowledge events for the sink: ``undelivered(sink, …)`` never returns
    them again. Idempotent and order-free: acknowledging twice, or a later
    event before an earlier one, is fine; ids not in the ledger are ignored.
    In the same step, advance the sink's mark over the acknowledged prefix
    and prune the acknowledged set below it, so the set stays small.
"""

import abc
import enum
from collections.abc import Sequence
from typing import Any, NamedTuple, Self

from cronwarden.events import Event, EventKind, JobInfo, Outcome, RunRecord
from cronwarden.lease import Lease
from cronwarden.policy import Policy


class Start(NamedTuple):
    """A request to start one run."""

    job: str
    key: str
    run_id: str
    host: str
    pid: int
    ttl: float
    at: float
    """Wall-clock time of the request (for the ledger, never for expiry)."""
    policy: Policy = Policy.SKIP
    slot: float | None = None
    max_pending: int = 1


class Holder(NamedTuple):
    """Who holds a lease, as the refusal reports it."""

    run_id: str
    host: str
    pid: int
    started_at: float
    token: int
    expires_in: float

    def age(self, now: float) -> float:
        return now - self.started_at


class Granted(NamedTuple):
    lease: Lease
    abandoned: tuple[str, ...] = ()
    overlapped: Holder | None = None


class Refusal(enum.StrEnum):
    SKIPPED = "skipped"
    QUEUED = "queued"
    QUEUE_FULL = "queue_full"
    REVOKING = "revoking"


class Refused(NamedTuple):
    refusal: Refusal
    holder: Holder
    abandoned: tuple[str, ...] = ()


class End(NamedTuple):
    """How a run ended, as the guard reports it to ``finish``."""

    outcome: Outcome
    at: float
    exit_code: int | None = None
    detail: str = ""
    replaced_by: str | None = None


class Finished(NamedTuple):
    owned: bool
    """False when the lease was no longer this run's at release (G1)."""
    recorded: bool
    """False when the run already had a terminal record (e.g. ``abandoned``)."""
    next: Lease | None = None


class LeaseInfo(NamedTuple):
    key: str
    owner: str | None
    token: int
    expires_in: float | None
    pending: int = 0
    revoked_by: str | None = None


class EventQuery(NamedTuple):
    job: str | None = None
    kinds: Sequence[EventKind] | None = None
    run_id: str | None = None
    since: float | None = None
    limit: int = 100
    newest_first: bool = True


NEW_SINK_BACKFILL = 3600.0
"""Seconds of history a newly registered sink is given (see ``undelivered``)."""


class Store(abc.ABC):
    """See the module docstring for the contract of each method."""

    url: str

    @abc.abstractmethod
    def acquire(self, start: Start) -> Granted | Refused: ...

    @abc.abstractmethod
    def renew(self, lease: Lease) -> None: ...

    @abc.abstractmethod
    def finish(self, lease: Lease, end: End, then: Start | None = None) -> Finished: ...

    @abc.abstractmethod
    def record(self, event: Event) -> None: ...

    @abc.abstractmethod
    def open_runs(self, job: str | None = None) -> list[RunRecord]:
        """Runs with no terminal record, oldest first, with ``expires_in``."""

    @abc.abstractmethod
    def runs(self, job: str, limit: int = 50) -> list[RunRecord]:
        """The job's runs, newest first."""

    @abc.abstractmethod
    def run(self, run_id: str) -> RunRecord | None: ...

    @abc.abstractmethod
    def events(self, query: EventQuery) -> list[Event]: ...

    @abc.abstractmethod
    def lease(self, key: str) -> LeaseInfo | None: ...

    @abc.abstractmethod
    def save_job(self, job: JobInfo) -> None: ...

    @abc.abstractmethod
    def jobs(self) -> list[JobInfo]: ...

    def job(self, name: str) -> JobInfo | None:
        # Each cronwarden store reads the one row; this serves any other.
        return next((j for j in self.jobs() if j.name == name), None)

    @abc.abstractmethod
    def undelivered(self, sink: str, limit: int, *, backfill: float = NEW_SINK_BACKFILL) -> list[Event]: ...

    @abc.abstractmethod
    def mark_delivered(self, sink: str, event_ids: Sequence[str]) -> None: ...

    @abc.abstractmethod
    def lock(self, key: str, owner: str, ttl: float) -> int | None: ...

    @abc.abstractmethod
    def renew_lock(self, key: str, owner: str, ttl: float) -> bool: ...

    @abc.abstractmethod
    def unlock(self, key: str, owner: str) -> bool: ...

    @abc.abstractmethod
    def claim_slot(self, job: str, slot: float, owner: str, keep: float) -> str: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def abandon_expired(
    store: Store,
    runs: Sequence[RunRecord],
    at: float,
    found_by: str,
    why: str = "lease expired with no terminal record",
) -> list[str]:
    """Record ``abandoned`` for each open run among ``runs`` whose lease has
    expired (G6), as the next start on its lease key would: for runs no start
    comes back to (policy allow's side leases, a shard not started again,
    report-only runs, any run when the monitor looks). ``finish`` compares
    the owner, so a lease another run took meanwhile is never released.
    Returns the runs closed."""
    done = []
    for r in runs:
        if r.outcome is not None or r.expires_in is None or r.expires_in > 0:
            continue
        lease = Lease(key=r.key, job=r.job, run_id=r.run_id, token=r.token, ttl=0.0)
        end = End(
            outcome=Outcome.ABANDONED,
            at=at,
            detail=f"{why}; found by {found_by}",
        )
        if store.finish(lease, end).recorded:
            done.append(r.run_id)
    return done


def holder_data(holder: Holder, now: float) -> dict[str, object]:
    """The holder fields every refusal event carries (G7)."""
    return {
        "holder_run_id": holder.run_id,
        "holder_host": holder.host,
        "holder_pid": holder.pid,
        "holder_started_at": holder.started_at,
        "holder_age": round(now - holder.started_at, 3),
        "holder_token": holder.token,
    }


def run_from_row(row: Sequence[Any], expires_in: float | None = None) -> RunRecord:
    """A run record from the SQL stores' ``runs`` columns, in table order:
    run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome,
    exit_code, detail."""
    run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome, exit_code, detail = row
    return RunRecord(
        run_id=run_id, job=job, key=key, host=host, pid=pid, token=token, slot=slot, started_at=started_at,
        ended_at=ended_at, outcome=None if outcome is None else Outcome(outcome), exit_code=exit_code,
        detail=detail, expires_in=expires_in,
    )  # fmt: skip
