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

Effects mode (``--effects``, see chaos/effects.py): the runs increment a
counter in a PostgreSQL table and a Redis hash through ``cronwarden.fence``
instead of writing to the referee, under the frozen-holder faults only; the
lease store is ``--store`` (on the test servers, a schema or key prefix per
round). ``--control`` runs the positive control alone (helpers bypassed).

    python bench/chaos.py --effects --store postgres --cycles 1000 --json pg-effects.json
    python bench/chaos.py --effects --control --store redis --cycles 100
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
from typing import TYPE_CHECKING, Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from chaos.checkers import Distribution, percentile  # noqa: E402
from chaos.faults import PAUSES, Fault, backend  # noqa: E402
from chaos.harness import RoundConfig, RoundResult, run_round, table  # noqa: E402

if TYPE_CHECKING:
    from chaos.effects import EffectsResult

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
    p.add_argument(
        "--effects",
        action="store_true",
        help="runs write to PostgreSQL and Redis through cronwarden.fence (frozen-holder faults)",
    )
    p.add_argument("--control", action="store_true",
                   help="with --effects: only positive-control rounds (the helpers bypassed)")  # fmt: skip
    p.add_argument("--json", metavar="PATH", help="write the summary as JSON here (after every round)")
    p.add_argument(
        "--report",
        nargs="+",
        metavar="JSON",
        help="only print the tables of earlier --json files; runs of the same store "
        "(e.g. several seeds side by side) are added up",
    )
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


def _fault_summary(rs: list[RoundResult]) -> dict[str, Any]:
    take, margin, orphan = Distribution(), Distribution(), Distribution()
    c: Counter[str] = Counter()
    for r in rs:
        take.extend(r.takeover)
        margin.values.extend(m / r.config.ttl for m in r.margin.values)
        orphan.extend(r.orphan)
        c["rounds"] += 1
        c["cycles"] += r.cycles
        c["attempts"] += r.attempts
        c["injections"] += len(r.injections)
        c["writes"] += r.writes
        c["rejected"] += r.rejected
        c["late_rejected"] += r.late_rejected
        c["expectation_misses"] += len(r.expectations)
        c["lease_kept"] += r.lease_kept
        c["lease_lost"] += r.lease_lost
        c["lost_within_budget"] += r.lost_within_budget
        c["takeover_over_bound"] += len(r.takeover_over_bound)
        c["control_hits"] += r.control_hits
        c["rounds_with_ab"] += r.found("a", "b") > 0
        c["tracebacks"] += len(r.tracebacks)
        c.update({f"outcome:{k}": v for k, v in r.outcomes.items()})
        c.update({f"violations:{k}": len(v) for k, v in r.violations.items()})
    return {
        "counts": dict(c),
        "takeover_s": take.values,
        "takeover_bound_s": [r.takeover_bound for r in rs if r.takeover.values],
        "stop_margin_ttl": margin.values,
        "orphan_s": orphan.values,
        "expectations": [e for r in rs for e in r.expectations],
    }


def summary(store: str, results: list[RoundResult], wall: float) -> dict[str, Any]:
    """Counts and the raw measurements, per fault; ``--report`` turns them into tables."""
    out: dict[str, Any] = {"store": store, "wall_s": round(wall, 1), "fenced": {}, "control": {}}
    for fenced, key in ((True, "fenced"), (False, "control")):
        groups: dict[str, list[RoundResult]] = {}
        for r in results:
            if r.config.fenced is fenced:
                groups.setdefault(r.config.fault.value, []).append(r)
        out[key] = {fault: _fault_summary(rs) for fault, rs in groups.items()}
    fenced_rs = [r for r in results if r.config.fenced]
    out["fenced_cycles"] = sum(r.cycles for r in fenced_rs)
    out["injections"] = sum(len(r.injections) for r in fenced_rs)
    out["violations"] = {k: sum(len(r.violations.get(k, [])) for r in fenced_rs) for k in "abcdgh"}
    out["violation_samples"] = [v for r in fenced_rs for vs in r.violations.values() for v in vs][:20]
    out["errors"] = [e for r in results for e in r.errors][:50]
    out["tracebacks"] = [t for r in results for t in r.tracebacks][:20]
    out["expectation_samples"] = [e for r in fenced_rs for e in r.expectations][:30]
    return out


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


