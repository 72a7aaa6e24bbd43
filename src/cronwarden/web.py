"""The dashboard: what on-call reads, in a browser, over one store. Read-only.

    /                  every job's verdict (as ``audit``), the findings that
                       hold now (as ``check``), the open runs (as ``status``)
                       and the latest trouble in the ledger
    /jobs/NAME         one job: its statistics, its durations against its
                       period, its runs and the refused starts between them
                       (as ``history``)
    /api/jobs          the same as JSON; /api/jobs/NAME, /api/runs (open
    /api/events        runs), /api/events?job=&kind=&run_id=&since=&limit=
    /metrics           the Prometheus exposition of ``cronwarden metrics``
    /healthz           200 while the store answers, 503 when it does not

``Dashboard.handle`` is the whole HTTP surface (method and target in, a
``Response`` out), so tests call it without a socket; ``serve`` puts it
behind the standard library's ``ThreadingHTTPServer``. No web framework: the
pages are small and their readers few, and the cron wrapper's dependencies
stay what they are. Every reading goes through one ``Monitor`` and its store,
one page at a time (see ``Dashboard``).
"""

from __future__ import annotations

import html
import json
import math
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from cronwarden.commands.monitor import audit_item, condition_item
from cronwarden.commands.views import dur as _dur
from cronwarden.commands.views import history_items, history_note, open_run_item, open_runs, state
from cronwarden.commands.views import when as _when
from cronwarden.errors import StoreError, StoreUnavailable, UsageError, mask_password
from cronwarden.events import Event, EventKind
from cronwarden.monitor import RESOLVED, JobStats, Monitor, Pass, Severity, Verdict
from cronwarden.sinks.base import event_json
from cronwarden.stores.base import EventQuery

DEFAULT_REFRESH = 30.0
BODY_MAX = 65536
"""A request body up to this size is read and dropped; a larger one closes
the connection (the dashboard reads no body)."""
EVENTS_MAX = 1000
"""The most events one ``/api/events`` call returns."""

FINE = {EventKind.STARTED, EventKind.SUCCEEDED, EventKind.QUEUED, EventKind.SINK_RECOVERED}
TROUBLE = tuple(k for k in EventKind if k not in FINE)
"""What the pages list as the latest trouble: every kind of event but a
start, a success, a queued start and a sink back up; and of the monitor's
findings, those raised (a resolution is good news)."""


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


class BadRequest(UsageError):
    """A query parameter the API cannot read (400)."""


class NotFound(UsageError):
    """No such page or job (404)."""


