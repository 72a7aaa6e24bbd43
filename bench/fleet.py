"""A fleet on one machine: many hosts running guarded jobs against one
PostgreSQL and one Redis, measured, for docs/scale.md's arithmetic.

Each host is a process of its own with a distinct ``CRONWARDEN_HOST`` id
and ``--jobs-per-host`` jobs (100 by default, as 100,000 jobs on 1,000
hosts). Each job starts every ``--period`` seconds (at a random phase) and
runs ``--duration`` seconds: ``acquire``, its lease renewed by the host's
one heartbeat thread (every lease of the host that is due in one
``renew_many``), then ``finish``, exactly the store calls a guarded run
makes; the job's command itself is left out (it costs the host, not the
store). A scale of 0.01 is 1,000 jobs on 10 hosts.

Measured over ``--seconds`` after one ``--duration`` of warm-up, per store
and ttl, on private servers the bench starts (so that their CPU is the
fleet's alone):

- runs/s and renewals/s the hosts achieved (and leases lost: 0 expected);
- the server's CPU (``/proc/PID/stat``: the ``redis-server``; the
  postmaster and every process it forked);
- connections the server holds (PostgreSQL ``pg_stat_activity``; Redis
  ``connected_clients``);
- p50/p99 of ``acquire`` and of each ``renew_many`` call, as the hosts saw them.

With two ttls (``--ttls 3,60``) at one scale the runs per second are the same
and the renewals differ twenty-fold, so the server CPU splits into a part
per run and a part per renewal (two equations, two unknowns), printed last.

    python bench/fleet.py                     # scales 0.01 and 0.1, ttl 3 and 60: about 10 minutes
    python bench/fleet.py --quick             # scale 0.01, shorter windows: about 2 minutes
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

CLK_TCK = os.sysconf("SC_CLK_TCK")
FULL_JOBS, FULL_HOSTS = 100_000, 1_000


# -- one host --------------------------------------------------------------


def host(args: argparse.Namespace) -> None:
    """One host's jobs until ``--until``; prints its measurements as JSON."""
    from cronwarden.clock import SYSTEM_CLOCK
    from cronwarden.errors import StoreError
    from cronwarden.events import Outcome, new_id
    from cronwarden.lease import Heartbeat, HeartbeatThread, Lease
    from cronwarden.stores import open_store
    from cronwarden.stores.base import End, Granted, Start

    store = open_store(args.url)
    name = os.environ["CRONWARDEN_HOST"]
    window = (args.window_from, args.until)
    renew_times: list[tuple[float, int]] = []
    lost: list[str] = []

    class Timed:
        """The store the heartbeats renew through, each call timed."""

        def renew_many(self, leases: list[Lease]) -> list[object]:
            began = time.monotonic()
            out = store.renew_many(leases)
            if window[0] <= began < window[1]:
                renew_times.append((time.monotonic() - began, len(leases)))
            return out  # type: ignore[return-value]

    timed = Timed()
    thread = HeartbeatThread(name=f"fleet-{name}")
    rng = random.Random(name)
    due: list[tuple[float, int, str]] = []  # (monotonic time, seq, job): starts
    ends: list[tuple[float, int, Any, Any]] = []  # (time, seq, lease, heartbeat)
    seq = 0
    for j in range(args.jobs):
        heapq.heappush(due, (args.start + rng.uniform(0, args.period), seq, f"{name}-job{j}"))
        seq += 1
    acquire_times: list[float] = []
    runs = refused = errors = 0
    pause = threading.Event()
    while True:
        now = time.monotonic()
        if now >= args.until:
            break
        if ends and ends[0][0] <= now:
            _, _, lease, beat = heapq.heappop(ends)
            beat.stop()
            if not beat.believed(SYSTEM_CLOCK.monotonic()):
                lost.append(lease.key)
            try:
                store.finish(lease, End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0))
            except StoreError:
                errors += 1  # the next start of the job records the run abandoned
            continue
        if due and due[0][0] <= now:
            at, _, job = heapq.heappop(due)
            heapq.heappush(due, (at + args.period, seq, job))
            seq += 1
            s = Start(job=job, key=job, run_id=new_id(), host=name, pid=os.getpid(), ttl=args.ttl,
                      at=time.time())  # fmt: skip
            sent = SYSTEM_CLOCK.monotonic()
            try:
                result = store.acquire(s)
            except StoreError:
                errors += 1  # a guarded run fails closed: it does not run
                continue
            took = time.monotonic() - sent
            if window[0] <= sent < window[1]:
                acquire_times.append(took)
                runs += 1
            if not isinstance(result, Granted):
                refused += 1
                continue
            lease = result.lease
            beat = Heartbeat(store=timed, lease=lease, ttl=args.ttl, clock=SYSTEM_CLOCK, started_at=sent,
                             thread=thread)  # fmt: skip
            beat.start(lease.key)
            heapq.heappush(ends, (time.monotonic() + args.duration, seq, lease, beat))
            seq += 1
            continue
        nxt = min([args.until] + [q[0][0] for q in (due, ends) if q])
        pause.wait(max(0.0, min(nxt - time.monotonic(), 0.5)))
    for _, _, lease, beat in ends:
        beat.stop()
        try:
            store.finish(lease, End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0))
        except StoreError:
            errors += 1
    thread.close()
    store.close()
    print(json.dumps({"acquire": acquire_times, "renew": renew_times, "runs": runs, "refused": refused,
                      "lost": lost, "errors": errors}))  # fmt: skip


