"""The Redis store's lease cycles against the floor of raw redis-py: ``SET key
owner NX PX ttl`` then a Lua compare-and-delete, and beside the Redis locks
users already run, all measured in the same interleaved rounds:

- the peers: **python-redis-lock** (``redis_lock.Lock(client, name,
  expire=…, auto_renewal=True)``, ``acquire(blocking=False)`` + ``release()``:
  a lock with a renewal thread, as a job wrapper uses it) and **redis-py's
  ``Lock``** (``client.lock(name, timeout=…)``, no renewal);
- cronwarden: the bare lease (``store.lock`` + ``store.unlock``, a fenced
  lease with no ledger), the store's cycle (``acquire`` + ``started`` +
  terminal record + release) and ``Warden(store).guard()`` enter/exit, which
  adds the heartbeat thread.

The requirement: the store's cycle, and ``Warden.guard``, no slower than
python-redis-lock in the same run (its ratio to the floor is their target
column; a paired ratio, cycle over python-redis-lock per round, is printed
below the table). The other ratios are shown for reference.

contended: 4 processes on one key for 5 s each way, successful cycles per
second against raw ``SET NX PX`` + compare-and-delete cycles per second (the
same 4-process setup; a refused store start records ``skipped``).

A reference row shows ``SET NX PX`` + ``INCR`` of a fencing counter in one Lua
call, i.e. what any fenced lease costs. Another, the *minimal ledger*, is the
least a ledger-keeping cycle can cost: two Lua calls and one written record
per event, nothing else. Acquire is ``SET NX PX GET`` (the refused start
learns the holder's run id in the same command), then ``HINCRBY`` of a
fencing counter and one ``HSET`` of the run's ``started`` record, or,
refused, one ``HSET`` of a ``skipped`` record naming the holder; finish is
compare-and-delete plus one ``HSET`` of the terminal record. No retention,
no index, no heartbeat state. It is in the uncontended table, the
server-time table and the contended run (a third mode, refused starts
recorded).

Server time per cycle (``INFO commandstats``, all commands of a cycle) is
measured on a private ``redis-server`` started for it (when the binary is
there), so that nobody else's traffic is counted: the shared server is never
reconfigured or reset.

Every key is under a fresh prefix, deleted at the end. The server is
``$CRONWARDEN_TEST_REDIS`` (default ``redis://127.0.0.1:6379/0``).
python-redis-lock is in the ``dev`` extra; without it its row is left out.

    python bench/redis_lease.py              # about 60 s
    python bench/redis_lease.py --quick      # a few seconds
    python bench/redis_lease.py --profile    # cProfile of the store's cycle and of Warden.guard
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from comparison import Candidate, Row, interleave, print_footer, print_header, print_table, quartiles, rows
from cronwarden.stores.base import Granted

REDIS_URL = os.environ.get("CRONWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")
TTL = 60.0
TTL_MS = int(TTL * 1000)
PROCESSES = 4

COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
FENCED_SET = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end
return false
"""


# The minimal ledger (see the module docstring). KEYS: live lease, fencing hash,
# runs hash. Every record is one field of the runs hash, keyed by run id:
# "started|job|host|pid|started_at|token", overwritten by the terminal record
# (which carries the same fields, so nothing is lost), or "skipped|job|host|pid|
# at|holder run id". SET ... NX GET (Redis >= 7.0) returns the holder's value
# when it refuses and nil when it sets, so a refused start costs no extra GET.
LEDGER_ACQUIRE = """
local holder = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if holder then
  redis.call('HSET', KEYS[3], ARGV[1], 'skipped|' .. ARGV[4] .. '|' .. holder)
  return false
end
local token = redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
redis.call('HSET', KEYS[3], ARGV[1], 'started|' .. ARGV[4] .. '|' .. token)
return token
"""
# KEYS: live lease, runs hash; ARGV: run id, terminal record. The terminal
# record is written even when the lease was lost (the run did run); the return
# value says whether the lease was still ours.
LEDGER_FINISH = """
local released = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then released = redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return released
"""
LEDGER_KEEP = 10_000
"""Memory cap of the minimal ledger: each client UNLINKs the runs hash after
this many of its acquire calls (one extra round trip per 10,000, inside one
timed operation, which the medians do not see). The hash stays bounded at
about ``LEDGER_KEEP`` x clients records of ~100 bytes; a real ledger's
retention (the store trims in its scripts) costs more than this."""


