"""The ledger's vocabulary: event kinds, terminal outcomes and the frozen
records stores return. Events are facts, named in the past tense.

Records are ``typing.NamedTuple``s, not dataclasses: they are built at
import time on the cron wrapper's hot path, where importing ``dataclasses``
and processing a dozen frozen dataclasses cost several times the whole
wrapper's own work (measured with callgrind: ~100M instructions against
~20M). Change one with ``record._replace(field=value)``."""

import enum
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Self

EMPTY: Mapping[str, Any] = MappingProxyType({})
"""The default for mappings in records: shared, so it must be read-only."""


class EventKind(enum.StrEnum):
    STARTED = "started"
    """A run acquired its lease and began (data: host, pid, token, slot, ttl)."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LEASE_LOST = "lease_lost"
    """The run stopped because it could no longer prove it held the lease."""
    REPLACED = "replaced"
    """The run was stopped because a newer start replaced it (policy replace)."""
    TIMED_OUT = "timed_out"
    """The run was stopped after ``max_runtime``."""
    ABANDONED = "abandoned"
    """The run's lease expired with no terminal record: its host or supervisor
    died. Written by whoever found it (the next start or the monitor)."""
    INTERRUPTED = "interrupted"
    """The run's supervisor was told to stop (SIGTERM, SIGINT or SIGHUP: a pod
    shutdown, ``systemctl stop``, Ctrl-C) and stopped its command first
    (data: signal, and who sent it when known)."""
    STOPPED = "stopped"
    """Someone stopped the run through the store (``cronwarden stop``), on
    whatever host it ran (data: by, reason)."""
    SKIPPED = "skipped"
    """A start refused because another run held the lease. The slot did no work."""
    QUEUED = "queued"
    QUEUE_FULL = "queue_full"
    OVERLAP = "overlap"
    """A start while an earlier run of the same job was still open."""
    MISSED = "missed"
    # Slots the scheduler decided not to start (data: slot, and why).
    PAUSED = "paused"
    """A slot of a paused job: not started (data: slot, by, reason)."""
    MISFIRED = "misfired"
    """A slot not started late: its time had passed by more than the misfire
    grace or the catch-up policy allows (data: slot, late_by)."""
    BACKFILLED = "backfilled"
    """A past slot started by ``cronwarden backfill`` (data: slot, run_id,
    asked_by); the run itself is recorded as any run is."""
    # Operators' decisions about a job (data: by, reason, until when timed).
    JOB_PAUSED = "job_paused"
    JOB_RESUMED = "job_resumed"
    TRIGGERED = "triggered"
    """A run started by hand (``cronwarden trigger``), outside the schedule:
    the started or refused start with the same ``run_id`` is that run (data:
    by, reason)."""
    STOP_REQUESTED = "stop_requested"
    """Someone asked the open run ``run_id`` to stop (``cronwarden stop``;
    data: by, reason, grace); the run records ``stopped`` when it has."""
    SNOOZED = "snoozed"
    """The job's findings are still recorded, but not delivered to alerting
    sinks, until ``data["until"]``."""
    UNSNOOZED = "unsnoozed"
    # Monitor findings; data["state"] is "raised" or "resolved".
    SLOW = "slow"
    SKIPS_IN_A_ROW = "skips_in_a_row"
    STUCK = "stuck"
    GRACE_TOO_WIDE = "grace_too_wide"
    POLICY_UNDECIDED = "policy_undecided"
    FAILING = "failing"
    """The job's last runs ended badly (its failure threshold in a row)."""
    TOO_OFTEN = "too_often"
    """Starts arrive faster than the job's period allows (a second scheduler,
    a duplicated crontab line)."""
    # Delivery to external sinks (``outbox.py``), recorded under the job name
    # ``sink:NAME`` (":" cannot occur in a real job name).
    SINK_FAILED = "sink_failed"
    """A delivery to a sink failed; its events stay in its outbox (data: sink,
    attempt, error, retry_at, down_since)."""
    SINK_RECOVERED = "sink_recovered"
    """A sink that had failed accepted a delivery again (data: sink, attempts,
    down_since)."""
    SINK_REJECTED = "sink_rejected"
    """A sink refused one event for good (an HTTP 4xx other than 408 and 429):
    it is set aside and the sink goes on with the rest (data: sink, event_id,
    status, error, and the refused event's kind and job)."""


class Outcome(enum.StrEnum):
    """How a started run ended. Exactly one per start."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LEASE_LOST = "lease_lost"
    REPLACED = "replaced"
    TIMED_OUT = "timed_out"
    ABANDONED = "abandoned"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"

    @property
    def event(self) -> EventKind:
        return EventKind(self.value)


TERMINAL_KINDS = frozenset(o.event for o in Outcome)


def new_id() -> str:
    """Run ids and event ids are canonical UUIDs (Healthchecks and Sentry
    accept nothing else)."""
    b = bytearray(os.urandom(16))  # uuid4 by hand: importing uuid costs the wrapper ~2 ms
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class _EventFields(NamedTuple):
    kind: EventKind
    job: str
    at: float
    """Wall-clock seconds since the epoch, from the writer's clock."""
    run_id: str | None = None
    data: Mapping[str, Any] = EMPTY
    event_id: str = ""
    """A canonical UUID; a new one when not given."""
    seq: int | None = None
    """Order in this store's ledger; set by the store on read."""


class Event(_EventFields):
    __slots__ = ()

    def __new__(
        cls,
        kind: EventKind,
        job: str,
        at: float,
        run_id: str | None = None,
        data: Mapping[str, Any] = EMPTY,
        event_id: str = "",
        seq: int | None = None,
    ) -> Self:
        return super().__new__(cls, kind, job, at, run_id, data, event_id or new_id(), seq)


class RunRecord(NamedTuple):
    run_id: str
    job: str
    key: str
    host: str
    pid: int
    token: int
    started_at: float
    slot: float | None = None
    ended_at: float | None = None
    outcome: Outcome | None = None
    exit_code: int | None = None
    detail: str = ""
    expires_in: float | None = None
    """For open runs: seconds until the lease expires by the store's clock
    (negative when already expired); None when the lease is no longer this
    run's."""

    @property
    def duration(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.started_at


class JobInfo(NamedTuple):
    """What the store knows of a job's schedule and policy, so the monitor can
    judge runs started by ``cronwarden run`` flags as well as by config."""

    name: str
    schedule: str | None = None
    period: float | None = None
    policy: str = "skip"
    reason: str = ""
    ttl: float | None = None
    grace: float | None = None
    max_runtime: float | None = None
    updated_at: float = 0.0
