"""``cronwarden prune``: apply the ledger's retention now, in bounded steps."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cronwarden.errors import UsageError

EPILOG = """what is kept: retention = "90d" and/or keep_runs = 1000 (finished runs per job) at the
  top of the config file, or ?retention=90d&keep_runs=1000 in the store URL (which wins);
  these flags win over both. Never pruned: open runs and their events, the monitor's findings
  and operators' decisions (pause, snooze), leases and fencing counters, per-job rollups.
  The dead letters of pruned events go with them.

`cronwarden monitor` prunes a step per pass and `cronwarden run` a little at the end of
each run, so this command is for the first prune of a big ledger, or to see what is due
(--dry-run).

exit status: 0 done (or, dry, counted); 2 bad usage, or no retention configured;
  75 store unreachable or locked."""

STEP_BUDGET = 500
"""Events per step: each step is one short transaction, so runs starting
meanwhile wait for at most one step."""


def configure(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag, duration

    p.description = "Delete the runs and events the ledger's retention no longer keeps, oldest first."
    p.epilog = EPILOG
    p.add_argument("--config", metavar="PATH", help="config file (default: $CRONWARDEN_CONFIG or "
                   "./cronwarden.toml)")  # fmt: skip
    p.add_argument(
        "--retention",
        type=duration("--retention"),
        metavar="DURATION",
        help="keep this much of the ledger, e.g. 90d (default: the store URL's or the config's)",
    )
    p.add_argument(
        "--keep-runs",
        type=_keep_runs,
        metavar="N",
        help="keep the newest N finished runs of each job (default: the URL's or the config's)",
    )
    p.add_argument("--dry-run", action="store_true", help="count what is due; delete nothing")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_store_flag(p)


def _keep_runs(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 10**9:
        raise UsageError(f"--keep-runs must be a whole number of runs from 1 to 10^9, got {text!r}")
    return int(text)


def main(args: Any) -> int:
    from cronwarden.cli.args import retention, store_url
    from cronwarden.clock import SYSTEM_CLOCK
    from cronwarden.config import find, read
    from cronwarden.durations import format_duration
    from cronwarden.stores import open_store
    from cronwarden.stores.base import Pruned

    path = find(args.config)
    config = read(path)
    if config.problems:
        from cronwarden.config import ConfigError

        raise ConfigError(config.problems)
    store = open_store(store_url(args, config.store))
    try:
        keep = retention(store, config, max_age=args.retention, keep_runs=args.keep_runs)
        if not keep.active:
            raise UsageError("prune: no retention configured; set retention = \"90d\" or keep_runs = 1000 at "
                             "the top of the config file (or ?retention=90d in the store URL), or give "
                             "--retention / --keep-runs")  # fmt: skip
        now = SYSTEM_CLOCK.wall()
        if args.dry_run:
            total = store.prune(keep, now, dry_run=True)
        else:
            total = Pruned()
            while True:
                step = store.prune(keep, now, budget=STEP_BUDGET)
                total = Pruned(total.runs + step.runs, total.events + step.events)
                if step.done or not (step.runs or step.events):
                    break
    finally:
        store.close()
    what = ", ".join(
        [*([f"older than {format_duration(keep.max_age)}"] if keep.max_age is not None else []),
         *([f"beyond the newest {keep.keep_runs} runs of each job"] if keep.keep_runs is not None else [])]
    )  # fmt: skip
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, "runs": total.runs, "events": total.events,
                          "retention": keep.max_age, "keep_runs": keep.keep_runs}))  # fmt: skip
    else:
        verb = "due" if args.dry_run else "pruned"
        print(f"{verb}: {total.runs} run{'s' * (total.runs != 1)} and {total.events} "
              f"event{'s' * (total.events != 1)} ({what})")  # fmt: skip
    sys.stdout.flush()
    return 0
