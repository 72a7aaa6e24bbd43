"""``cronwarden audit``, ``check`` and ``metrics``: every job's durations
against its period, one monitoring pass, and the Prometheus exposition."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

from cronwarden.cli.window import add_window_flags, open_monitor, open_store_of
from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.monitor.views import audit_item, condition_item, dur, strict_failures

if TYPE_CHECKING:
    from cronwarden.monitor import Pass

AUDIT_EPILOG = """verdicts:
  failing      the last runs ended badly (failed, lease_lost, timed_out, abandoned, interrupted),
               the job's failure_threshold in a row (default 1)
  ok           p95 is at most half the period
  watch        the period is under twice the p95: a second start is possible; write the policy's reason
  at risk      p95 ≥ the slow threshold (2/3) of the period, N skips in a row, a stuck run, or
               more than one start in each of the last slots
  overlapping  two runs of the job were open at once in the window
  unscheduled  no schedule known (a job seen only through its runs)
  unknown      too few completed runs

--strict exits 1 when a job is failing, at risk or overlapping, or undecided (watch or worse with no
written reason), unless its policy is allow with a reason."""


def configure_audit(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Every job with its schedule, period, p50/p95/max duration, p95 as a share of the period, "
        "policy and reason, and a verdict. Read-only."
    )
    p.epilog = AUDIT_EPILOG
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when any job is at risk or undecided")
    add_window_flags(p)


def main_audit(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.cli.text import table

    out = out or sys.stdout
    store = open_store_of(args, clock)
    try:
        monitor = open_monitor(args, store, clock)
        all_stats = monitor.audit()
    finally:
        store.close()
    t = monitor.thresholds
    failing = {s.job: strict_failures(s, t) for s in all_stats}
    if args.json:
        print(json.dumps([audit_item(s, t) for s in all_stats], indent=2), file=out)
    elif not all_stats:
        print("no jobs known: run one with cronwarden run --every/--schedule, or describe it with "
              "cronwarden report describe", file=out)  # fmt: skip
    else:
        headers = ["JOB", "SCHEDULE", "PERIOD", "P50", "P95", "MAX", "P95/PERIOD", "POLICY", "REASON",
                   "VERDICT", "NOTES"]  # fmt: skip
        rows: list[list[str]] = []
        for s in all_stats:
            r = s.ratio
            reason = s.reason.strip() or ("(none)" if s.undecided(t) else "-")
            if len(reason) > 40:
                reason = reason[:39] + "…"
            rows.append([
                s.job, s.schedule or "-", dur(s.period), dur(s.p50), dur(s.p95), dur(s.max),
                "-" if r is None else f"{r:.0%}", s.policy, reason, s.verdict(t).value,
                "; ".join(s.notes(t)),
            ])  # fmt: skip
        print(table(headers, rows), file=out)
    if args.strict and any(failing.values()):
        bad = [f"{job} ({', '.join(why)})" for job, why in failing.items() if why]
        print(f"cronwarden: audit --strict: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


CHECK_EPILOG = """exit status (monitoring plugins): 0 OK, 1 WARNING, 2 CRITICAL (also for a bad flag or an
unreachable store: 'cronwarden: …' on stderr).

critical: failing, stuck, overlap, missed, skips_in_a_row, slow with p95 ≥ the period
warning:  slow, grace_too_wide, policy_undecided, too_often
A snoozed job's findings (cronwarden snooze, maintenance windows) are shown, marked (snoozed),
and do not count toward the exit status.

Findings that changed state are recorded in the ledger (as monitor does), so check and monitor
agree and nothing is raised twice; --dry-run records nothing."""


def configure_check(p: argparse.ArgumentParser) -> None:
    p.description = "One evaluation pass with monitoring-plugin exit codes and one line per problem."
    p.epilog = CHECK_EPILOG
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--dry-run", action="store_true", help="evaluate only; record no finding")
    add_window_flags(p)


def _pass_json(result: Pass) -> dict[str, Any]:
    return {
        "status": result.severity.name,
        "at": result.at,
        "problems": [condition_item(c) for c in result.active],
        "raised": len(result.raised),
        "resolved": len(result.resolved),
        "abandoned": list(result.abandoned),
    }


def main_check(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    store = open_store_of(args, clock)
    try:
        result = open_monitor(args, store, clock).evaluate(record=not args.dry_run)
    finally:
        store.close()
    if args.json:
        print(json.dumps(_pass_json(result), indent=2), file=out)
        return int(result.severity)
    print(summary_line(result), file=out)
    for c in sorted(result.active, key=lambda c: (-c.severity, c.job, c.rule.value)):
        print(c.line(), file=out)
    return int(result.severity)


def summary_line(result: Pass) -> str:
    from cronwarden.monitor import Severity

    jobs = len(result.stats)
    paging = [c for c in result.active if not c.snoozed]
    snoozed = len(result.active) - len(paging)
    also = f" ({snoozed} snoozed)" if snoozed else ""
    counts = {s: sum(1 for c in paging if c.severity is s) for s in (Severity.CRITICAL, Severity.WARNING)}
    if not paging:
        return f"CRONWARDEN OK - {jobs} job{'s' * (jobs != 1)}, no problems{also}"
    parts = [f"{n} {s.name.lower()}" for s, n in counts.items() if n]
    return f"CRONWARDEN {result.severity.name} - {', '.join(parts)} in {jobs} job{'s' * (jobs != 1)}{also}"


def configure_metrics(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Prometheus text exposition of every job: runs by outcome, skips, overlaps, open runs, lease "
        "losses, duration histogram and quantiles, p95/period, queue depth, last success. "
        "Needs prometheus_client (pip install 'cronwarden[metrics]')."
    )
    add_window_flags(p, rules=False)


def main_metrics(args: Any, *, clock: Clock = SYSTEM_CLOCK) -> int:
    from cronwarden.monitor.metrics import exposition, require_prometheus_client

    require_prometheus_client()
    store = open_store_of(args, clock)
    try:
        text = exposition(open_monitor(args, store, clock))
    finally:
        store.close()
    sys.stdout.write(text.decode())
    return 0
