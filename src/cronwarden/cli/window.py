"""The flags and set-up shared by the commands that read the monitor
(``audit``, ``check``, ``metrics``, ``monitor``, ``dashboard``): the window
and thresholds, the config file's jobs, the store and the ``Monitor``."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cronwarden.clock import Clock
from cronwarden.errors import UsageError

if TYPE_CHECKING:
    from cronwarden.events import JobInfo
    from cronwarden.monitor import JobRules, Monitor, Thresholds
    from cronwarden.stores.base import Store


SLOW_RANGE = "greater than 0 and at most 1 (the whole period)"
"""What ``--slow`` accepts: at p95 ≥ the period a job is already critical
(``slow`` with p95 ≥ the period), so a larger fraction could never warn."""


def _fraction(text: str) -> float:
    """``2/3``, ``0.67`` or ``67%``, of the period."""
    t = text.strip()
    try:
        if t.endswith("%"):
            value = float(t[:-1]) / 100
        elif "/" in t:
            num, den = t.split("/", 1)
            value = float(num) / float(den)
        else:
            value = float(t)
    except (ValueError, ZeroDivisionError):
        value = math.nan
    if not 0 < value <= 1:
        raise UsageError(f"--slow must be a fraction of the period like 2/3, 0.67 or 67%, {SLOW_RANGE}, "
                         f"got {text!r}")  # fmt: skip
    return value


def count_flag(what: str, most: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number from 1 to ``most``."""

    def parse(text: str) -> int:
        if not text.strip().isdigit() or not 1 <= int(text) <= most:
            raise UsageError(f"{what} must be a whole number from 1 to {most}, got {text!r}")
        return int(text)

    parse.__name__ = what
    return parse


MOST_RUNS = 100_000
"""The largest window in runs: more is a mistake (each is read from the store)."""


def add_window_flags(p: argparse.ArgumentParser, *, rules: bool = True) -> None:
    from cronwarden.cli.args import add_store_flag, duration

    g = p.add_argument_group("window and thresholds")
    g.add_argument("--runs", type=count_flag("--runs", MOST_RUNS), default=50, metavar="N",
                   help="statistics over at most the last N runs (default 50)")  # fmt: skip
    g.add_argument("--days", type=duration("--days"), default=7 * 86400.0, metavar="DURATION",
                   help="... started in the last DURATION (default 7d)")  # fmt: skip
    if rules:
        g.add_argument("--slow", type=_fraction, default=2 / 3, metavar="FRACTION",
                       help="slow when p95 ≥ FRACTION of the period (default 2/3)")  # fmt: skip
        g.add_argument("--skips", type=count_flag("--skips", 10_000), default=3, metavar="N",
                       help="skips_in_a_row after N consecutive skipped starts (default 3)")  # fmt: skip
        g.add_argument("--min-runs", type=count_flag("--min-runs", MOST_RUNS), default=3, metavar="N",
                       help="completed runs needed before judging durations (default 3)")  # fmt: skip
    p.add_argument(
        "--config",
        metavar="PATH",
        help="cronwarden.toml: its jobs' schedules, policies and reasons join the store's",
    )
    add_store_flag(p)


def thresholds(args: Any) -> Thresholds:
    from cronwarden.monitor import Thresholds

    return Thresholds(
        runs=args.runs, days=args.days / 86400, slow=getattr(args, "slow", 2 / 3),
        skips_in_a_row=getattr(args, "skips", 3), min_runs=getattr(args, "min_runs", 3),
    )  # fmt: skip


def config_jobs(args: Any) -> list[JobInfo]:
    """Jobs declared in the config file, as ``JobInfo``: the file is where a
    policy's reason is usually written."""
    return _from_config(args)[0]


def _from_config(args: Any) -> tuple[list[JobInfo], dict[str, JobRules], JobRules | None]:
    """The config file's jobs, their monitoring settings, and those of
    ``[defaults]`` (for jobs the file does not name)."""
    from cronwarden.config import find, load
    from cronwarden.events import JobInfo
    from cronwarden.monitor import JobRules

    path = find(getattr(args, "config", None))
    if path is None:
        return [], {}, None
    config = load(path)
    jobs = []
    rules: dict[str, JobRules] = {}
    for j in config.jobs:
        jobs.append(
            JobInfo(
                name=j.name, schedule=j.schedule_text(), period=j.every, policy=str(j.policy),
                reason=j.reason, ttl=j.ttl, grace=j.grace, max_runtime=j.max_runtime,
            )
        )  # fmt: skip
        rules[j.name] = JobRules(
            failure_threshold=j.failure_threshold,
            recovery_threshold=j.recovery_threshold,
            maintenance=j.maintenance,
        )
    d = config.defaults
    default = JobRules(failure_threshold=d.get("failure_threshold", 1),
                       recovery_threshold=d.get("recovery_threshold", 1),
                       maintenance=tuple(d.get("maintenance", ())))  # fmt: skip
    return jobs, rules, default


def open_store_of(args: Any, clock: Clock, *, existing: bool = False) -> Store:
    """``args``' store; with ``existing``, for a command that only reads it,
    a SQLite file that does not exist is an error, not a new empty ledger,
    and one cronwarden cannot write is opened read-only."""
    from cronwarden.cli.args import existing_store_url, store_url
    from cronwarden.stores import open_store

    if existing:
        return open_store(existing_store_url(args), clock=clock, read_only=True)
    return open_store(store_url(args), clock=clock)


def open_monitor(args: Any, store: Store, clock: Clock) -> Monitor:
    from cronwarden.monitor import Monitor

    jobs, rules, default = _from_config(args)
    return Monitor(store, clock=clock, thresholds=thresholds(args), extra_jobs=jobs, job_rules=rules,
                   default_rules=default)  # fmt: skip