class Dashboard:
    """Pages and JSON over one ``Monitor`` and its store (``close`` closes
    it). ``refresh``: seconds between the pages' reloads (0: never)."""

    def __init__(self, monitor: Monitor, *, refresh: float = DEFAULT_REFRESH) -> None:
        self.monitor = monitor
        self.store = monitor.store
        self.refresh = refresh
        # One page is read at a time: a burst of reloads then costs the store
        # what one reader costs, and the monitor's caches see one thread.
        # /healthz does not wait behind a slow page.
        self._lock = threading.Lock()
        self._routes: list[tuple[str, bool, Callable[[str, Mapping[str, list[str]]], Response]]] = [
            ("/", False, self._front),
            ("/jobs/", True, self._job_page),
            ("/api/jobs", False, self._api_jobs),
            ("/api/jobs/", True, self._api_job),
            ("/api/runs", False, self._api_runs),
            ("/api/events", False, self._api_events),
            ("/metrics", False, self._metrics),
        ]

    def close(self) -> None:
        """Close the store once the page being read (if any) is done."""
        with self._lock:
            self.store.close()

    def handle(self, method: str, target: str) -> Response:
        """Answer one request. Never raises: a store that cannot be read is a
        503 (or 500) page saying why, and the server goes on."""
        api = target.startswith("/api/")
        if method not in ("GET", "HEAD"):
            refused = f"{method} is not served: the dashboard is read-only"
            return _error(HTTPStatus.METHOD_NOT_ALLOWED, refused, api, headers={"Allow": "GET, HEAD"})
        try:
            try:
                parts = urlsplit(target)
                query = parse_qs(parts.query, keep_blank_values=True)
            except ValueError as e:
                raise BadRequest(f"cannot read the request target {target!r}: {e}") from None
            path = parts.path
            if path == "/healthz":
                return self._health()
            for prefix, takes_rest, view in self._routes:
                if takes_rest and path.startswith(prefix) and len(path) > len(prefix):
                    rest = unquote(path[len(prefix) :])
                elif not takes_rest and path == prefix:
                    rest = ""
                else:
                    continue
                with self._lock:
                    return view(rest, query)
            raise NotFound(f"no page at {path}; see / for the jobs, /api/jobs for JSON")
        except NotFound as e:
            return _error(HTTPStatus.NOT_FOUND, str(e), api)
        except BadRequest as e:
            return _error(HTTPStatus.BAD_REQUEST, str(e), api)
        except StoreUnavailable as e:
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, f"the store cannot be read now: {e}", api)
        except (StoreError, UsageError) as e:
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, str(e), api)
        except Exception as e:  # a bug: one line to the reader, and the server goes on
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {type(e).__name__}: {e}", api)

    # -- readings ---------------------------------------------------------

    def _pass(self) -> Pass:
        return self.monitor.evaluate(record=False)  # read-only: no finding recorded, no run abandoned

    def _known(self, job: str) -> JobStats:
        stats = self.monitor.stats(job)
        if stats.info is None and stats.runs == 0 and not self.store.runs(job, 1):
            raise NotFound(f"no job named {job!r} in the ledger or the config file")
        return stats

    def _trouble(self, job: str | None = None, limit: int = 50) -> list[Event]:
        # Across jobs this is a scan of the events on SQLite, which has no index
        # of them by time alone (one more per insert is not worth it): ~50 ms
        # at 400,000 events, beside the monitor's pass the page makes anyway.
        events = self._events(job=job, kinds=TROUBLE, limit=2 * limit)
        return [e for e in events if e.data.get("state") != RESOLVED][:limit]

    def _events(self, **query: Any) -> list[Event]:
        return self.store.events(EventQuery(**query))

    # -- JSON -------------------------------------------------------------

    def _api_jobs(self, _: str, query: Mapping[str, list[str]]) -> Response:
        result = self._pass()
        t = self.monitor.thresholds
        return _json(
            {
                "as_of": result.at,
                "jobs": [audit_item(s, t) for s in result.stats],
                "findings": [condition_item(c) for c in result.active],
            }
        )

    def _api_job(self, job: str, query: Mapping[str, list[str]]) -> Response:
        stats = self._known(job)
        limit = _int(query, "limit", 50, 1, EVENTS_MAX)
        return _json(
            {"job": stats.as_dict(self.monitor.thresholds), "history": history_items(self.store, job, limit)}
        )

    def _api_runs(self, _: str, query: Mapping[str, list[str]]) -> Response:
        job = _one(query, "job")
        now = self.monitor.clock.wall()
        return _json([open_run_item(r, pending, now) for r, pending in open_runs(self.store, job)])

    def _api_events(self, _: str, query: Mapping[str, list[str]]) -> Response:
        kinds: list[EventKind] = []
        for text in (k for value in query.get("kind", []) for k in value.split(",") if k):
            try:
                kinds.append(EventKind(text))
            except ValueError:
                raise BadRequest(
                    f"kind={text!r} is no event kind; expected one of {', '.join(k.value for k in EventKind)}"
                ) from None
        since = _one(query, "since")
        try:
            since_at = None if since is None else float(since)
        except ValueError:
            raise BadRequest(f"since={since!r} is not a time; expected seconds since the epoch") from None
        if since_at is not None and not math.isfinite(since_at):
            raise BadRequest(f"since={since!r} is not a time; expected seconds since the epoch")
        events = self._events(
            job=_one(query, "job"),
            kinds=kinds or None,
            run_id=_one(query, "run_id"),
            since=since_at,
            limit=_int(query, "limit", 100, 1, EVENTS_MAX),
        )
        return _json([event_json(e) for e in events])

    def _metrics(self, _: str, query: Mapping[str, list[str]]) -> Response:
        from cronwarden.metrics import exposition

        try:
            body = exposition(self.monitor)
        except UsageError as e:  # prometheus_client is not installed
            return _error(HTTPStatus.NOT_IMPLEMENTED, str(e), api=True)
        return Response(HTTPStatus.OK, "text/plain; version=0.0.4; charset=utf-8", body)

    def _health(self) -> Response:
        self.store.jobs()
        return Response(HTTPStatus.OK, "text/plain; charset=utf-8", b"ok\n")

    # -- pages ------------------------------------------------------------

    def _front(self, _: str, query: Mapping[str, list[str]]) -> Response:
        result = self._pass()
        t = self.monitor.thresholds
        now = result.at
        counts = Counter(s.verdict(t) for s in result.stats)
        runs = open_runs(self.store, runs=result.open_runs)  # the pass read them
        chips = [f'<span class="chip {_css(v)}">{counts[v]} {_h(v)}</span>' for v in Verdict if v in counts]
        summary = " ".join(chips) or '<span class="chip">no jobs yet</span>'
        summary += f' <span class="chip">{len(runs)} open run{"s" * (len(runs) != 1)}</span>'
        jobs = _table(
            [
                "job",
                "verdict",
                "schedule",
                "p50",
                "p95",
                "max",
                "p95 / period",
                "runs",
                "skips in a row",
                "open",
                "last success",
                "notes",
            ],
            [
                [
                    _job_link(s.job),
                    _badge(s.verdict(t)),
                    _h(s.schedule or _dur(s.period)),
                    _dur(s.p50),
                    _dur(s.p95),
                    _dur(s.max),
                    _share(s.ratio, t.slow),
                    str(s.completed),
                    str(s.skips_in_a_row),
                    str(s.open_runs),
                    _ago(s.last_success, now),
                    _h("; ".join(s.notes(t))),
                ]
                for s in result.stats
            ],
            empty="No jobs in the ledger yet: run one with cronwarden run --job NAME -- COMMAND.",
        )
        findings = _table(
            ["severity", "job", "finding", "run", "what"],
            [
                [
                    _severity(c.severity),
                    _job_link(c.job),
                    _h(c.rule.value),
                    _h(c.run_id or "-"),
                    _h(c.summary),
                ]
                for c in sorted(result.active, key=lambda c: (-c.severity, c.job))
            ],
            empty="Nothing holds now.",
        )
        body = (
            f"<p>{summary}</p><h2>Jobs</h2>{jobs}<h2>Findings</h2>{findings}"
            f"<h2>Open runs</h2>{self._open_table(runs, now)}"
            f"<h2>Latest trouble</h2>{_events_table(self._trouble(), now)}"
        )
        return self._page("cronwarden", body, now)

    def _open_table(self, runs: Sequence[tuple[Any, int]], now: float) -> str:
        return _table(
            [
                "job",
                "run id",
                "host",
                "pid",
                "started",
                "age",
                "lease expires in",
                "token",
                "pending",
                "state",
            ],
            [
                [
                    _job_link(r.job),
                    _h(r.run_id),
                    _h(r.host),
                    str(r.pid),
                    _when(r.started_at),
                    _dur(now - r.started_at),
                    _dur(r.expires_in),
                    str(r.token),
                    str(pending),
                    _h(state(r)),
                ]
                for r, pending in runs
            ],
            empty="No run is open.",
        )

    def _job_page(self, job: str, query: Mapping[str, list[str]]) -> Response:
        stats = self._known(job)
        t = self.monitor.thresholds
        now = stats.now
        limit = _int(query, "limit", 50, 1, EVENTS_MAX)
        items = history_items(self.store, job, limit)
        facts = [
            ("verdict", _badge(stats.verdict(t))),
            ("schedule", _h(stats.schedule or "-")),
            ("period", _dur(stats.period)),
            ("policy", f"{_h(stats.policy)} — {_h(stats.reason) if stats.reason else 'no written reason'}"),
            ("p50 / p95 / max", f"{_dur(stats.p50)} / {_dur(stats.p95)} / {_dur(stats.max)}"),
            ("p95 / period", _share(stats.ratio, t.slow)),
            ("runs in the window", f"{stats.runs} ({stats.completed} completed, {stats.open_runs} open)"),
            ("skips", f"{stats.skips} ({stats.skips_in_a_row} in a row)"),
            ("overlaps", str(stats.overlaps)),
            ("failures / lease losses", f"{stats.failures} / {stats.lease_losses}"),
            ("last start / success", f"{_ago(stats.last_start, now)} / {_ago(stats.last_success, now)}"),
            ("notes", _h("; ".join(stats.notes(t)) or "-")),
        ]
        dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
        rows = [
            [_when(i["started_at"]), _outcome(i["outcome"]), _h(i["run_id"]), _dur(i["duration"]),
             str(i["token"]), _h(f"{i['host']}:{i['pid']}"), _h(history_note(i))]
            if i["type"] == "run"
            else [_when(i["at"]), _outcome(i["type"]), _h(i["run_id"] or "-"), "-", "-",
                  _h(str(i.get("host", "-"))), _h(history_note(i))]
            for i in items
        ]  # fmt: skip
        history = _table(
            ["when", "outcome", "run id", "duration", "token", "host:pid", "note"],
            rows,
            empty="No runs recorded yet.",
        )
        chart = duration_chart([i for i in reversed(items) if i["type"] == "run"], stats.period, t.slow, now)
        body = (
            f'<p><a href="/">← all jobs</a></p><dl>{dl}</dl><h2>Durations against the period</h2>{chart}'
            f"<h2>Runs and refused starts</h2>{history}"
            f"<h2>Latest trouble</h2>{_events_table(self._trouble(job, 20), now)}"
        )
        return self._page(job, body, now)

    def _page(self, title: str, body: str, now: float) -> Response:
        refresh = f'<meta http-equiv="refresh" content="{round(self.refresh)}">' if self.refresh > 0 else ""
        store = _h(mask_password(self.store.url))
        text = (
            f'<!doctype html><html lang="en"><head><meta charset="utf-8">{refresh}'
            f"<title>{_h(title if title == 'cronwarden' else f'{title} — cronwarden')}</title>"
            f"<style>{CSS}</style></head><body>"
            f"<header><h1>{_h(title)}</h1><p>{store} · as of {_when(now)}"
            f"{f' · reloads every {_dur(self.refresh)}' if self.refresh > 0 else ''}</p></header>"
            f"{body}</body></html>"
        )
        return Response(HTTPStatus.OK, "text/html; charset=utf-8", text.encode())


