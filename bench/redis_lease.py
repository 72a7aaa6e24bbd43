"""The Redis store's lease cycles against the floor of raw redis-py: ``SET key
owner NX PX ttl`` then a Lua compare-and-delete, on a kept connection.

Issue 3's targets, measured in the same run:

- (b) bare lease acquire+release <= 1.15x the floor. The store has no
  ledger-free path: ``acquire`` always writes the run and ``started`` (or the
  refusal), ``finish`` the terminal record, each in its one Lua call. So (b)
  is measured as ``store.acquire`` + ``store.finish``, the same cycle as (c).
- (c) a full guarded cycle (acquire + ``started`` + terminal record +
  release) through the store <= 1.3x; also through the library,
  ``Warden(store).guard()`` enter/exit, which adds the heartbeat thread.
- contended: 4 processes on one key for 5 s each way, successful guarded
  cycles per second >= 0.85x raw ``SET NX PX`` + compare-and-delete cycles per
  second (the same 4-process setup; a refused store start records ``skipped``).

A reference row shows ``SET NX PX`` + ``INCR`` of a fencing counter in one Lua
call, i.e. what a bare fenced lease would cost.

Every key is under a fresh prefix, deleted at the end. The server is
``$CRONWARDEN_TEST_REDIS`` (default ``redis://127.0.0.1:6379/0``).

    python bench/redis_lease.py              # about 60 s
    python bench/redis_lease.py --quick      # a few seconds
    python bench/redis_lease.py --profile    # cProfile of the store's cycle
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from comparison import Candidate, Row, interleave, print_footer, print_header, print_table, quartiles, rows

REDIS_URL = os.environ.get("CRONWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")
TTL = 60.0
TTL_MS = int(TTL * 1000)
PROCESSES = 4
FULL, BARE, CONTENDED = 1.3, 1.15, 0.85

COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
FENCED_SET = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end
return false
"""


def store_url(prefix: str) -> str:
    return f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}"


class Floor:
    """The raw redis-py lease: what any Redis lock does, with nothing else."""

    def __init__(self, prefix: str) -> None:
        import redis

        self.client = redis.Redis.from_url(REDIS_URL)
        self.release = self.client.register_script(COMPARE_AND_DELETE)
        self.fenced = self.client.register_script(FENCED_SET)
        self.key, self.counter = f"{prefix}floor", f"{prefix}floor:token"

    def try_cycle(self) -> bool:
        owner = os.urandom(16).hex()
        if not self.client.set(self.key, owner, nx=True, px=TTL_MS):
            return False
        self.release(keys=[self.key], args=[owner])
        return True

    def cycle(self) -> None:
        assert self.try_cycle(), "floor lease refused: another holder?"

    def fenced_cycle(self) -> None:
        owner = os.urandom(16).hex()
        token = self.fenced(keys=[self.key, self.counter], args=[owner, TTL_MS])
        assert token, "fenced floor lease refused"
        self.release(keys=[self.key], args=[owner])

    def close(self) -> None:
        self.client.close()


class StoreCycle:
    """One guarded cycle through the store: ``acquire`` (run + ``started``)
    then ``finish`` (terminal record + release)."""

    def __init__(self, prefix: str, job: str) -> None:
        from cronwarden.guard import Warden, this_host
        from cronwarden.stores import open_store

        self.store = open_store(store_url(prefix))
        self.warden = Warden(self.store, quiet=True)
        self.job, self.host, self.pid = job, this_host(), os.getpid()

    def try_cycle(self) -> bool:
        from cronwarden.events import Outcome, new_id
        from cronwarden.stores.base import End, Granted, Start

        start = Start(job=self.job, key=self.job, run_id=new_id(), host=self.host, pid=self.pid, ttl=TTL,
                      at=time.time())  # fmt: skip
        result = self.store.acquire(start)
        if not isinstance(result, Granted):
            return False
        self.store.finish(result.lease, End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0))
        return True

    def cycle(self) -> None:
        assert self.try_cycle(), "store lease refused: another holder?"

    def guard_cycle(self) -> None:
        with self.warden.guard(self.job + "-guard", ttl=TTL):
            pass

    def close(self) -> None:
        self.store.close()


