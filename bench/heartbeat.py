"""One process holding many leases: does its heartbeat keep every one?

For each server store (PostgreSQL, Redis), one process takes ``--leases``
leases (10,000 by default) at ttl 10 s and holds them on one
``HeartbeatThread``, as a scheduler or a worker holding many runs does: each
lease's heartbeat is started as soon as it is granted, and the thread renews
every lease of the store that is due in one ``Store.renew_many`` round trip.
After one renew interval of warm-up it measures, over ``--seconds`` (120 by
default):

- renewals achieved per second against those needed (leases / renew
  interval): the target is at least 0.99x, with **0 lost** (a heartbeat
  declared lost, or no longer believed, at the end; and a sample of the
  leases read back from the store, each still its holder's);
- the process's CPU per renewal, against the same measurement with 100
  leases in the same run: the target is at most 1.5x (the cost of a renewal
  does not grow with the leases held);
- one ``renew_many`` of 1,000 due leases against one ``renew`` of one lease
  (medians, same store, same leases): the target is at most 5x.

Leases are taken by a few helper threads, each with a store of its own (the
grants are not what is measured); the renewals all go through the one store
the heartbeats were given. Every lease lives under a fresh schema or prefix,
dropped at the end. The servers are ``$CRONWARDEN_TEST_POSTGRES`` and
``$CRONWARDEN_TEST_REDIS`` (defaults ``postgresql://postgres@127.0.0.1:5432/test``
and ``redis://127.0.0.1:6379/0``).

    python bench/heartbeat.py                 # about 10 minutes
    python bench/heartbeat.py --quick         # 2,000 leases, 15 s each: about 2 minutes
    python bench/heartbeat.py --stores redis  # one store
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from cronwarden.clock import SYSTEM_CLOCK
from cronwarden.events import new_id
from cronwarden.lease import Heartbeat, HeartbeatThread, Lease, renew_interval
from cronwarden.stores import open_store
from cronwarden.stores.base import Granted, Start, Store
from namespaces import cleanup, url_for

TTL = 10.0
TAKERS = 4
"""Helper threads (each with its own store) that take the leases."""
SAMPLE = 200
"""Leases read back from the store at the end."""


class Held(NamedTuple):
    leases: int
    seconds: float
    achieved: float
    """Renewals per second over the window."""
    needed: float
    lost: int
    cpu_per_renewal: float
    """Seconds of this process's CPU per renewal over the window."""
    batches: int
    """renew_many calls over the window."""


