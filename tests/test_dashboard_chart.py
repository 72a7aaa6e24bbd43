"""A job's chart is a time axis: each run a bar at its start, refused starts
as markers, y ticks in seconds, the period and slow labels apart, a short
failed run still visible and red; the pages carry a viewport meta tag."""

from __future__ import annotations

import re
from pathlib import Path

from cronwarden.web.render import MIN_BAR, duration_chart


def run(run_id: str, started: float, duration: float | None, outcome: str) -> dict[str, object]:
    return {"type": "run", "run_id": run_id, "started_at": started, "duration": duration, "outcome": outcome}


def test_bars_sit_at_their_start_times_and_refusals_are_markers() -> None:
    t = 1_760_000_000.0
    items = [
        run("a", t, 30.0, "succeeded"),
        {"type": "skipped", "run_id": "s", "at": t + 10},
        run("b", t + 600, 0.01, "failed"),  # a 10 ms failure
        run("c", t + 1800, 40.0, "succeeded"),  # after a missing slot: a gap on the axis
    ]
    svg = duration_chart(items, 600.0, 2 / 3, t + 2000)

    bars = re.findall(r'<rect class="run (\w+)" x="([\d.]+)" y="([\d.]+)" width="[\d.]+" height="([\d.]+)"'
                      r' fill="([^"]+)"', svg)  # fmt: skip
    assert [b[0] for b in bars] == ["succeeded", "failed", "succeeded"]
    x = [float(b[1]) for b in bars]
    # Time, not index: the gap from b to c (1200 s) is twice the gap from a to b (600 s).
    assert abs((x[2] - x[1]) - 2 * (x[1] - x[0])) < 1.0, x
    failed = bars[1]
    assert float(failed[3]) >= MIN_BAR and failed[4] == "#d9534f"
    assert svg.count('class="mark skipped"') == 1
    ticks = re.findall(r'class="ytick"[^>]*>([^<]+)<', svg)
    assert len(ticks) >= 2 and all(re.fullmatch(r"[\d.hms ]+", tick) for tick in ticks), ticks
    labels = [float(y) for y in re.findall(r'class="line-label" x="[\d.]+" y="([\d.]+)"', svg)]
    assert len(labels) == 2 and abs(labels[0] - labels[1]) >= 12


def test_period_and_slow_labels_do_not_overlap_when_the_lines_are_close() -> None:
    t = 1_760_000_000.0
    svg = duration_chart([run("a", t, 5000.0, "succeeded")], 60.0, 0.9, t + 6000)
    labels = [float(y) for y in re.findall(r'class="line-label" x="[\d.]+" y="([\d.]+)"', svg)]
    assert len(labels) == 2 and abs(labels[0] - labels[1]) >= 12


def test_pages_have_a_viewport_meta_tag(tmp_path: Path) -> None:
    from cronwarden.monitor import Monitor
    from cronwarden.stores import open_store
    from cronwarden.web.dashboard import Dashboard

    store = open_store(f"sqlite:///{tmp_path}/s.db")
    try:
        page = Dashboard(Monitor(store)).handle("GET", "/")
        assert b'<meta name="viewport" content="width=device-width, initial-scale=1">' in page.body
    finally:
        store.close()
