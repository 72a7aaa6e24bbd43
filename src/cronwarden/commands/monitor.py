"""``cronwarden audit``, ``check``, ``monitor``, ``metrics`` and ``report``:
the monitoring half of cronwarden. None of this is on the ``cronwarden run``
path."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.commands.views import dur as _dur
from cronwarden.errors import StoreUnavailable, UsageError

if TYPE_CHECKING:
    from cronwarden.events import JobInfo
    from cronwarden.monitor import Condition, JobStats, Monitor, Pass, Thresholds
    from cronwarden.stores.base import Store


# -- shared flags -------------------------------------------------------------


def _fraction(text: str) -> float:
    """``2/3``, ``0.67`` or ``67%``."""
    t = text.strip()
    try:
        if t.endswith("%"):
            return float(t[:-1]) / 100
        if "/" in t:
            num, den = t.split("/", 1)
            return float(num) / float(den)
        return float(t)
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"--slow must be a fraction like 2/3, 0.67 or 67%, got {text!r}") from None


def _positive_int(what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.strip().isdigit() or int(text) < 1:
            raise UsageError(f"{what} must be a whole number of at least 1, got {text!r}")
        return int(text)

    parse.__name__ = what
    return parse


def _add_window_flags(p: argparse.ArgumentParser, *, rules: bool = True) -> None:
    from cronwarden.cli import add_store_flag, duration

    g = p.add_argument_group("window and thresholds")
    g.add_argument("--runs", type=_positive_int("--runs"), default=50, metavar="N",
                   help="statistics over at most the last N runs (default 50)")  # fmt: skip
    g.add_argument("--days", type=duration("--days"), default=7 * 86400.0, metavar="DURATION",
                   help="... started in the last DURATION (default 7d)")  # fmt: skip
    if rules:
        g.add_argument("--slow", type=_fraction, default=2 / 3, metavar="FRACTION",
                       help="slow when p95 ≥ FRACTION of the period (default 2/3)")  # fmt: skip
        g.add_argument("--skips", type=_positive_int("--skips"), default=3, metavar="N",
                       help="skips_in_a_row after N consecutive skipped starts (default 3)")  # fmt: skip
        g.add_argument("--min-runs", type=_positive_int("--min-runs"), default=3, metavar="N",
                       help="completed runs needed before judging durations (default 3)")  # fmt: skip
    p.add_argument(
        "--config",
        metavar="PATH",
        help="cronwarden.toml: its jobs' schedules, policies and reasons join the store's",
    )
    add_store_flag(p)


def _thresholds(args: Any) -> Thresholds:
    from cronwarden.monitor import Thresholds

    return Thresholds(
        runs=args.runs, days=args.days / 86400, slow=getattr(args, "slow", 2 / 3),
        skips_in_a_row=getattr(args, "skips", 3), min_runs=getattr(args, "min_runs", 3),
    )  # fmt: skip


def _config_jobs(args: Any) -> list[JobInfo]:
    """Jobs declared in the config file, as ``JobInfo``: the file is where a
    policy's reason is usually written."""
    try:
        config_module = importlib.import_module("cronwarden.config")
    except ImportError:  # pragma: no cover - the config module ships with cronwarden
        return []
    path = config_module.find(getattr(args, "config", None))
    if path is None:
        return []
    from cronwarden.events import JobInfo

    out = []
    for j in config_module.load(path).jobs:
        out.append(
            JobInfo(
                name=j.name, schedule=j.schedule_text(), period=j.every, policy=str(j.policy),
                reason=j.reason, ttl=j.ttl, grace=j.grace, max_runtime=j.max_runtime,
            )
        )  # fmt: skip
    return out


def _store(args: Any, clock: Clock) -> Store:
    from cronwarden.cli import store_url
    from cronwarden.stores import open_store

    return open_store(store_url(args), clock=clock)


def _monitor(args: Any, store: Store, clock: Clock) -> Monitor:
    from cronwarden.monitor import Monitor

    return Monitor(store, clock=clock, thresholds=_thresholds(args), extra_jobs=_config_jobs(args))


# -- audit --------------------------------------------------------------------

AUDIT_EPILOG = """verdicts:
  ok           p95 is at most half the period
  watch        the period is under twice the p95: a second start is possible; write the policy's reason
  at risk      p95 ≥ the slow threshold (2/3) of the period, N skips in a row, or a stuck run
  overlapping  two runs of the job were open at once in the window
  unknown      no schedule known, or too few completed runs

--strict exits 1 when a job is at risk or overlapping, or undecided (watch or worse with no
written reason), unless its policy is allow with a reason."""


