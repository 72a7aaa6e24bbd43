"""``cronwarden demo``: an overlap incident in compressed time, shown as it
happens.

A reconciliation job fires every "ten minutes" (here 0.8 s). Each run takes
the closed windows that have no snapshot yet, works for a while, then writes
one snapshot per window, like the essay's job. Its runtime creeps up; one
night a vacuum makes one run take 2.5 periods. First the job runs as plain
cron would start it (every fire starts, nothing asks whether the last run is
alive), then under ``cronwarden run``. Real processes, a temporary SQLite
store, about 20 seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

PERIOD = 0.8
"""Seconds standing in for the job's ten-minute period."""
DURATIONS = [0.30, 0.34, 0.38, 0.42, 0.46, 0.50, 2.00, 0.55, 0.58, 0.60]
"""Runtime of each slot's run: creeping up, with one slow night (slot 6)."""

JOB = """
import os, sqlite3, sys, time
path, label = sys.argv[1], sys.argv[5]
t0, period, duration = (float(a) for a in sys.argv[2:5])
db = sqlite3.connect(path, timeout=30, isolation_level=None)
closed = int((time.time() - t0) / period + 1e-6)
done = {w for (w,) in db.execute("SELECT window FROM snapshots")}
todo = [w for w in range(closed) if w not in done]
time.sleep(duration)
for w in todo:
    db.execute("INSERT INTO snapshots (window, run, at) VALUES (?, ?, ?)", (w, label, time.time() - t0))
"""


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Replays an overlap incident: a job whose runtime creeps up until one slow night overlaps the "
        "next start. First as plain cron (every fire starts), then under cronwarden run. Prints a "
        "timeline and how many windows were processed twice. Real processes, a temporary SQLite "
        "store, about 20 seconds."
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory and print its path")


class Screen:
    """The demo's output: timeline lines as they happen, and on a terminal a
    progress line under them, redrawn in place."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self._progress = ""

    def say(self, line: str = "") -> None:
        if self.tty and self._progress:
            sys.stdout.write("\r\x1b[K")  # the progress line gives way, then comes back below
        sys.stdout.write(line + "\n")
        if self.tty and self._progress:
            sys.stdout.write(self._progress)
        sys.stdout.flush()

    def progress(self, text: str) -> None:
        if not self.tty:
            return
        self._progress = text
        sys.stdout.write("\r\x1b[K" + text)
        sys.stdout.flush()

    def done(self) -> None:
        if self.tty and self._progress:
            sys.stdout.write("\r\x1b[K")
            sys.stdout.flush()
        self._progress = ""


def _fire_all(commands: list[list[str]], t0: float, work: str, screen: Screen, phase: str,
              on_fire: Callable[[int, float], None],
              tick: Callable[[], None]) -> list[tuple[float, int]]:  # fmt: skip
    """Start one command per slot on the clock, like cron, saying each as it
    happens (``on_fire``; ``tick`` between); wait for all."""
    procs: list[tuple[float, subprocess.Popen[str]]] = []

    def wait_until(deadline: float | None) -> None:
        while True:
            tick()
            running = sum(p.poll() is None for _, p in procs)
            screen.progress(f"   [{phase}] t={time.time() - t0:5.2f}s  slot {len(procs)}/{len(commands)} "
                            f"fired, {running} running")  # fmt: skip
            now = time.time()
            if deadline is None:
                if not running:
                    return
            elif now >= deadline:
                return
            time.sleep(min(0.1, max(0.0, (deadline or now + 0.1) - now)))

    for i, argv in enumerate(commands):
        wait_until(t0 + (i + 1) * PERIOD)
        at = time.time() - t0
        procs.append((at, subprocess.Popen(argv, cwd=work, stderr=subprocess.PIPE, text=True)))
        on_fire(i, at)
    wait_until(None)
    tick()
    screen.done()
    out = []
    for at, p in procs:
        _, err = p.communicate(timeout=60)
        out.append((at, p.returncode))
        if err.strip() and "skipped" not in err:
            print(f"    job stderr: {err.strip()}", file=sys.stderr)
    return out


def _snapshots(path: str) -> list[tuple[int, str, float]]:
    with sqlite3.connect(path) as db:
        return list(db.execute("SELECT window, run, at FROM snapshots ORDER BY at"))


def _twice(rows: list[tuple[int, str, float]]) -> dict[int, list[str]]:
    seen: dict[int, list[str]] = {}
    for w, run, _ in rows:
        seen.setdefault(w, []).append(run)
    return {w: runs for w, runs in seen.items() if len(runs) > 1}


def _fresh_db(path: str) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE snapshots (window INTEGER, run TEXT, at REAL)")


def _naive(work: str, screen: Screen) -> dict[int, list[str]]:
    screen.say(f"1. plain cron: every {PERIOD}s ('ten minutes') a new run starts, whatever is still running")
    snaps = os.path.join(work, "naive.db")
    _fresh_db(snaps)
    t0 = time.time()
    cmds = [[sys.executable, "-c", JOB, snaps, repr(t0), repr(PERIOD), repr(d), f"run#{i}"]
            for i, d in enumerate(DURATIONS)]  # fmt: skip
    fired: list[float] = []

    def on_fire(i: int, at: float) -> None:
        running = [j for j, a in enumerate(fired) if a + DURATIONS[j] > at]
        fired.append(at)
        note = f"  <- starts while run#{', run#'.join(map(str, running))} still running" if running else ""
        screen.say(f"   t={at:5.2f}s  slot {i:02d}  run#{i} starts (takes {DURATIONS[i]:.2f}s){note}")

    _fire_all(cmds, t0, work, screen, "plain cron", on_fire, lambda: None)
    rows = _snapshots(snaps)
    dup = _twice(rows)
    for w, runs in sorted(dup.items()):
        screen.say(f"   window {w:02d} snapshotted {len(runs)} times, by {' and '.join(runs)}")
    return dup


def _guarded(work: str, store_url: str, screen: Screen) -> tuple[dict[int, list[str]], Any]:
    from cronwarden.events import EventKind
    from cronwarden.stores import open_store
    from cronwarden.stores.base import EventQuery

    screen.say(f"\n2. the same schedule under cronwarden run (policy skip, ttl {PERIOD * 4:g}s)")
    snaps = os.path.join(work, "guarded.db")
    _fresh_db(snaps)
    t0 = time.time()
    cmds = [[sys.executable, "-m", "cronwarden", "run", "--job", "reconcile", "--every", f"{PERIOD}s",
             "--ttl", f"{PERIOD * 4}s", "--store", store_url, "--quiet", "--",
             sys.executable, "-c", JOB, snaps, repr(t0), repr(PERIOD), repr(d), f"slot{i:02d}"]
            for i, d in enumerate(DURATIONS)]  # fmt: skip
    store = open_store(store_url)
    said: list[Any] = []
    seen: set[str] = set()

    def tick() -> None:
        """Say the ledger's new events, as the runs write them."""
        events = store.events(EventQuery(job="reconcile", limit=1000, newest_first=False))
        for e in events:
            if e.event_id in seen:
                continue
            seen.add(e.event_id)
            said.append(e)
            rel = e.at - t0
            rid = (e.run_id or "")[:8]
            if e.kind is EventKind.STARTED:
                screen.say(f"   t={rel:5.2f}s  run {rid} started, fencing token {e.data['token']}")
            elif e.kind is EventKind.SKIPPED:
                holder = str(e.data["holder_run_id"])[:8]
                screen.say(f"   t={rel:5.2f}s  SKIPPED slot: run {holder} (pid {e.data['holder_pid']}) still "
                           f"open, running for {e.data['holder_age']:.2f}s; recorded as {rid}")  # fmt: skip
            else:
                dur = e.data.get("duration")
                screen.say(
                    f"   t={rel:5.2f}s  run {rid} {e.kind.value}" + (f" after {dur:.2f}s" if dur else "")
                )

    try:
        _fire_all(cmds, t0, work, screen, "cronwarden", lambda _i, _at: None, tick)
    finally:
        store.close()
    dup = _twice(_snapshots(snaps))
    return dup, said