# -- the servers -------------------------------------------------------------


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        # utime, stime, cutime, cstime: children that exited count in their parent.
        total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return total / CLK_TCK


def children_of(top: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == top:
                        out.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                continue
    return out


class Servers:
    def __init__(self, base: Path) -> None:
        from pgserver import private_postgres
        from redisserver import RedisServer

        self._pg = private_postgres()
        self.pg = self._pg.__enter__()
        self.redis = RedisServer(base / "redis", port=28897)
        self.redis.start()
        self.idle: dict[str, float] = {}
        self.pg.max_connections = 400  # two connections per host (its runs, its heartbeat)
        self.pg.stop()
        self.pg.start()

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.pg.url(), autocommit=True)

    def measure_idle(self, seconds: float = 10.0) -> None:
        """Each server's CPU with no host at all (its own timers, its
        background processes), taken off before the CPU is split."""
        pause = threading.Event()
        for store in ("postgres", "redis"):
            cpu0, t0 = cpu_seconds(self.pids(store)), time.monotonic()
            pause.wait(seconds)
            self.idle[store] = (cpu_seconds(self.pids(store)) - cpu0) / (time.monotonic() - t0)

    def url(self, store: str, namespace: str) -> str:
        if store == "postgres":
            return self.pg.url(schema=namespace)
        return self.redis.url(prefix=f"{namespace}:")

    def pids(self, store: str) -> list[int]:
        if store == "redis":
            return [self.redis.pid]
        top = self.pg.postmaster_pid()
        assert top is not None
        return [top, *children_of(top)]

    def connections(self, store: str) -> int:
        if store == "redis":
            admin = self.redis.admin()
            try:
                return int(admin.info("clients")["connected_clients"]) - 1  # not this one
            finally:
                admin.close()
        with self._admin() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> pg_backend_pid()"
            ).fetchone()
        return int(row[0])

    def close(self) -> None:
        self.redis.stop()
        self._pg.__exit__(None, None, None)


# -- one measurement -----------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(servers: Servers, store: str, scale: float, ttl: float, a: argparse.Namespace) -> dict[str, Any]:
    hosts = max(1, round(FULL_HOSTS * scale))
    namespace = f"fleet_{uuid.uuid4().hex[:8]}"
    url = servers.url(store, namespace)
    if store == "postgres":  # the schema made once, before the hosts race to make it
        from cronwarden.stores import open_store

        open_store(url).close()
    spawn = 0.3 * hosts + 5  # starting interpreters on a loaded box (about 0.3 s of CPU each)
    start = time.monotonic() + spawn
    window_from = start + a.duration
    until = window_from + a.seconds
    procs = []
    for i in range(hosts):
        argv = [sys.executable, __file__, "--host", "--url", url, "--jobs", str(a.jobs_per_host),
                "--period", str(a.period), "--duration", str(a.duration), "--ttl", str(ttl),
                "--start", repr(start), "--window-from", repr(window_from),
                "--until", repr(until)]  # fmt: skip
        env = {**os.environ, "CRONWARDEN_HOST": f"h{i:04d}"}
        procs.append(
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        )
    pause = threading.Event()
    pause.wait(max(0.0, window_from - time.monotonic()))
    cpu0, t0 = cpu_seconds(servers.pids(store)), time.monotonic()
    conns = []
    while time.monotonic() < until - 0.5:
        conns.append(servers.connections(store))
        pause.wait(min(5.0, max(0.0, until - 0.5 - time.monotonic())))
    cpu1, t1 = cpu_seconds(servers.pids(store)), time.monotonic()
    acquire: list[float] = []
    renew: list[tuple[float, int]] = []
    runs = refused = errors = 0
    lost: list[str] = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"a host failed ({p.returncode}): {err.strip()[-2000:]}")
        got = json.loads(out.strip().splitlines()[-1])
        acquire += got["acquire"]
        renew += [tuple(x) for x in got["renew"]]
        runs, refused, lost = runs + got["runs"], refused + got["refused"], lost + got["lost"]
        errors += got["errors"]
    seconds = t1 - t0
    renewals = sum(n for _, n in renew)
    return {
        "store": store, "scale": scale, "hosts": hosts, "jobs": hosts * a.jobs_per_host, "ttl": ttl,
        "runs_s": runs / seconds, "renewals_s": renewals / seconds,
        # A run renews every ttl/3 while it runs: that many times per run.
        "needed_renewals_s": hosts * a.jobs_per_host / a.period * math.floor(a.duration / (ttl / 3)),
        "cpu": (cpu1 - cpu0) / seconds, "connections": max(conns) if conns else 0,
        "acquire_p50": pct(acquire, 0.5), "acquire_p99": pct(acquire, 0.99),
        "renew_p50": pct([t for t, _ in renew], 0.5), "renew_p99": pct([t for t, _ in renew], 0.99),
        "batch": statistics.mean([n for _, n in renew]) if renew else 0.0,
        "lost": len(lost), "refused": refused, "errors": errors, "idle_cpu": servers.idle[store],
    }  # fmt: skip


