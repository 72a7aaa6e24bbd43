"""``cronwarden config check`` and ``cronwarden config show``: the config file
as cronwarden reads it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cronwarden.config import DURATION_KEYS, Config, JobSettings, find, load, read, resolve
from cronwarden.durations import format_duration
from cronwarden.errors import UsageError, mask_password
from cronwarden.policy import Policy

WHERE = "give --config PATH, set $CRONWARDEN_CONFIG, or create ./cronwarden.toml"

POLICY_ONLY = {"max_pending": Policy.QUEUE, "replace_grace": Policy.REPLACE, "shards": Policy.ALLOW,
               "allow_unpartitioned": Policy.ALLOW}  # fmt: skip
"""Settings shown only for the policy they belong to."""

SHOWN = ("schedule", "timezone", "every", "policy", "reason", "ttl", "renew_every", "grace", "max_runtime",
         "max_pending", "replace_grace", "shards", "allow_unpartitioned", "command", "failure_threshold",
         "recovery_threshold", "maintenance")  # fmt: skip


def configure(p: argparse.ArgumentParser) -> None:
    p.usage = "cronwarden config {check,show} [--config PATH] ..."
    p.description = (
        "The config file: --config PATH, else $CRONWARDEN_CONFIG, else ./cronwarden.toml. "
        "Precedence: flags > CRONWARDEN_* environment > [jobs.NAME] > [defaults] > built-in."
    )
    sub = p.add_subparsers(dest="action", metavar="{check,show}", required=True)
    check = sub.add_parser("check", help="report every problem in the file, one per line (exit 2 if any)",
                           description="Report every problem in the config file and CRONWARDEN_* "
                           "variables at once, as PATH:LINE: message; exit 2 if there are any.")  # fmt: skip
    check.add_argument("--config", metavar="PATH", help="the file to check")
    show = sub.add_parser("show", help="the resolved settings of each job, and where each came from",
                          description="The settings each job runs with (file, environment and built-in "
                          "defaults resolved), and where each value came from.")  # fmt: skip
    show.add_argument("jobs", nargs="*", metavar="JOB", help="only these jobs (any name: shows what "
                      "cronwarden run --job NAME would use)")  # fmt: skip
    show.add_argument("--config", metavar="PATH", help="the file to read")
    show.add_argument("--json", action="store_true", help="print JSON")


def main(args: Any) -> int:
    if args.action == "check":
        return check(args)
    return show(args)


def check(args: Any) -> int:
    path = find(args.config)
    if path is None:
        raise UsageError(f"config check: no config file found; {WHERE}")
    from cronwarden.preflight import problems as preflight_problems

    config = read(path)
    # With the file's own problems, what run and scheduler would refuse
    # beyond it: the functions they call, so that "ok" means they would start.
    problems = [*config.problems, *preflight_problems(config)]
    if problems:
        for problem in problems:
            print(problem)
        n = len(problems)
        print(f"cronwarden: {n} problem{'s' if n > 1 else ''} in {path}", file=sys.stderr)
        return 2
    names = [j.name for j in config.jobs]
    jobs = f"{len(names)} job{'s' if len(names) != 1 else ''}" + (f" ({', '.join(names)})" if names else "")
    store = f", store {mask_password(config.store)}" if config.store else ""
    print(f"{path}: ok: {jobs}{store}")
    return 0


def show(args: Any) -> int:
    path = find(args.config)
    config = load(path)
    names = list(args.jobs) or [j.name for j in config.jobs]
    if args.json:
        out = {
            "config": path,
            "store": None if config.store is None else mask_password(config.store),
            "store_source": config.store_source,
            "jobs": [_json(resolve(name, config)) for name in names],
        }
        print(json.dumps(out, indent=2))
        return 0
    print(f"config: {path or f'none ({WHERE})'}")
    if config.store:
        print(f"store:  {mask_password(config.store)}  ({config.store_source})")
    if not names:
        print("no jobs in the config file")
    for name in names:
        print()
        print(_text(resolve(name, config), config))
    return 0


def _shown(job: JobSettings) -> list[str]:
    keys = []
    for key in SHOWN:
        if key in POLICY_ONLY and POLICY_ONLY[key] is not job.policy:
            continue
        if getattr(job, key) in (None, (), "") and key not in ("reason",):
            continue
        if key == "timezone" and job.schedule is None:
            continue
        if key in ("failure_threshold", "recovery_threshold") and key not in job.sources:
            continue  # the monitor's defaults: shown once set
        keys.append(key)
    return keys


def _format(key: str, value: Any) -> str:
    if value is None or value == "":
        return "-"
    if key in DURATION_KEYS or key == "every":
        return format_duration(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if key == "shards":
        return ", ".join(value)
    if key == "maintenance":
        return ", ".join(w.text for w in value)
    if key == "command":
        import shlex

        return shlex.join(value)
    return str(value)


def _text(job: JobSettings, config: Config) -> str:
    title = f"[jobs.{job.name}]" + ("" if job.in_file else "  (not in the config file: defaults)")
    rows = [(key, _format(key, getattr(job, key)), job.sources.get(key, "built-in default"))
            for key in _shown(job)]  # fmt: skip
    if job.policy is not Policy.SKIP and not job.reason:
        rows.append(("", "", "no reason given: say in one sentence why this policy"))
    width = max((len(k) for k, _, _ in rows), default=0)
    vwidth = max((len(v) for _, v, _ in rows), default=0)
    lines = [title]
    lines += [f"  {k.ljust(width)}  {v.ljust(vwidth)}  {s}".rstrip() for k, v, s in rows]
    return "\n".join(lines)


def _json(job: JobSettings) -> dict[str, Any]:
    settings = {key: getattr(job, key) for key in SHOWN}
    settings["policy"] = job.policy.value
    for key in ("shards", "command"):
        settings[key] = list(settings[key])
    settings["maintenance"] = [w.text for w in job.maintenance]
    return {
        "name": job.name,
        "in_file": job.in_file,
        "settings": settings,
        "sources": {key: job.sources.get(key, "default") for key in SHOWN},
    }
