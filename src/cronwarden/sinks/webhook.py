"""A webhook: one JSON POST per event, signed.

Headers on every request:

- ``X-Cronwarden-Signature: sha256=<hex>``: HMAC-SHA256 of the exact body
  bytes, keyed with the sink's secret. Verify it over the raw body before
  parsing, with a constant-time comparison.
- ``X-Cronwarden-Event-Id``: the event's id (also in the body). Delivery is
  at least once: deduplicate on this id.
- ``X-Cronwarden-Event``: the event's kind, for routing without parsing.

Any 2xx is an acknowledgement; anything else (or no answer within the
timeout) leaves the event and everything after it in the outbox.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

from cronwarden import __version__
from cronwarden.events import Event
from cronwarden.sinks.base import DeliveryError, SinkOptions, dumps, event_json, http_request

SIGNATURE_HEADER = "X-Cronwarden-Signature"
EVENT_ID_HEADER = "X-Cronwarden-Event-Id"


def signature(secret: bytes, body: bytes) -> str:
    """The value of ``X-Cronwarden-Signature`` for ``body``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class WebhookSink:
    def __init__(
        self,
        name: str,
        options: SinkOptions,
        *,
        url: str,
        secret: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._name = name
        self._options = options
        self.url = url
        self._secret = secret
        self._headers = dict(headers or {})

    @property
    def name(self) -> str:
        return self._name

    @property
    def options(self) -> SinkOptions:
        return self._options

    def accepts(self, event: Event) -> bool:
        return True

    def request(self, event: Event) -> tuple[bytes, dict[str, str]]:
        """The body and headers of the POST for ``event``."""
        body = dumps(event_json(event)).encode()
        headers = {
            **self._headers,
            "Content-Type": "application/json",
            "User-Agent": f"cronwarden/{__version__}",
            EVENT_ID_HEADER: event.event_id,
            "X-Cronwarden-Event": event.kind.value,
            SIGNATURE_HEADER: signature(self._secret, body),
        }
        return body, headers

    def deliver(self, events: Sequence[Event], *, timeout: float) -> None:
        for i, event in enumerate(events):
            body, headers = self.request(event)
            try:
                http_request(self.url, body=body, headers=headers, timeout=timeout)
            except DeliveryError as e:
                raise DeliveryError(str(e), delivered=i) from None
