"""HTML for the dashboard's pages: escaping, badges, tables and the
duration chart (server-rendered SVG: the pages need no JavaScript)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from cronwarden.errors import printable
from cronwarden.events import Event
from cronwarden.monitor import Severity, Verdict
from cronwarden.monitor.views import dur, history_note, when

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
header p{color:#666;margin-top:-.6em}h2{margin-top:1.6em;font-size:1.1em}
table{border-collapse:collapse}th,td{padding:.25em .7em;text-align:left;border-bottom:1px solid #e4e4e4;
vertical-align:top}th{font-weight:600;background:#f6f6f6}td.empty{color:#777}
.chip,.badge{display:inline-block;padding:.05em .55em;border-radius:.8em;background:#eee;white-space:nowrap}
.ok{background:#d8f0d8}.watch{background:#fbeec2}.at-risk,.overlapping,.critical{background:#f6cfcf}
.failing{background:#d9534f;color:#fff}.unknown,.unscheduled{background:#eee}td:first-child{white-space:nowrap}.warning{background:#fbeec2}
.bar{display:inline-block;width:6em;height:.7em;background:#eee;margin-right:.4em;vertical-align:middle}
.bar span{display:block;height:100%}
dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1.2em}dt{color:#666}dd{margin:0}
svg text{font:11px system-ui,sans-serif;fill:#555}a{color:#1a56a8}
.scroll{overflow-x:auto;max-width:100%}header p{overflow-wrap:anywhere}dd{overflow-wrap:anywhere}
form.filters{display:flex;flex-wrap:wrap;gap:.4em .8em;align-items:center;margin:.6em 0}
nav.pages{margin:.6em 0}nav.pages a,nav.pages span{margin-right:.8em}
a.chip{text-decoration:none;color:inherit}
.finding{font-size:.85em;margin-left:.3em}
@media (max-width:700px){body{margin:.6em}.wide{display:none}th,td{padding:.2em .4em}}
"""

_OUTCOME_CSS = {"succeeded": "ok", "running": "watch", "queued": "watch", "overlap": "watch"}


def esc(text: object) -> str:
    """``text`` for HTML, its control characters shown as escapes (``printable``)."""
    return html.escape(printable(str(text)), quote=True)


def css_class(v: Verdict | Severity) -> str:
    name = v.value if isinstance(v, Verdict) else v.name
    return str(name).lower().replace(" ", "-")


def badge(v: Verdict) -> str:
    return f'<span class="badge {css_class(v)}">{esc(v.value)}</span>'


def severity_badge(s: Severity) -> str:
    return f'<span class="badge {css_class(s)}">{esc(s.name.lower())}</span>'


def outcome_badge(outcome: str) -> str:
    return f'<span class="badge {_OUTCOME_CSS.get(outcome, "critical")}">{esc(outcome)}</span>'


def job_link(job: str) -> str:
    if job.startswith("sink:"):  # delivery events, recorded under the sink's name
        return esc(job)
    return f'<a href="/jobs/{quote(job, safe="")}">{esc(job)}</a>'


def ago(t: float | None, now: float) -> str:
    return "-" if t is None else f'<span title="{when(t)}">{dur(max(0.0, now - t))} ago</span>'