def _load(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return list(json.load(f)["stores"])


def write_json(path: str, args: argparse.Namespace, summaries: list[dict[str, Any]]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        doc = {"args": vars(args), "load": os.getloadavg(), "stores": summaries}
        json.dump(doc, f, indent=2, default=str)
    os.replace(tmp, path)


def ok(s: dict[str, Any]) -> bool:
    """No violation with fencing; violations in every control round without."""
    controls = [f["counts"] for f in s["control"].values()]
    return sum(s["violations"].values()) == 0 and all(c["rounds_with_ab"] == c["rounds"] for c in controls)


def _p(values: list[float], q: float) -> str:
    v = percentile(values, q)
    return "-" if v is None else f"{v:.2f}"


def report(summaries: list[dict[str, Any]]) -> str:
    """The fault table and the positive control, in Markdown."""
    lines = [
        "| store | fault | cycles | faults | violations a/b/c/d/g/h | takeover p50 / p99 / max (s) "
        "| stop margin p50 / min (×ttl) | outcomes |",
        "|---|---|---:|---:|---|---|---|---|",
    ]
    for s in summaries:
        for fault, f in s["fenced"].items():
            c = f["counts"]
            v = "/".join(str(c.get(f"violations:{k}", 0)) for k in "abcdgh")
            take = f["takeover_s"]
            t = "-" if not take else f"{_p(take, 50)} / {_p(take, 99)} / {max(take):.2f}"
            m = f["stop_margin_ttl"]
            margin = "-" if not m else f"{_p(m, 50)} / {min(m):.2f}"
            outcomes = ", ".join(
                f"{k.split(':')[1]} {n}" for k, n in sorted(c.items()) if k.startswith("outcome:")
            )
            notes = []
            if c.get("late_rejected"):
                notes.append(f"late ops refused {c['late_rejected']}")
            if fault == "pause_short":
                notes.append(f"lease kept {c['lease_kept']}/{c['injections']}, lost within budget "
                             f"{c['lost_within_budget']}")  # fmt: skip
            if f["orphan_s"]:
                notes.append(f"child gone after p99 {_p(f['orphan_s'], 99)}s")
            if c.get("takeover_over_bound"):
                notes.append(f"takeovers over the bound {c['takeover_over_bound']}")
            said = "; ".join([outcomes, *notes])
            lines.append(f"| {s['store']} | {fault} | {c['cycles']} | {c['injections']} | {v} | {t} "
                         f"| {margin} | {said} |")  # fmt: skip
    lines += ["", "| store | fault (fencing off) | rounds | faults | faults that produced a violation "
              "| violations a/b/c |", "|---|---|---:|---:|---:|---|"]  # fmt: skip
    for s in summaries:
        for fault, f in s["control"].items():
            c = f["counts"]
            v = "/".join(str(c.get(f"violations:{k}", 0)) for k in "abc")
            lines.append(
                f"| {s['store']} | {fault} | {c['rounds']} | {c['injections']} | {c['control_hits']} | {v} |"
            )
    return "\n".join(lines)


def merge(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per store: runs of the same store (e.g. several seeds run
    side by side) add up — counts are summed, measurements concatenated."""
    merged: dict[str, dict[str, Any]] = {}
    for s in summaries:
        into = merged.get(s["store"])
        if into is None:
            merged[s["store"]] = json.loads(json.dumps(s))  # a deep copy
            continue
        into["wall_s"] = max(into["wall_s"], s["wall_s"])
        for key in ("fenced_cycles", "injections"):
            into[key] += s[key]
        for k, n in s["violations"].items():
            into["violations"][k] = into["violations"].get(k, 0) + n
        for key in ("violation_samples", "errors", "tracebacks", "expectation_samples"):
            into[key] = into[key] + s[key]
        for part in ("fenced", "control"):
            for fault, f in s[part].items():
                mine = into[part].setdefault(fault, {k: type(v)() for k, v in f.items()})
                for k, v in f.items():
                    if k == "counts":
                        for name, n in v.items():
                            mine["counts"][name] = mine["counts"].get(name, 0) + n
                    else:
                        mine[k] = mine[k] + v
    return list(merged.values())


def run_effects_store(store: str, args: argparse.Namespace) -> dict[str, Any]:
    """Effects rounds on one lease store: the frozen-holder faults in turn,
    fenced (a control round every ``--control-every``), or only the control
    with ``--control``; until ``--cycles`` cycles (fenced ones, or control
    ones with ``--control``) or ``--duration``."""
    from chaos.effects import effects_config, lease_backend, run_effects_round

    results: list[EffectsResult] = []
    t0 = time.monotonic()
    limit = parse_positive_duration(args.duration, what="--duration") if args.duration else float("inf")
    faults = [Fault(f) for f in args.faults.split(",")] if args.faults != "all" else list(PAUSES)
    bad = [f for f in faults if f not in PAUSES]
    if bad:
        raise SystemExit(f"chaos: --effects injects {', '.join(PAUSES)}; got {', '.join(bad)}")
    order = itertools.cycle(faults)
    seeds = itertools.count(args.seed) if args.seed is not None else itertools.repeat(None)
    counted, n = 0, 0
    with lease_backend(store) as b:
        while counted < args.cycles and time.monotonic() - t0 < limit:
            n += 1
            fenced = not args.control and not (args.control_every and n % args.control_every == 0)
            fault = next(order)
            n_faults = args.faults_per_round if fenced else max(2, args.faults_per_round // 2)
            config = effects_config(fault, fenced=fenced, ttl=args.ttl, faults=n_faults, seed=next(seeds))
            # Longer gaps than the referee mode: a cycle here costs a worker with two
            # database clients, so fewer pauses per cycle keep a long run to minutes.
            config.slots, config.gap, config.long_share = args.slots, (6, 10), 0.2
            config.timeout = max(120.0, n_faults * 30 * args.ttl)  # up to 10 clean cycles and a pause a fault
            try:
                r = run_effects_round(b, config)
            except Exception as e:  # a long run reports a broken round and goes on
                print(f"{store} effects round {n} {fault}: harness error {e!r}", flush=True)
                continue
            results.append(r)
            if fenced != args.control:
                counted += r.cycles
            summary = effects_summary(store, results, time.monotonic() - t0)
            if args.json:
                write_json(args.json, args, [summary])
            found = {k: len(v) for k, v in r.violations.items() if v}
            print(f"{store} effects round {n:4d} {fault.value:17s} fence={'on ' if fenced else 'OFF'} "
                  f"cycles={r.cycles:3d} faults={len(r.injections):2d} late fenced={r.late_fenced:2d} "
                  f"violations={found or 0} misses={len(r.expectations)} errors={len(r.errors)} "
                  f"{r.wall:5.1f}s [{counted}/{args.cycles} after {time.monotonic() - t0:.0f}s]",
                  flush=True)  # fmt: skip
    return effects_summary(store, results, time.monotonic() - t0)


def effects_summary(store: str, results: list[EffectsResult], wall: float) -> dict[str, Any]:
    out: dict[str, Any] = {"store": store, "effects": True, "wall_s": round(wall, 1)}
    for fenced, key in ((True, "fenced"), (False, "control")):
        rs = [r for r in results if r.config.fenced is fenced]
        c: Counter[str] = Counter()
        for r in rs:
            c["rounds"] += 1
            c["cycles"] += r.cycles
            c["injections"] += len(r.injections)
            c["late_fenced"] += r.late_fenced
            c["control_hits"] += r.control_hits
            c["rounds_with_violations"] += r.found("a", "b", "c") > 0
            c["expectation_misses"] += len(r.expectations)
            c["errors"] += len(r.errors) + len(r.db_errors)
            c["tracebacks"] += len(r.tracebacks)
            c.update({f"violations:{k}": len(v) for k, v in r.violations.items()})
            for target in r.increments:
                c[f"{target}:final"] += r.increments[target]
                c[f"{target}:recorded"] += r.recorded[target]
                c[f"{target}:acknowledged"] += r.acknowledged[target]
                c[f"{target}:fenced"] += r.fenced[target]
        out[key] = dict(c)
        out[f"{key}_samples"] = {
            "violations": [v for r in rs for vs in r.violations.values() for v in vs][:20],
            "expectations": [e for r in rs for e in r.expectations][:20],
            "errors": [e for r in rs for e in (*r.errors, *r.db_errors)][:20],
            "tracebacks": [t for r in rs for t in r.tracebacks][:5],
        }
    return out


def effects_ok(s: dict[str, Any]) -> bool:
    """No violation with fencing; a violation in every control round."""
    f, c = s["fenced"], s["control"]
    clean = sum(n for k, n in f.items() if k.startswith("violations:")) == 0
    return clean and c.get("rounds_with_violations", 0) == c.get("rounds", 0)


def effects_report(summaries: list[dict[str, Any]]) -> str:
    lines = [
        "| lease store | cycles | pauses | late writes refused (Fenced) | increments PostgreSQL / Redis "
        "(final = recorded; acknowledged) | violations a/b/c/d/g/h | control rounds: pauses, found |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for s in summaries:
        f, c = s["fenced"], s["control"]
        incr = " / ".join(
            f"{f.get(f'{t}:final', 0)} = {f.get(f'{t}:recorded', 0)}; {f.get(f'{t}:acknowledged', 0)}"
            for t in ("postgres", "redis")
        )
        v = "/".join(str(f.get(f"violations:{k}", 0)) for k in "abcdgh")
        cv = "/".join(str(c.get(f"violations:{k}", 0)) for k in "abc")
        control = (f"{c.get('rounds', 0)}: {c.get('injections', 0)} pauses, {c.get('control_hits', 0)} "
                   f"caught (a/b/c {cv})")  # fmt: skip
        lines.append(f"| {s['store']} | {f.get('cycles', 0)} | {f.get('injections', 0)} | "
                     f"{f.get('late_fenced', 0)} | {incr} | {v} | {control} |")  # fmt: skip
    return "\n".join(lines)


def effects_main(args: argparse.Namespace) -> int:
    stores = STORES if args.store == "all" else (args.store,)
    summaries = [run_effects_store(store, args) for store in stores]
    print()
    print(effects_report(summaries))
    if args.json:
        write_json(args.json, args, summaries)
    return 0 if all(effects_ok(s) for s in summaries) else 1


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    # Started in the background, SIGINT may be ignored: let SIGTERM stop a long
    # run cleanly too (rounds stop their processes, private servers go away).
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    args = parse_args(argv)
    if args.control and not args.effects:
        print("chaos: --control goes with --effects (the long mode's controls are --control-every)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.report and any(s.get("effects") for path in args.report for s in _load(path)):
        summaries = [s for path in args.report for s in _load(path)]
        print(effects_report(summaries))
        return 0 if all(effects_ok(s) for s in summaries) else 1
    if args.effects:
        return effects_main(args)
    if args.report:
        summaries = []
        for path in args.report:
            with open(path) as f:
                summaries.extend(json.load(f)["stores"])
        summaries = merge(summaries)
        for s in summaries:
            print(f"{s['store']}: {s['fenced_cycles']} fenced cycles, {s['injections']} faults injected")
        print()
        print(report(summaries))
        return 0 if all(ok(s) for s in summaries) else 1
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
    print(report(summaries))
    if args.json:
        write_json(args.json, args, summaries)
    return 0 if all(ok(s) for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
