"""Redis through Sentinel: how many acknowledged grants a failover loses,
with and without ``wait_replicas``, and what the wait costs per grant.

Each failover trial starts a private master, one replica and three
sentinels (``tests/sentinels.py``), grants fresh keys from several threads
as fast as they go, kills the master with SIGKILL mid-stream, waits for the
promotion and counts the acknowledged grants the new master does not have.
The cost is measured on one healthy set-up: ``acquire`` with
``wait_replicas=1`` against ``acquire`` without, in interleaved rounds.

    python bench/sentinel.py             # about two minutes
    python bench/sentinel.py --quick     # about half a minute
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from cronwarden.events import Outcome  # noqa: E402
from cronwarden.stores import open_store  # noqa: E402
from cronwarden.stores.base import End, Granted, Start, Store  # noqa: E402
from sentinels import DOWN_AFTER_MS, Cluster, grants_lost_in_a_failover  # noqa: E402

WAIT = {"wait_replicas": "1", "wait_timeout": "500ms"}


def acquire(store: Store) -> float:
    s = Start(job="bench", key=f"b-{uuid.uuid4().hex}", run_id=uuid.uuid4().hex, host="bench",
              pid=os.getpid(), ttl=60.0, at=time.time())  # fmt: skip
    began = time.perf_counter()
    result = store.acquire(s)
    took = time.perf_counter() - began
    assert isinstance(result, Granted), result
    store.finish(result.lease, End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0))
    return took


def cost(base: Path, rounds: int, per_round: int) -> tuple[float, float, float]:
    """Median acquire without and with the wait (seconds), and the median of
    the per-round ratios."""
    cluster = Cluster(base)
    try:
        with open_store(cluster.url()) as plain, open_store(cluster.url(**WAIT)) as waiting:
            for store in (plain, waiting):
                acquire(store)  # scripts loaded, connections made
            ratios, a_all, b_all = [], [], []
            for i in range(rounds):
                order = [(plain, a_all), (waiting, b_all)]
                if i % 2:
                    order.reverse()
                medians = {}
                for store, into in order:
                    taken = [acquire(store) for _ in range(per_round)]
                    into.extend(taken)
                    medians[id(store)] = statistics.median(taken)
                ratios.append(medians[id(waiting)] / medians[id(plain)])
            return statistics.median(a_all), statistics.median(b_all), statistics.median(ratios)
    finally:
        cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-cost", action="store_true", help="only the failovers")
    ap.add_argument("--trials", type=int, default=None, help="failovers per setting (default 3, quick 1)")
    ap.add_argument("--threads", type=int, default=4, help="granting threads during a failover")
    ap.add_argument("--lag", type=float, default=2.0, help="seconds the replica is stopped before the kill")
    args = ap.parse_args()
    trials = args.trials or (1 if args.quick else 3)
    rounds, per_round = (4, 50) if args.quick else (10, 200)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"sentinel down-after-milliseconds {DOWN_AFTER_MS}, {args.threads} granting threads")
    with tempfile.TemporaryDirectory(prefix="cw-bench-sentinel-") as tmp:
        base = Path(tmp)
        if not args.skip_cost:
            plain, waited, ratio = cost(base / "cost", rounds, per_round)
            print(f"acquire median: {plain * 1e3:.3f} ms plain, {waited * 1e3:.3f} ms with wait_replicas=1: "
                  f"{ratio:.2f}x (median of {rounds} interleaved rounds of {per_round})")  # fmt: skip
        print("setting          replica         trial  granted  lost  kill to promoted s")
        settings = [(label, lag, params) for lag in (0.0, args.lag) for label, params in
                    (("no wait", {}), ("wait_replicas=1", WAIT))]  # fmt: skip
        for label, lag, params in settings:
            for trial in range(trials):
                cluster = Cluster(base / f"{label.replace(' ', '_')}-{lag}-{trial}")
                try:
                    measured = grants_lost_in_a_failover(cluster, threads=args.threads, lag=lag, **params)
                finally:
                    cluster.stop()
                behind = f"stopped {lag:g} s" if lag else "in sync"
                counts = f"{measured.acknowledged:>7}  {measured.lost:>4}"
                print(f"{label:<16} {behind:>14}  {trial:>5}  {counts}  {measured.promotion:>17.1f}")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
