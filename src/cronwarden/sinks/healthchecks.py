"""Healthchecks.io (and compatible) ping URLs, one check per job.

The mapping (DESIGN §7), each ping carrying ``rid=<run_id>`` so Healthchecks
pairs a start with its end and shows concurrent runs as such:

=============================================  ==================
event                                          ping
=============================================  ==================
started                                        ``/start?rid=``
succeeded                                      ``?rid=`` (the check URL)
failed, lease_lost, replaced, timed_out,       ``/fail?rid=``
abandoned
skipped, queued, queue_full, overlap           ``/log?rid=``
monitor findings (slow, stuck, missed, …)      ``/log``
=============================================  ==================

Every ping is a POST whose text body says what happened and why (a skip
names the run holding the lease, its host, pid, age and the slot that did no
work), so the Healthchecks event log reads on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cronwarden import __version__
from cronwarden.durations import format_duration
from cronwarden.events import Event, EventKind
from cronwarden.sinks.base import DeliveryError, SinkOptions, dumps, http_request, utc

FAILURES = frozenset(
    {EventKind.FAILED, EventKind.LEASE_LOST, EventKind.REPLACED, EventKind.TIMED_OUT, EventKind.ABANDONED}
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
    }
)


def endpoint(kind: EventKind) -> str | None:
    """The path suffix a kind is pinged at, or None if it is not sent."""
    if kind is EventKind.STARTED:
        return "/start"
    if kind is EventKind.SUCCEEDED:
        return ""
    if kind in FAILURES:
        return "/fail"
    if kind in REFUSALS or kind in FINDINGS:
        return "/log"
    return None


class HealthchecksSink:
    """``ping_urls`` maps job names to check URLs; ``url_template`` (with
    ``{job}``, e.g. ``https://hc-ping.com/<ping-key>/{job}``) covers the
    jobs not listed. Jobs with neither are not sent."""

    def __init__(
        self,
        name: str,
        options: SinkOptions,
        *,
        ping_urls: Mapping[str, str] | None = None,
        url_template: str | None = None,
    ) -> None:
        self._name = name
        self._options = options
        self.ping_urls = dict(ping_urls or {})
        self.url_template = url_template

    @property
    def name(self) -> str:
        return self._name

    @property
    def options(self) -> SinkOptions:
        return self._options

    def check_url(self, job: str) -> str | None:
        if job in self.ping_urls:
            return self.ping_urls[job]
        if self.url_template is not None and not job.startswith("sink:"):
            return self.url_template.replace("{job}", job)
        return None

    def accepts(self, event: Event) -> bool:
        return endpoint(event.kind) is not None and self.check_url(event.job) is not None

    def ping_url(self, event: Event) -> str:
        base, suffix = self.check_url(event.job), endpoint(event.kind)
        assert base is not None and suffix is not None
        parts = urlsplit(base)
        query = parts.query
        if event.run_id:
            query = f"{query}&rid={event.run_id}" if query else f"rid={event.run_id}"
        return urlunsplit(parts._replace(path=parts.path.rstrip("/") + suffix, query=query))

    def deliver(self, events: Sequence[Event], *, timeout: float) -> None:
        headers = {"Content-Type": "text/plain; charset=utf-8", "User-Agent": f"cronwarden/{__version__}"}
        for i, event in enumerate(events):
            try:
                http_request(self.ping_url(event), body=describe(event).encode(), headers=headers,
                             timeout=timeout)  # fmt: skip
            except DeliveryError as e:
                raise DeliveryError(f"{e} (job {event.job})", delivered=i) from None


def describe(event: Event) -> str:
    """One paragraph saying what happened and why, for a ping body."""
    d: Mapping[str, Any] = event.data
    kind, rid = event.kind, event.run_id or "-"
    if kind is EventKind.STARTED:
        slot = f", slot {utc(d['slot'])}" if d.get("slot") is not None else ""
        return (f"started: run {rid} of {event.job} on host {d.get('host', '?')} (pid {d.get('pid', '?')}), "
                f"fencing token {d.get('token', '?')}{slot}")  # fmt: skip
    if kind is EventKind.SUCCEEDED or kind in FAILURES:
        parts = [f"{kind.value}: run {rid} of {event.job}"]
        if d.get("duration") is not None:
            parts.append(f"after {format_duration(float(d['duration']))}")
        if d.get("exit_code") is not None:
            parts.append(f"exit status {d['exit_code']}")
        if d.get("detail"):
            parts.append(str(d["detail"]))
        if d.get("found_by"):
            parts.append(f"lease expired with no terminal record; found by run {d['found_by']}")
        if d.get("replaced_by"):
            parts.append(f"replaced by run {d['replaced_by']}")
        return "; ".join(parts)
    if kind in REFUSALS:
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
    state = f" {d['state']}" if d.get("state") else ""
    rest = {k: v for k, v in d.items() if k != "state"}
    return f"{kind.value}{state}: {event.job}" + (f" {dumps(rest)}" if rest else "")