# -- the server -----------------------------------------------------------


def serve(
    dashboard: Dashboard,
    host: str,
    port: int,
    *,
    ready: Callable[[str], None] = lambda url: None,
    log: Callable[[str], None] | None = None,
) -> None:
    """Serve ``dashboard`` on ``host:port`` until interrupted (KeyboardInterrupt,
    or an exception raised by a signal handler). ``ready`` gets the URL once
    the socket listens (port 0 picks a free one). Raises ``UsageError`` when
    the address cannot be bound."""
    server = bind(dashboard, host, port, log=log)
    try:
        ready(url_of(server))
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = str(server.server_address[0]), server.server_address[1]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def bind(
    dashboard: Dashboard, host: str, port: int, *, log: Callable[[str], None] | None = None
) -> ThreadingHTTPServer:
    """A server for ``dashboard``, listening on ``host:port`` (``serve_forever``
    to answer; ``shutdown`` from another thread and ``server_close`` to stop).
    Raises ``UsageError`` when the address cannot be bound."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "cronwarden"
        protocol_version = "HTTP/1.1"
        timeout = 30  # a client that stops sending frees its thread
        # The headers and the body are two writes: with Nagle's algorithm the
        # body of a small answer waits for the client's delayed ACK, ~40 ms
        # on a kept-alive connection (bench/dashboard.py measured it).
        disable_nagle_algorithm = True

        def __getattr__(self, name: str) -> Callable[[], None]:
            # Every method reaches ``handle`` (http.server answers 501 itself for
            # a method with no ``do_`` function): GET and HEAD are served, the
            # rest get 405 with the reason.
            if name.startswith("do_"):
                return self._answer
            raise AttributeError(name)

        def _answer(self) -> None:
            started = time.monotonic()
            self._discard_body()
            response = dashboard.handle(self.command, self.path)
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)
            if log is not None:
                took = (time.monotonic() - started) * 1000
                shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in self.path)
                log(f"{self.client_address[0]} {self.command} {shown} {response.status} {took:.0f} ms")

        def _discard_body(self) -> None:
            """Read a request's body, unused: left on a kept-alive connection it
            would be read as the next request. A large or chunked one ends the
            connection instead."""
            length = self.headers.get("Content-Length", "0").strip() or "0"
            chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            if chunked or not length.isascii() or not length.isdigit() or int(length) > BODY_MAX:
                self.close_connection = True
            elif int(length):
                self.rfile.read(int(length))

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request from _answer instead, or none

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            # Not socketserver's traceback: a client that went away is no
            # news, anything else is one line.
            error = sys.exc_info()[1]
            if isinstance(error, ConnectionError | TimeoutError) or log is None:
                return
            log(f"{client_address[0]}: request failed: {type(error).__name__}: {error}")

    try:
        return Server((host, port), Handler)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


# -- rendering helpers ----------------------------------------------------

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
header p{color:#666;margin-top:-.6em}h2{margin-top:1.6em;font-size:1.1em}
table{border-collapse:collapse}th,td{padding:.25em .7em;text-align:left;border-bottom:1px solid #e4e4e4;
vertical-align:top}th{font-weight:600;background:#f6f6f6}td.empty{color:#777}
.chip,.badge{display:inline-block;padding:.05em .55em;border-radius:.8em;background:#eee;white-space:nowrap}
.ok{background:#d8f0d8}.watch{background:#fbeec2}.at-risk,.overlapping,.critical{background:#f6cfcf}
.unknown{background:#eee}.warning{background:#fbeec2}
.bar{display:inline-block;width:6em;height:.7em;background:#eee;margin-right:.4em;vertical-align:middle}
.bar span{display:block;height:100%}
dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1.2em}dt{color:#666}dd{margin:0}
svg text{font:11px system-ui,sans-serif;fill:#555}a{color:#1a56a8}
"""

