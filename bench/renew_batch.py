"""Where the time of one batched renewal goes: ``renew_many`` of N due
leases against one ``renew``, taken apart.

For each server store, in one run, on the same leases (medians):

- ``renew``: one lease, one round trip;
- ``round trip``: the cheapest call on the same kind of connection
  (``SELECT 1`` on a kept connection; ``PING``);
- ``renew_many``: N leases (1,000 by default), the ratio to ``renew`` (the
  target is at most 5x);
- ``server``: the server's own time for that batch (PostgreSQL: the
  statement's planning + execution time from ``EXPLAIN (ANALYZE)``, run on
  the same leases; Redis: ``INFO commandstats`` microseconds per
  ``EVALSHA`` of the batch script, on a private ``redis-server``);
- ``client``: what is left (building the arguments, sending them, reading
  and judging N answers);
- ``floor``: the least the server can do to extend N rows or keys with no
  owner check at all (PostgreSQL: ``UPDATE … WHERE key = ANY(keys)``; Redis:
  a script of N bare ``PEXPIRE``), so that the ratio a renewal *with* its
  checks could reach on this machine is visible.

    python bench/renew_batch.py               # about a minute
    python bench/renew_batch.py --quick       # a few seconds
    python bench/renew_batch.py --leases 100  # another batch size
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from cronwarden.events import new_id  # noqa: E402
from cronwarden.lease import Lease  # noqa: E402
from cronwarden.stores import open_store  # noqa: E402
from cronwarden.stores.base import Granted, Start, Store  # noqa: E402
from redisserver import RedisServer  # noqa: E402

POSTGRES = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
TTL = 60.0


def median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def take(store: Store, n: int) -> list[Lease]:
    leases = []
    for i in range(n):
        s = Start(job="batch", key=f"batch-{i}", run_id=new_id(), host="bench", pid=os.getpid(), ttl=TTL,
                  at=time.time())  # fmt: skip
        result = store.acquire(s)
        assert isinstance(result, Granted), result
        leases.append(result.lease)
    return leases


def report(name: str, n: int, one: float, rtt: float, many: float, server: float, floor: float) -> None:
    client = many - server - rtt
    print(f"\n{name}: renew_many of {n} due leases")
    print(f"  renew (1 lease)          {one * 1e3:8.3f} ms")
    print(f"  round trip (floor call)  {rtt * 1e3:8.3f} ms")
    print(f"  renew_many ({n})       {many * 1e3:8.3f} ms   {many / one:5.1f}x one renew (target <= 5x)")
    print(f"    server                 {server * 1e3:8.3f} ms   {server / n * 1e6:5.2f} µs per lease")
    print(f"    client + transfer      {client * 1e3:8.3f} ms   {client / n * 1e6:5.2f} µs per lease")
    print(f"  floor: bare extend of {n} {floor * 1e3:8.3f} ms   {floor / one:5.1f}x one renew")
    print(f"  5x one renew = {5 * one * 1e3:.3f} ms = {5 * one / n * 1e6:.2f} µs per lease for everything")


def postgres(n: int, repeat: int) -> None:
    import psycopg

    schema = f"cw_bench_{uuid.uuid4().hex[:10]}"
    url = f"{POSTGRES}{'&' if '?' in POSTGRES else '?'}schema={schema}"
    try:
        with open_store(url) as store:
            leases = take(store, n)
            one = median_time(lambda: store.renew(leases[0]), repeat * 10)
            many = median_time(lambda: store.renew_many(leases), repeat)
            sql = (ROOT / "src/cronwarden/stores/postgres/queries.sql").read_text()
            statement = sql.split("-- name: renew_many --", 1)[1].split("-- name:", 1)[0]
            statement = statement.replace("{s}", f'"{schema}"')
            args = {
                "keys": [x.key for x in leases],
                "owners": [x.run_id for x in leases],
                "ttls": [float(x.ttl) for x in leases],
            }
            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                rtt = median_time(lambda: conn.execute("SELECT 1").fetchone(), repeat * 10)
                servers = []
                for _ in range(repeat):
                    plan = conn.execute(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, args, prepare=False
                    ).fetchone()
                    assert plan is not None
                    top = (plan[0] if isinstance(plan[0], list) else json.loads(plan[0]))[0]
                    servers.append((top["Planning Time"] + top["Execution Time"]) / 1000)
                server = statistics.median(servers)
                keys = args["keys"]
                bare = (
                    f'UPDATE "{schema}".leases SET expires = clock_timestamp() + make_interval(secs => 60) '
                    "WHERE key = ANY(%s::text[])"
                )
                floor = median_time(lambda: conn.execute(bare, (keys,), prepare=False), repeat)
            report("postgres", n, one, rtt, many, server, floor)
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def redis_store(n: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cw-bench-renew-") as tmp:
        server = RedisServer(Path(tmp), port=28899)
        server.start()
        try:
            admin = server.admin()
            with open_store(server.url(prefix="cw-bench:")) as store:
                leases = take(store, n)
                one = median_time(lambda: store.renew(leases[0]), repeat * 10)
                admin.config_resetstat()  # a private server: its counters are ours
                many = median_time(lambda: store.renew_many(leases), repeat)
                stats = admin.info("commandstats")["cmdstat_evalsha"]
                server_time = stats["usec_per_call"] / 1e6
                rtt = median_time(admin.ping, repeat * 10)
                bare = admin.register_script(
                    "for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end return #KEYS"
                )
                live = [f"cw-bench:live:{x.key}" for x in leases]
                floor = median_time(lambda: bare(keys=live, args=[60_000]), repeat)
            admin.close()
            report("redis", n, one, rtt, many, server_time, floor)
        finally:
            server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--leases", type=int, default=1000)
    ap.add_argument("--stores", default="postgres,redis")
    args = ap.parse_args()
    repeat = 10 if args.quick else 50
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name in args.stores.split(","):
        {"postgres": postgres, "redis": redis_store}[name](args.leases, repeat)
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