def store_url(prefix: str, server: str = REDIS_URL) -> str:
    return f"{server}{'&' if '?' in server else '?'}prefix={prefix}"


class Floor:
    """The raw redis-py lease: what any Redis lock does, with nothing else."""

    def __init__(self, prefix: str, server: str = REDIS_URL) -> None:
        import redis

        self.client = redis.Redis.from_url(server)
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

    def hold(self) -> None:
        self.client.set(self.key + ":held", "holder", px=TTL_MS * 10)

    def refused_held(self) -> None:
        assert not self.client.set(self.key + ":held", "someone else", nx=True, px=TTL_MS)

    def close(self) -> None:
        self.client.close()


class Peers:
    """The Redis locks users already run, each on a default ``redis.Redis``:
    python-redis-lock (``redis_lock.Lock`` with its renewal thread, as a job
    wrapper would use it) and redis-py's own ``Lock``. One lock object per
    cycle, as one per run."""

    def __init__(self, prefix: str, server: str = REDIS_URL) -> None:
        import redis

        self.client = redis.Redis.from_url(server)
        self.prl_key, self.lock_key = f"{prefix}peer:prl", f"{prefix}peer:redis-py"
        try:
            import redis_lock
        except ImportError:
            self.redis_lock: Any = None
        else:
            self.redis_lock = redis_lock

    def python_redis_lock(self) -> None:
        lock = self.redis_lock.Lock(self.client, self.prl_key, expire=int(TTL), auto_renewal=True)
        assert lock.acquire(blocking=False), "python-redis-lock refused: another holder?"
        lock.release()

    def redis_py_lock(self) -> None:
        lock = self.client.lock(self.lock_key, timeout=TTL)
        assert lock.acquire(blocking=False), "redis-py Lock refused: another holder?"
        lock.release()

    def candidates(self) -> list[Candidate]:
        """The peers as candidates (python-redis-lock only when installed)."""
        out = [Candidate("peer: redis-py Lock, acquire(blocking=False) + release", self.redis_py_lock,
                         note="reference: a lock users already have")]  # fmt: skip
        if self.redis_lock is not None:
            name = "peer: python-redis-lock Lock(auto_renewal=True), acquire + release"
            note = "cronwarden's cycle must not be slower"
            out.insert(0, Candidate(name, self.python_redis_lock, note=note))
        return out

    def close(self) -> None:
        self.client.close()


class MinimalLedger:
    """The least a ledger-keeping lease can do: lease + fencing token +
    ``started`` record in one Lua call, release + terminal record in another,
    and a refused start recorded as ``skipped`` by the first. Same client as
    ``Floor``: a default ``redis.Redis`` on a kept connection."""

    def __init__(self, prefix: str, server: str = REDIS_URL, job: str = "bench") -> None:
        import redis

        self.client = redis.Redis.from_url(server)
        self.acquire = self.client.register_script(LEDGER_ACQUIRE)
        self.finish = self.client.register_script(LEDGER_FINISH)
        self.key, self.fence = f"{prefix}minimal", f"{prefix}minimal:token"
        self.runs = f"{prefix}minimal:runs"
        self.job = job
        self.who = f"{job}|{socket.gethostname()}|{os.getpid()}"
        """The fixed part of every record: job, host, pid."""
        self.calls = 0

    def _acquire(self, key: str, run_id: str, at: float) -> Any:
        self.calls += 1
        if self.calls % LEDGER_KEEP == 0:
            self.client.unlink(self.runs)
        args = [run_id, TTL_MS, self.job, f"{self.who}|{at:.6f}"]
        return self.acquire(keys=[key, self.fence, self.runs], args=args)

    def try_cycle(self) -> bool:
        run_id, started = os.urandom(16).hex(), time.time()
        token = self._acquire(self.key, run_id, started)
        if token is None:
            return False
        record = f"succeeded|{self.who}|{started:.6f}|{token}|{time.time():.6f}|0"
        self.finish(keys=[self.key, self.runs], args=[run_id, record])
        return True

    def cycle(self) -> None:
        assert self.try_cycle(), "minimal ledger lease refused: another holder?"

    def hold(self) -> None:
        self.client.set(self.key + ":held", "holder-run-id", px=TTL_MS * 10)

    def refused(self) -> None:
        """A start refused by a live holder: one ``skipped`` record."""
        assert self._acquire(self.key + ":held", os.urandom(16).hex(), time.time()) is None

    def close(self) -> None:
        self.client.close()


