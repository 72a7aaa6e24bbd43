"""The chaos harness, long mode: rounds of real ``cronwarden run`` processes
under injected faults, for as many guarded cycles (or as long) as asked,
then the fault table (see docs/RELIABILITY.md).

    python bench/chaos.py --store sqlite --cycles 10000
    python bench/chaos.py --store all --duration 2h --faults pause_long,kill_supervisor
    python bench/chaos.py --store redis --cycles 500 --json /tmp/redis.json

Rounds cycle through the faults the store supports (fencing on); every
``--control-every`` rounds one positive-control round runs a frozen-holder
fault with fencing off, which must find violations. Exit status: 0 when every
fenced round had no violation and every control round found some, else 1.
Only fenced cycles count towards ``--cycles``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import time
from collections import Counter
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from chaos.checkers import Distribution  # noqa: E402
from chaos.faults import PAUSES, Fault, backend  # noqa: E402
from chaos.harness import RoundConfig, RoundResult, run_round, table  # noqa: E402

from cronwarden.durations import parse_positive_duration  # noqa: E402

STORES = ("sqlite", "postgres", "redis")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/chaos.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--store", choices=[*STORES, "all"], default="sqlite")
    p.add_argument("--cycles", type=int, default=1000, help="fenced guarded runs per store (default 1000)")
    p.add_argument("--duration", help="stop each store after this long instead (e.g. 30m), whichever first")
    p.add_argument("--faults", default="all", help="comma-separated faults (default: all the store supports)")
    p.add_argument("--ttl", type=float, default=1.0, help="lease ttl in seconds (default 1)")
    p.add_argument("--faults-per-round", type=int, default=8)
    p.add_argument("--control-every", type=int, default=8, help="a positive-control round every N rounds")
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", metavar="PATH", help="write the summary as JSON here")
    return p.parse_args(argv)


def round_config(fault: Fault, args: argparse.Namespace, *, fenced: bool, seed: int | None) -> RoundConfig:
    n = args.faults_per_round if fenced else max(2, args.faults_per_round // 2)
    return RoundConfig(
        fault=fault, fenced=fenced, ttl=args.ttl, slots=args.slots,
        faults=0 if fault is Fault.NONE else n,
        min_cycles=40 if fault is Fault.NONE else 4,
        gap=(2, 5), long_share=0.25,
        long_work=4.0 if fault is Fault.STALL_SUPERVISOR else 1.5,
        timeout=max(120.0, n * args.ttl * 20), seed=seed,
    )  # fmt: skip


def summary(store: str, results: list[RoundResult], wall: float) -> dict[str, Any]:
    fenced = [r for r in results if r.config.fenced]
    control = [r for r in results if not r.config.fenced]
    take, margin, orphan = Distribution(), Distribution(), Distribution()
    per_fault: dict[str, Counter[str]] = {}
    for r in fenced:
        take.extend(r.takeover)
        margin.values.extend(m / r.config.ttl for m in r.margin.values)
        orphan.extend(r.orphan)
        c = per_fault.setdefault(r.config.fault.value, Counter())
        c["rounds"] += 1
        c["cycles"] += r.cycles
        c["injections"] += len(r.injections)
        c["violations"] += r.safety_violations
        c["late_rejected"] += r.late_rejected
        c["expectation_misses"] += len(r.expectations)
        c["lease_kept"] += r.lease_kept
        c["lease_lost"] += r.lease_lost
        c["lost_within_budget"] += r.lost_within_budget
        c["takeover_over_bound"] += len(r.takeover_over_bound)
        c.update({f"outcome:{k}": v for k, v in r.outcomes.items()})
    return {
        "store": store,
        "wall_s": round(wall, 1),
        "fenced_cycles": sum(r.cycles for r in fenced),
        "attempts": sum(r.attempts for r in results),
        "injections": sum(len(r.injections) for r in fenced),
        "violations": {k: sum(len(r.violations.get(k, [])) for r in fenced) for k in "abcdgh"},
        "violation_samples": [v for r in fenced for vs in r.violations.values() for v in vs][:20],
        "takeover_s": {
            "n": len(take.values),
            "p50": take.p(50),
            "p99": take.p(99),
            "max": max(take.values, default=None),
        },
        "stop_margin_ttl": {
            "n": len(margin.values),
            "p50": margin.p(50),
            "p1": margin.p(1),
            "min": min(margin.values, default=None),
        },
        "orphan_s": {"n": len(orphan.values), "p99": orphan.p(99), "max": max(orphan.values, default=None)},
        "per_fault": per_fault,
        "control": {
            "rounds": len(control),
            "injections": sum(len(r.injections) for r in control),
            "rounds_with_violations": sum(1 for r in control if r.found("a", "b") > 0),
            "injections_with_violations": sum(r.control_hits for r in control),
            "violations": {k: sum(len(r.violations.get(k, [])) for r in control) for k in "abc"},
        },
        "errors": [e for r in results for e in r.errors][:50],
        "expectation_samples": [e for r in fenced for e in r.expectations][:30],
    }


def run_store(store: str, args: argparse.Namespace) -> tuple[list[RoundResult], dict[str, Any]]:
    results: list[RoundResult] = []
    t0 = time.monotonic()
    limit = parse_positive_duration(args.duration, what="--duration") if args.duration else float("inf")
    with backend(store) as b:
        supported = list(b.supports)
        wanted = supported if args.faults == "all" else [Fault(f) for f in args.faults.split(",")]
        faults = [f for f in wanted if f in supported]
        if not faults:
            raise SystemExit(f"chaos: {store} supports none of {args.faults}")
        controls = itertools.cycle([f for f in PAUSES if f in faults] or [None])
        order = itertools.cycle(faults)
        seeds = itertools.count(args.seed or 0) if args.seed is not None else itertools.repeat(None)
        fenced_cycles, n = 0, 0
        while fenced_cycles < args.cycles and time.monotonic() - t0 < limit:
            n += 1
            control = next(controls) if args.control_every and n % args.control_every == 0 else None
            fault, fenced = (control, False) if control is not None else (next(order), True)
            try:
                r = run_round(b, round_config(fault, args, fenced=fenced, seed=next(seeds)))
            except Exception as e:  # a long run reports a broken round and goes on
                print(f"{store} round {n} {fault}: harness error {e!r}", flush=True)
                continue
            results.append(r)
            if fenced:
                fenced_cycles += r.cycles
            if args.json:  # after every round: a long run stopped early still leaves its numbers
                write_json(args.json, args, [summary(store, results, time.monotonic() - t0)])
            found = {k: len(v) for k, v in r.violations.items() if v}
            progress = f"[{fenced_cycles}/{args.cycles} after {time.monotonic() - t0:.0f}s]"
            print(f"{store} round {n:4d} {fault.value:17s} fence={'on ' if fenced else 'OFF'} "
                  f"cycles={r.cycles:3d} faults={len(r.injections):2d} violations={found or 0} "
                  f"misses={len(r.expectations)} errors={len(r.errors)} {r.wall:5.1f}s {progress}",
                  flush=True)  # fmt: skip
    return results, summary(store, results, time.monotonic() - t0)


def write_json(path: str, args: argparse.Namespace, summaries: list[dict[str, Any]]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        doc = {"args": vars(args), "load": os.getloadavg(), "stores": summaries}
        json.dump(doc, f, indent=2, default=str)
    os.replace(tmp, path)


def ok(s: dict[str, Any]) -> bool:
    c = s["control"]
    return sum(s["violations"].values()) == 0 and c["rounds_with_violations"] == c["rounds"]


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    # Started in the background, SIGINT may be ignored: let SIGTERM stop a long
    # run cleanly too (rounds stop their processes, private servers go away).
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    args = parse_args(argv)
    stores = STORES if args.store == "all" else (args.store,)
    everything: list[RoundResult] = []
    summaries = []
    for store in stores:
        results, s = run_store(store, args)
        everything.extend(results)
        summaries.append(s)
    print()
    print(table(everything))
    print()
    for s in summaries:
        t, m, c = s["takeover_s"], s["stop_margin_ttl"], s["control"]
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"{s['store']}: {s['fenced_cycles']} fenced cycles, {s['injections']} faults, violations "
              f"{s['violations']}, takeover p50/p99 {fmt(t['p50'])}/{fmt(t['p99'])}s, stop margin "
              f"p50/min {fmt(m['p50'])}/{fmt(m['min'])}×ttl; control: {c['rounds_with_violations']}/"
              f"{c['rounds']} rounds and {c['injections_with_violations']}/{c['injections']} faults found "
              f"violations; {s['wall_s']:.0f}s")  # fmt: skip
    if args.json:
        write_json(args.json, args, summaries)
    return 0 if all(ok(s) for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