class Counting:
    """The store the heartbeats renew through, with its ``renew_many`` calls
    counted (a count, no other change)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls = 0

    def renew_many(self, leases: list[Lease]) -> list[object]:  # the Renews protocol
        self.calls += 1
        return self.store.renew_many(leases)  # type: ignore[return-value]


def take(url: str, n: int, prefix: str, start_beat: Callable[[Lease, float], None]) -> None:
    """Grant ``n`` leases from ``TAKERS`` threads; each one's heartbeat is
    started as soon as it is granted."""

    def taker(part: range) -> None:
        with open_store(url) as store:
            for i in part:
                sent = SYSTEM_CLOCK.monotonic()
                key = f"{prefix}{i}"
                s = Start(
                    job=key, key=key, run_id=new_id(), host="bench", pid=os.getpid(), ttl=TTL, at=time.time()
                )
                result = store.acquire(s)
                assert isinstance(result, Granted), result
                start_beat(result.lease, sent)

    step = (n + TAKERS - 1) // TAKERS
    with ThreadPoolExecutor(TAKERS) as pool:
        for f in [pool.submit(taker, range(i, min(n, i + step))) for i in range(0, n, step)]:
            f.result()


def hold(url: str, n: int, seconds: float, prefix: str) -> tuple[Held, list[Lease], Store]:
    """Hold ``n`` leases for ``seconds`` after a warm-up; returns the
    measurement, the leases and the store (heartbeats stopped)."""
    store = open_store(url)
    counting = Counting(store)
    thread = HeartbeatThread(name=f"bench-heartbeat-{n}")
    beats: list[Heartbeat] = []
    lock = threading.Lock()

    def start_beat(lease: Lease, sent: float) -> None:
        hb = Heartbeat(
            store=counting, lease=lease, ttl=TTL, clock=SYSTEM_CLOCK, started_at=sent, thread=thread
        )
        hb.start(lease.key)
        with lock:
            beats.append(hb)

    t = time.monotonic()
    take(url, n, prefix, start_beat)
    print(f"  {n} leases granted in {time.monotonic() - t:.1f}s", flush=True)
    time.sleep(renew_interval(TTL))  # warm-up: every lease renewed once
    r0, c0, cpu0, t0 = sum(b.renewals for b in beats), counting.calls, time.process_time(), time.monotonic()
    time.sleep(seconds)
    r1, c1, cpu1, t1 = sum(b.renewals for b in beats), counting.calls, time.process_time(), time.monotonic()
    now = SYSTEM_CLOCK.monotonic()
    lost = sum(1 for b in beats if not b.believed(now))
    for b in beats:
        b.stop()
    thread.close()
    leases = [b.lease for b in beats if b.lease is not None]
    step = max(1, len(leases) // SAMPLE)
    for lease in leases[::step]:
        info = store.lease(lease.key)
        if info is None or info.owner != lease.run_id or not info.expires_in or info.expires_in <= 0:
            lost += 1
    renewals = max(1, r1 - r0)
    held = Held(
        leases=n,
        seconds=t1 - t0,
        achieved=(r1 - r0) / (t1 - t0),
        needed=n / renew_interval(TTL),
        lost=lost,
        cpu_per_renewal=(cpu1 - cpu0) / renewals,
        batches=c1 - c0,
    )
    return held, leases, store


def median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench(name: str, leases: int, seconds: float, small_seconds: float) -> bool:
    unique = uuid.uuid4().hex[:10]
    url = url_for(name, unique)
    ok = True
    try:
        print(f"{name}: {leases} leases at ttl {TTL:g}s for {seconds:g}s", flush=True)
        big, held, store = hold(url, leases, seconds, "big-")
        batch = held[:1000]  # still live: their heartbeats stopped just now
        one = median_time(lambda: store.renew(batch[0]), 200)
        many = median_time(lambda: store.renew_many(batch), 20)
        store.close()
        print(f"{name}: 100 leases at ttl {TTL:g}s for {small_seconds:g}s", flush=True)
        small, _, small_store = hold(url, 100, small_seconds, "small-")
        small_store.close()
    finally:
        cleanup(name, unique)

    print(f"\n{name:8} leases  renewals/s  needed/s  achieved/needed  lost  CPU/renewal  per batch")
    for h in (big, small):
        per_batch = (h.achieved * h.seconds) / max(1, h.batches)
        print(f"  {'':6} {h.leases:6d} {h.achieved:11.0f} {h.needed:9.0f} {h.achieved / h.needed:16.3f}"
              f" {h.lost:5d} {h.cpu_per_renewal * 1e6:9.1f} µs {per_batch:10.0f}")  # fmt: skip
    cpu_ratio = big.cpu_per_renewal / small.cpu_per_renewal
    rate = big.achieved / big.needed
    print(f"  achieved/needed at {big.leases}: {rate:.3f} (target >= 0.99); lost: {big.lost} (target 0)")
    print(f"  CPU per renewal, {big.leases} vs 100 leases: {cpu_ratio:.2f}x (target <= 1.5x)")
    print(f"  renew_many of {len(batch)} due leases: {many * 1e3:.2f} ms; one renew: {one * 1e3:.3f} ms; "
          f"ratio {many / one:.1f}x (target <= 5x)\n")  # fmt: skip
    ok = rate >= 0.99 and big.lost == 0 and cpu_ratio <= 1.5
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2,000 leases, 15 s each (a smoke run)")
    ap.add_argument("--leases", type=int, help="leases the process holds (default 10,000)")
    ap.add_argument("--seconds", type=float, help="measured window (default 120 s, quick 15 s)")
    ap.add_argument("--stores", default="postgres,redis", help="comma-separated: postgres, redis")
    args = ap.parse_args()
    leases = args.leases or (2000 if args.quick else 10_000)
    seconds = args.seconds or (15.0 if args.quick else 120.0)
    small_seconds = min(seconds, 15.0 if args.quick else 60.0)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n", flush=True)
    results = {name: bench(name, leases, seconds, small_seconds) for name in args.stores.split(",")}
    print(
        "renewal targets (rate, lost, CPU ratio) met:",
        ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in results.items()),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