def cpu_split(rows: list[dict[str, Any]]) -> list[str]:
    """Per store and scale, the server CPU above idle as ``a`` per run plus
    ``b`` per renewal, from the lowest and highest ttl measured: the runs
    per second are the same, the renewals differ."""
    out = []
    for store, scale in sorted({(r["store"], r["scale"]) for r in rows}):
        mine = [r for r in rows if r["store"] == store and r["scale"] == scale]
        pair = sorted(mine, key=lambda r: r["ttl"])
        if len(pair) < 2:
            continue
        x, y = ({**r, "cpu": r["cpu"] - r["idle_cpu"]} for r in (pair[0], pair[-1]))
        det = x["runs_s"] * y["renewals_s"] - y["runs_s"] * x["renewals_s"]
        if det == 0:
            continue
        per_run = (x["cpu"] * y["renewals_s"] - y["cpu"] * x["renewals_s"]) / det
        per_renewal = (x["runs_s"] * y["cpu"] - y["runs_s"] * x["cpu"]) / det
        out.append(f"  {store:8} scale {scale:g}: {per_run * 1e6:7.1f} µs per run, "
                   f"{per_renewal * 1e6:6.1f} µs per renewal")  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--start", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--window-from", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--until", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--ttl", type=float, default=3.0, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--scales", default=None, help="fractions of 100,000 jobs / 1,000 hosts (default 0.01,0.1)"
    )
    ap.add_argument("--ttls", default="3,60", help="lease ttls in seconds (default 3,60)")
    ap.add_argument("--stores", default="postgres,redis")
    ap.add_argument("--jobs-per-host", type=int, default=100)
    ap.add_argument("--period", type=float, default=None, help="seconds between a job's starts (default 60)")
    ap.add_argument("--duration", type=float, default=None, help="seconds a run holds its lease (default 30)")
    ap.add_argument("--seconds", type=float, default=None, help="measured window (default 60)")
    a = ap.parse_args()
    if a.host:
        host(a)
        return 0
    a.period = a.period or (20.0 if a.quick else 60.0)
    a.duration = a.duration or a.period / 2
    a.seconds = a.seconds or (20.0 if a.quick else 60.0)
    scales = [float(x) for x in (a.scales or ("0.01" if a.quick else "0.01,0.1")).split(",")]
    ttls = [float(x) for x in a.ttls.split(",")]
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{a.jobs_per_host} jobs per host, each every {a.period:g} s for {a.duration:g} s; "
          f"window {a.seconds:g} s")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="cw-bench-fleet-") as tmp:
        servers = Servers(Path(tmp))
        try:
            servers.measure_idle()
            print(f"idle server CPU: {servers.idle}", flush=True)
            for scale in scales:
                for store in a.stores.split(","):
                    for ttl in ttls:
                        row = measure(servers, store, scale, ttl, a)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            servers.close()
    print("\nstore     jobs   hosts  ttl  runs/s  renewals/s (needed)  server CPU  conns  "
          "acquire p50/p99 ms  renew p50/p99 ms  batch  lost  errors")  # fmt: skip
    for r in rows:
        print(f"{r['store']:8} {r['jobs']:6} {r['hosts']:6} {r['ttl']:4g} {r['runs_s']:7.1f} "
              f"{r['renewals_s']:9.0f} ({r['needed_renewals_s']:6.0f}) {r['cpu']:9.3f}  {r['connections']:5} "
              f"{r['acquire_p50'] * 1e3:8.2f}/{r['acquire_p99'] * 1e3:7.2f} "
              f"{r['renew_p50'] * 1e3:7.2f}/{r['renew_p99'] * 1e3:7.2f} "
              f"{r['batch']:6.1f} {r['lost']:5} {r['errors']:6}")  # fmt: skip
    print("\nserver CPU above idle, split (two ttls, same scale): per run and per renewal")
    for line in cpu_split(rows):
        print(line)
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