class StoreCycle:
    """One guarded cycle through the store: ``acquire`` (run + ``started``)
    then ``finish`` (terminal record + release)."""

    def __init__(self, prefix: str, job: str, server: str = REDIS_URL) -> None:
        from cronwarden.guard import Warden, this_host
        from cronwarden.stores import open_store

        self.store = open_store(store_url(prefix, server))
        self.warden = Warden(self.store, quiet=True)
        self.job, self.host, self.pid = job, this_host(), os.getpid()

    def try_cycle(self) -> bool:
        from cronwarden.events import Outcome, new_id
        from cronwarden.stores.base import End, Start

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

    def lock_cycle(self) -> None:
        owner = os.urandom(16).hex()
        assert self.store.lock(self.job, owner, TTL) is not None, "lock refused: another holder?"
        self.store.unlock(self.job, owner)

    def refused(self) -> None:
        """A start refused by a live holder: records ``skipped`` (G7)."""
        from cronwarden.events import new_id
        from cronwarden.stores.base import Start

        start = Start(job=self.job, key=self.job + "-held", run_id=new_id(), host=self.host, pid=self.pid,
                      ttl=TTL, at=time.time())  # fmt: skip
        assert not isinstance(self.store.acquire(start), Granted)

    def close(self) -> None:
        self.store.close()


def uncontended(prefix: str, quick: bool, budget: float) -> None:
    started = time.monotonic()
    floor, store, minimal = Floor(prefix), StoreCycle(prefix, "bench"), MinimalLedger(prefix)
    peers = Peers(prefix)
    base = Candidate("floor: SET NX PX + Lua compare-and-delete", floor.cycle)
    fenced = Candidate("ref: SET NX PX + INCR token in one Lua, + compare-and-delete", floor.fenced_cycle,
                       note="reference: a bare fenced lease")  # fmt: skip
    ledger = Candidate("ref: minimal ledger (lease+token+run record / CAD+terminal record), 2 Lua calls",
                       minimal.cycle, note="reference: the least a ledger-keeping cycle costs")  # fmt: skip
    bare = Candidate("bare lease: store.lock + store.unlock", store.lock_cycle)
    cycle = Candidate("store cycle: store.acquire + store.finish", store.cycle)
    guard = Candidate("store cycle: Warden.guard enter/exit", store.guard_cycle)
    mates = peers.candidates()
    others = [*mates, fenced, ledger, bare, cycle, guard]
    try:
        n = interleave(base, others, min_rounds=5, budget=budget)
    finally:
        floor.close()
        store.close()
        minimal.close()
        peers.close()
    table = rows(base, others)
    peer = next((c for c in mates if c.name.startswith("peer: python-redis-lock")), None)
    if peer is not None:
        # The requirement: no slower than python-redis-lock, in this run.
        limit = table[1 + others.index(peer)].ratio
        for row in table:
            if row.name in (cycle.name, guard.name):
                row.target = limit
    print_table("uncontended: one acquire+release cycle, the floor on a default redis.Redis", table)
    if peer is not None:
        for c in (cycle, guard):
            ratios = [a / b for a, b in zip(c.blocks, peer.blocks, strict=True)]
            low, high = quartiles(ratios)
            print(f"{c.name} / python-redis-lock, paired per round: {statistics.median(ratios):.2f}x "
                  f"(IQR {low:.2f}-{high:.2f}), required <= 1")  # fmt: skip
    print_footer(n, started)


