"""Chat, pager and email services through Apprise (``pip install
'cronwarden[notify]'``): Slack, Microsoft Teams, Discord, email, PagerDuty,
Opsgenie, ntfy, Telegram… each by an Apprise URL (``slack://…``,
``mailto://…``, ``pagerduty://…``; Apprise's documentation lists them), with
no code of ours per service.

Each event is one notification: the title says the job and what happened
(``reconcile: failed``), the body says why (``sinks.message.describe``), and
the notification type is Apprise's ``failure`` for a run that ended badly
or a sink in trouble, ``warning`` for a refusal and a raised finding,
``success`` for a success, a resolved finding and a sink back, ``info``
otherwise. By default an Apprise sink is sent the events that page (the
route group ``alerts``), not every start and success.

Apprise says whether a service took a notification, not why not, so every
failure is treated as the service being down: the sink backs off and the
event stays in its outbox (no event is set aside as rejected). The service
is called in the outbox's own thread, bounded by Apprise's request timeouts
(4 s to connect and 4 s to read by default; ``?cto=``/``?rto=`` in the URL).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from cronwarden.errors import UsageError
from cronwarden.events import Event, EventKind
from cronwarden.sinks.base import Call, DeliveryError, SinkBase, SinkOptions
from cronwarden.sinks.message import describe, title
from cronwarden.sinks.route import DELIVERY, ENDINGS_BAD, FINDINGS, REFUSALS


def notify_type(event: Event) -> str:
    """Apprise's notification type for ``event``."""
    kind, state = event.kind, event.data.get("state")
    if kind in ENDINGS_BAD or kind in (EventKind.SINK_FAILED, EventKind.SINK_REJECTED):
        return "failure"
    if kind in FINDINGS:
        return "success" if state == "resolved" else "warning"
    if kind in REFUSALS:
        return "warning"
    if kind is EventKind.SUCCEEDED or kind in DELIVERY:
        return "success"
    return "info"


def _apprise() -> Any:
    try:
        import apprise
    except ImportError:
        raise UsageError("type apprise needs Apprise: pip install 'cronwarden[notify]'") from None
    return apprise


class AppriseSink(SinkBase):
    """``url`` is one Apprise URL: a sink per service, so that one service
    being down holds back only its own notifications."""

    def __init__(self, name: str, options: SinkOptions, *, url: str) -> None:
        super().__init__(name, options)
        apprise = _apprise()
        # Sequential and without Apprise's own service timeout: the call runs
        # in the outbox's thread (a daemon the outbox can leave behind),
        # never in Apprise's worker pool, which the interpreter waits for at
        # exit.
        try:
            asset = apprise.AppriseAsset(async_mode=False, service_timeout=0)
        except TypeError:  # an Apprise older than service_timeout runs sequential calls inline
            asset = apprise.AppriseAsset(async_mode=False)
        self._apprise = apprise.Apprise(asset=asset)
        if not self._apprise.add(url):
            scheme = url.partition("://")[0] or url[:12]
            raise UsageError(f"url is not a URL Apprise can use (scheme {scheme!r}); see Apprise's "
                             "services, e.g. slack://TOKEN_A/TOKEN_B/TOKEN_C, json://HOST/PATH")  # fmt: skip
        self.service = str(next(iter(self._apprise)).service_name)

    def accepts(self, event: Event) -> bool:
        return True

    def deliver(self, events: Sequence[Event], *, timeout: float, call: Call) -> None:
        apprise = _apprise()
        for i, event in enumerate(events):
            with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as captured:
                ok = self._apprise.notify(body=describe(event), title=title(event),
                                          notify_type=apprise.NotifyType(notify_type(event)))  # fmt: skip
            if not ok:
                why = " ".join(str(captured.getvalue()).split())[:200] or "no reason given"
                raise DeliveryError(f"apprise: {self.service} did not take the notification: {why}",
                                    delivered=i)  # fmt: skip
