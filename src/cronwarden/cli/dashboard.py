"""``cronwarden dashboard``: the read-only web dashboard, JSON API and
``/metrics`` of ``cronwarden.web``, served until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.errors import UsageError

if TYPE_CHECKING:
    from cronwarden.web import Dashboard

EPILOG = """pages:
  /                every job's strip of its last 20 slots and its verdict, the findings that hold now,
                   the open runs, the latest trouble; ?verdict=failing&q=TEXT&per_page=100&page=2
  /jobs/NAME       one job: statistics, durations against the period, runs and refused starts
  /api/jobs        JSON; also /api/jobs/NAME, /api/runs, /api/events?job=&kind=&run_id=&since=&limit=
  /metrics         Prometheus exposition (needs pip install 'cronwarden[metrics]')
  /healthz         200 while the store answers, 503 when it does not

examples:
  cronwarden dashboard                                   # http://127.0.0.1:8370/ on the default store
  cronwarden dashboard --store postgresql://cw@db/cron --listen 0.0.0.0:8370 --config cronwarden.toml

It only reads the ledger: no finding is recorded and no run is marked abandoned (cronwarden monitor
does that). On loopback (the default) it asks for no login; anywhere else it needs --token or
$CRONWARDEN_DASHBOARD_TOKEN, sent as "Authorization: Bearer TOKEN" or through the login form at
/login (a cookie). Every answer carries a Content-Security-Policy, X-Frame-Options: DENY and
X-Content-Type-Options: nosniff; a request with two Content-Lengths, or a length and a
Transfer-Encoding, is refused (400) and its connection closed."""


def configure(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.window import add_window_flags

    p.description = (
        "Serve a read-only web dashboard of the ledger: verdicts, findings, open runs, each job's "
        "durations against its period, with the same data as JSON and Prometheus /metrics."
    )
    p.epilog = EPILOG
    p.add_argument("--listen", type=address, default="127.0.0.1:8370", metavar="HOST:PORT",
                   help="address to serve on (default 127.0.0.1:8370; port 0 picks a free one)")  # fmt: skip
    p.add_argument("--refresh", type=refresh, metavar="DURATION",
                   help="how often the pages reload themselves (default 30s; 0: never)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no line per request on stderr")
    add_token_flag(p)
    add_window_flags(p)


def add_token_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token", metavar="TOKEN",
                   help="require this token (16+ characters) of every request: a bearer header or the "
                   "login form's cookie (default: $CRONWARDEN_DASHBOARD_TOKEN; needed to listen beyond "
                   "loopback)")  # fmt: skip


def token_of(args: Any) -> str | None:
    """``--token`` > ``$CRONWARDEN_DASHBOARD_TOKEN`` (the environment keeps it
    off the world-readable command line)."""
    return getattr(args, "token", None) or os.environ.get("CRONWARDEN_DASHBOARD_TOKEN") or None


def refresh(text: str) -> float:
    """An argparse ``type`` for ``--refresh``: 0 (never), or at least a second."""
    from cronwarden.cli.args import duration

    seconds = duration("--refresh", allow_zero=True)(text)
    if 0 < seconds < 1:
        raise UsageError(f"--refresh must be 0 (never) or at least 1s, got {text!r}")
    return seconds


def address(text: str) -> tuple[str, int]:
    """An argparse ``type`` for ``--listen HOST:PORT``."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT such as 127.0.0.1:8370, got {text!r}")
    return host, int(port)


def open_dashboard(args: Any, clock: Clock) -> Dashboard:
    """The dashboard over ``args``' store (a connection of its own), window,
    thresholds and config file; ``Dashboard.close`` closes the store. A store
    that cannot be read is said now (exit 75, or 2), not on the first page."""
    from cronwarden.cli.args import existing_store_url
    from cronwarden.cli.window import open_monitor
    from cronwarden.stores import open_store
    from cronwarden.web import DEFAULT_REFRESH, Dashboard

    url = existing_store_url(args)
    store = open_store(url, clock=clock)
    try:
        store.jobs()
        refresh = DEFAULT_REFRESH if args.refresh is None else args.refresh
        return Dashboard(open_monitor(args, store, clock), refresh=refresh)
    except BaseException:
        store.close()
        raise


def request_log(args: Any) -> Callable[[str], None] | None:
    """A line per request on stderr, unless ``--quiet``."""

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    return None if args.quiet else log


def main(args: Any, *, clock: Clock = SYSTEM_CLOCK) -> int:
    from cronwarden.web import serve

    asked: list[int] = []
    # A SIGTERM while the store is opened (a new PostgreSQL schema takes a
    # while on a busy host) is a stop too, not a death by signal.
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: asked.append(signum))
    try:
        dashboard = open_dashboard(args, clock)
    except BaseException:
        signal.signal(signal.SIGTERM, previous)
        raise
    if asked:
        signal.signal(signal.SIGTERM, previous)
        dashboard.close()
        return 0
    host, port = args.listen

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # serve_forever's loop unwinds to the finally below

    def ready(url: str) -> None:
        print(f"cronwarden dashboard: {url} (Ctrl-C to stop)", flush=True)

    signal.signal(signal.SIGTERM, stop)
    try:
        serve(dashboard, host, port, ready=ready, log=request_log(args), token=token_of(args))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        dashboard.close()
    return 0
