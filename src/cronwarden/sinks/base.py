"""What a sink is, and the one HTTP request every network sink makes.

A sink is a view of the ledger outside cronwarden (DESIGN §7). The outbox
(``cronwarden.outbox``) hands it one event at a time (``batch`` of them for a
sink that writes many at once, the log); ``deliver`` raises on failure and
the outbox keeps the event for the next flush, or sets it aside when the
receiver refused it for good. Nothing a sink does ever reaches the job: the
outbox catches every error, and bounds every call in time.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cronwarden.events import EMPTY, Event, JobInfo
from cronwarden.sinks.route import Route

DEFAULT_TIMEOUT = 5.0
"""Seconds one request to a sink may take (connect, send, each read)."""
DEFAULT_CONCURRENCY = 4
"""Requests one network sink has in flight at most, one per job at a time."""
SINK_WIDE = frozenset({401, 403, 407, 408, 429})
"""4xx answers about the sink, not the event (its credentials, its proxy, its
load): the sink backs off and the event stays in its outbox."""


def permanent(status: int) -> bool:
    """Whether an HTTP answer refuses the event for good: a 4xx other than
    those in ``SINK_WIDE``. Sending it again would be refused again (a
    Healthchecks 400 for a malformed ``rid``, 404 for an unknown slug)."""
    return 400 <= status < 500 and status not in SINK_WIDE


@dataclass(frozen=True, kw_only=True)
class SinkOptions:
    """What every sink accepts in its ``[sinks.NAME]`` table, whatever its type."""

    jobs: frozenset[str] | None = None
    """The sink-level ``jobs`` key (names or globs), also in ``routes``."""
    max_age: float | None = None
    """Events older than this (by their ``at``) when their turn comes are
    acknowledged without sending. For receivers that read a late ping as
    "now" (Healthchecks, Sentry); None: deliver everything, however late."""
    timeout: float = DEFAULT_TIMEOUT
    backfill: float = 3600.0
    """History a newly configured sink is given (the store's ``undelivered``)."""
    concurrency: int = 1
    """Deliveries in flight at most; more than 1 delivers each job's events
    in order, several jobs at a time."""
    routes: tuple[Route, ...] = (Route(snoozed=True),)
    """An event is sent when any route matches it (``cronwarden.sinks.route``)."""
    job_tags: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Each configured job's ``tags``, for routes by tag."""

    def wants(self, event: Event, now: float | None) -> bool:
        """Whether a route takes ``event``, and (unless ``now`` is None) it is
        not older than ``max_age``."""
        if self.max_age is not None and now is not None and now - event.at > self.max_age:
            return False
        return any(route.matches(event, self.job_tags) for route in self.routes)


class Call:
    """One delivery, as the outbox hands it to a sink: when it was made (the
    webhook signs that time), what the store knows of the events' jobs (for
    a sink that ``uses_jobs``), and the sockets its requests opened, so the
    outbox can abandon it, connection and all, when the flush's time is up."""

    def __init__(self, *, at: float, jobs: Mapping[str, JobInfo | None] = EMPTY) -> None:
        self.at = at
        self.jobs = jobs
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._abandoned = False

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    def attach(self, sock: socket.socket) -> None:
        """A socket the call's request opened; shut at once if the call was
        abandoned meanwhile."""
        with self._lock:
            self._sockets.append(sock)
            if not self._abandoned:
                return
        _shut(sock)

    def abandon(self) -> None:
        """Give up the call: shut its sockets, so a request waiting on a slow
        or trickling receiver fails now instead of sending or reading on."""
        with self._lock:
            self._abandoned = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # shutdown, not close: it wakes a thread blocked reading the socket.
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class Sink(Protocol):
    """An external destination for events."""

    @property
    def name(self) -> str:
        """The ``NAME`` of ``[sinks.NAME]``: the outbox is kept per name."""

    @property
    def options(self) -> SinkOptions: ...

    @property
    def batch(self) -> int:
        """Events per ``deliver`` call at most: 1 for a sink that makes a
        request per event."""

    @property
    def uses_jobs(self) -> bool:
        """Whether ``deliver`` reads ``call.jobs``."""

    def accepts(self, event: Event) -> bool:
        """Whether this sink has anything to say about the event (a mapping
        for its kind, a URL for its job). Events it does not accept are
        acknowledged without sending."""

    def deliver(self, events: Sequence[Event], *, timeout: float, call: Call) -> None:
        """Send the events, in order. Raise ``DeliveryError`` on any failure
        (saying how many leading events did arrive, and whether the receiver
        refused the next one for good); never retry here, the outbox does,
        with backoff. ``timeout`` caps each request, and is never more than
        the time left in the flush."""


class SinkBase:
    """The parts every sink type shares."""

    batch = 1

    def __init__(self, name: str, options: SinkOptions) -> None:
        self._name = name
        self._options = options

    @property
    def name(self) -> str:
        return self._name

    @property
    def options(self) -> SinkOptions:
        return self._options

    @property
    def uses_jobs(self) -> bool:
        return False


class DeliveryError(Exception):
    """A delivery failed after ``delivered`` leading events of the batch had
    been accepted. ``permanent``: the receiver refused the next event for
    good (by default, when ``status`` is a 4xx outside ``SINK_WIDE``). The
    message is one line, with no secrets (URLs are reduced to scheme, host
    and port)."""

    def __init__(
        self, message: str, *, delivered: int = 0, status: int | None = None, permanent: bool | None = None
    ) -> None:
        super().__init__(message)
        self.delivered = delivered
        self.status = status
        self.permanent = (status is not None and _permanent(status)) if permanent is None else permanent


_permanent = permanent


_UUID = frozenset("0123456789abcdef")
RUN_ID_NAMESPACE = "8e3c3a52-4f0d-5b8e-9a63-2f6d1c0b7a41"
"""The uuid5 namespace run ids that are not UUIDs are mapped in."""


def run_uuid(run_id: str) -> str:
    """``run_id`` as a canonical UUID (``8-4-4-4-12`` lowercase hex), for
    receivers that accept nothing else (Healthchecks' ``rid``, Sentry's
    ``check_in_id``): itself when it is one, else the uuid5 of it, so one run
    id always maps to the same UUID."""
    text = run_id.lower()
    parts = text.split("-")
    if [len(p) for p in parts] == [8, 4, 4, 4, 12] and set(text) <= _UUID | {"-"}:
        return text
    import uuid

    return str(uuid.uuid5(uuid.UUID(RUN_ID_NAMESPACE), run_id))


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
    call: Call | None = None,
    method: str = "POST",
) -> int:
    """One request, on a connection of its own that ``call`` can abandon;
    returns the 2xx status or raises ``DeliveryError`` (with the status when
    the receiver answered). Redirects are failures (a POST must not silently
    turn into a GET). Honours the usual ``http_proxy``/``https_proxy``/
    ``no_proxy`` environment."""
    import http.client
    from urllib.parse import urlsplit

    where = redact(url)
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        raise DeliveryError(f"{where}: not a URL") from None
    if parts.scheme not in ("http", "https") or not host:
        raise DeliveryError(f"{where}: not an http(s) URL")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = dict(headers)
    timeout = max(0.05, timeout)
    proxy = _proxy(parts.scheme, host)
    if proxy is None:
        conn = _connection(parts.scheme, host, port, timeout, call)
    else:
        conn, auth = _through(proxy, parts.scheme, host, port, timeout, call)
        if parts.scheme == "http":
            target = url.split("#", 1)[0]  # an HTTP proxy takes the absolute URL
            if auth:
                headers["Proxy-Authorization"] = auth
    try:
        conn.request(method, target, body=body, headers=headers)
        response = conn.getresponse()
        response.read(65536)
        status, reason = int(response.status), str(response.reason or "").strip()
    except (OSError, http.client.HTTPException, ValueError) as e:
        if call is not None and call.abandoned:
            raise DeliveryError(f"{where}: abandoned when the flush's time was up") from None
        raise DeliveryError(f"{where}: {_reason(e)}") from None
    finally:
        conn.close()
    if not 200 <= status < 300:
        raise DeliveryError(f"{where} answered HTTP {status}" + (f" {reason}" if reason else ""),
                            status=status)  # fmt: skip
    return status


