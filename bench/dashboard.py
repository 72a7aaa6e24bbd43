"""What ``cronwarden dashboard`` costs on top of the readings it shows.

The dashboard (``src/cronwarden/web.py``) stands for readings that exist
without it: its front page ``/`` is ``Monitor.evaluate(record=False)`` (what
``cronwarden check --dry-run`` reads) plus the open runs (``status``) and the
latest trouble events, rendered as HTML; ``/jobs/NAME`` is
``monitor.stats(job)`` plus ``history_items(store, job, 50)`` (``history``)
with an SVG of the durations. So the question is not "is it fast" in the
abstract but: is rendering negligible next to those reads, and does a page
stay fast on a big ledger? The ratios are printed for reference; the
absolute targets below them (``FRONT_MS``, ``FRONT_KB``, ``JOB_MS``: the
front page at 2,000 jobs in 0.25 s and 200 KB, a job's page at 500 runs in
50 ms) say met or not.

Two tables, each a floor measured in the same run with its candidates in
interleaved rounds (``comparison.py``; ratio = median over rounds of the
candidate's block median / the floor's, spread = IQR of those ratios):

    floor           Monitor(store).evaluate(record=False)
    reads of /      the floor + open runs + the latest 50 trouble events (the
                    page's own ``Dashboard._trouble()``): every read the page
                    makes, no HTML (reference: splits the page's extra time
                    into reads and rendering)
    / in process    Dashboard.handle("GET", "/")
    /api/jobs       Dashboard.handle("GET", "/api/jobs"): the same pass as JSON
    / over HTTP     GET / from a real serve() on 127.0.0.1 (a thread of this
                    process, port 0), http.client on one kept-alive
                    connection, as a browser reloads a page
    ..., new conn.  the same with urllib.request: a connection per request
    ..., NODELAY    reference: kept-alive, the server's socket with TCP_NODELAY
                    (the standard library's disable_nagle_algorithm, which
                    serve() leaves off; set only while that one connection
                    is accepted)

    floor           monitor.stats(job) + history_items(store, job, 50)
    reads of page   the floor + the job's latest 20 trouble events (``_trouble(job, 20)``)
    /jobs/NAME, /api/jobs/NAME in process; /jobs/NAME over HTTP, the same three ways

Why the NODELAY row: ``serve()`` writes a response's headers and its body in
two writes; on a kept-alive connection, a body shorter than one segment
(the loopback MSS is ~64 KB) then waits for the ACK of the headers, which
the client delays (Nagle's algorithm against delayed ACKs): ~40 ms on Linux.

The CPU column is this process's CPU time, all threads: the HTTP rows
include the server thread's. Below each table: the paired per-round
differences in ms (what rendering and HTTP add); above them, the page sizes.

The ledger: ``--jobs`` x ``--runs`` (default 200 x 50), filled by
``bench/audit.py``'s bulk SQL on SQLite and PostgreSQL (into the tables the
store created; its shape: 1 run in 50 failed, 1 slot in 40 with a
``skipped`` event, durations from 1% to 90% of the 10-minute period, every
tenth job on a cron schedule; the rollup's triggers off during the fill,
then ``Store.rebuild_rollups()``, as ``bench/rollup.py`` does), and through the store contract
(``acquire``/``finish``: the same runs, times and outcomes; each skip is
refused while its run holds the lease) on Redis, for which ``audit.py`` has
no bulk fill. Then, through the contract on every store, the
pages get every section: an open run on ``job-1`` refused 3 starts just now
(``skips_in_a_row``), ``job-2`` has an open run, ``job-3`` one whose lease
has expired (``stuck``).

    python bench/dashboard.py                         # SQLite in a temp dir, about a minute
    python bench/dashboard.py --quick                 # a few seconds, rough numbers
    python bench/dashboard.py --store postgres        # $CRONWARDEN_TEST_POSTGRES, a fresh schema
    python bench/dashboard.py --store redis           # $CRONWARDEN_TEST_REDIS, a fresh key prefix
    python bench/dashboard.py --store postgresql://user@host:5432/db   # or redis://host:port/N

A PostgreSQL or Redis URL is used with a schema ``cw_bench_<random>`` or key
prefix ``cw-bench-<random>:`` of the bench's own (any ``schema=`` or
``prefix=`` in it is replaced), removed at the end; a ``sqlite:///PATH``
must not exist yet and is removed too. Not a timed test: nothing fails, it
prints.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

import audit
from comparison import Candidate, interleave, print_footer, print_header, print_table, quartiles, rows

FRONT_MS = 250.0
FRONT_KB = 200.0
JOB_MS = 50.0
"""Targets: the front page (first page) at 2,000 jobs in 0.25 s and 200 KB,
a job's page at 500 runs in 50 ms (the in-process and kept-alive HTTP
medians; printed against the measurement, met or not)."""
PAGE_JOB = "job-1"
"""The job whose page is timed: an open run and three skips in a row."""
POSTGRES_URL = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CRONWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")


# -- the store and its ledger ---------------------------------------------


class Ledger:
    """A fresh store of the bench's own: its URL, its kind and how to remove it."""

    def __init__(self, spec: str | None, workdir: str) -> None:
        spec = spec or "sqlite"
        self.cleanup: Callable[[], None] = lambda: None
        self.schema = ""
        scheme = spec.partition("://")[0].lower()
        if scheme in ("postgres", "postgresql"):
            self.kind = "postgres"
            base, params = _split(spec if "://" in spec else POSTGRES_URL, drop="schema")
            self.schema = f"cw_bench_{uuid.uuid4().hex[:12]}"
            self.base = base + (f"?{urlencode(params)}" if params else "")
            self.url = f"{base}?{urlencode([*params, ('schema', self.schema)])}"
        elif scheme in ("redis", "rediss"):
            self.kind = "redis"
            base, params = _split(spec if "://" in spec else REDIS_URL, drop="prefix")
            self.prefix = f"cw-bench-{uuid.uuid4().hex[:12]}:"
            self.base = base
            self.url = f"{base}?{urlencode([*params, ('prefix', self.prefix)])}"
        elif scheme == "sqlite":
            self.kind = "sqlite"
            rest, _, query = spec.partition("://")[2].partition("?")  # the store's reading of the URL
            self.path = "/" + rest.lstrip("/") if "://" in spec else os.path.join(workdir, "dashboard.db")
            if os.path.exists(self.path):
                raise SystemExit(f"{self.path} exists: the bench fills a fresh ledger, name a new file")
            self.fill_url = f"sqlite:///{self.path}"  # audit's fill reads the path after three slashes
            self.url = self.fill_url + (f"?{query}" if query else "")
        else:
            raise SystemExit(f"--store {spec!r}: expected sqlite, postgres, redis or a store URL")

    def fill(self, jobs: int, runs: int, now: float) -> None:
        # The fill's runs start on the 10-minute grid, each job up to 59 s late (as cron starts
        # them), and the latest slot that has come already has its run, started by ``now``: so the
        # findings do not depend on the time of day (no slot is missed until a minute or more
        # after ``now``; the bench reports it if that changes them before it ends).
        end = (now + audit.PERIOD - 59) // audit.PERIOD * audit.PERIOD
        if self.kind in ("sqlite", "postgres"):
            from cronwarden.stores import open_store
            from rollup import _pg_set_triggers, _sqlite_set_triggers, _sqlite_triggers

            open_store(self.url).close()  # the store creates its tables and the rollup's triggers
            # The rollup's triggers off during the bulk fill (row by row they would take most of
            # its time, longer than folding the ledger in afterwards), then on again.
            if self.kind == "sqlite":
                self.cleanup = self._remove_files
                triggers = _sqlite_triggers(self.path)
                _sqlite_set_triggers(self.path, False, triggers)
                audit._sqlite_fill(self.fill_url, jobs, runs, end)
                _sqlite_set_triggers(self.path, True, triggers)
            else:
                self.cleanup = self._drop_schema
                audit.POSTGRES_URL = self.base  # the server its fill connects to (read at call time)
                _pg_set_triggers(self.schema, False)
                audit._postgres_fill(self.url, self.schema, jobs, runs, end)
                _pg_set_triggers(self.schema, True)
            # Fold the filled ledger into the rollups, as `cronwarden rollup --rebuild` does.
            store = open_store(self.url)
            try:
                store.rebuild_rollups()
            finally:
                store.close()
        else:
            self.cleanup = self._delete_keys
            contract_fill(self.url, jobs, runs, end)
        every_section(self.url, now)

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(self.path + suffix):
                os.remove(self.path + suffix)

    def _drop_schema(self) -> None:
        import psycopg

        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    def _delete_keys(self) -> None:
        from redis_lease import cleanup

        cleanup(self.prefix, self.base)