def uncontended(prefix: str, quick: bool, budget: float) -> None:
    started = time.monotonic()
    floor, store = Floor(prefix), StoreCycle(prefix, "bench")
    base = Candidate("(a) floor: SET NX PX + Lua compare-and-delete", floor.cycle)
    fenced = Candidate("ref: SET NX PX + INCR token in one Lua, + compare-and-delete", floor.fenced_cycle)
    cycle = Candidate("store.acquire + store.finish", store.cycle)
    guard = Candidate("Warden.guard enter/exit (library, heartbeat thread)", store.guard_cycle, FULL)
    try:
        n = interleave(base, [fenced, cycle, guard], min_rounds=5, budget=budget)
    finally:
        floor.close()
        store.close()
    table = rows(base, [fenced, cycle, guard])
    ref, full, lib = table[1], table[2], table[3]
    ref.note = "reference: a bare fenced lease"
    bare = Row(**{**vars(full), "name": "(b) bare lease: store.acquire + store.finish", "target": BARE,
                  "note": "no ledger-free path: includes started + terminal"})  # fmt: skip
    full.name, full.target = "(c) full guarded cycle: store.acquire + store.finish", FULL
    lib.name = "(c) full guarded cycle: Warden.guard enter/exit"
    print_table(
        "uncontended: one acquire+release cycle on a kept connection", [table[0], ref, bare, full, lib]
    )
    print_footer(n, started)


def _worker(mode: str, prefix: str, seconds: float, barrier: Any, results: Any) -> None:
    worker: Floor | StoreCycle = Floor(prefix) if mode == "raw" else StoreCycle(prefix, "contended")
    try_cycle: Callable[[], bool] = worker.try_cycle
    ok = refused = 0
    try:
        barrier.wait()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if try_cycle():
                ok += 1
            else:
                refused += 1
    finally:
        worker.close()
    results.put((ok, refused))


def contended_round(mode: str, prefix: str, seconds: float) -> tuple[float, float]:
    """(successful cycles per second, refused attempts per second) of
    ``PROCESSES`` processes on one key."""
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(mode, prefix, seconds, barrier, results))
             for _ in range(PROCESSES)]  # fmt: skip
    for p in procs:
        p.start()
    counts = [results.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    return sum(c[0] for c in counts) / seconds, sum(c[1] for c in counts) / seconds


def contended(prefix: str, rounds: int, seconds: float) -> None:
    started = time.monotonic()
    raw: list[float] = []
    guarded: list[float] = []
    refused: dict[str, list[float]] = {"raw": [], "guarded": []}
    for i in range(rounds):
        for mode in ("raw", "guarded") if i % 2 == 0 else ("guarded", "raw"):
            ok, no = contended_round(mode, prefix, seconds)
            (raw if mode == "raw" else guarded).append(ok)
            refused[mode].append(no)
    ratios = [g / r for g, r in zip(guarded, raw, strict=True)]
    low, high = quartiles(ratios)
    table = [
        Row(f"raw SET NX PX + compare-and-delete, {PROCESSES} processes", statistics.median(raw), 1.0,
            None, None, None, "cycles/s", f"{statistics.median(refused['raw']):.0f} refused/s"),
        Row(f"store acquire+finish, {PROCESSES} processes", statistics.median(guarded),
            statistics.median(ratios), low, high, CONTENDED, "cycles/s",
            f"{statistics.median(refused['guarded']):.0f} refused/s, each recorded as skipped",
            at_least=True),
    ]  # fmt: skip
    print_table(f"contended: {PROCESSES} processes on one key, {seconds:g} s per round, successful cycles/s",
                table)  # fmt: skip
    print_footer(rounds, started)


def profile(prefix: str, cycles: int) -> None:
    import cProfile
    import pstats

    store = StoreCycle(prefix, "profile")
    for _ in range(20):
        store.cycle()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(cycles):
        store.cycle()
    prof.disable()
    store.close()
    print(f"\ncProfile of {cycles} store.acquire + store.finish cycles, top 25 by own time:")
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)


def cleanup(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        batch = []
        for key in client.scan_iter(match=prefix.replace("*", r"\*") + "*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)
    finally:
        client.close()


def unavailable() -> str | None:
    try:
        import redis
    except ImportError as e:
        return f"redis-py not installed ({e}): pip install 'cronwarden[redis]'"
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except redis.RedisError as e:
        return f"Redis not reachable at {REDIS_URL}: {e}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few seconds (CI smoke run)")
    ap.add_argument("--budget", type=float, help="seconds of uncontended interleaved rounds")
    ap.add_argument("--rounds", type=int, help="contended rounds (each: raw, then guarded, or the reverse)")
    ap.add_argument("--seconds", type=float, help="length of one contended run (default 5, quick 1)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the store's cycle instead")
    args = ap.parse_args()
    why = unavailable()
    if why:
        print(f"skipping the Redis bench: {why}")
        return 0
    prefix = f"cw-bench-{uuid.uuid4().hex[:12]}:"
    try:
        if args.profile:
            profile(prefix, 500 if args.quick else 3000)
            return 0
        print_header(f"Redis ({REDIS_URL}, keys under {prefix}): store lease cycles vs raw redis-py")
        budget = args.budget if args.budget is not None else (1.5 if args.quick else 25.0)
        uncontended(prefix, args.quick, budget)
        seconds = args.seconds if args.seconds is not None else (1.0 if args.quick else 5.0)
        contended(prefix, args.rounds or (1 if args.quick else 3), seconds)
    finally:
        cleanup(prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