SERVER_TIME_CYCLES = 2000
SERVER_BLOCKS = 10


def server_time(cycles: int) -> None:
    """Server time per cycle of each candidate, from ``INFO commandstats`` of a
    private ``redis-server`` that nothing else uses."""
    import shutil
    import socket
    import subprocess
    import tempfile

    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        print("\n(no redis-server binary: server time per cycle not measured)")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="cw-bench-redis-") as tmp:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", tmp],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        admin = redis.Redis(port=port, socket_timeout=5)
        try:
            for _ in range(500):
                try:
                    admin.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.01)
            version = admin.info("server")["redis_version"]
            url = f"redis://127.0.0.1:{port}/0"
            floor, store = Floor("cw-bench:", url), StoreCycle("cw-bench:", "bench", url)
            minimal = MinimalLedger("cw-bench:", url)
            peers = Peers("cw-bench:", url)
            holder = store.store.acquire(_held_start(store))
            assert isinstance(holder, Granted)
            floor.hold()
            minimal.hold()
            script = ("evalsha", "eval")
            candidates = [
                ("floor: SET NX PX + Lua compare-and-delete", floor.cycle, ("set", *script)),
                ("peer: redis-py Lock", peers.redis_py_lock, ("set", *script)),
                *(
                    [("peer: python-redis-lock", peers.python_redis_lock, ("set", *script))]
                    if peers.redis_lock is not None
                    else []
                ),
                ("ref: SET NX PX + INCR in one Lua + compare-and-delete", floor.fenced_cycle, script),
                ("ref: minimal ledger, 2 Lua calls", minimal.cycle, script),
                ("store.lock + store.unlock", store.lock_cycle, script),
                ("store.acquire + store.finish", store.cycle, script),
                ("Warden.guard enter/exit", store.guard_cycle, script),
                ("refused: SET NX PX on a held key", floor.refused_held, ("set",)),
                ("refused: minimal ledger acquire on a held key (records skipped)", minimal.refused, script),
                ("refused: store.acquire on a held key (records skipped)", store.refused, script),
            ]
            print(f"\nserver time per cycle, private redis-server {version}, {cycles} cycles each: "
                  f"INFO commandstats of the top-level commands (a script's time includes its calls) "
                  f"in {SERVER_BLOCKS} blocks; median, min and max of the blocks' means")  # fmt: skip
            width = max(len(c[0]) for c in candidates)
            print(f"{'what':<{width}}  {'µs':>6}  {'min':>6}  {'max':>6}  {'trips':>5}  {'calls':>5}  "
                  "commands run inside scripts, per cycle (SLOWLOG)")  # fmt: skip
            per_block = max(1, cycles // SERVER_BLOCKS)
            for name, op, top in candidates:
                for _ in range(20):
                    op()
                means, trips = [], 0.0
                for _ in range(SERVER_BLOCKS):
                    admin.config_resetstat()
                    for _ in range(per_block):
                        op()
                    stats = {k.removeprefix("cmdstat_"): v for k, v in admin.info("commandstats").items()}
                    means.append(sum(stats[c]["usec"] for c in top if c in stats) / per_block)
                    trips = sum(stats[c]["calls"] for c in top if c in stats) / per_block
                # Which commands the scripts run: SLOWLOG logs them with the client address "?:0".
                admin.config_set("slowlog-log-slower-than", 0)
                admin.config_set("slowlog-max-len", 10_000)
                admin.slowlog_reset()
                for _ in range(50):
                    op()
                admin.config_set("slowlog-log-slower-than", 10_000)
                inner: dict[str, int] = {}
                for e in admin.slowlog_get(10_000):
                    if e["client_address"] in (b"?:0", "?:0"):
                        inner[_name(e)] = inner.get(_name(e), 0) + 1
                calls = sum(inner.values()) / 50 + trips
                what = ", ".join(f"{k.lower()} {v / 50:.1f}" for k, v in sorted(inner.items()))
                print(f"{name:<{width}}  {statistics.median(means):>6.1f}  {min(means):>6.1f}  "
                      f"{max(means):>6.1f}  {trips:>5.1f}  {calls:>5.1f}  {what}")  # fmt: skip
            floor.close()
            store.close()
            minimal.close()
            peers.close()
        finally:
            admin.close()
            proc.terminate()
            proc.wait(timeout=10)


def _name(entry: dict[str, Any]) -> str:
    command = entry["command"]
    text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
    return text.split(" ", 1)[0].upper()


def _held_start(store: StoreCycle) -> Any:
    from cronwarden.events import new_id
    from cronwarden.stores.base import Start

    return Start(job=store.job, key=store.job + "-held", run_id=new_id(), host=store.host, pid=store.pid,
                 ttl=TTL * 10, at=time.time())  # fmt: skip


def _worker(mode: str, prefix: str, seconds: float, barrier: Any, results: Any) -> None:
    worker: Floor | StoreCycle | MinimalLedger
    if mode == "raw":
        worker = Floor(prefix)
    elif mode == "minimal":
        worker = MinimalLedger(prefix, job="contended")
    else:
        worker = StoreCycle(prefix, "contended")
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
    modes = ("raw", "guarded", "minimal")
    ok: dict[str, list[float]] = {m: [] for m in modes}
    refused: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(rounds):
        for mode in modes[i % 3 :] + modes[: i % 3]:
            done, no = contended_round(mode, prefix, seconds)
            ok[mode].append(done)
            refused[mode].append(no)

    def paired(mode: str) -> tuple[float, float, float]:
        ratios = [c / r for c, r in zip(ok[mode], ok["raw"], strict=True)]
        return statistics.median(ratios), *quartiles(ratios)

    table = [
        Row(f"raw SET NX PX + compare-and-delete, {PROCESSES} processes", statistics.median(ok["raw"]), 1.0,
            None, None, None, "cycles/s", f"{statistics.median(refused['raw']):.0f} refused/s"),
        Row(f"store acquire+finish, {PROCESSES} processes", statistics.median(ok["guarded"]),
            *paired("guarded"), None, "cycles/s",
            f"{statistics.median(refused['guarded']):.0f} refused/s, each recorded as skipped",
            at_least=True),
        Row(f"ref: minimal ledger, 2 Lua calls, {PROCESSES} processes", statistics.median(ok["minimal"]),
            *paired("minimal"), None, "cycles/s",
            f"reference: {statistics.median(refused['minimal']):.0f} refused/s, each recorded as skipped "
            "by the one HSET"),
    ]  # fmt: skip
    print_table(f"contended: {PROCESSES} processes on one key, {seconds:g} s per round, successful cycles/s",
                table)  # fmt: skip
    print_footer(rounds, started)


def profile(prefix: str, cycles: int) -> None:
    import cProfile
    import pstats

    store = StoreCycle(prefix, "profile")
    cases = [("store.acquire + store.finish", store.cycle), ("Warden.guard enter/exit", store.guard_cycle),
             ("store.lock + store.unlock", store.lock_cycle)]  # fmt: skip
    for name, op in cases:
        for _ in range(20):
            op()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(cycles):
            op()
        prof.disable()
        print(f"\ncProfile of {cycles} {name} cycles, top 25 by own time:")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    store.close()


def cleanup(prefix: str, url: str = REDIS_URL) -> None:
    """Delete every key under ``prefix`` (the benches' own, random prefixes)."""
    import redis

    client = redis.Redis.from_url(url)
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
    ap.add_argument("--rounds", type=int, help="contended rounds (each: raw, store, minimal ledger; rotated)")
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
        server_time(200 if args.quick else SERVER_TIME_CYCLES)
        seconds = args.seconds if args.seconds is not None else (1.0 if args.quick else 5.0)
        contended(prefix, args.rounds or (1 if args.quick else 3), seconds)
    finally:
        cleanup(prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