def _connection(scheme: str, host: str, port: int | None, timeout: float, call: Call | None) -> Any:
    kwargs: dict[str, Any] = {"timeout": timeout}
    if scheme == "https":
        kwargs["context"] = _tls()
    conn = _connection_class(scheme)(host, port, **kwargs)
    conn.call = call
    return conn


@functools.cache
def _connection_class(scheme: str) -> Any:
    """``http.client``'s connection for ``scheme``, telling its call about the
    socket once connected (so the call can shut it)."""
    import http.client

    base: Any = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection

    class Attached(base):  # type: ignore[misc]
        call: Call | None = None

        def connect(self) -> None:
            super().connect()
            if self.call is not None:
                self.call.attach(self.sock)

    return Attached


def _proxy(scheme: str, host: str) -> str | None:
    """The proxy URL the environment names for ``scheme``, unless ``host``
    is in ``no_proxy``."""
    import urllib.request

    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    return proxy


def _through(
    proxy: str, scheme: str, host: str, port: int | None, timeout: float, call: Call | None
) -> tuple[Any, str | None]:
    """A connection to ``host`` through an HTTP proxy (a CONNECT tunnel for
    https), and the ``Proxy-Authorization`` the proxy URL's credentials make."""
    import base64
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    auth = None
    if parts.username:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        auth = "Basic " + base64.b64encode(pair).decode()
    proxy_host, proxy_port = parts.hostname or "", parts.port or 8080
    if scheme == "http":
        return _connection("http", proxy_host, proxy_port, timeout, call), auth
    conn = _connection("https", proxy_host, proxy_port, timeout, call)
    conn.set_tunnel(host, port or 443, headers={"Proxy-Authorization": auth} if auth else None)
    return conn, None


@functools.cache
def _tls() -> Any:
    """One TLS context per process: loading the system's CA certificates
    costs milliseconds."""
    import ssl

    return ssl.create_default_context()


def _reason(e: object) -> str:
    if isinstance(e, TimeoutError) or "timed out" in str(e):
        return "no answer in time"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
