"""``cronwarden status`` and ``cronwarden history``: what on-call reads."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cronwarden.durations import format_duration
from cronwarden.events import EventKind, RunRecord
from cronwarden.stores.base import EventQuery

if TYPE_CHECKING:
    from cronwarden.stores.base import Store


def when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def dur(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _open(args: Any) -> Any:
    from cronwarden.cli import store_url
    from cronwarden.stores import open_store

    return open_store(store_url(args))


REFUSALS = (EventKind.SKIPPED, EventKind.QUEUED, EventKind.QUEUE_FULL, EventKind.OVERLAP)
"""The starts that met an open run, shown between a job's runs."""


def history_items(store: Store, job: str, limit: int) -> list[dict[str, Any]]:
    """A job's last ``limit`` runs and the refused or overlapping starts
    since the oldest of them, newest first, as ``history --json`` and the
    dashboard show them."""
    runs = store.runs(job, limit)
    since = runs[-1].started_at if runs else None
    refusals = store.events(EventQuery(job=job, kinds=REFUSALS, since=since, limit=10_000))
    items: list[tuple[float, dict[str, Any]]] = []
    for r in runs:
        items.append((r.started_at, {
            "type": "run", "run_id": r.run_id, "started_at": r.started_at, "host": r.host, "pid": r.pid,
            "token": r.token, "outcome": r.outcome.value if r.outcome else "running",
            "duration": r.duration, "exit_code": r.exit_code, "detail": r.detail,
        }))  # fmt: skip
    for e in refusals:
        items.append((e.at, {"type": e.kind.value, "run_id": e.run_id, "at": e.at, **dict(e.data)}))
    items.sort(key=lambda item: item[0], reverse=True)
    return [i for _, i in items]


def history_note(item: dict[str, Any]) -> str:
    """What a ``history_items`` item's NOTE says: a run's detail or exit
    status; a refused start's holder and how long it had held."""
    if item["type"] == "run":
        return str(item["detail"] or ("" if item["exit_code"] in (None, 0) else f"exit {item['exit_code']}"))
    age = item.get("holder_age")
    held = f" for {format_duration(age)}" if isinstance(age, int | float) else ""
    return f"held by {item.get('holder_run_id', '?')}{held}"


def state(run: RunRecord) -> str:
    if run.expires_in is None:
        return "lease gone"
    if run.expires_in <= 0:
        return "expired (abandoned at next start)"
    return "running"


def configure_status(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli import add_store_flag

    p.description = (
        "The runs open now on every host: job, run id, host, pid, age, lease expiry, fencing "
        "token, pending starts. A run whose lease expired is recorded abandoned at the next start."
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--job", help="only this job")
    add_store_flag(p)


def configure_history(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli import add_store_flag

    p.add_argument("job", help="job name")
    p.add_argument("--limit", type=int, default=20, help="how many runs (default 20)")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_store_flag(p)


def open_runs(
    store: Store, job: str | None = None, runs: Sequence[RunRecord] | None = None
) -> list[tuple[RunRecord, int]]:
    """The runs open now (or ``runs``, read already), each with its lease's
    pending (queued) starts."""
    out = []
    for r in store.open_runs(job) if runs is None else runs:
        info = store.lease(r.key)
        out.append((r, info.pending if info else 0))
    return out


def open_run_item(r: RunRecord, pending: int, now: float) -> dict[str, Any]:
    """An open run as ``status --json`` and the dashboard's API show it."""
    return {
        "job": r.job, "run_id": r.run_id, "key": r.key, "host": r.host, "pid": r.pid,
        "started_at": r.started_at, "age": round(now - r.started_at, 3), "token": r.token,
        "lease_expires_in": None if r.expires_in is None else round(r.expires_in, 3),
        "state": state(r).split(" ")[0], "pending": pending,
    }  # fmt: skip


def main_status(args: Any) -> int:
    store = _open(args)
    try:
        runs = open_runs(store, args.job)
        now = time.time()
    finally:
        store.close()
    if args.json:
        print(json.dumps([open_run_item(r, pending, now) for r, pending in runs], indent=2))
        return 0
    if not runs:
        print("no open runs")
        return 0
    rows = [
        [r.job, r.run_id, r.host, str(r.pid), when(r.started_at), format_duration(now - r.started_at),
         "-" if r.expires_in is None else format_duration(r.expires_in), str(r.token),
         str(pending), state(r)]
        for r, pending in runs
    ]  # fmt: skip
    print(
        table(
            ["JOB", "RUN ID", "HOST", "PID", "STARTED", "AGE", "EXPIRES IN", "TOKEN", "PENDING", "STATE"],
            rows,
        )
    )
    return 0


def main_history(args: Any) -> int:
    from cronwarden.guard import check_name

    check_name(args.job, "job name")
    if args.limit < 1:
        from cronwarden.errors import UsageError

        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    store = _open(args)
    try:
        items = history_items(store, args.job, args.limit)
    finally:
        store.close()
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    if not items:
        print(f"no runs recorded for {args.job}")
        return 0
    rows = []
    for i in items:
        at = i["started_at"] if i["type"] == "run" else i["at"]
        if i["type"] == "run":
            rows.append([when(at), i["outcome"], i["run_id"], dur(i["duration"]), str(i["token"]), i["host"],
                         history_note(i)])  # fmt: skip
        else:
            rows.append([when(at), i["type"], i["run_id"] or "-", "-", "-", str(i.get("host", "-")),
                         history_note(i)])  # fmt: skip
    print(table(["WHEN", "OUTCOME", "RUN ID", "DURATION", "TOKEN", "HOST", "NOTE"], rows))
    return 0
