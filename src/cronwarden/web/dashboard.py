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
behind the standard library's ``ThreadingHTTPServer`` (``web.server``). No web framework: the
pages are small and their readers few, and the cron wrapper's dependencies
stay what they are. Every reading goes through one ``Monitor`` and its store,
one page at a time (see ``Dashboard``).
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from cronwarden.errors import StoreError, StoreUnavailable, UsageError, mask_password
from cronwarden.events import Event, EventKind
from cronwarden.monitor import RESOLVED, Condition, JobStats, Monitor, Pass, Severity, Verdict
from cronwarden.monitor.views import (
    STRIP_SLOTS,
    audit_item,
    condition_item,
    dur,
    history_items,
    history_note,
    open_run_item,
    open_runs,
    slot_decisions,
    state,
    strip_cells,
    strip_runs,
    when,
)
from cronwarden.sinks.base import event_json
from cronwarden.stores.base import EventQuery
from cronwarden.web.render import (
    CSS,
    STRIP_CSS,
    ago,
    badge,
    css_class,
    duration_chart,
    esc,
    events_table,
    job_link,
    outcome_badge,
    severity_badge,
    share,
    strip,
    table,
)

DEFAULT_REFRESH = 30.0

PAGE_SIZE = 100
"""Jobs on one front page (``?per_page=`` changes it, up to ``PAGE_SIZE_MAX``)."""
PAGE_SIZE_MAX = 1000
CHART_SLOTS = 1000
"""The most slots a job's chart marks missed (the span of the runs it shows)."""
LISTED_MAX = 100
"""The most findings and open runs the front page lists (the API has all)."""

EVENTS_MAX = 1000
"""The most events one ``/api/events`` call returns."""