def configure_audit(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Every job with its schedule, period, p50/p95/max duration, p95 as a share of the period, "
        "policy and reason, and a verdict. Read-only."
    )
    p.epilog = AUDIT_EPILOG
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when any job is at risk or undecided")
    _add_window_flags(p)


def strict_failures(stats: Any, thresholds: Thresholds) -> list[str]:
    """Why ``--strict`` fails for one job (empty: it passes)."""
    from cronwarden.monitor import Verdict

    verdict = stats.verdict(thresholds)
    decided = stats.policy == "allow" and stats.reason.strip()
    why = []
    if verdict is Verdict.AT_RISK:
        why.append("at risk")
    if verdict is Verdict.OVERLAPPING and not decided:
        why.append("overlapping")
    if stats.undecided(thresholds):
        why.append("undecided")
    return why


def audit_item(stats: JobStats, thresholds: Thresholds) -> dict[str, Any]:
    """One job as ``audit --json`` (and the dashboard's ``/api/jobs``) shows it."""
    return {**stats.as_dict(thresholds), "strict": strict_failures(stats, thresholds)}


def main_audit(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.commands.views import table

    out = out or sys.stdout
    store = _store(args, clock)
    try:
        monitor = _monitor(args, store, clock)
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
                s.job, s.schedule or "-", _dur(s.period), _dur(s.p50), _dur(s.p95), _dur(s.max),
                "-" if r is None else f"{r:.0%}", s.policy, reason, s.verdict(t).value,
                "; ".join(s.notes(t)),
            ])  # fmt: skip
        print(table(headers, rows), file=out)
    if args.strict and any(failing.values()):
        bad = [f"{job} ({', '.join(why)})" for job, why in failing.items() if why]
        print(f"cronwarden: audit --strict: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


# -- check --------------------------------------------------------------------

CHECK_EPILOG = """exit status (monitoring plugins): 0 OK, 1 WARNING, 2 CRITICAL (also for a bad flag or an
unreachable store: 'cronwarden: …' on stderr).

critical: stuck, overlap, missed, skips_in_a_row, slow with p95 ≥ the period
warning:  slow, grace_too_wide, policy_undecided

Findings that changed state are recorded in the ledger (as monitor does), so check and monitor
agree and nothing is raised twice; --dry-run records nothing."""


def configure_check(p: argparse.ArgumentParser) -> None:
    p.description = "One evaluation pass with monitoring-plugin exit codes and one line per problem."
    p.epilog = CHECK_EPILOG
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--dry-run", action="store_true", help="evaluate only; record no finding")
    _add_window_flags(p)


def condition_item(c: Condition) -> dict[str, Any]:
    """A finding that holds, as ``check --json`` (and the dashboard's ``/api/jobs``) shows it."""
    return {"severity": c.severity.name.lower(), "job": c.job, "rule": c.rule.value, "run_id": c.run_id,
            "summary": c.summary, "data": dict(c.data)}  # fmt: skip


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
    store = _store(args, clock)
    try:
        result = _monitor(args, store, clock).evaluate(record=not args.dry_run)
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
    counts = {s: sum(1 for c in result.active if c.severity is s) for s in (Severity.CRITICAL,
                                                                            Severity.WARNING)}  # fmt: skip
    if not result.active:
        return f"CRONWARDEN OK - {jobs} job{'s' * (jobs != 1)}, no problems"
    parts = [f"{n} {s.name.lower()}" for s, n in counts.items() if n]
    return f"CRONWARDEN {result.severity.name} - {', '.join(parts)} in {jobs} job{'s' * (jobs != 1)}"


# -- monitor ------------------------------------------------------------------

OUTBOX_BUDGET = 10.0
"""Seconds one pass may spend delivering the outbox to sinks."""


def configure_monitor(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli import duration

    p.description = (
        "Evaluate every job in a loop: record findings when they are raised and when they resolve, "
        "record abandoned runs, and deliver the outbox to the configured sinks."
    )
    p.add_argument("--interval", type=duration("--interval"), default=30.0, metavar="DURATION",
                   help="time between passes (default 30s)")  # fmt: skip
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    from cronwarden.commands.dashboard import address, refresh

    p.add_argument("--listen", type=address, metavar="HOST:PORT",
                   help="also serve the dashboard, its JSON API and /metrics here (see cronwarden "
                   "dashboard --help), from this process")  # fmt: skip
    p.add_argument("--refresh", type=refresh, metavar="DURATION",
                   help="with --listen: how often the pages reload (default 30s; 0: never)")  # fmt: skip
    _add_window_flags(p)


def outbox_flusher(
    store: Store, args: Any, clock: Clock, budget: float = OUTBOX_BUDGET
) -> Callable[[], int] | None:
    """A function that delivers the sinks' outboxes (issue 5, item 5:
    ``cronwarden.sinks.load_sinks`` and ``cronwarden.outbox.flush_sinks``),
    or None when no config file configures a sink. Sinks are loaded once, so
    a bad sink table stops ``monitor`` at startup, not in the loop. Each call
    spends at most ``budget`` seconds; a failing sink is reported in one line
    and its events stay in the outbox."""
    config_module = importlib.import_module("cronwarden.config")
    path = config_module.find(getattr(args, "config", None))
    if path is None:
        return None
    try:
        sinks_module = importlib.import_module("cronwarden.sinks")
        outbox = importlib.import_module("cronwarden.outbox")
    except ImportError:  # a build without sinks: nothing to deliver to
        return None
    import tomllib

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise UsageError(f"{path}: cannot read the config file: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: TOML syntax: {e}") from None
    if not sinks_module.has_sinks(doc):
        return None
    sinks = sinks_module.load_sinks(doc)

    def flush() -> int:
        results = outbox.flush_sinks(store, sinks, deadline=clock.monotonic() + budget, clock=clock)
        for r in results:
            if r.error is not None and not r.backing_off:
                print(f"cronwarden: sink {r.sink}: {r.error}; its events stay in the outbox",
                      file=sys.stderr, flush=True)  # fmt: skip
        return sum(int(r.delivered) for r in results)

    return flush


def watch(
    monitor: Monitor,
    *,
    interval: float,
    once: bool = False,
    passes: int | None = None,
    flush: Callable[[], int] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """The monitor loop: a pass, findings printed, the outbox flushed, then
    sleep ``interval`` on the monitor's clock (a ``FakeClock`` in tests).
    An unreachable store is reported and retried at the next pass."""
    out, err = out or sys.stdout, err or sys.stderr
    clock = monitor.clock
    n = 0
    while True:
        began = clock.monotonic()
        try:
            result = monitor.evaluate()
            for e in (*result.raised, *result.resolved):
                state = e.data.get("state", "")
                who = f" run {e.run_id}" if e.run_id else ""
                print(f"{_stamp(e.at)} {state} {e.job} {e.kind.value}{who}: {e.data.get('summary', '')}",
                      file=out, flush=True)  # fmt: skip
            if flush is not None:
                flush()
        except StoreUnavailable as e:
            print(f"cronwarden: {e}; retrying in {_dur(interval)}", file=err, flush=True)
            if once:
                return e.exit_code
        n += 1
        if once or (passes is not None and n >= passes):
            return 0
        clock.sleep(max(0.0, interval - (clock.monotonic() - began)))


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


class _Stop(Exception):
    """SIGTERM: the loop ends, the dashboard stops, the stores close."""


def main_monitor(args: Any, *, clock: Clock = SYSTEM_CLOCK) -> int:
    if args.listen and args.once:
        raise UsageError("--listen serves while the monitor loops: drop --once")
    if args.refresh is not None and not args.listen:
        raise UsageError("--refresh is how often the dashboard's pages reload: give --listen too")

    def stop(signum: int, frame: Any) -> None:
        raise _Stop

    store = _store(args, clock)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        monitor = _monitor(args, store, clock)
        out = open("/dev/null", "w") if args.quiet else sys.stdout  # noqa: SIM115
        try:
            flush = outbox_flusher(store, args, clock)
            with _dashboard(args, clock):
                return watch(monitor, interval=args.interval, once=args.once, out=out, flush=flush)
        finally:
            if args.quiet:
                out.close()
    except _Stop:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        store.close()


@contextlib.contextmanager
def _dashboard(args: Any, clock: Clock) -> Iterator[None]:
    """With ``--listen``: the dashboard served from a thread while the loop
    runs, on a store of its own (the loop's is used by one thread)."""
    if not args.listen:
        yield
        return
    from cronwarden.commands.dashboard import open_dashboard, request_log
    from cronwarden.web import bind, url_of

    dashboard = open_dashboard(args, clock)
    try:
        host, port = args.listen
        server = bind(dashboard, host, port, log=request_log(args))
        print(f"cronwarden monitor: dashboard on {url_of(server)}", file=sys.stderr, flush=True)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                                  name="cronwarden-dashboard", daemon=True)  # fmt: skip
        thread.start()
        try:
            yield
        finally:
            server.shutdown()
            server.server_close()
    finally:
        dashboard.close()


# -- metrics ------------------------------------------------------------------


def configure_metrics(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Prometheus text exposition of every job: runs by outcome, skips, overlaps, open runs, lease "
        "losses, duration histogram and quantiles, p95/period, queue depth, last success. "
        "Needs prometheus_client (pip install 'cronwarden[metrics]')."
    )
    _add_window_flags(p, rules=False)


def main_metrics(args: Any, *, clock: Clock = SYSTEM_CLOCK) -> int:
    from cronwarden.metrics import exposition, require_prometheus_client

    require_prometheus_client()
    store = _store(args, clock)
    try:
        text = exposition(_monitor(args, store, clock))
    finally:
        store.close()
    sys.stdout.write(text.decode())
    return 0


# -- report -------------------------------------------------------------------

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
    from cronwarden.cli import add_store_flag, duration

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
    d.add_argument("--tz", metavar="ZONE", help="time zone of --schedule")
    d.add_argument("--grace", type=duration("--grace"), metavar="DURATION",
                   help="how late a start may be before the slot is missed")  # fmt: skip
    d.add_argument("--max-runtime", type=duration("--max-runtime"), metavar="DURATION",
                   help="a run open longer is stuck")  # fmt: skip
    d.add_argument("--policy", help="what a second start does: skip, allow, replace or queue")
    d.add_argument("--reason", help="one sentence: why this policy")
    add_store_flag(p)


def main_report(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.events import Outcome
    from cronwarden.guard import check_name
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
    store = _store(args, clock)
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
        raise UsageError("--tz applies to --schedule; give --schedule 'CRON' too")
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
    print(f"{info.name}: schedule {info.schedule or '-'}, grace {_dur(info.grace)}, max runtime "
          f"{_dur(info.max_runtime)}, policy {info.policy}, reason {info.reason or '(none)'}",
          file=out)  # fmt: skip
    return 0


# -- ack ----------------------------------------------------------------------


def configure_ack(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli import add_store_flag

    p.description = (
        "Resolve a raised finding by hand: mostly a stuck run that was abandoned (its host died "
        "mid-work), which stays raised, however many runs succeed after it, until someone has looked. "
        "A finding whose condition still holds for a job (slow, missed, ...) is raised again at the "
        "next pass."
    )
    p.add_argument("--job", required=True, help="job name")
    p.add_argument("--run-id", metavar="ID", help="the run the finding is about (stuck, overlap)")
    p.add_argument("--rule", default="stuck", help="the finding's rule (default stuck)")
    p.add_argument("--by", default="", help="who looked (recorded with the acknowledgment)")
    add_store_flag(p)


def main_ack(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.guard import check_name
    from cronwarden.monitor import FINDING_KINDS, PER_RUN, Monitor

    out = out or sys.stdout
    check_name(args.job, "job name")
    rules = {k.value: k for k in FINDING_KINDS}
    rule = rules.get(args.rule)
    if rule is None:
        raise UsageError(f"--rule must be one of {', '.join(rules)}, got {args.rule!r}")
    if rule in PER_RUN and not args.run_id:
        raise UsageError(f"ack: a {rule.value} finding is about one run; give --run-id")
    store = _store(args, clock)
    try:
        monitor = Monitor(store, clock=clock)
        state = monitor.states(args.job).get((rule, args.run_id if rule in PER_RUN else None))
        if state is None or state.data.get("state", "raised") != "raised":
            what = f"{rule.value} finding for {args.job}" + (f" run {args.run_id}" if args.run_id else "")
            raise UsageError(f"ack: no raised {what}")
        monitor.acknowledge(args.job, rule, args.run_id, by=args.by)
    finally:
        store.close()
    print(
        f"acknowledged {rule.value} of {args.job}" + (f" run {args.run_id}" if args.run_id else ""), file=out
    )
    return 0