def share(ratio: float | None, slow: float) -> str:
    if ratio is None:
        return "-"
    colour = "#d9534f" if ratio >= slow else "#e0a800" if ratio > 0.5 else "#5cb85c"
    width = min(100.0, ratio * 100)
    return f'<span class="bar"><span style="width:{width:.0f}%;background:{colour}"></span></span>{ratio:.0%}'


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, empty: str, wide: Sequence[int] = ()
) -> str:
    """Cells are HTML already (escaped by the caller); headers are text.
    ``wide``: the columns left out on a narrow screen. The table scrolls
    inside its own box, so a wide one never widens the page."""
    cls = ['<td class="wide">' if i in wide else "<td>" for i in range(len(headers))]
    head = "".join(f'<th class="wide">{esc(h)}</th>' if i in wide else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))  # fmt: skip
    if not rows:
        cell = f'<td class="empty" colspan="{len(headers)}">{esc(empty)}</td>'
        return f'<div class="scroll"><table><tr>{head}</tr><tr>{cell}</tr></table></div>'
    body = "".join("<tr>" + "".join(f"{cls[i]}{c}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>'


def events_table(events: Iterable[Event], now: float) -> str:
    return table(
        ["when", "job", "event", "run id", "what"],
        [
            [ago(e.at, now), job_link(e.job), outcome_badge(e.kind.value), esc(e.run_id or "-"), esc(_say(e))]
            for e in events
        ],
        empty="Nothing yet.",
        wide=(3,),
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


OUTCOME_COLOURS = {
    "succeeded": "#5cb85c",
    "running": "none",
    "replaced": "#f0ad4e",
    "stopped": "#999999",
    "interrupted": "#f0ad4e",
}
"""Bar fills by outcome; every other ending (failed, timed out, lease lost, abandoned) is red."""
MARKERS = {
    "skipped": "#f0ad4e",
    "queued": "#5bc0de",
    "queue_full": "#d9534f",
    "overlap": "#d9534f",
    "missed": "#d9534f",
}
"""Refused and missed starts: a marker on the time axis, no bar."""
MIN_BAR = 3.0
"""Pixels: the least height of a bar, so a 10 ms failure is seen (and coloured)."""


def _ticks(top: float, n: int = 4) -> list[float]:
    """About ``n`` round tick values from 0 to ``top`` seconds (1, 2 or 5 × a power of ten)."""
    import math

    raw = top / n
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [step * k for k in range(1, int(top / step) + 1)]


def duration_chart(items: Sequence[Mapping[str, Any]], period: float | None, slow: float, now: float) -> str:
    """An SVG on a time axis: each run's duration as a bar at its start time
    (an open run's age so far, drawn hollow; at least ``MIN_BAR`` pixels
    high, coloured by outcome), each refused start (skipped, queued,
    queue_full, overlap) as a marker at its time, y ticks in seconds, and
    lines at the period and the slow threshold labelled at the right edge,
    pushed apart when they would overlap. ``items`` are ``history_items``."""
    runs = sorted((i for i in items if i["type"] == "run"), key=lambda i: i["started_at"])
    marks = [i for i in items if i["type"] != "run"]
    if not runs and not marks:
        return '<p class="empty">No runs recorded yet.</p>'
    width, height, left, right, top = 680, 170, 52, 60, 10
    times = [r["started_at"] for r in runs] + [m["at"] for m in marks]
    t0, t1 = min(times), max([*times, *((r["started_at"] + (r["duration"] or 0)) for r in runs)])
    span = max(t1 - t0, 1.0)
    ages = [r["duration"] if r["duration"] is not None else now - r["started_at"] for r in runs]
    scale_top = max([*ages, period or 0.0, 0.001]) * 1.1
    plot = width - left - right

    def x(t: float) -> float:
        return float(left + plot * (t - t0) / span)

    def y(seconds: float) -> float:
        return float(top + (height - top) * (1 - min(seconds, scale_top) / scale_top))

    bar = max(2.0, min(12.0, plot / max(len(runs), 1) * 0.6))
    parts = [f'<svg viewBox="0 0 {width} {height + 22}" width="100%" style="max-width:{width}px" role="img" '
             f'aria-label="run durations over time" class="chart">']  # fmt: skip
    for tick in _ticks(scale_top):
        parts.append(f'<line x1="{left}" x2="{left + plot}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                     f'stroke="#eee"/><text class="ytick" x="{left - 4}" y="{y(tick) + 4:.1f}" '
                     f'text-anchor="end">{dur(tick)}</text>')  # fmt: skip
    for r, seconds in zip(runs, ages, strict=True):
        fill = OUTCOME_COLOURS.get(r["outcome"], "#d9534f")
        h = max(MIN_BAR, height - y(seconds))
        parts.append(
            f'<rect class="run {esc(r["outcome"])}" x="{x(r["started_at"]) - bar / 2:.1f}" '
            f'y="{height - h:.1f}" '
            f'width="{bar:.1f}" height="{h:.1f}" fill="{fill}" stroke="#5b7ea8" '
            f'stroke-width="{int(fill == "none")}">'
            f"<title>{esc(r['run_id'])}: {esc(r['outcome'])}, {dur(seconds)}, started {when(r['started_at'])}"
            "</title></rect>"
        )
    for m in marks:
        colour = MARKERS.get(m["type"], "#777")
        cx = x(m["at"])
        parts.append(
            f'<path class="mark {esc(m["type"])}" d="M{cx - 4:.1f},{height + 8} L{cx + 4:.1f},{height + 8} '
            f'L{cx:.1f},{height + 1} Z" fill="{colour}"><title>{esc(m["type"])} at {when(m["at"])}'
            "</title></path>"
        )
    if period:
        lines = [(period, "period", "#333"), (period * slow, "slow", "#d9534f")]
        placed: list[float] = []
        for seconds, label, colour in sorted(lines, key=lambda line: line[0], reverse=True):
            ly = y(seconds)
            at = ly + 4
            while any(abs(at - p) < 12 for p in placed):
                at += 12
            placed.append(at)
            parts.append(
                f'<line x1="{left}" x2="{left + plot}" y1="{ly:.1f}" y2="{ly:.1f}" stroke="{colour}" '
                f'stroke-dasharray="4 3"/><text class="line-label" x="{left + plot + 4}" y="{at:.1f}">'
                f"{label}</text>"
            )
    parts.append(
        f'<line x1="{left}" x2="{left + plot}" y1="{height}" y2="{height}" stroke="#999"/>'
        f'<text x="{left}" y="{height + 20}">{when(t0)}</text>'
        f'<text x="{left + plot}" y="{height + 20}" text-anchor="end">{when(t1)}</text></svg>'
    )
    return "".join(parts)


STRIP_CSS = """
.strip{display:inline-flex;gap:1px;vertical-align:middle}.strip i{display:block;width:6px;height:16px;
background:#ccc}.strip .ok{background:#5cb85c}.strip .bad,.strip .missed,.strip .misfired{background:#d9534f}
.strip .missed,.strip .misfired{background:repeating-linear-gradient(45deg,#d9534f 0 2px,#f6cfcf 2px 4px)}
.strip .late,.strip .skipped{background:#f0ad4e}.strip .queued{background:#5bc0de}
.strip .run{background:#fff;box-shadow:inset 0 0 0 1px #5b7ea8}.strip .due{background:#fff;
box-shadow:inset 0 0 0 1px #bbb}.strip .paused,.strip .other{background:#999}
"""
"""The strip's colours: green ok, red a bad ending, hatched red a missed
slot, amber late or skipped, blue queued, hollow an open run or a slot not
yet due, grey paused, replaced or stopped."""


def strip(cells: Sequence[Any], job: str) -> str:
    """A job's last slots as a row of cells, oldest left (``views.Cell``).
    Only the cells that are not a plain success carry a tooltip: a page of
    100 jobs stays small."""
    counts: dict[str, int] = {}
    for c in cells:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    said = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    label = esc(f"{job}: last {len(cells)} slots: {said or 'none yet'}")
    inner = "".join(
        '<i class="ok"></i>'
        if c.kind == "ok"
        else f'<i class="{c.kind}" title="{when(c.at)} {esc(c.what)}"></i>'
        for c in cells
    )
    return f'<span class="strip" role="img" aria-label="{label}" data-cells="{len(cells)}">{inner}</span>'