TROUBLE: tuple[EventKind, ...] = (
    EventKind.ABANDONED,
    EventKind.FAILED,
    EventKind.FAILING,
    EventKind.GRACE_TOO_WIDE,
    EventKind.INTERRUPTED,
    EventKind.JOB_PAUSED,
    EventKind.JOB_RESUMED,
    EventKind.LEASE_LOST,
    EventKind.MISFIRED,
    EventKind.MISSED,
    EventKind.OVERLAP,
    EventKind.PAUSED,
    EventKind.POLICY_UNDECIDED,
    EventKind.QUEUE_FULL,
    EventKind.REPLACED,
    EventKind.SINK_FAILED,
    EventKind.SINK_REJECTED,
    EventKind.SKIPPED,
    EventKind.SKIPS_IN_A_ROW,
    EventKind.SLOW,
    EventKind.SNOOZED,
    EventKind.STOPPED,
    EventKind.STUCK,
    EventKind.TIMED_OUT,
    EventKind.TOO_OFTEN,
    EventKind.UNSNOOZED,
)
"""What the pages list as the latest trouble: endings that are not a
success, refused and missed starts, the scheduler's pauses, sink failures,
snoozes and the monitor's findings (of those, the raised ones: a resolution
is good news). Not a start, a success, a queued start, a sink back up, nor
an operator's trigger or stop request. Listed, not derived: the read across
jobs goes through a partial index of exactly these kinds (SQLite migration
0013, PostgreSQL 0015), so a kind added here needs the index's list
changed by a migration too (tests/test_dashboard_front.py checks the plan)."""


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
        from cronwarden.monitor.metrics import exposition

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
        verdicts = _verdicts(query)
        text = (_one(query, "q") or "").strip()
        per_page = _int(query, "per_page", PAGE_SIZE, 1, PAGE_SIZE_MAX)
        page = _int(query, "page", 1, 1, 1_000_000)
        result = self._pass()
        t = self.monitor.thresholds
        now = result.at
        verdict_of = {s.job: s.verdict(t) for s in result.stats}
        counts = Counter(verdict_of.values())
        needle = text.casefold()
        matching = [
            s for s in result.stats
            if (not verdicts or verdict_of[s.job] in verdicts) and needle in s.job.casefold()
        ]  # fmt: skip
        pages = max(1, math.ceil(len(matching) / per_page))
        page = min(page, pages)
        shown = matching[(page - 1) * per_page : page * per_page]
        by_job: dict[str, list[Condition]] = {}
        for c in result.active:
            by_job.setdefault(c.job, []).append(c)

        def link(**change: Any) -> str:
            params = {"verdict": [v.value for v in verdicts], "q": text, "per_page": per_page, "page": page}
            params.update(change)
            if params["per_page"] == PAGE_SIZE:
                del params["per_page"]
            if params["page"] == 1:
                del params["page"]
            kept = {k: v for k, v in params.items() if v not in ("", [], None)}
            return "/?" + urlencode(kept, doseq=True) if kept else "/"

        chips = [
            f'<a class="chip {css_class(v)}" href="{esc(link(verdict=[v.value], page=1))}">'
            f"{counts[v]} {esc(v)}</a>"
            for v in Verdict
            if v in counts
        ]
        summary = " ".join(chips) or '<span class="chip">no jobs yet</span>'
        runs = open_runs(self.store, runs=result.open_runs)  # the pass read them
        summary += f' <span class="chip">{len(runs)} open run{"s" * (len(runs) != 1)}</span>'
        options = "".join(
            f'<option value="{esc(v.value)}"{" selected" if v in verdicts else ""}>{esc(v.value)}</option>'
            for v in Verdict
        )
        form = (
            '<form class="filters" method="get" action="/">'
            f'<label>verdict <select name="verdict"><option value="">any</option>{options}</select></label>'
            f'<label>job <input type="search" name="q" value="{esc(text)}" '
            'placeholder="name contains"></label>'
            f"{'' if per_page == PAGE_SIZE else f'<input type=hidden name=per_page value={per_page}>'}"
            '<button type="submit">filter</button>'
            f"{' <a href=/>clear</a>' if verdicts or text else ''}</form>"
        )
        first = (page - 1) * per_page + 1
        nav = [f"<span>jobs {first}–{first + len(shown) - 1} of {len(matching)}</span>" if shown
               else f"<span>no job matches (of {len(result.stats)})</span>"]  # fmt: skip
        if page > 1:
            nav.append(f'<a rel="prev" href="{esc(link(page=page - 1))}">← previous</a>')
        if page < pages:
            nav.append(f'<a rel="next" href="{esc(link(page=page + 1))}">next →</a>')
        pager = f'<nav class="pages">{"".join(nav)}</nav>'
        latest = self.store.latest_runs([s.job for s in shown], strip_runs()) if shown else {}  # the strips'
        jobs = table(
            [
                "job",
                f"last {STRIP_SLOTS} slots",
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
                    job_link(s.job),
                    strip(strip_cells(self.store, s, runs=latest[s.job]), s.job),
                    badge(verdict_of[s.job]) + _finding_badges(by_job.get(s.job, ())),
                    esc(s.schedule or dur(s.period)),
                    dur(s.p50),
                    dur(s.p95),
                    dur(s.max),
                    share(s.ratio, t.slow),
                    str(s.completed),
                    str(s.skips_in_a_row),
                    str(s.open_runs),
                    ago(s.last_success, now),
                    esc("; ".join(s.notes(t))),
                ]
                for s in shown
            ],
            empty="No jobs in the ledger yet: run one with cronwarden run --job NAME -- COMMAND."
            if not result.stats
            else "No job matches these filters.",
            wide=(3, 4, 5, 6, 8, 9, 10, 12),
        )
        listed = {s.job for s in matching}
        active = sorted((c for c in result.active if c.job in listed), key=lambda c: (-c.severity, c.job))
        findings = table(
            ["severity", "job", "finding", "run", "what"],
            [
                [
                    severity_badge(c.severity),
                    job_link(c.job),
                    esc(c.rule.value),
                    esc(c.run_id or "-"),
                    esc(c.summary),
                ]
                for c in active[:LISTED_MAX]
            ],
            empty="Nothing holds now.",
            wide=(3,),
        )
        if len(active) > LISTED_MAX:
            findings += f"<p>… and {len(active) - LISTED_MAX} more: filter the jobs, or read /api/jobs.</p>"
        opened = self._opentable(runs[:LISTED_MAX], now)
        if len(runs) > LISTED_MAX:
            opened += f"<p>… and {len(runs) - LISTED_MAX} more: /api/runs lists every open run.</p>"
        body = (
            f"<p>{summary}</p>{form}<h2>Jobs</h2>{pager}{jobs}{pager if len(shown) > 20 else ''}"
            f"<h2>Findings</h2>{findings}<h2>Open runs</h2>{opened}"
            f"<h2>Latest trouble</h2>{events_table(self._trouble(), now)}"
        )
        return self._page("cronwarden", body, now)

    def _opentable(self, runs: Sequence[tuple[Any, int]], now: float) -> str:
        return table(
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
                    job_link(r.job),
                    esc(r.run_id),
                    esc(r.host),
                    str(r.pid),
                    when(r.started_at),
                    dur(now - r.started_at),
                    dur(r.expires_in),
                    str(r.token),
                    str(pending),
                    esc(state(r)),
                ]
                for r, pending in runs
            ],
            empty="No run is open.",
            wide=(2, 3, 6, 7, 8),
        )

    def _job_page(self, job: str, query: Mapping[str, list[str]]) -> Response:
        stats = self._known(job)
        t = self.monitor.thresholds
        now = stats.now
        limit = _int(query, "limit", 50, 1, EVENTS_MAX)
        items = history_items(self.store, job, limit)
        facts = [
            ("verdict", badge(stats.verdict(t))),
            (f"last {STRIP_SLOTS} slots", strip(strip_cells(self.store, stats), stats.job)),
            ("schedule", esc(stats.schedule or "-")),
            ("period", dur(stats.period)),
            ("policy", f"{esc(stats.policy)} — {esc(stats.reason) if stats.reason else 'no written reason'}"),
            ("p50 / p95 / max", f"{dur(stats.p50)} / {dur(stats.p95)} / {dur(stats.max)}"),
            ("p95 / period", share(stats.ratio, t.slow)),
            ("runs in the window", f"{stats.runs} ({stats.completed} completed, {stats.open_runs} open)"),
            ("skips", f"{stats.skips} ({stats.skips_in_a_row} in a row)"),
            ("overlaps", str(stats.overlaps)),
            ("failures / lease losses", f"{stats.failures} / {stats.lease_losses}"),
            ("last start / success", f"{ago(stats.last_start, now)} / {ago(stats.last_success, now)}"),
            ("notes", esc("; ".join(stats.notes(t)) or "-")),
        ]
        dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
        rows = [
            [when(i["started_at"]), outcome_badge(i["outcome"]), esc(i["run_id"]), dur(i["duration"]),
             str(i["token"]), esc(f"{i['host']}:{i['pid']}"), esc(history_note(i))]
            if i["type"] == "run"
            else [when(i["at"]), outcome_badge(i["type"]), esc(i["run_id"] or "-"), "-", "-",
                  esc(str(i.get("host", "-"))), esc(history_note(i))]
            for i in items
        ]  # fmt: skip
        history = table(
            ["when", "outcome", "run id", "duration", "token", "host:pid", "note"],
            rows,
            empty="No runs recorded yet.",
            wide=(2, 4, 5),
        )
        # Slots with no start at all are markers on the chart's axis too (over the runs shown).
        runs_shown = [i["started_at"] for i in items if i["type"] == "run"]
        decided = slot_decisions(self.store, stats, min(runs_shown), CHART_SLOTS) if runs_shown else []
        missed = [{"type": d.decision, "at": d.slot, "run_id": None} for d in decided
                  if d.decision in ("missed", "misfired")]  # fmt: skip
        chart = duration_chart([*items, *missed], stats.period, t.slow, now)
        body = (
            f'<p><a href="/">← all jobs</a></p><dl>{dl}</dl><h2>Durations against the period</h2>{chart}'
            f"<h2>Runs and refused starts</h2>{history}"
            f"<h2>Latest trouble</h2>{events_table(self._trouble(job, 20), now)}"
        )
        return self._page(job, body, now)

    def _page(self, title: str, body: str, now: float) -> Response:
        refresh = f'<meta http-equiv="refresh" content="{round(self.refresh)}">' if self.refresh > 0 else ""
        store = esc(mask_password(self.store.url))
        text = (
            f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">{refresh}'
            f"<title>{esc(title if title == 'cronwarden' else f'{title} — cronwarden')}</title>"
            f"<style>{CSS}{STRIP_CSS}</style></head><body>"
            f"<header><h1>{esc(title)}</h1><p>{store} · as of {when(now)}"
            f"{f' · reloads every {dur(self.refresh)}' if self.refresh > 0 else ''}</p></header>"
            f"{body}</body></html>"
        )
        return Response(HTTPStatus.OK, "text/html; charset=utf-8", text.encode())