_OUTCOME_CSS = {"succeeded": "ok", "running": "watch", "queued": "watch", "overlap": "watch"}


def _h(text: object) -> str:
    return html.escape(str(text), quote=True)


def _css(v: Verdict | Severity) -> str:
    name = v.value if isinstance(v, Verdict) else v.name
    return str(name).lower().replace(" ", "-")


def _badge(v: Verdict) -> str:
    return f'<span class="badge {_css(v)}">{_h(v.value)}</span>'


def _severity(s: Severity) -> str:
    return f'<span class="badge {_css(s)}">{_h(s.name.lower())}</span>'


def _outcome(outcome: str) -> str:
    return f'<span class="badge {_OUTCOME_CSS.get(outcome, "critical")}">{_h(outcome)}</span>'


def _job_link(job: str) -> str:
    if job.startswith("sink:"):  # delivery events, recorded under the sink's name
        return _h(job)
    return f'<a href="/jobs/{quote(job, safe="")}">{_h(job)}</a>'


def _ago(t: float | None, now: float) -> str:
    return "-" if t is None else f'<span title="{_when(t)}">{_dur(max(0.0, now - t))} ago</span>'


def _share(ratio: float | None, slow: float) -> str:
    if ratio is None:
        return "-"
    colour = "#d9534f" if ratio >= slow else "#e0a800" if ratio > 0.5 else "#5cb85c"
    width = min(100.0, ratio * 100)
    return f'<span class="bar"><span style="width:{width:.0f}%;background:{colour}"></span></span>{ratio:.0%}'


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, empty: str) -> str:
    """Cells are HTML already (escaped by the caller); headers are text."""
    head = "".join(f"<th>{_h(h)}</th>" for h in headers)
    if not rows:
        cell = f'<td class="empty" colspan="{len(headers)}">{_h(empty)}</td>'
        return f"<table><tr>{head}</tr><tr>{cell}</tr></table>"
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _events_table(events: Iterable[Event], now: float) -> str:
    return _table(
        ["when", "job", "event", "run id", "what"],
        [
            [_ago(e.at, now), _job_link(e.job), _outcome(e.kind.value), _h(e.run_id or "-"), _h(_say(e))]
            for e in events
        ],
        empty="Nothing yet.",
    )


