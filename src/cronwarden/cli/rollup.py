"""``cronwarden rollup``: the per-job statistics the store keeps as runs
end, shown, or rebuilt from the ledger."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from cronwarden.cli.window import open_store_of
from cronwarden.clock import SYSTEM_CLOCK, Clock

EPILOG = """The store updates each job's rollup in the same step that records a run's start or end,
or a refused start; audit, check, metrics and the dashboard read these rows instead of every
job's window of the ledger. --rebuild folds the ledger into them again: after an upgrade from
a version without rollups (the monitor's next recording pass does it too), or after the ledger
was edited by hand. Counters count what the ledger holds when rebuilt: runs the store's
retention has dropped are no longer in them."""


def configure(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag

    p.description = (
        "Each job's rollup (lifetime counts, the window's p50/p95), or rebuild it from the ledger."
    )
    p.epilog = EPILOG
    p.add_argument("jobs", nargs="*", metavar="JOB", help="only these jobs (default: every job)")
    p.add_argument("--rebuild", action="store_true", help="fold the ledger into the rollups again")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_store_flag(p)


def main(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.cli.text import table
    from cronwarden.monitor.views import dur

    out = out or sys.stdout
    store = open_store_of(args, clock)
    try:
        if args.rebuild:
            n = store.rebuild_rollups(args.jobs or None)
            if not args.json:
                print(f"rebuilt the rollups of {n} job{'s' * (n != 1)} from the ledger", file=out)
        kept = store.rollups()
    finally:
        store.close()
    if kept is None:
        print("cronwarden: this store keeps no rollups; audit reads the ledger", file=sys.stderr)
        return 1
    rows = [r for job, r in kept.items() if not args.jobs or job in args.jobs]
    if args.json:
        items = [
            {**r._asdict(), "outcomes": dict(r.outcomes), "w_outcomes": dict(r.w_outcomes),
             "skip_times": list(r.skip_times), "w_durations": list(r.durations())}
            for r in rows
        ]  # fmt: skip
        print(json.dumps(items, indent=2), file=out)
        return 0
    if not rows:
        print("no rollups yet: they appear as runs end", file=out)
        return 0
    headers = ["JOB", "ENDED", "WINDOW", "P50", "P95", "MAX", "BAD IN A ROW", "SKIPS", "STATE"]
    print(table(headers, [
        [r.job, str(r.ended), str(r.w_runs), dur(r.p50), dur(r.p95), dur(r.w_max), str(r.bad_in_a_row),
         str(r.skips), "stale (rebuild)" if r.stale else ("ledger read" if r.w_flagged else "ok")]
        for r in rows
    ]), file=out)  # fmt: skip
    return 0
