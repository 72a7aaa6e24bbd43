"""``cronwarden status`` and ``cronwarden history``: what on-call reads."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from cronwarden.durations import format_duration
from cronwarden.events import EventKind, RunRecord
from cronwarden.stores.base import EventQuery


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _open(args: Any) -> Any:
    from cronwarden.cli import store_url
    from cronwarden.stores import open_store

    return open_store(store_url(args))


def _state(run: RunRecord) -> str:
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


def main_status(args: Any) -> int:
    store = _open(args)
    try:
        runs = store.open_runs(args.job)
        now = time.time()
        pending: dict[str, int] = {}
        for r in runs:
            info = store.lease(r.key)
            pending[r.run_id] = info.pending if info else 0
    finally:
        store.close()
    if args.json:
        out = [
            {"job": r.job, "run_id": r.run_id, "key": r.key, "host": r.host, "pid": r.pid,
             "started_at": r.started_at, "age": round(now - r.started_at, 3), "token": r.token,
             "lease_expires_in": None if r.expires_in is None else round(r.expires_in, 3),
             "state": _state(r).split(" ")[0], "pending": pending[r.run_id]}
            for r in runs
        ]  # fmt: skip
        print(json.dumps(out, indent=2))
        return 0
    if not runs:
        print("no open runs")
        return 0
    rows = [
        [r.job, r.run_id, r.host, str(r.pid), _when(r.started_at), format_duration(now - r.started_at),
         "-" if r.expires_in is None else format_duration(r.expires_in), str(r.token),
         str(pending[r.run_id]), _state(r)]
        for r in runs
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
        runs = store.runs(args.job, args.limit)
        since = runs[-1].started_at if runs else None
        kinds = [EventKind.SKIPPED, EventKind.QUEUED, EventKind.QUEUE_FULL, EventKind.OVERLAP]
        refusals = store.events(EventQuery(job=args.job, kinds=kinds, since=since, limit=10_000))
    finally:
        store.close()
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
    if args.json:
        print(json.dumps([i for _, i in items], indent=2))
        return 0
    if not items:
        print(f"no runs recorded for {args.job}")
        return 0
    rows = []
    for at, i in items:
        if i["type"] == "run":
            dur = "-" if i["duration"] is None else format_duration(i["duration"])
            note = i["detail"] or ("" if i["exit_code"] in (None, 0) else f"exit {i['exit_code']}")
            rows.append([_when(at), i["outcome"], i["run_id"], dur, str(i["token"]), i["host"], note])
        else:
            holder = i.get("holder_run_id", "?")
            age = i.get("holder_age")
            note = f"held by {holder}" + (f" for {format_duration(age)}" if age is not None else "")
            rows.append([_when(at), i["type"], i["run_id"] or "-", "-", "-", str(i.get("host", "-")), note])
    print(table(["WHEN", "OUTCOME", "RUN ID", "DURATION", "TOKEN", "HOST", "NOTE"], rows))
    return 0
