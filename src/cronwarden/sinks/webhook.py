"""A webhook: one JSON POST per event, signed against forgery and replay.

Headers on every request:

- ``X-Cronwarden-Signature: t=<unix time>,v1=<hex>``: HMAC-SHA256, keyed
  with the sink's secret, of ``<t>.<event id>.`` followed by the exact body
  bytes. ``t`` is when the request was sent (a redelivery is signed anew).
  Verify it before parsing, with a constant-time comparison, and refuse a
  ``t`` outside your window (5 minutes is usual): a captured request then
  replays neither under another event id nor later (``verify`` below is a
  receiver's check, written once).
- ``X-Cronwarden-Event-Id``: the event's id (also in the body), covered by
  the signature. Delivery is at least once: deduplicate on this id.
- ``X-Cronwarden-Event``: the event's kind, for routing without parsing.

Any 2xx is an acknowledgement. A 4xx other than 401, 403, 407, 408 and 429
refuses that event for good: it is set aside (``sink_rejected``) and the
sink goes on with the rest. Anything else (or no answer within the
timeout) leaves the event and the rest in the outbox, for after a backoff.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

from cronwarden import __version__
from cronwarden.events import Event
from cronwarden.sinks.base import Call, DeliveryError, SinkBase, SinkOptions, dumps, event_json, http_request

SIGNATURE_HEADER = "X-Cronwarden-Signature"
EVENT_ID_HEADER = "X-Cronwarden-Event-Id"
REPLAY_WINDOW = 300.0
"""Seconds a receiver should accept a signature's timestamp either side of now."""


def signature(secret: bytes, at: float, event_id: str, body: bytes) -> str:
    """The value of ``X-Cronwarden-Signature`` for ``body`` sent at ``at``."""
    t = int(at)
    digest = hmac.new(secret, f"{t}.{event_id}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={digest}"


def verify(
    secret: bytes, header: str, event_id: str, body: bytes, *, now: float, window: float = REPLAY_WINDOW
) -> bool:
    """A receiver's check of a request: the signature header, the event id
    header and the raw body, at its own time ``now``. False for a forged, a
    replayed (another id, or older than ``window``) or a malformed one."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    t, given = fields.get("t", ""), fields.get("v1", "")
    if not t.isdigit() or abs(now - int(t)) > window:
        return False
    expected = hmac.new(secret, f"{t}.{event_id}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, given)


class WebhookSink(SinkBase):
    def __init__(
        self,
        name: str,
        options: SinkOptions,
        *,
        url: str,
        secret: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(name, options)
        self.url = url
        self._secret = secret
        self._headers = dict(headers or {})

    def accepts(self, event: Event) -> bool:
        return True

    def request(self, event: Event, *, at: float) -> tuple[bytes, dict[str, str]]:
        """The body and headers of the POST for ``event``, sent at ``at``."""
        body = dumps(event_json(event)).encode()
        headers = {
            **self._headers,
            "Content-Type": "application/json",
            "User-Agent": f"cronwarden/{__version__}",
            EVENT_ID_HEADER: event.event_id,
            "X-Cronwarden-Event": event.kind.value,
            SIGNATURE_HEADER: signature(self._secret, at, event.event_id, body),
        }
        return body, headers

    def deliver(self, events: Sequence[Event], *, timeout: float, call: Call) -> None:
        for i, event in enumerate(events):
            body, headers = self.request(event, at=call.at)
            try:
                http_request(self.url, body=body, headers=headers, timeout=timeout, call=call)
            except DeliveryError as e:
                raise DeliveryError(str(e), delivered=i, status=e.status, permanent=e.permanent) from None
