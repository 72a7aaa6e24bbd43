"""Sentry Crons check-ins, sent as ``check_in`` envelope items to the
project's envelope endpoint (the protocol Sentry's SDKs use).

=============================================  =======================================
event                                          check-in
=============================================  =======================================
started                                        ``in_progress``, ``check_in_id=<run id>``
succeeded                                      ``ok`` + ``duration``
failed, lease_lost, replaced, timed_out,       ``error`` + ``duration``
abandoned, interrupted, stopped
skipped, queued, queue_full, overlap           not sent: Sentry has no status for "this
                                               slot did no work" or "a second run
                                               started"; use a webhook or Healthchecks
                                               ``/log`` for those
monitor findings                               not sent (Sentry judges missed and
                                               timed-out check-ins itself)
=============================================  =======================================

``check_in_id`` is the run id as a UUID (32 hex digits; a run id that is not
a UUID is sent as its uuid5, ``sinks.base.run_uuid``), so the ``ok`` or
``error`` closes the very check-in its run opened, also when runs overlap.
The monitor slug is the job name (lowercased; characters other than letters,
digits, ``_`` and ``-`` become ``-``) unless ``monitors`` maps it.

With ``monitor_config = true`` every check-in carries the job's monitor
configuration, so Sentry creates the monitor or updates it (an upsert):
the schedule the store knows for the job (a crontab with its ``CRON_TZ``
zone, else the sink's ``timezone``; ``every N`` as an interval in minutes,
hours, days or weeks), ``checkin_margin`` from the job's grace and
``max_runtime`` from its ``max_runtime`` (whole minutes, rounded up), and
the sink's ``failure_issue_threshold`` and ``recovery_threshold``. A job
whose schedule Sentry cannot express (an interval that is not whole
minutes) is sent without one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from cronwarden import __version__
from cronwarden.errors import UsageError
from cronwarden.events import Event, EventKind, JobInfo
from cronwarden.sinks.base import Call, DeliveryError, SinkBase, SinkOptions, dumps, http_request, run_uuid
from cronwarden.sinks.healthchecks import FAILURES

STATUS: Mapping[EventKind, str] = {
    EventKind.STARTED: "in_progress",
    EventKind.SUCCEEDED: "ok",
    **{kind: "error" for kind in FAILURES},
}
UNITS = (("week", 604_800), ("day", 86_400), ("hour", 3_600), ("minute", 60))
"""Sentry's interval units that are a fixed number of seconds, largest first."""


def slug(job: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", job.lower())[:50]


def parse_dsn(dsn: str) -> tuple[str, str]:
    """``(envelope URL, public key)`` from ``https://KEY@HOST[:PORT]/[PATH/]PROJECT``."""
    try:
        parts = urlsplit(dsn)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.username or not parts.hostname:
        raise UsageError("dsn must look like https://PUBLIC_KEY@o0.ingest.sentry.io/PROJECT_ID "
                         "(the project's DSN from Sentry's client keys settings)")  # fmt: skip
    path, _, project = parts.path.rstrip("/").rpartition("/")
    if not project.isdigit():
        raise UsageError("dsn must end with the numeric project id, like https://KEY@o0.ingest.sentry.io/42")
    netloc = parts.hostname + (f":{port}" if port else "")
    return f"{parts.scheme}://{netloc}{path}/api/{project}/envelope/", parts.username


def schedule_config(schedule: str | None, timezone: str | None) -> dict[str, Any] | None:
    """``monitor_config``'s schedule (and timezone) from a job's schedule as
    the store keeps it (``every 10m``, ``CRON_TZ=Zone EXPR`` or ``EXPR``), or
    None when Sentry cannot express it."""
    if not schedule:
        return None
    text = schedule.strip()
    if text.startswith("CRON_TZ="):
        timezone, _, text = text.removeprefix("CRON_TZ=").partition(" ")
    for prefix in ("every ", "@every "):
        if text.lower().startswith(prefix):
            from cronwarden.durations import parse_duration

            seconds = parse_duration(text[len(prefix) :].strip(), what="every")
            for unit, size in UNITS:
                if seconds >= size and seconds % size == 0:
                    return {"schedule": {"type": "interval", "value": int(seconds // size), "unit": unit}}
            return None
    config: dict[str, Any] = {"schedule": {"type": "crontab", "value": text}}
    if timezone:
        config["timezone"] = timezone
    return config


class SentrySink(SinkBase):
    def __init__(
        self,
        name: str,
        options: SinkOptions,
        *,
        dsn: str,
        environment: str | None = None,
        monitors: Mapping[str, str] | None = None,
        monitor_config: bool = False,
        timezone: str | None = None,
        failure_issue_threshold: int | None = None,
        recovery_threshold: int | None = None,
    ) -> None:
        super().__init__(name, options)
        self.envelope_url, self._key = parse_dsn(dsn)
        self.environment = environment
        self.monitors = dict(monitors or {})
        self.monitor_config = monitor_config
        self.timezone = timezone
        self.failure_issue_threshold = failure_issue_threshold
        self.recovery_threshold = recovery_threshold

    @property
    def uses_jobs(self) -> bool:
        return self.monitor_config

    def accepts(self, event: Event) -> bool:
        return event.kind in STATUS and event.run_id is not None and not event.job.startswith("sink:")

    def config_for(self, job: JobInfo | None) -> dict[str, Any] | None:
        """The ``monitor_config`` of a check-in of ``job``, or None."""
        if not self.monitor_config or job is None:
            return None
        config = schedule_config(job.schedule, self.timezone)
        if config is None:
            return None
        if job.grace:
            config["checkin_margin"] = max(1, math.ceil(job.grace / 60))
        if job.max_runtime:
            config["max_runtime"] = max(1, math.ceil(job.max_runtime / 60))
        if self.failure_issue_threshold is not None:
            config["failure_issue_threshold"] = self.failure_issue_threshold
        if self.recovery_threshold is not None:
            config["recovery_threshold"] = self.recovery_threshold
        return config

    def check_in(self, event: Event, job: JobInfo | None = None) -> dict[str, Any]:
        assert event.run_id is not None
        item: dict[str, Any] = {
            "check_in_id": run_uuid(event.run_id).replace("-", ""),
            "monitor_slug": self.monitors.get(event.job) or slug(event.job),
            "status": STATUS[event.kind],
        }
        if event.kind is not EventKind.STARTED and event.data.get("duration") is not None:
            item["duration"] = float(event.data["duration"])
        if self.environment:
            item["environment"] = self.environment
        config = self.config_for(job)
        if config is not None:
            item["monitor_config"] = config
        return item

    def envelope(self, event: Event, job: JobInfo | None = None) -> bytes:
        # The envelope header may be empty: the key travels in X-Sentry-Auth.
        lines = ["{}", dumps({"type": "check_in"}), dumps(self.check_in(event, job))]
        return ("\n".join(lines) + "\n").encode()

    def deliver(self, events: Sequence[Event], *, timeout: float, call: Call) -> None:
        headers = {
            "Content-Type": "application/x-sentry-envelope",
            "User-Agent": f"cronwarden/{__version__}",
            "X-Sentry-Auth": f"Sentry sentry_version=7, sentry_key={self._key}, "
            f"sentry_client=cronwarden/{__version__}",
        }
        for i, event in enumerate(events):
            body = self.envelope(event, call.jobs.get(event.job))
            try:
                http_request(self.envelope_url, body=body, headers=headers, timeout=timeout, call=call)
            except DeliveryError as e:
                raise DeliveryError(f"{e} (job {event.job})", delivered=i, status=e.status,
                                    permanent=e.permanent) from None  # fmt: skip