def _say(e: Event) -> str:
    """One line of what an event's data says."""
    d = e.data
    if "summary" in d:
        return f"{d.get('state', '')}: {d['summary']}".lstrip(": ")
    if "holder_run_id" in d:
        return history_note({"type": e.kind.value, **d})
    if "error" in d:
        return str(d["error"])
    if d.get("detail"):
        return str(d["detail"])
    if d.get("exit_code") not in (None, 0):
        return f"exit {d['exit_code']}"
    return ""


def duration_chart(runs: Sequence[Mapping[str, Any]], period: float | None, slow: float, now: float) -> str:
    """An SVG bar per run, oldest first (its height its duration; an open
    run's is its age so far, drawn hollow), under a line at the period and
    one at the slow threshold: a creeping runtime shows as bars walking up
    to the line before a start meets an open run."""
    if not runs:
        return '<p class="empty">No runs recorded yet.</p>'
    width, height, left, top = 640, 160, 44, 10
    ends = [r["duration"] for r in runs if r["duration"] is not None]
    tallest = float(max([*ends, *((now - r["started_at"]) for r in runs if r["duration"] is None), 0.001]))
    scale_top = max(tallest, period or 0.0) * 1.1
    step = (width - left) / len(runs)

    def y(seconds: float) -> float:
        return top + (height - top) * (1 - min(seconds, scale_top) / scale_top)

    parts = [f'<svg width="{width}" height="{height + 18}" role="img" aria-label="durations">']
    for i, r in enumerate(runs):
        seconds = r["duration"] if r["duration"] is not None else now - r["started_at"]
        fill = {"succeeded": "#5cb85c", "running": "none"}.get(r["outcome"], "#d9534f")
        x = left + i * step + step * 0.15
        parts.append(
            f'<rect x="{x:.1f}" y="{y(seconds):.1f}" width="{max(1.0, step * 0.7):.1f}" '
            f'height="{height - y(seconds):.1f}" fill="{fill}" stroke="#5b7ea8" '
            f'stroke-width="{int(fill == "none")}">'
            f"<title>{_h(r['run_id'])}: {_h(r['outcome'])}, {_dur(seconds)}</title></rect>"
        )
    if period:
        for seconds, label, colour in ((period, "period", "#333"), (period * slow, "slow", "#d9534f")):
            parts.append(
                f'<line x1="{left}" x2="{width}" y1="{y(seconds):.1f}" y2="{y(seconds):.1f}" '
                f'stroke="{colour}" '
                f'stroke-dasharray="4 3"/><text x="2" y="{y(seconds) + 4:.1f}">{label}</text>'
            )
    parts.append(
        f'<text x="{left}" y="{height + 14}">oldest</text>'
        f'<text x="{width - 40}" y="{height + 14}">newest</text>'
        f'<text x="2" y="{top + 4}">{_dur(scale_top)}</text></svg>'
    )
    return "".join(parts)


# -- JSON helpers ---------------------------------------------------------


def _json(value: Any) -> Response:
    return Response(HTTPStatus.OK, "application/json", json.dumps(value, indent=1).encode() + b"\n")


def _error(status: HTTPStatus, message: str, api: bool, headers: Mapping[str, str] | None = None) -> Response:
    if api:
        body = json.dumps({"error": message}).encode() + b"\n"
        return Response(status, "application/json", body, headers or {})
    text = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{status.value} — cronwarden'
        f"</title><style>{CSS}</style></head><body><h1>{status.value} {_h(status.phrase)}</h1>"
        f'<p>{_h(message)}</p><p><a href="/">all jobs</a></p></body></html>'
    )
    return Response(status, "text/html; charset=utf-8", text.encode(), headers or {})


def _one(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"{name} given {len(values)} times; give it once")
    return values[0] or None


def _int(query: Mapping[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    text = _one(query, name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise BadRequest(f"{name}={text!r}: expected a whole number from {low} to {high}")
    return int(text)
