"""HTML for the dashboard's pages: escaping, badges, tables and the
duration chart (server-rendered SVG: the pages need no JavaScript)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

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
.unknown{background:#eee}.warning{background:#fbeec2}
.bar{display:inline-block;width:6em;height:.7em;background:#eee;margin-right:.4em;vertical-align:middle}
.bar span{display:block;height:100%}
dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1.2em}dt{color:#666}dd{margin:0}
svg text{font:11px system-ui,sans-serif;fill:#555}a{color:#1a56a8}
"""

_OUTCOME_CSS = {"succeeded": "ok", "running": "watch", "queued": "watch", "overlap": "watch"}


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


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


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, empty: str) -> str:
    """Cells are HTML already (escaped by the caller); headers are text."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    if not rows:
        cell = f'<td class="empty" colspan="{len(headers)}">{esc(empty)}</td>'
        return f"<table><tr>{head}</tr><tr>{cell}</tr></table>"
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def events_table(events: Iterable[Event], now: float) -> str:
    return table(
        ["when", "job", "event", "run id", "what"],
        [
            [ago(e.at, now), job_link(e.job), outcome_badge(e.kind.value), esc(e.run_id or "-"), esc(_say(e))]
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
            f"<title>{esc(r['run_id'])}: {esc(r['outcome'])}, {dur(seconds)}</title></rect>"
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
        f'<text x="2" y="{top + 4}">{dur(scale_top)}</text></svg>'
    )
    return "".join(parts)
