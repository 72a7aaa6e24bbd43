"""``cronwarden snooze`` and ``unsnooze``: a job's findings recorded and
shown but not delivered to alerting sinks for a while, said by whom and why."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.errors import UsageError


def _who() -> str:
    """The operator's login name, for the record (``--by`` overrides it)."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no login name (a container with an unnamed uid): say nothing
        return ""


def configure_snooze(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag, duration

    p.description = (
        "Keep a job's findings from alerting sinks for a while: the monitor still records them, with "
        "snoozed = true, check and the dashboard still show them, and routes that ask for snoozed "
        "findings (and the log sink) still get them. The snooze is an event in the ledger, with who "
        'and why. Recurring windows go in the config file: maintenance = ["Sun 02:00-04:00 Europe/Berlin"].'
    )
    p.add_argument("job", help="job name")
    p.add_argument("--for", dest="seconds", required=True, type=duration("--for"), metavar="DURATION",
                   help="how long, from now (e.g. 2h, 30m)")  # fmt: skip
    p.add_argument("--reason", required=True, help="why, in one sentence (recorded and shown)")
    p.add_argument("--by", help="who (default: your login name)")
    add_store_flag(p)


def configure_unsnooze(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag

    p.description = (
        "End a job's snooze now: findings raised from now on are delivered again. A maintenance "
        "window in the config file still holds in its hours."
    )
    p.add_argument("job", help="job name")
    p.add_argument("--reason", default="", help="why (recorded)")
    p.add_argument("--by", help="who (default: your login name)")
    add_store_flag(p)


def _monitor(args: Any, clock: Clock) -> Any:
    from cronwarden.cli.window import open_store_of
    from cronwarden.config.settings import check_name
    from cronwarden.monitor import Monitor

    check_name(args.job, "job name")
    return Monitor(open_store_of(args, clock), clock=clock)


def main_snooze(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.durations import format_duration
    from cronwarden.monitor.views import when

    out = out or sys.stdout
    if not args.reason.strip() or "\n" in args.reason.strip():
        raise UsageError(f"snooze: --reason must be one sentence saying why, got {args.reason!r}")
    if args.seconds > 366 * 86400:
        raise UsageError(f"snooze: --for must be at most a year, got {format_duration(args.seconds)}")
    monitor = _monitor(args, clock)
    try:
        by = _who() if args.by is None else args.by
        event = monitor.snooze(args.job, args.seconds, by=by, reason=args.reason.strip())
    finally:
        monitor.store.close()
    who = f" by {by}" if by else ""
    print(f"snoozed {args.job} until {when(event.data['until'])} ({format_duration(args.seconds)}){who}: "
          f"{args.reason.strip()}", file=out)  # fmt: skip
    return 0


def main_unsnooze(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.monitor.snooze import SNOOZE_KINDS, snooze_at
    from cronwarden.stores.base import EventQuery

    out = out or sys.stdout
    monitor = _monitor(args, clock)
    try:
        last = monitor.store.events(EventQuery(job=args.job, kinds=SNOOZE_KINDS, limit=1))
        if snooze_at(clock.wall(), last) is None:
            raise UsageError(f"unsnooze: {args.job} is not snoozed")
        by = _who() if args.by is None else args.by
        monitor.unsnooze(args.job, by=by, reason=args.reason.strip())
    finally:
        monitor.store.close()
    print(f"unsnoozed {args.job}", file=out)
    return 0
