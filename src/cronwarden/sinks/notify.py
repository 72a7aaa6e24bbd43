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
import re
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
    being down holds back only its own notifications.

    ``check``: ask Apprise now whether it can use the URL (importing Apprise
    costs a tenth of a second: the config read at the start of every
    ``cronwarden run`` only checks the URL's shape, and loading the sinks
    to deliver asks Apprise)."""

    def __init__(self, name: str, options: SinkOptions, *, url: str, check: bool = True) -> None:
        super().__init__(name, options)
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*://\S+", url):
            raise UsageError("url must be an Apprise URL like slack://TOKEN_A/TOKEN_B/TOKEN_C or "
                             "json://HOST/PATH")  # fmt: skip
        self._url = url
        self._apprise: Any = None
        self.service = url.partition("://")[0]
        if check:
            self._service()

    def _service(self) -> Any:
        """The Apprise object for the URL, made once; ``UsageError`` if Apprise
        cannot use it."""
        if self._apprise is not None:
            return self._apprise
        apprise = _apprise()
        # Sequential and without Apprise's own service timeout: the call runs
        # in the outbox's thread (a daemon the outbox can leave behind),
        # never in Apprise's worker pool, which the interpreter waits for at
        # exit.
        try:
            asset = apprise.AppriseAsset(async_mode=False, service_timeout=0)
        except TypeError:  # an Apprise older than service_timeout runs sequential calls inline
            asset = apprise.AppriseAsset(async_mode=False)
        service = apprise.Apprise(asset=asset)
        if not service.add(self._url):
            raise UsageError(f"url is not a URL Apprise can use (scheme {self.service!r}); see Apprise's "
                             "services, e.g. slack://TOKEN_A/TOKEN_B/TOKEN_C, json://HOST/PATH")  # fmt: skip
        self.service = str(next(iter(service)).service_name)
        self._apprise = service
        return service

    def accepts(self, event: Event) -> bool:
        return True

    def deliver(self, events: Sequence[Event], *, timeout: float, call: Call) -> None:
        try:
            service = self._service()
        except UsageError as e:
            raise DeliveryError(f"apprise: {e}") from None
        apprise = _apprise()
        for i, event in enumerate(events):
            with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as captured:
                ok = service.notify(body=describe(event), title=title(event),
                                    notify_type=apprise.NotifyType(notify_type(event)))  # fmt: skip
            if not ok:
                why = " ".join(str(captured.getvalue()).split())[:200] or "no reason given"
                raise DeliveryError(f"apprise: {self.service} did not take the notification: {why}",
                                    delivered=i)  # fmt: skip
