"""Sentry Crons check-ins, sent as ``check_in`` envelope items to the
project's envelope endpoint (the protocol Sentry's SDKs use).

=============================================  =======================================
event                                          check-in
=============================================  =======================================
started                                        ``in_progress``, ``check_in_id=<run id>``
succeeded                                      ``ok`` + ``duration``
failed, lease_lost, replaced, timed_out,       ``error`` + ``duration``
abandoned
skipped, queued, queue_full, overlap           not sent: Sentry has no status for "this
                                               slot did no work" or "a second run
                                               started"; use a webhook or Healthchecks
                                               ``/log`` for those
monitor findings                               not sent (Sentry judges missed and
                                               timed-out check-ins itself)
=============================================  =======================================

``check_in_id`` is the run id (a UUID, as 32 hex digits), so the ``ok`` or
``error`` closes the very check-in its run opened, also when runs overlap.
The monitor slug is the job name (lowercased; characters other than letters,
digits, ``_`` and ``-`` become ``-``) unless ``monitors`` maps it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from cronwarden import __version__
from cronwarden.errors import UsageError
from cronwarden.events import Event, EventKind
from cronwarden.sinks.base import DeliveryError, SinkOptions, dumps, http_request
from cronwarden.sinks.healthchecks import FAILURES

STATUS: Mapping[EventKind, str] = {
    EventKind.STARTED: "in_progress",
    EventKind.SUCCEEDED: "ok",
    **{kind: "error" for kind in FAILURES},
}


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


class SentrySink:
    def __init__(
        self,
        name: str,
        options: SinkOptions,
        *,
        dsn: str,
        environment: str | None = None,
        monitors: Mapping[str, str] | None = None,
    ) -> None:
        self._name = name
        self._options = options
        self.envelope_url, self._key = parse_dsn(dsn)
        self.environment = environment
        self.monitors = dict(monitors or {})

    @property
    def name(self) -> str:
        return self._name

    @property
    def options(self) -> SinkOptions:
        return self._options

    def accepts(self, event: Event) -> bool:
        return event.kind in STATUS and event.run_id is not None and not event.job.startswith("sink:")

    def check_in(self, event: Event) -> dict[str, Any]:
        assert event.run_id is not None
        item: dict[str, Any] = {
            "check_in_id": event.run_id.replace("-", ""),
            "monitor_slug": self.monitors.get(event.job) or slug(event.job),
            "status": STATUS[event.kind],
        }
        if event.kind is not EventKind.STARTED and event.data.get("duration") is not None:
            item["duration"] = float(event.data["duration"])
        if self.environment:
            item["environment"] = self.environment
        return item

    def envelope(self, event: Event) -> bytes:
        # The envelope header may be empty: the key travels in X-Sentry-Auth.
        lines = ["{}", dumps({"type": "check_in"}), dumps(self.check_in(event))]
        return ("\n".join(lines) + "\n").encode()

    def deliver(self, events: Sequence[Event], *, timeout: float) -> None:
        headers = {
            "Content-Type": "application/x-sentry-envelope",
            "User-Agent": f"cronwarden/{__version__}",
            "X-Sentry-Auth": f"Sentry sentry_version=7, sentry_key={self._key}, "
            f"sentry_client=cronwarden/{__version__}",
        }
        for i, event in enumerate(events):
            try:
                http_request(self.envelope_url, body=self.envelope(event), headers=headers, timeout=timeout)
            except DeliveryError as e:
                raise DeliveryError(f"{e} (job {event.job})", delivered=i) from None