def _json(value: Any) -> Response:
    return Response(HTTPStatus.OK, "application/json", json.dumps(value, indent=1).encode() + b"\n")


def _error(status: HTTPStatus, message: str, api: bool, headers: Mapping[str, str] | None = None) -> Response:
    if api:
        body = json.dumps({"error": message}).encode() + b"\n"
        return Response(status, "application/json", body, headers or {})
    text = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{status.value} — cronwarden"
        f"</title><style>{CSS}</style></head><body><h1>{status.value} {esc(status.phrase)}</h1>"
        f'<p>{esc(message)}</p><p><a href="/">all jobs</a></p></body></html>'
    )
    return Response(status, "text/html; charset=utf-8", text.encode(), headers or {})


def _verdicts(query: Mapping[str, list[str]]) -> list[Verdict]:
    """``?verdict=failing&verdict=at+risk`` (or ``failing,at-risk``): the verdicts to list; none: all."""
    out: list[Verdict] = []
    for text in (v.strip() for value in query.get("verdict", []) for v in value.split(",")):
        if not text:
            continue
        try:
            verdict = Verdict(text.replace("-", " "))
        except ValueError:
            expected = ", ".join(v.value for v in Verdict)
            raise BadRequest(f"verdict={text!r} is no verdict; expected one of {expected}") from None
        if verdict not in out:
            out.append(verdict)
    return out


def _finding_badges(conditions: Sequence[Condition]) -> str:
    """The findings that hold for a job, beside its verdict: a missed slot
    or a stuck run is said on the row, not only in the findings below
    (``failing`` is the verdict already)."""
    rules = sorted(
        {(-c.severity, c.rule.value, c.snoozed) for c in conditions if c.rule is not EventKind.FAILING}
    )
    return "".join(
        f'<span class="badge finding {css_class(Severity(-sev))}">'
        f"{esc(rule)}{' (snoozed)' if snoozed else ''}</span>"
        for sev, rule, snoozed in rules
    )


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