def main(args: Any) -> int:
    work = tempfile.mkdtemp(prefix="cronwarden-demo-")
    try:
        store_url = f"sqlite:///{os.path.join(work, 'cronwarden.db')}"
        screen = Screen()
        screen.say("cronwarden demo: a reconciliation job whose runtime creeps up, and one slow night\n")
        naive_dup = _naive(work, screen)
        guarded_dup, events = _guarded(work, store_url, screen)
        from cronwarden.events import EventKind

        skips = [e for e in events if e.kind is EventKind.SKIPPED]
        runs = [e for e in events if e.kind is EventKind.STARTED]
        print("\nsummary")
        which = ", ".join(f"window {w:02d}" for w in sorted(naive_dup))
        print(f"   plain cron:  {len(DURATIONS)} starts, windows processed twice: {len(naive_dup)}"
              + (f" ({which})" if naive_dup else ""))  # fmt: skip
        print(f"   cronwarden:  {len(runs)} runs, {len(skips)} skips recorded, "
              f"windows processed twice: {len(guarded_dup)}")  # fmt: skip
        for s in skips:
            d = s.data
            print(f"     skip {str(s.run_id)[:8]}: held by run {str(d['holder_run_id'])[:8]} on "
                  f"{d['holder_host']} pid {d['holder_pid']}, open {d['holder_age']:.2f}s")  # fmt: skip
        slowest = max(DURATIONS)
        print(f"\n   The slow night took {slowest / PERIOD:.1f} periods. Under cronwarden the starts that "
              "met it did no work\n   and said so in the ledger; nothing was written twice.")  # fmt: skip
        if args.keep:
            print(f"   Look again with:  cronwarden history reconcile --store {store_url}")
            print(f"               or:  cronwarden dashboard --store {store_url}")
        else:
            print("   (temporary files removed; --keep to look at them with cronwarden history or dashboard)")
        return 0 if not guarded_dup else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