def _split(url: str, *, drop: str) -> tuple[str, list[tuple[str, str]]]:
    base, _, query = url.partition("?")
    return base, [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != drop]


def contract_fill(url: str, jobs: int, runs: int, now: float) -> None:
    """``audit.py``'s ledger, written through ``acquire``/``finish`` (the run's
    times are the requests' wall-clock ``at``; expiry is the store's)."""
    from cronwarden.events import JobInfo, Outcome, new_id
    from cronwarden.policy import Policy
    from cronwarden.stores import open_store
    from cronwarden.stores.base import End, Granted, Start

    period = audit.PERIOD
    t0 = now - runs * period
    store = open_store(url)
    try:
        for i in range(jobs):
            job = f"job-{i}"
            store.save_job(
                JobInfo(job, "*/10 * * * *" if i % 10 == 0 else "every 10m", None if i % 10 == 0 else period,
                        "skip", "one run per window" if i % 3 == 0 else "", 60, 120, None, t0)
            )  # fmt: skip
            for n in range(runs):
                started = t0 + n * period + i % 60
                dur = (6 + (i * 37) % 534) * (0.9 + ((n * 7 + i) % 20) / 100.0)
                failed = (n * 13 + i) % 50 == 0
                granted = store.acquire(
                    Start(job, job, new_id(), "bench", 1000 + i, 60, started, Policy.SKIP)
                )
                assert isinstance(granted, Granted), granted
                if (n * 11 + i) % 40 == 0:  # refused while it runs: a skipped event naming it
                    store.acquire(Start(job, job, new_id(), "bench", 2000 + i, 60, started + dur / 2))
                end = End(Outcome.FAILED if failed else Outcome.SUCCEEDED, started + dur, int(failed))
                store.finish(granted.lease, end)
    finally:
        store.close()


