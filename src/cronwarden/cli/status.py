"""``cronwarden status`` and ``cronwarden history``: what on-call reads."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from cronwarden.cli.text import table
from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.durations import format_duration
from cronwarden.monitor.views import dur, history_items, history_note, open_run_item, open_runs, state, when


def _open(args: Any) -> Any:
    from cronwarden.cli.args import existing_store_url
    from cronwarden.stores import open_store

    return open_store(existing_store_url(args), read_only=True)


def configure_status(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag

    p.description = (
        "The runs open now on every host: job, run id, host, pid, age, lease expiry, fencing "
        "token, pending starts, and a stop in progress (cronwarden stop: who asked, when). A run whose "
        "lease expired is recorded abandoned at the next start. Then a line per paused job (who, when, "
        "why) and per sink that set events aside because its receiver refused them for good."
    )
    p.add_argument("--json", action="store_true", help='print JSON: a list of the open runs ("type": "run") '
                   'then of the paused jobs ("type": "paused", with by, reason and since)')  # fmt: skip
    p.add_argument("--job", help="only this job")
    add_store_flag(p)


def configure_history(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag, duration

    p.description = (
        "A job's recent runs, newest first, with every start refused or queued between them. With "
        "--slots: every expected slot of its schedule and the one decision it got (ran, late, queued, "
        "skipped, paused, misfired, missed, or due while its grace lasts; backfilled for a past slot run by "
        "cronwarden backfill)."
    )
    p.add_argument("job", help="job name")
    from cronwarden.cli.window import MOST_RUNS, count_flag

    p.add_argument("--limit", type=count_flag("--limit", MOST_RUNS), default=20,
                   help="how many runs, or slots with --slots (default 20)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--slots", action="store_true", help="the slot ledger: one line per expected slot")
    p.add_argument(
        "--since",
        type=duration("--since"),
        metavar="DURATION",
        help="with --slots: every slot of the last DURATION (e.g. 7d) instead of --limit",
    )
    p.add_argument("--config", metavar="PATH", help="with --slots: cronwarden.toml, for the job's schedule")
    add_store_flag(p)


def main_status(args: Any) -> int:
    from cronwarden.control import paused_item, paused_jobs, stop_requests

    store = _open(args)
    try:
        runs = open_runs(store, args.job)
        now = time.time()
        stops = stop_requests(store, [r for r, _ in runs])
        set_aside = [] if args.json else _set_aside(store)
        paused = paused_jobs(store, [args.job] if args.job else store.ledger_jobs())
    finally:
        store.close()
    if args.json:
        items = [open_run_item(r, pending, now) for r, pending in runs]
        for item in items:
            asked = stops.get(str(item["run_id"]))
            if asked is not None:
                item["stop_requested"] = {"by": asked.data.get("by"), "at": asked.at,
                                          "reason": asked.data.get("reason")}  # fmt: skip
        items += [paused_item(job, pause) for job, pause in sorted(paused.items())]
        print(json.dumps(items, indent=2))
        return 0
    said = _paused_lines(paused) + set_aside
    if not runs:
        print("no open runs")
        for line in said:
            print(line)
        return 0
    rows = [
        [r.job, r.run_id, r.host, str(r.pid), when(r.started_at), format_duration(now - r.started_at),
         "-" if r.expires_in is None else format_duration(r.expires_in), str(r.token),
         str(pending), _state(r, stops)]
        for r, pending in runs
    ]  # fmt: skip
    print(
        table(
            ["JOB", "RUN ID", "HOST", "PID", "STARTED", "AGE", "EXPIRES IN", "TOKEN", "PENDING", "STATE"],
            rows,
        )
    )
    for line in said:
        print(line)
    return 0


def _state(run: Any, stops: Any) -> str:
    """The run's state, and a stop in progress: who asked, when."""
    asked = stops.get(run.run_id)
    if asked is None:
        return state(run)
    return f"{state(run)}; stop requested by {asked.data.get('by') or 'someone'} at {when(asked.at)}"


def _paused_lines(paused: Any) -> list[str]:
    """A line per paused job: who paused it, when and why."""
    from cronwarden.control import describe_pause

    return [
        f"{job}: {describe_pause(pause)} (cronwarden resume {job})" for job, pause in sorted(paused.items())
    ]


def _set_aside(store: Any) -> list[str]:
    """A line per sink that keeps events it refused for good, with the
    latest refusal and how to send them again."""
    from cronwarden.events import EventKind
    from cronwarden.stores.base import EventQuery

    lines = []
    for sink, n in sorted(store.rejected_counts().items()):
        latest = store.events(EventQuery(job=f"sink:{sink}", kinds=[EventKind.SINK_REJECTED], limit=1))
        why = ""
        if latest:
            d = latest[0].data
            what = f"{d.get('kind', '?')} of {d.get('job', '?')}"
            why = f"; latest {when(latest[0].at)}: {what}: {d.get('error', '?')}"
        lines.append(f"sink {sink}: {n} event{'s' if n != 1 else ''} set aside (refused for good){why}; "
                     f"cronwarden flush --retry-rejected --sink {sink} sends them again")  # fmt: skip
    return lines


def main_history(args: Any, *, clock: Clock = SYSTEM_CLOCK) -> int:
    from cronwarden.config.settings import check_name
    from cronwarden.errors import UsageError

    check_name(args.job, "job name")
    if args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    if args.slots:
        return _slots(args, clock)
    if args.since is not None:
        raise UsageError("--since is the span of --slots: give --slots too")
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


def _slots(args: Any, clock: Clock) -> int:
    from cronwarden.cli.window import config_jobs, open_store_of
    from cronwarden.monitor.views import slot_items

    now = clock.wall()
    store = open_store_of(args, clock, existing=True)
    try:
        info = next((j for j in config_jobs(args) if j.name == args.job), None) or store.job(args.job)
        since = None if args.since is None else now - args.since
        items = slot_items(store, args.job, info, now, limit=args.limit, since=since)
    finally:
        store.close()
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    rows = []
    for i in items:
        note = []
        if i["late_by"] is not None:
            note.append(f"{format_duration(i['late_by'])} late")
        if i["decision"] in ("skipped", "queued") and i["run_id"]:
            note.append(f"held by {i['run_id']}")
        if i["extra"]:
            note.append(f"also {', '.join(i['extra'])}")
        run_id = i["run_id"] if i["decision"] in ("ran", "backfilled", "late") else "-"
        rows.append([when(i["slot"]), i["decision"], run_id or "-", i["outcome"] or "-", when(i["at"]),
                     "; ".join(note)])  # fmt: skip
    print(table(["SLOT", "DECISION", "RUN ID", "OUTCOME", "AT", "NOTE"], rows))
    return 0
