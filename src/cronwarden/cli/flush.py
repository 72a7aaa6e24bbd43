"""``cronwarden flush``: deliver what the sinks' outboxes hold, now."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from cronwarden.errors import UsageError

DEFAULT_TIMEOUT = 5.0

EPILOG = """exit status: 0 every sink is up to date; 1 some sink failed, is backing off after a
  failure, or ran out of time (its events stay in the outbox for the next flush); 2 bad usage
  or configuration.

Sinks are the [sinks.NAME] tables of the config file (--config, $CRONWARDEN_CONFIG or
./cronwarden.toml). See docs/sinks.md."""


def configure(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag, duration

    p.description = (
        "Deliver the events each configured sink has not acknowledged yet, within --timeout. "
        "`cronwarden run` does this at the end of every run when sinks are configured; this "
        "command is for cron-less hosts, for draining after an outage, and for checking sinks."
    )
    p.epilog = EPILOG
    p.add_argument("--config", metavar="PATH", help="config file (default: $CRONWARDEN_CONFIG or "
                   "./cronwarden.toml)")  # fmt: skip
    p.add_argument("--timeout", type=duration("--timeout"), default=DEFAULT_TIMEOUT, metavar="DURATION",
                   help="stop delivering after this long (default 5s)")  # fmt: skip
    p.add_argument("--sink", action="append", metavar="NAME", help="only this sink (repeatable)")
    p.add_argument("--force", action="store_true",
                   help="try sinks that are backing off after a failure, now")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON")
    add_store_flag(p)


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
    try:
        deadline = SYSTEM_CLOCK.monotonic() + args.timeout
        results = flush_sinks(store, sinks, deadline=deadline, force=args.force)
    finally:
        store.close()
    if args.json:
        print(json.dumps([{"sink": r.sink, "delivered": r.delivered, "skipped": r.skipped, "ok": r.ok,
                           "error": r.error, "retry_at": r.retry_at, "backing_off": r.backing_off,
                           "out_of_time": r.out_of_time} for r in results], indent=2))  # fmt: skip
    else:
        width = max(len(r.sink) for r in results)
        for r in results:
            print(f"{r.sink.ljust(width)}  {_describe(r)}")
    return 0 if all(r.ok for r in results) else 1


def _describe(r: Any) -> str:
    when = "" if r.retry_at is None else time.strftime("%H:%M:%S", time.localtime(r.retry_at))
    if r.backing_off:
        return f"backing off until {when} after: {r.error} (--force to try now)"
    sent = f"delivered {r.delivered}" + (f", skipped {r.skipped}" if r.skipped else "")
    if r.error is not None:
        return f"{sent}; failed: {r.error}; retry after {when}" if when else f"{sent}; failed: {r.error}"
    if r.out_of_time:
        return f"{sent}; out of time, more events wait (raise --timeout)"
    return sent
