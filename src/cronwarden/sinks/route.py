"""Routing: which of a sink's events it is sent, by job (a name or a glob),
by the jobs' tags, by event kind (a kind or a group of kinds), and whether
findings raised while the job was snoozed reach it.

A sink has one route (its ``jobs``/``tags``/``kinds``/``snoozed`` keys) or
several (``[[sinks.NAME.routes]]`` tables); an event is sent when any route
matches it, and when the sink has something to say about it (``accepts``:
Healthchecks has no ping for a ``sink_failed``). Every other event is
acknowledged unsent.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import NamedTuple

from cronwarden.events import Event, EventKind

ENDINGS_BAD = frozenset(
    {
        EventKind.FAILED,
        EventKind.LEASE_LOST,
        EventKind.REPLACED,
        EventKind.TIMED_OUT,
        EventKind.ABANDONED,
        EventKind.INTERRUPTED,
        EventKind.STOPPED,
    }
)
REFUSALS = frozenset({EventKind.SKIPPED, EventKind.QUEUED, EventKind.QUEUE_FULL, EventKind.OVERLAP})
FINDINGS = frozenset(
    {
        EventKind.MISSED,
        EventKind.SLOW,
        EventKind.SKIPS_IN_A_ROW,
        EventKind.STUCK,
        EventKind.GRACE_TOO_WIDE,
        EventKind.POLICY_UNDECIDED,
        EventKind.FAILING,
        EventKind.TOO_OFTEN,
    }
)
DELIVERY = frozenset({EventKind.SINK_FAILED, EventKind.SINK_RECOVERED, EventKind.SINK_REJECTED})
GROUPS: Mapping[str, frozenset[EventKind]] = {
    "all": frozenset(EventKind),
    "runs": frozenset({EventKind.STARTED, EventKind.SUCCEEDED, *ENDINGS_BAD}),
    "endings": frozenset({EventKind.SUCCEEDED, *ENDINGS_BAD}),
    "failures": ENDINGS_BAD,
    "refusals": REFUSALS,
    "findings": FINDINGS,
    "scheduler": frozenset({EventKind.PAUSED, EventKind.MISFIRED, EventKind.BACKFILLED}),
    "operator": frozenset(
        {
            EventKind.JOB_PAUSED,
            EventKind.JOB_RESUMED,
            EventKind.SNOOZED,
            EventKind.UNSNOOZED,
            EventKind.TRIGGERED,
            EventKind.STOP_REQUESTED,
        }
    ),
    "delivery": DELIVERY,
    # What pages: a run that ended badly, a start that did no work or
    # overlapped, a finding, a sink in trouble. Not starts and successes.
    "alerts": frozenset(
        {*ENDINGS_BAD, EventKind.SKIPPED, EventKind.QUEUE_FULL, EventKind.OVERLAP, *FINDINGS}
        | {EventKind.SINK_FAILED, EventKind.SINK_REJECTED}
    ),
}
"""Names a route's ``kinds`` may use besides single kinds."""


def kinds_named(names: list[str]) -> frozenset[EventKind]:
    """The kinds a list of kind and group names stands for. Raises
    ``ValueError`` naming the first unknown name."""
    out: set[EventKind] = set()
    for name in names:
        if name in GROUPS:
            out |= GROUPS[name]
            continue
        try:
            out.add(EventKind(name))
        except ValueError:
            raise ValueError(name) from None
    return frozenset(out)


def snoozed(event: Event) -> bool:
    """A finding raised while its job was snoozed or in a maintenance window
    (the monitor records it with ``data["snoozed"] = true``)."""
    return event.data.get("snoozed") is True


class Route(NamedTuple):
    """One rule of a sink: an event matches when each given part does."""

    jobs: tuple[str, ...] | None = None
    """Job names or globs (``billing-*``); None: every job, and cronwarden's
    own ``sink:NAME`` delivery events."""
    tags: frozenset[str] | None = None
    """Jobs with any of these tags (``tags = [...]`` in ``[jobs.NAME]``)."""
    kinds: frozenset[EventKind] | None = None
    """None: every kind the sink maps."""
    snoozed: bool = False
    """Whether findings raised while the job was snoozed match."""

    def matches(self, event: Event, job_tags: Mapping[str, frozenset[str]]) -> bool:
        if self.kinds is not None and event.kind not in self.kinds:
            return False
        if snoozed(event) and not self.snoozed:
            return False
        if self.jobs is not None and not any(fnmatchcase(event.job, p) for p in self.jobs):
            return False
        return self.tags is None or bool(self.tags & job_tags.get(event.job, frozenset()))
