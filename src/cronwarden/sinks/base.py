"""What a sink is, and the one HTTP request every network sink makes.

A sink is a view of the ledger outside cronwarden (DESIGN §7). The outbox
(``cronwarden.outbox``) hands it batches of events; ``deliver`` raises on
failure and the outbox keeps the events for the next flush. Nothing a sink
does ever reaches the job: the outbox catches every error, and bounds every
call in time.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cronwarden.events import Event

DEFAULT_TIMEOUT = 5.0
"""Seconds one request to a sink may take (connect, send, each read)."""


@dataclass(frozen=True, kw_only=True)
class SinkOptions:
    """What every sink accepts in its ``[sinks.NAME]`` table, whatever its type."""

    jobs: frozenset[str] | None = None
    """Deliver only these jobs' events (None: every job, and cronwarden's own
    ``sink:*`` delivery events)."""
    max_age: float | None = None
    """Events older than this (by their ``at``) when their turn comes are
    acknowledged without sending. For receivers that read a late ping as
    "now" (Healthchecks, Sentry); None: deliver everything, however late."""
    timeout: float = DEFAULT_TIMEOUT
    backfill: float = 3600.0
    """History a newly configured sink is given (the store's ``undelivered``)."""

    def wants(self, event: Event, now: float) -> bool:
        if self.jobs is not None and event.job not in self.jobs:
            return False
        return self.max_age is None or now - event.at <= self.max_age


class Sink(Protocol):
    """An external destination for events."""

    @property
    def name(self) -> str:
        """The ``NAME`` of ``[sinks.NAME]``: the outbox is kept per name."""

    @property
    def options(self) -> SinkOptions: ...

    def accepts(self, event: Event) -> bool:
        """Whether this sink has anything to say about the event (a mapping
        for its kind, a URL for its job). Events it does not accept are
        acknowledged without sending."""

    def deliver(self, events: Sequence[Event], *, timeout: float) -> None:
        """Send the events, in order. Raise (``DeliveryError`` to say how many
        leading events did arrive) on any failure; never retry here, the
        outbox does, with backoff. ``timeout`` caps each request, and is
        never more than the time left in the flush."""


class DeliveryError(Exception):
    """A delivery failed after ``delivered`` leading events of the batch had
    been accepted. The message is one line, with no secrets (URLs are
    reduced to scheme, host and port)."""

    def __init__(self, message: str, *, delivered: int = 0) -> None:
        super().__init__(message)
        self.delivered = delivered


def event_json(event: Event) -> dict[str, Any]:
    """The JSON form of an event, as the webhook and log sinks send it."""
    return {
        "event_id": event.event_id,
        "seq": event.seq,
        "kind": event.kind.value,
        "job": event.job,
        "run_id": event.run_id,
        "at": event.at,
        "data": dict(event.data),
    }


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def utc(t: float | None) -> str:
    """``2024-05-01T10:10:00Z``: times in texts sent out, unambiguous anywhere."""
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def redact(url: str) -> str:
    """``scheme://host:port`` only: ping URLs, paths and DSN keys are secrets,
    and error messages end up in the ledger and in other sinks."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<bad url>"
    return f"{parts.scheme}://{host}{port}"


def http_request(
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    timeout: float,
    method: str = "POST",
) -> int:
    """One request; returns the 2xx status or raises ``DeliveryError``.
    Redirects are failures (a POST must not silently turn into a GET).
    Honours the usual ``https_proxy``/``no_proxy`` environment."""
    import http.client
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, headers=dict(headers), method=method)
    where = redact(url)
    try:
        with _opener().open(request, timeout=max(0.05, timeout)) as response:
            response.read(65536)
            status = int(response.status)
    except urllib.error.HTTPError as e:
        raise DeliveryError(f"{where} answered HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise DeliveryError(f"{where}: {_reason(e.reason)}") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise DeliveryError(f"{where}: {_reason(e)}") from None
    if not 200 <= status < 300:
        raise DeliveryError(f"{where} answered HTTP {status}")
    return status


def _reason(e: object) -> str:
    if isinstance(e, TimeoutError) or "timed out" in str(e):
        return "no answer in time"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


@functools.cache
def _opener() -> Any:
    """An opener that refuses redirects: ``redirect_request`` returning None
    makes urllib raise the 3xx as an ``HTTPError``."""
    import urllib.request

    class NoRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    return urllib.request.build_opener(NoRedirects())
