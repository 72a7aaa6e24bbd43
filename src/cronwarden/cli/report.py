"""``cronwarden report``: runs of a job cronwarden cannot wrap, reported
by the job itself (start, success, fail), and the job's description."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TextIO

from cronwarden.cli.window import open_store_of
from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.errors import UsageError
from cronwarden.monitor.views import dur

if TYPE_CHECKING:
    from cronwarden.stores.base import Store

REPORT_EPILOG = """actions:
  start     record that a run started; prints its run id (a new UUID unless --run-id)
  success   record that the run succeeded (--exit-code, default 0)
  fail      record that the run failed (--exit-code, --detail)
  describe  record the job's schedule, grace, max runtime, policy and reason (what audit judges by)

for a job cronwarden cannot wrap; nothing is refused, everything is recorded:
  RID=$(cronwarden report start --job export)
  ./export.sh && cronwarden report success --job export --run-id "$RID" \\
              || cronwarden report fail --job export --run-id "$RID" --exit-code $?

a start while another run of the job is open records 'overlap' naming both run ids."""


def configure_report(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag, duration

    p.usage = "cronwarden report {start,success,fail,describe} --job NAME [options]"
    p.description = "Report runs of a job cronwarden does not run (no lease, no refusal)."
    p.epilog = REPORT_EPILOG
    p.add_argument("action", choices=["start", "success", "fail", "describe"])
    p.add_argument("--job", required=True, help="job name")
    p.add_argument("--run-id", metavar="ID",
                   help="the run's id (letters, digits, _ . @ -; start makes a UUID if absent)")  # fmt: skip
    p.add_argument("--exit-code", type=int, metavar="N", help="the job's exit status")
    p.add_argument("--detail", default="", help="fail: what went wrong (one line)")
    p.add_argument("--pid", type=int, help="start: the job's pid (default: the calling process)")
    p.add_argument("--ttl", type=duration("--ttl"), metavar="DURATION",
                   help="start: how long the run may go without reporting its end before it counts as "
                        "abandoned (default: max runtime, else 3 periods, else 1d)")  # fmt: skip
    d = p.add_argument_group("describe")
    when = d.add_mutually_exclusive_group()
    when.add_argument("--every", metavar="DURATION", help="the job's period, e.g. 10m")
    when.add_argument("--schedule", metavar="CRON", help="the job's cron expression")
    d.add_argument("--timezone", "--tz", dest="tz", metavar="ZONE", help="IANA time zone of --schedule")
    d.add_argument("--grace", type=duration("--grace"), metavar="DURATION",
                   help="how late a start may be before the slot is missed")  # fmt: skip
    d.add_argument("--max-runtime", type=duration("--max-runtime"), metavar="DURATION",
                   help="a run open longer is stuck")  # fmt: skip
    d.add_argument("--policy", help="what a second start does: skip, allow, replace or queue")
    d.add_argument("--reason", help="one sentence: why this policy")
    add_store_flag(p)


def main_report(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.config.settings import check_name
    from cronwarden.events import Outcome
    from cronwarden.report import Reporter

    out = out or sys.stdout
    check_name(args.job, "job name")
    if args.action != "describe":
        extra = [f for f in ("every", "schedule", "tz", "grace", "max_runtime", "policy", "reason")
                 if getattr(args, f) is not None]  # fmt: skip
        if extra:
            flag = "--" + extra[0].replace("_", "-")
            raise UsageError(f"report {args.action}: {flag} belongs to report describe")
    if args.action in ("success", "fail") and not args.run_id:
        raise UsageError(f"report {args.action}: give --run-id, the id report start printed")
    store = open_store_of(args, clock)
    try:
        if args.action == "describe":
            return _describe(args, store, clock, out)
        reporter = Reporter(store, clock=clock)
        if args.action == "start":
            got = reporter.start(args.job, args.run_id, pid=args.pid, ttl=args.ttl)
            print(got.run_id, file=out)
            for rid in got.abandoned:
                print(f"cronwarden: {args.job}: run {rid} never reported its end; recorded abandoned",
                      file=sys.stderr)  # fmt: skip
            if got.overlapped:
                print(f"cronwarden: {args.job}: run {got.run_id} started while {', '.join(got.overlapped)} "
                      "still open; recorded overlap", file=sys.stderr)  # fmt: skip
            return 0
        if args.action == "success":
            code = 0 if args.exit_code is None else args.exit_code
            recorded = reporter.end(args.job, args.run_id, Outcome.SUCCEEDED, exit_code=code)
        else:
            detail = args.detail or ("" if args.exit_code is None else f"exit status {args.exit_code}")
            recorded = reporter.end(args.job, args.run_id, Outcome.FAILED, exit_code=args.exit_code,
                                    detail=detail)  # fmt: skip
        if not recorded:
            run = store.run(args.run_id)
            what = run.outcome.value if run and run.outcome else "an end"
            print(f"cronwarden: run {args.run_id} already ended ({what}); nothing recorded", file=sys.stderr)
        return 0
    finally:
        store.close()


def _describe(args: Any, store: Store, clock: Clock, out: TextIO) -> int:

    from cronwarden.events import JobInfo
    from cronwarden.policy import Policy
    from cronwarden.schedule import Schedule

    info = store.job(args.job) or JobInfo(name=args.job)
    changes: dict[str, Any] = {"updated_at": clock.wall()}
    if args.every is not None:
        sched = Schedule.every_(args.every)
        changes.update(schedule=sched.text, period=sched.every)
    elif args.schedule is not None:
        sched = Schedule.cron_(args.schedule, args.tz)
        text = f"CRON_TZ={args.tz} {sched.text}" if args.tz else sched.text
        changes.update(schedule=text, period=None)
    elif args.tz is not None:
        raise UsageError("--timezone applies to --schedule; give --schedule 'CRON' too")
    if args.grace is not None:
        changes["grace"] = args.grace
    if args.max_runtime is not None:
        changes["max_runtime"] = args.max_runtime
    if args.policy is not None:
        changes["policy"] = Policy.parse(args.policy).value
    if args.reason is not None:
        changes["reason"] = " ".join(args.reason.split())
    info = info._replace(**changes)
    store.save_job(info)
    print(f"{info.name}: schedule {info.schedule or '-'}, grace {dur(info.grace)}, max runtime "
          f"{dur(info.max_runtime)}, policy {info.policy}, reason {info.reason or '(none)'}",
          file=out)  # fmt: skip
    return 0
