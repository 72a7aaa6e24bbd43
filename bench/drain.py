"""How fast a backlog drains to a slow receiver, against the receiver's own
pace measured in the same run.

A loopback HTTP receiver answers each request after ``--delay`` seconds
(the floor: one request at a time, back to back, is ``1 / delay`` events a
second, and ``concurrency / delay`` for that many at once). A SQLite store
holds ``--events`` events; flushes with a budget of ``--budget`` seconds
each drain it through a webhook sink. Printed per case: the events each
flush delivered, the rate against the floor, and the repeats (events the
receiver got more than once: at most one per request in flight at a
flush's deadline, so up to ``concurrency`` per flush).

Cases: one job (each job's events go one at a time, so concurrency does
not help), and eight jobs with concurrency 1 and 4.

    python bench/drain.py [--delay 0.1] [--events 150] [--budget 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.receivers import Receiver

from cronwarden.clock import SYSTEM_CLOCK
from cronwarden.events import Event, EventKind
from cronwarden.outbox import flush_sinks
from cronwarden.sinks import load_sinks
from cronwarden.stores.sqlite import SqliteStore


def case(delay: float, events: int, budget: float, jobs: int, concurrency: int) -> dict[str, object]:
    receiver = Receiver(delay=delay)
    with tempfile.TemporaryDirectory() as d, SqliteStore(os.path.join(d, "s.db")) as store:
        assert store.undelivered("hook", 1, backfill=0) == []
        for i in range(events):
            store.record(Event(kind=EventKind.SUCCEEDED, job=f"job{i % jobs}", at=time.time()))
        [sink] = load_sinks({"sinks": {"hook": {"type": "webhook", "url": receiver.url(), "secret": "x",
                                                "concurrency": concurrency}}})  # fmt: skip
        per_flush, began = [], time.monotonic()
        while store.undelivered("hook", 1) and len(per_flush) < 100:
            [r] = flush_sinks(store, [sink], deadline=SYSTEM_CLOCK.monotonic() + budget)
            per_flush.append(r.delivered)
        took = time.monotonic() - began
    receiver.stop()
    ids = Counter(q.headers["X-Cronwarden-Event-Id"] for q in receiver.requests)
    lanes = min(jobs, concurrency)
    return {
        "case": f"{jobs} job{'s' if jobs > 1 else ''}, concurrency {concurrency}",
        "flushes": len(per_flush),
        "per flush": per_flush,
        "rate": events / took,
        "floor": lanes / delay,
        "repeats": sum(n - 1 for n in ids.values()),
        "missing": events - len(ids),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--delay", type=float, default=0.1)
    p.add_argument("--events", type=int, default=150)
    p.add_argument("--budget", type=float, default=3.0)
    p.add_argument("--quick", action="store_true", help="40 events, 1 s budgets")
    args = p.parse_args()
    events, budget = (40, 1.0) if args.quick else (args.events, args.budget)
    print(f"receiver: {args.delay}s per event; {events} events; flush budget {budget}s")
    head = ("case", "flushes", "rate/s", "floor/s", "ratio", "repeats", "missing")
    print(f"{head[0]:26} " + " ".join(f"{h:>{w}}" for h, w in zip(head[1:], (7, 8, 8, 6, 7, 7), strict=True))
          + "  per flush")  # fmt: skip
    for jobs, concurrency in ((1, 4), (8, 1), (8, 4)):
        r = case(args.delay, events, budget, jobs, concurrency)
        ratio = float(r["rate"]) / float(r["floor"])  # type: ignore[arg-type]
        print(f"{r['case']:26} {r['flushes']:>7} {r['rate']:>8.1f} {r['floor']:>8.1f} {ratio:>6.2f} "
              f"{r['repeats']:>7} {r['missing']:>7}  {r['per flush']}")  # fmt: skip


if __name__ == "__main__":
    main()