def every_section(url: str, now: float) -> None:
    """Through the contract: open runs, three skips in a row and an expired
    lease, so every table of the pages has rows."""
    from cronwarden.events import new_id
    from cronwarden.policy import Policy
    from cronwarden.stores import open_store
    from cronwarden.stores.base import Granted, Refused, Start

    store = open_store(url)
    try:
        for job, ttl in ((PAGE_JOB, 3600.0), ("job-2", 3600.0), ("job-3", 0.05)):
            granted = store.acquire(Start(job, job, new_id(), "bench", 4242, ttl, now - 300, Policy.SKIP))
            assert isinstance(granted, Granted), granted
        for _ in range(3):
            refused = store.acquire(Start(PAGE_JOB, PAGE_JOB, new_id(), "bench", 4343, 60, now, Policy.SKIP))
            assert isinstance(refused, Refused), refused
        time.sleep(0.1)  # job-3's lease expires: a stuck run, which a read-only pass does not abandon
    finally:
        store.close()


# -- the HTTP side ----------------------------------------------------------


def start_server(dashboard: Any) -> int:
    """``serve(dashboard)`` in a daemon thread on 127.0.0.1, port 0; its port.
    ``serve`` stops only on KeyboardInterrupt, so the thread ends with the
    process (after the store is closed, no request is in flight)."""
    from cronwarden.web import serve

    bound: list[str] = []
    ready = threading.Event()

    def on_ready(url: str) -> None:
        bound.append(url)
        ready.set()

    threading.Thread(
        target=serve, args=(dashboard, "127.0.0.1", 0), kwargs={"ready": on_ready}, daemon=True
    ).start()
    if not ready.wait(10):
        raise SystemExit("the dashboard's server did not start listening")
    return int(bound[0].rstrip("/").rpartition(":")[2])


class Client:
    """One kept-alive connection, reopened when the server closed it (its
    handler drops a connection idle for 30 s). ``nodelay``: the server side
    of the connection gets TCP_NODELAY, the standard library's
    ``disable_nagle_algorithm``, which ``serve()`` leaves off: set only while
    this client's connection is accepted (it is read once per connection, in
    ``StreamRequestHandler.setup``, before the request is read)."""

    def __init__(self, port: int, *, nodelay: bool = False) -> None:
        self.nodelay = nodelay
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def get(self, target: str) -> bytes:
        import http.server

        for attempt in (1, 2):
            fresh = self.nodelay and self.conn.sock is None
            if fresh:
                http.server.BaseHTTPRequestHandler.disable_nagle_algorithm = True
            try:
                self.conn.request("GET", target)
                response = self.conn.getresponse()
                body = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                if attempt == 2:
                    raise
                continue
            finally:
                if fresh:  # back to StreamRequestHandler's False
                    del http.server.BaseHTTPRequestHandler.disable_nagle_algorithm
            if response.status != 200:
                raise SystemExit(f"GET {target}: {response.status} {body[:300]!r}")
            return body
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


