"""``cronwarden flush``: deliver what the sinks' outboxes hold, now."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from cronwarden.errors import UsageError

DEFAULT_TIMEOUT = 5.0

EPILOG = """exit status: 0 every sink is up to date; 1 some sink failed, is backing off after a
  failure, ran out of time (its events stay in the outbox for the next flush), or refused
  events for good (they are set aside: --retry-rejected sends them again); 2 bad usage or
  configuration; 130/143 stopped by SIGINT/SIGTERM (what was not delivered stays in the
  outbox).

A sink delivers each event as its receiver answers, so a slow receiver drains a little more
at every flush. An event the receiver refuses for good (an HTTP 4xx other than 401, 403,
407, 408, 429) is set aside and recorded as sink_rejected, and the sink goes on with the
rest; `cronwarden status` lists the sinks with events set aside.

Sinks are the [sinks.NAME] tables of the config file (--config, $CRONWARDEN_CONFIG or
./cronwarden.toml). See docs/sinks.md."""


def configure(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag, duration

    p.description = (
        "Deliver the events each configured sink has not acknowledged yet, within --timeout. "
        "`cronwarden run` does this at the end of every run when sinks are configured; this "
        "command is for cron-less hosts, for draining after an outage, for checking sinks, and "
        "for sending again the events a sink refused."
    )
    p.epilog = EPILOG
    p.add_argument("--config", metavar="PATH", help="config file (default: $CRONWARDEN_CONFIG or "
                   "./cronwarden.toml)")  # fmt: skip
    p.add_argument("--timeout", type=duration("--timeout"), default=DEFAULT_TIMEOUT, metavar="DURATION",
                   help="stop delivering after this long (default 5s)")  # fmt: skip
    p.add_argument("--sink", action="append", metavar="NAME", help="only this sink (repeatable)")
    p.add_argument("--force", action="store_true",
                   help="try sinks that are backing off after a failure, now")  # fmt: skip
    p.add_argument("--retry-rejected", action="store_true",
                   help="instead of the outbox, send again the events each sink refused for good and set "
                   "aside (after fixing the receiver or the sink's config); each one it takes is "
                   "forgotten, each it refuses again stays set aside")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON")
    add_store_flag(p)


class _Stop(BaseException):
    """SIGTERM or SIGINT: not an ``Exception``, so the outbox does not take
    it for a sink's failure; it abandons what is in flight and lets it by."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _document(path: str | None) -> tuple[str, dict[str, Any]]:
    from cronwarden.config import find

    found = find(path)
    if found is None:
        raise UsageError("flush: no config file (--config PATH, $CRONWARDEN_CONFIG or ./cronwarden.toml), "
                         "so no sinks to flush")  # fmt: skip
    import tomllib

    try:
        with open(found, "rb") as f:
            return found, tomllib.load(f)
    except OSError as e:
        raise UsageError(f"{found}: cannot read the config file: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{found}: TOML syntax: {e}") from None


def main(args: Any) -> int:
    from cronwarden.cli.args import store_url
    from cronwarden.clock import SYSTEM_CLOCK
    from cronwarden.outbox import flush_sinks
    from cronwarden.sinks import SinkConfigError, load_sinks
    from cronwarden.stores import open_store

    path, doc = _document(args.config)
    try:
        sinks = load_sinks(doc)
    except SinkConfigError as e:
        raise UsageError(f"{path}: {e}") from None
    if args.sink:
        known = {s.name for s in sinks}
        missing = [n for n in args.sink if n not in known]
        if missing:
            raise UsageError(f"flush: no sink {missing[0]!r} in {path}; configured: "
                             f"{', '.join(sorted(known)) or 'none'}")  # fmt: skip
        sinks = [s for s in sinks if s.name in args.sink]
    if not sinks:
        raise UsageError(f"flush: {path} configures no sinks; add a [sinks.NAME] table")
    configured = doc.get("store")
    url = store_url(args, configured if isinstance(configured, str) else None)
    store = open_store(str(url))

    def stop(signum: int, frame: Any) -> None:
        raise _Stop(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        deadline = SYSTEM_CLOCK.monotonic() + args.timeout
        results = flush_sinks(store, sinks, deadline=deadline, force=args.force, replay=args.retry_rejected)
        set_aside = store.rejected_counts()
    except _Stop as e:
        name = signal.Signals(e.signum).name
        print(f"cronwarden flush: stopped by {name}; what was not delivered stays in the outbox",
              file=sys.stderr)  # fmt: skip
        return 128 + e.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        store.close()
    if args.json:
        print(json.dumps([{"sink": r.sink, "delivered": r.delivered, "skipped": r.skipped, "ok": r.ok,
                           "rejected": r.rejected, "rejection": r.rejection,
                           "set_aside": set_aside.get(r.sink, 0), "error": r.error, "retry_at": r.retry_at,
                           "backing_off": r.backing_off, "out_of_time": r.out_of_time} for r in results],
                         indent=2))  # fmt: skip
    else:
        width = max(len(r.sink) for r in results)
        for r in results:
            print(f"{r.sink.ljust(width)}  {_describe(r, args.retry_rejected)}")
            if set_aside.get(r.sink):
                n = set_aside[r.sink]
                print(f"{''.ljust(width)}  {n} event{'s' if n != 1 else ''} set aside (refused for good): "
                      f"cronwarden flush --retry-rejected --sink {r.sink}")  # fmt: skip
    return 0 if all(r.ok and not r.rejected for r in results) else 1


def _describe(r: Any, replay: bool) -> str:
    when = "" if r.retry_at is None else time.strftime("%H:%M:%S", time.localtime(r.retry_at))
    if r.backing_off:
        return f"backing off until {when} after: {r.error} (--force to try now)"
    sent = f"{'sent again' if replay else 'delivered'} {r.delivered}"
    if r.skipped:
        sent += f", skipped {r.skipped}"
    if r.rejected:
        sent += f", {'refused again' if replay else 'rejected'} {r.rejected} ({r.rejection})"
    if r.error is not None:
        return f"{sent}; failed: {r.error}; retry after {when}" if when else f"{sent}; failed: {r.error}"
    if r.out_of_time:
        return f"{sent}; out of time, more events wait (raise --timeout)"
    return sent
