"""Events as text people read: a title and one paragraph saying what
happened and why, for the sinks that send text (a Healthchecks ping body, an
Apprise notification)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cronwarden.durations import format_duration
from cronwarden.events import Event, EventKind
from cronwarden.sinks.base import dumps, utc
from cronwarden.sinks.route import DELIVERY, ENDINGS_BAD, REFUSALS

_OWN = frozenset({"state", "summary", "severity"})


def title(event: Event) -> str:
    """``reconcile: failed``, ``reconcile: slow raised``, ``sink hc: sink_rejected``."""
    who = f"sink {event.job[5:]}" if event.job.startswith("sink:") else event.job
    state = event.data.get("state")
    return f"{who}: {event.kind.value}" + (f" {state}" if state else "")


def describe(event: Event) -> str:
    """One paragraph saying what happened and why. Each fact is said once."""
    d: Mapping[str, Any] = event.data
    kind, rid = event.kind, event.run_id or "-"
    if kind is EventKind.STARTED:
        slot = f", slot {utc(d['slot'])}" if d.get("slot") is not None else ""
        return (f"started: run {rid} of {event.job} on host {d.get('host', '?')} (pid {d.get('pid', '?')}), "
                f"fencing token {d.get('token', '?')}{slot}")  # fmt: skip
    if kind is EventKind.SUCCEEDED or kind in ENDINGS_BAD:
        return _ending(event, d, rid)
    if kind in REFUSALS:
        return _refusal(event, d, rid)
    if kind in DELIVERY:
        return _delivery(event, d)
    state = f" {d['state']}" if d.get("state") else ""
    if d.get("summary"):
        extra = " (while snoozed)" if d.get("snoozed") is True else ""
        return f"{kind.value}{state}: {event.job}: {d['summary']}{extra}"
    rest = {k: v for k, v in d.items() if k not in _OWN}
    return f"{kind.value}{state}: {event.job}" + (f" {dumps(rest)}" if rest else "")


def _ending(event: Event, d: Mapping[str, Any], rid: str) -> str:
    parts = [f"{event.kind.value}: run {rid} of {event.job}"]
    if d.get("duration") is not None:
        parts.append(f"after {format_duration(float(d['duration']))}")
    if d.get("exit_code") is not None:
        parts.append(f"exit status {d['exit_code']}")
    if event.kind is EventKind.INTERRUPTED and d.get("signal"):
        sender = d.get("sender") or d.get("by")
        parts.append(f"on {d['signal']}" + (f" from {sender}" if sender else ""))
    if event.kind is EventKind.STOPPED and d.get("by"):
        parts.append(f"stopped by {d['by']}" + (f": {d['reason']}" if d.get("reason") else ""))
    # The detail often repeats what is said already ("exit status 3").
    said = "; ".join(parts)
    if d.get("detail") and str(d["detail"]) not in said:
        parts.append(str(d["detail"]))
    if d.get("found_by"):
        parts.append(f"lease expired with no terminal record; found by run {d['found_by']}")
    if d.get("replaced_by"):
        parts.append(f"replaced by run {d['replaced_by']}")
    return "; ".join(parts)


def _refusal(event: Event, d: Mapping[str, Any], rid: str) -> str:
    kind = event.kind
    holder = (f"run {d.get('holder_run_id', '?')} (host {d.get('holder_host', '?')}, "
              f"pid {d.get('holder_pid', '?')}, token {d.get('holder_token', '?')})")  # fmt: skip
    held = ""
    if d.get("holder_age") is not None:
        held = (f" has held the lease for {format_duration(float(d['holder_age']))}"
                f" (since {utc(d.get('holder_started_at'))})")  # fmt: skip
    slot = utc(d["slot"]) if d.get("slot") is not None else "unscheduled"
    who = f"run {rid} of {event.job} on host {d.get('host', '?')} (pid {d.get('pid', '?')})"
    if kind is EventKind.OVERLAP:
        return f"overlap: {who} started while {holder} was still open{held}; policy allow"
    if kind is EventKind.QUEUED:
        return f"queued: {who} is pending ({d.get('pending', '?')} pending) because {holder}{held}"
    if kind is EventKind.QUEUE_FULL:
        return (f"queue_full: {who} did no work for slot {slot}: {d.get('pending', '?')} start(s) "
                f"already pending and {holder}{held}")  # fmt: skip
    return f"skipped: {who} did no work for slot {slot}: {holder}{held}"


def _delivery(event: Event, d: Mapping[str, Any]) -> str:
    sink = d.get("sink", event.job[5:])
    if event.kind is EventKind.SINK_REJECTED:
        return (f"sink_rejected: sink {sink} refused event {d.get('event_id', '?')} ({d.get('kind', '?')} of "
                f"{d.get('job', '?')}) for good: {d.get('error', '?')}; it is set aside "
                f"(cronwarden flush --retry-rejected --sink {sink} sends it again)")  # fmt: skip
    if event.kind is EventKind.SINK_FAILED:
        return (f"sink_failed: sink {sink} failed (attempt {d.get('attempt', '?')}): {d.get('error', '?')}; "
                f"its events wait, next try after {utc(d.get('retry_at'))}")  # fmt: skip
    return f"sink_recovered: sink {sink} delivers again (down since {utc(d.get('down_since'))})"
