"""Healthchecks.io (and compatible) pings, one check per job, as its Pinging
API documents them.

A job's check is its ``ping_urls`` entry (a UUID URL), or the ``url``
template (``https://hc-ping.com/PING_KEY/{job}``) with the job's slug: its
``slugs`` entry, else its name mapped to a slug (lowercased, each character
other than ``a-z0-9_-`` turned into ``-``; a name whose slug would be longer
than Healthchecks' 100 characters is refused, and each of its events is set
aside as rejected, saying so). ``create = true`` adds ``?create=1`` to slug
pings, so Healthchecks creates a missing check on its first ping.

=============================================  =====================================
event                                          ping
=============================================  =====================================
started                                        ``/start?rid=``
succeeded                                      ``/0?rid=`` (the check URL itself when
                                               the run has no exit status: a
                                               library run)
failed                                         ``/<exit status>?rid=`` (1-255), else
                                               ``/fail?rid=``
lease_lost, replaced, timed_out, abandoned,    ``/fail?rid=``
interrupted, stopped
skipped, queued, queue_full, overlap           ``/log?rid=``
monitor findings (slow, stuck, missed, …)      ``/log`` (``rid`` when about a run)
=============================================  =====================================

``rid`` is the run id, which Healthchecks requires to be a UUID: a run id
that is not one is sent as its uuid5 (``sinks.base.run_uuid``), the same for
every ping of the run. Every ping is a POST whose text body says what
happened and why, each fact once (``sinks.message.describe``), at most
Healthchecks' default ping body limit (10,000 bytes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from cronwarden import __version__
from cronwarden.events import Event, EventKind
from cronwarden.sinks.base import Call, DeliveryError, SinkBase, SinkOptions, http_request, run_uuid
from cronwarden.sinks.message import describe
from cronwarden.sinks.route import ENDINGS_BAD, FINDINGS, REFUSALS

FAILURES = ENDINGS_BAD
"""Endings that are pinged as failures."""
SLUG = re.compile(r"[a-z0-9_-]{1,100}")
"""A slug Healthchecks accepts: lowercase letters, digits, ``-``, ``_``, at most 100."""
BODY_LIMIT = 10_000
"""Bytes of a ping body Healthchecks keeps by default (``PING_BODY_LIMIT``)."""


def slug_of(job: str) -> str | None:
    """The slug a job name maps to, or None when it would be too long."""
    slug = re.sub(r"[^a-z0-9_-]", "-", job.lower())
    return slug if SLUG.fullmatch(slug) else None


def endpoint(event: Event) -> str | None:
    """The path suffix an event is pinged at, or None if it is not sent."""
    kind, code = event.kind, event.data.get("exit_code")
    if kind is EventKind.STARTED:
        return "/start"
    if kind is EventKind.SUCCEEDED:
        return "/0" if code == 0 else ""
    if kind is EventKind.FAILED and isinstance(code, int) and 0 < code <= 255:
        return f"/{code}"
    if kind in FAILURES:
        return "/fail"
    if kind in REFUSALS or kind in FINDINGS:
        return "/log"
    return None


class HealthchecksSink(SinkBase):
    """``ping_urls`` maps job names to check URLs; ``url_template`` (with
    ``{job}``) covers the jobs not listed, by slug. Jobs with neither are
    not sent."""

    def __init__(
        self,
        name: str,
        options: SinkOptions,
        *,
        ping_urls: Mapping[str, str] | None = None,
        url_template: str | None = None,
        slugs: Mapping[str, str] | None = None,
        create: bool = False,
    ) -> None:
        super().__init__(name, options)
        self.ping_urls = dict(ping_urls or {})
        self.url_template = url_template
        self.slugs = dict(slugs or {})
        self.create = create

    def accepts(self, event: Event) -> bool:
        if endpoint(event) is None:
            return False
        if event.job in self.ping_urls:
            return True
        return self.url_template is not None and not event.job.startswith("sink:")

    def check_url(self, job: str) -> str:
        """The job's check URL. Raises a permanent ``DeliveryError`` for a
        job whose name maps to no slug."""
        if job in self.ping_urls:
            return self.ping_urls[job]
        assert self.url_template is not None
        slug = self.slugs.get(job) or slug_of(job)
        if slug is None:
            raise DeliveryError(f"job {job!r} maps to no Healthchecks slug (at most 100 of a-z0-9_-); "
                                "give it one in slugs", permanent=True)  # fmt: skip
        url = self.url_template.replace("{job}", slug)
        return _with_query(url, "create=1") if self.create else url

    def ping_url(self, event: Event) -> str:
        suffix = endpoint(event)
        assert suffix is not None
        parts = urlsplit(self.check_url(event.job))
        url = urlunsplit(parts._replace(path=parts.path.rstrip("/") + suffix))
        return _with_query(url, f"rid={run_uuid(event.run_id)}") if event.run_id else url

    def deliver(self, events: Sequence[Event], *, timeout: float, call: Call) -> None:
        headers = {"Content-Type": "text/plain; charset=utf-8", "User-Agent": f"cronwarden/{__version__}"}
        for i, event in enumerate(events):
            body = describe(event).encode()[:BODY_LIMIT].decode(errors="ignore").encode()
            try:
                http_request(self.ping_url(event), body=body, headers=headers, timeout=timeout, call=call)
            except DeliveryError as e:
                raise DeliveryError(f"{e} (job {event.job})", delivered=i, status=e.status,
                                    permanent=e.permanent) from None  # fmt: skip


def _with_query(url: str, pair: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(query=f"{parts.query}&{pair}" if parts.query else pair))
