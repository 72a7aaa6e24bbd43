"""Snoozes and maintenance windows: when a job's findings are recorded and
shown but not delivered to alerting sinks.

A snooze is an event (``snoozed``, with ``until``, ``by`` and ``reason``;
``unsnoozed`` ends it early), so who silenced what, when and why is in the
ledger like everything else. A maintenance window is a recurring span of the
week in the job's config (``cronwarden.config.windows.Window``). While either
holds, the monitor records each finding it raises with ``data["snoozed"] =
true``, and routing (``cronwarden.sinks.route``) keeps those from every route
that does not ask for snoozed findings."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cronwarden.events import Event, EventKind

SNOOZE_KINDS = (EventKind.SNOOZED, EventKind.UNSNOOZED)


@dataclass(frozen=True, kw_only=True)
class Snooze:
    """Why a job's findings are not delivered now, and until when."""

    until: float
    by: str = ""
    reason: str = ""
    window: str | None = None
    """The maintenance window's text; None for a snooze."""

    def __str__(self) -> str:
        until = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.until))
        if self.window is not None:
            return f"in maintenance window {self.window} until {until}"
        who = f" by {self.by}" if self.by else ""
        why = f": {self.reason}" if self.reason else ""
        return f"snoozed{who} until {until}{why}"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"until": self.until, "by": self.by, "reason": self.reason}
        if self.window is not None:
            out["window"] = self.window
        return out


def snooze_at(now: float, events: Iterable[Event], windows: Sequence[Any] = ()) -> Snooze | None:
    """The snooze holding at ``now``: the job's last ``snoozed`` or
    ``unsnoozed`` event (``events``: any of the job's events, in any order;
    others are ignored), else a maintenance window that holds ``now``."""
    last: Event | None = None
    for e in events:
        if e.kind in SNOOZE_KINDS and (last is None or (e.at, e.seq or 0) >= (last.at, last.seq or 0)):
            last = e
    if last is not None and last.kind is EventKind.SNOOZED:
        until = last.data.get("until")
        if isinstance(until, int | float) and now < until:
            return Snooze(until=float(until), by=str(last.data.get("by", "")),
                          reason=str(last.data.get("reason", "")))  # fmt: skip
    for w in windows:
        end = w.end_of(now)
        if end is not None:
            return Snooze(until=end, window=w.text)
    return None


def snooze_event(job: str, now: float, seconds: float, *, by: str, reason: str) -> Event:
    return Event(kind=EventKind.SNOOZED, job=job, at=now,
                 data={"until": now + seconds, "by": by, "reason": reason})  # fmt: skip


def unsnooze_event(job: str, now: float, *, by: str, reason: str) -> Event:
    return Event(kind=EventKind.UNSNOOZED, job=job, at=now, data={"by": by, "reason": reason})