def fresh_connection(port: int, target: str) -> Callable[[], bytes]:
    """``urllib.request``: a new connection per request (``Connection: close``)."""
    import urllib.request

    url = f"http://127.0.0.1:{port}{target}"

    def op() -> bytes:
        with urllib.request.urlopen(url, timeout=30) as response:
            return bytes(response.read())

    return op


# -- measuring --------------------------------------------------------------


def page(dashboard: Any, target: str) -> Callable[[], bytes]:
    def op() -> bytes:
        response = dashboard.handle("GET", target)
        if response.status != 200:
            raise SystemExit(f"{target}: {response.status} {response.body[:300]!r}")
        return bytes(response.body)

    return op


def paired_ms(a: Candidate, b: Candidate) -> tuple[float, float, float]:
    """Median and IQR over rounds of (a's block median − b's), in ms."""
    diffs = [(x - y) * 1e3 for x, y in zip(a.blocks, b.blocks, strict=True)]
    low, high = quartiles(diffs)
    return statistics.median(diffs), low, high


def say_diff(what: str, a: Candidate, b: Candidate) -> str:
    mid, low, high = paired_ms(a, b)
    return f"  {what}: {mid:+.2f} ms (IQR {low:+.2f} to {high:+.2f})"


def check_sections(front: bytes, job_page: bytes) -> None:
    """The pages show what the fill meant them to: no table is empty."""
    text = front.decode()
    for empty in ("No jobs in the ledger yet", "Nothing holds now.", "No run is open.", "Nothing yet."):
        if empty in text:
            raise SystemExit(f"/ has an empty section ({empty!r}): the fill is not what the bench expects")
    text = job_page.decode()
    for expect in ("<svg", ">skipped<", ">running<", ">succeeded<"):
        if expect not in text:
            raise SystemExit(f"/jobs/{PAGE_JOB} lacks {expect!r}: the fill is not what the bench expects")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", help="sqlite (default, in a temp dir), postgres, redis, or a store URL")
    ap.add_argument("--jobs", type=int, default=200, help="jobs in the ledger (default 200)")
    ap.add_argument("--runs", type=int, default=50, help="runs per job (default 50)")
    ap.add_argument(
        "--seconds", type=float, default=30.0, help="front page rounds, s (default 30; job page: 1/3)"
    )
    ap.add_argument("--quick", action="store_true", help="a fifth of the jobs, 2 s per table: a smoke run")
    args = ap.parse_args()
    jobs = max(4, args.jobs // 5) if args.quick else args.jobs
    front_budget = 2.0 if args.quick else args.seconds
    job_budget = 2.0 if args.quick else args.seconds / 3
    started = time.monotonic()

    from cronwarden.monitor import Monitor
    from cronwarden.monitor.views import history_items, open_runs
    from cronwarden.stores import open_store
    from cronwarden.web import Dashboard

    with tempfile.TemporaryDirectory(prefix="cw-bench-") as workdir:
        ledger = Ledger(args.store, workdir)
        print_header(f"cronwarden dashboard: {jobs} jobs x {args.runs} runs on {ledger.kind}")
        try:
            t0 = time.perf_counter()
            ledger.fill(jobs, args.runs, time.time())
            print(f"ledger filled in {time.perf_counter() - t0:.1f} s")
            store = open_store(ledger.url)
            try:
                monitor = Monitor(store)
                dashboard = Dashboard(monitor)
                port = start_server(dashboard)
                kept = Client(port)
                nodelay = Client(port, nodelay=True)
                target = f"/jobs/{PAGE_JOB}"
                sizes = {t: len(page(dashboard, t)()) for t in ("/", "/api/jobs", target, f"/api{target}")}
                check_sections(page(dashboard, "/")(), page(dashboard, target)())
                result = monitor.evaluate(record=False)
                print(f"the pass: {len(result.stats)} jobs, {len(result.active)} findings hold, "
                      f"{len(open_runs(store))} open runs; page sizes: "
                      + ", ".join(f"{t} {n:,} B" for t, n in sizes.items()))  # fmt: skip

                floor = Candidate("floor: evaluate(record=False)", lambda: monitor.evaluate(record=False))
                reads = Candidate(
                    "reads of /: floor + open runs + trouble",
                    lambda: (monitor.evaluate(record=False), open_runs(store), dashboard._trouble()),
                    note="reference: no HTML",
                )
                front = Candidate("/ in process", page(dashboard, "/"))
                api = Candidate("/api/jobs in process", page(dashboard, "/api/jobs"))
                http_front = Candidate(
                    "/ over HTTP", lambda: kept.get("/"), note="kept-alive, as browsers do"
                )
                http_new = Candidate(
                    "/ over HTTP, new connection", fresh_connection(port, "/"), note="urllib"
                )
                http_nodelay = Candidate(
                    "/ over HTTP, TCP_NODELAY", lambda: nodelay.get("/"), note="reference: kept-alive"
                )
                others = [reads, front, api, http_front, http_new, http_nodelay]
                # One operation per block: a pass takes ~0.1 s here, so a block of one already
                # lasts longer than comparison.BLOCK_SECONDS, and rounds stay short.
                n1 = interleave(floor, others, per_block=1, min_rounds=5, budget=front_budget, warmup=2)
                print_table(
                    f"The front page, {jobs} jobs (ms; ratios for reference, targets below)",
                    rows(floor, others, scale=1e3, unit="ms"),
                )
                print("paired per round:")
                print(say_diff("/ minus its reads (rendering the HTML)", front, reads))
                print(say_diff("/ minus the floor (open runs, trouble, HTML)", front, floor))
                print(say_diff("/ over HTTP minus / in process", http_front, front))
                print(say_diff("/ over HTTP minus the same with TCP_NODELAY", http_front, http_nodelay))

                job_floor = Candidate(
                    f"floor: stats + history_items({PAGE_JOB}, 50)",
                    lambda: (monitor.stats(PAGE_JOB), history_items(store, PAGE_JOB, 50)),
                )
                job_reads = Candidate(
                    "reads of the page: floor + its trouble",
                    lambda: (
                        monitor.stats(PAGE_JOB),
                        history_items(store, PAGE_JOB, 50),
                        dashboard._trouble(PAGE_JOB, 20),
                    ),
                    note="reference: no HTML",
                )
                job_page = Candidate(f"{target} in process", page(dashboard, target))
                job_api = Candidate(f"/api{target} in process", page(dashboard, f"/api{target}"))
                http_job = Candidate(f"{target} over HTTP", lambda: kept.get(target), note="kept-alive")
                http_job_new = Candidate(
                    f"{target} over HTTP, new connection", fresh_connection(port, target), note="urllib"
                )
                http_job_nodelay = Candidate(
                    f"{target} over HTTP, TCP_NODELAY", lambda: nodelay.get(target), note="reference"
                )
                others2 = [job_reads, job_page, job_api, http_job, http_job_new, http_job_nodelay]
                n2 = interleave(job_floor, others2, min_rounds=5, budget=job_budget, warmup=3)
                print_table(
                    f"One job's page, {args.runs} runs (ms; ratios for reference, targets below)",
                    rows(job_floor, others2, scale=1e3, unit="ms"),
                )
                print("paired per round:")
                print(say_diff("the page minus its reads (HTML + SVG)", job_page, job_reads))
                print(say_diff("over HTTP minus in process", http_job, job_page))
                print(say_diff("over HTTP minus the same with TCP_NODELAY", http_job, http_job_nodelay))
                print("\ntargets (absolute):")
                for what, got, limit, unit in (
                    (f"/ in process, {jobs} jobs", front.median * 1e3, FRONT_MS, "ms"),
                    (f"/ over HTTP, kept-alive, {jobs} jobs", http_front.median * 1e3, FRONT_MS, "ms"),
                    ("/ page size (first page)", sizes["/"] / 1e3, FRONT_KB, "KB"),
                    (f"{target} in process, {args.runs} runs", job_page.median * 1e3, JOB_MS, "ms"),
                    (f"{target} over HTTP, kept-alive", http_job.median * 1e3, JOB_MS, "ms"),
                ):
                    print(f"  {what:<40} {got:>9.1f} {unit}   target <= {limit:g} {unit}   "
                          f"{'met' if got <= limit else 'NOT met'}")  # fmt: skip
                kept.close()
                nodelay.close()
                now_active = len(monitor.evaluate(record=False).active)
                if now_active != len(result.active):
                    print(f"note: {now_active} findings hold at the end, {len(result.active)} at the "
                          "start (a slot came due): the later rounds read a bigger pass")  # fmt: skip
            finally:
                store.close()
        finally:
            ledger.cleanup()
    print_footer(n1 + n2, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
