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


def interleaved(candidates: dict[str, tuple[Callable[[], object], int]], rounds: int) -> dict[str, float]:
    """Each round runs every candidate (``repeat`` times, timed one by one),
    so a wave of load on the shared machine hits all of them alike; the
    result is the median over rounds of each one's median in the round."""
    per: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, (fn, repeat) in candidates.items():
            per[name].append(median_time(fn, repeat))
    return {name: statistics.median(v) for name, v in per.items()}


def report(name: str, n: int, m: dict[str, float], extra: list[tuple[str, float]]) -> None:
    one, rtt, many, server, floor = m["one"], m["rtt"], m["many"], m["server"], m["floor"]
    client = many - server - rtt
    print(f"\n{name}: renew_many of {n} due leases (medians of interleaved rounds)")
    print(f"  renew (1 lease)             {one * 1e3:8.3f} ms")
    print(f"  round trip (cheapest call)  {rtt * 1e3:8.3f} ms")
    print(f"  renew_many ({n})          {many * 1e3:8.3f} ms  {many / one:6.1f}x one renew (target <= 5x)")
    print(f"    server                    {server * 1e3:8.3f} ms  {server / n * 1e6:6.2f} µs per lease")
    print(f"    client + transfer         {client * 1e3:8.3f} ms  {client / n * 1e6:6.2f} µs per lease")
    print(f"  floor: bare extend of {n}  {floor * 1e3:8.3f} ms  {floor / one:6.1f}x one renew")
    for label, value in extra:
        print(f"  {label:<27} {value * 1e3:8.3f} ms  {value / one:6.1f}x one renew")
    print(f"  5x one renew = {5 * one * 1e3:.3f} ms: {5 * one / n * 1e6:.2f} µs per lease for everything")


def postgres(n: int, rounds: int) -> None:
    import psycopg

    schema = f"cw_bench_{uuid.uuid4().hex[:10]}"
    url = f"{POSTGRES}{'&' if '?' in POSTGRES else '?'}schema={schema}"
    try:
        with open_store(url) as store, psycopg.connect(POSTGRES, autocommit=True) as conn:
            leases = take(store, n)
            sql = (ROOT / "src/cronwarden/stores/postgres/queries.sql").read_text()
            statement = sql.split("-- name: renew_many --", 1)[1].split("-- name:", 1)[0]
            lines = [x for x in statement.splitlines() if not x.lstrip().startswith("--")]
            statement = "\n".join(lines).replace("{s}", f'"{schema}"')
            # The same statement with its arrays sent as text, as before.
            as_text = statement.replace(")b::", ")s::")
            args = {
                "keys": [x.key for x in leases],
                "owners": [x.run_id for x in leases],
                "ttls": [float(x.ttl) for x in leases],
            }
            bare = (
                f'UPDATE "{schema}".leases SET expires = clock_timestamp() + make_interval(secs => 60) '
                "WHERE key = ANY(%(keys)b::text[])"
            )
            server_times: list[float] = []

            def explained() -> None:
                plan = conn.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + statement, args,
                                    prepare=False).fetchone()  # fmt: skip
                assert plan is not None
                top = (plan[0] if isinstance(plan[0], list) else json.loads(plan[0]))[0]
                server_times.append((top["Planning Time"] + top["Execution Time"]) / 1000)

            m = interleaved(
                {
                    "one": (lambda: store.renew(leases[0]), 10),
                    "rtt": (lambda: conn.execute("SELECT 1").fetchone(), 10),
                    "many": (lambda: store.renew_many(leases), 1),
                    "text": (lambda: conn.execute(as_text, args, prepare=False).fetchall(), 1),
                    "server": (explained, 1),
                    "floor": (lambda: conn.execute(bare, {"keys": args["keys"]}, prepare=False), 1),
                },
                rounds,
            )
            m["server"] = statistics.median(server_times)
            report("postgres", n, m, [("the statement, text arrays", m["text"])])
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def redis_store(n: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cw-bench-renew-") as tmp:
        server = RedisServer(Path(tmp), port=28899)
        server.start()
        try:
            admin = server.admin()
            with open_store(server.url(prefix="cw-bench:")) as store:
                leases = take(store, n)
                bare = admin.register_script(
                    "for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end return #KEYS"
                )
                live = [f"cw-bench:live:{x.key}" for x in leases]
                server_times: list[float] = []

                def usec() -> int:
                    return int(admin.info("commandstats")["cmdstat_evalsha"]["usec"])

                def timed_on_server() -> None:
                    before = usec()  # a private server: every EVALSHA on it is ours
                    store.renew_many(leases)
                    server_times.append((usec() - before) / 1e6)

                m = interleaved(
                    {
                        "one": (lambda: store.renew(leases[0]), 10),
                        "rtt": (admin.ping, 10),
                        "many": (lambda: store.renew_many(leases), 1),
                        "server": (timed_on_server, 1),
                        "floor": (lambda: bare(keys=live, args=[60_000]), 1),
                    },
                    rounds,
                )
                m["server"] = statistics.median(server_times)
            admin.close()
            report("redis", n, m, [])
        finally:
            server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--leases", type=int, default=1000)
    ap.add_argument("--stores", default="postgres,redis")
    args = ap.parse_args()
    rounds = 10 if args.quick else 50
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name in args.stores.split(","):
        {"postgres": postgres, "redis": redis_store}[name](args.leases, rounds)
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
