"""The scheduler at fleet size: does one instance fire 10,000 jobs a minute
on time, and do three instances share 2,000 without a double or a gap?

**One instance** (``--mode single``, the default): ``--jobs`` jobs (10,000)
``every = "1m"`` running ``true``, jitter off, fired by one real
``cronwarden scheduler`` process for ``--minutes`` minutes (5) on
``--store`` (``sqlite``, ``postgres`` or both). From the ledger afterwards:

- missed job-slots: each job and minute of the window without a run
  (a slot the start queue reached too late is recorded ``misfired``, and
  counted here);
- lateness of each start after its slot: p50, p90, p99, max;
- the scheduler's CPU per fire (its process and every process it waited
  for: keepers and commands), over the firing window only, against the
  floor measured in the same run: a bare fork+exec of ``true`` plus two
  store round trips (a slot claim and a lease read) from this process.

The scheduler starts between two minutes with ``--misfire-grace 10s`` (a start
later than that is recorded ``misfired``: missed), so
the slot of the minute it starts in is not fired while it is still loading
its jobs: the first slot measured is the next minute's.

**Three instances** (``--mode multi``): ``--jobs`` (2,000) on PostgreSQL and
Redis, three instances; at a minute's slot, once the first starts of it
are in the ledger, one instance is ``kill -9``ed and started again. From the
ledger: double fires (a job and slot with two runs) and missed job-slots.

Targets (issue 17): single, 0 missed, p99 <= 1 s, CPU per fire <= 3x the
floor; multi, 0 double fires, 0 missed. Heavy: check ``uptime`` first, run
one store at a time when the machine is quiet.

    python bench/scheduler.py --store sqlite                    # 10,000 jobs x 5 min
    python bench/scheduler.py --store postgres --minutes 2
    python bench/scheduler.py --mode multi --store postgres,redis
    python bench/scheduler.py --jobs 500 --minutes 1            # a quick look
    python bench/scheduler.py --store sqlite --sqlite-sync normal   # without the fsync of each commit

**Long runs** (``--long-every N [--long-seconds 60] [--long-ttl 15s]``):
the single instance with one more job per N, each ``sleep`` 60 s every
minute with a 15 s ttl, so its runs outlive their lease unless the
scheduler's batched heartbeat renews it. From the ledger: how each long run
started in the window ended and how long it ran (target: every one
succeeded, 0 ``lease_lost`` or ``abandoned``), the long slots skipped
because the previous long run still held the lease (policy skip, expected),
and the other jobs' missed slots.

    python bench/scheduler.py --store sqlite --jobs 2000 --minutes 3 --long-every 100
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import namespaces
from cronwarden.events import EventKind
from cronwarden.stores import open_store
from cronwarden.stores.base import EventQuery
from namespaces import cleanup

GRACE = "10s"
MULTI_GRACE = "60s"
"""The default grace for the three instances: what is judged there is
doubles and gaps across a kill, not lateness."""
TRUE = shutil.which("true") or "/bin/true"
TICK = os.sysconf("SC_CLK_TCK")


SQLITE_SYNC = "full"
"""``--sqlite-sync``: the SQLite store's ``synchronous`` (``full``, its
default, fsyncs every commit; ``normal`` shows what is left without)."""


def url_for(store: str, unique: str, tmp: Path) -> str:
    if store == "sqlite":
        return f"sqlite:///{tmp / 'cw.db'}?synchronous={SQLITE_SYNC}"
    return namespaces.url_for(store, unique)


def write_config(path: Path, jobs: int) -> None:
    lines = []
    for n in range(jobs):
        lines.append(f'[jobs.j{n:05d}]\nevery = "1m"\nttl = "60s"\ncommand = ["{TRUE}"]\n')
    path.write_text("\n".join(lines))


def start(config: Path, url: str, *extra: str, grace: str = GRACE) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "cronwarden", "scheduler", "--config", str(config), "--store", url,
            "--misfire-grace", grace, "--concurrency", "64", *extra]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_line(proc: subprocess.Popen[str], text: str, timeout: float) -> None:
    """Until the scheduler prints a line holding ``text``; the rest of its
    output is drained by a thread (a full pipe would stall it)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if text in line:
            threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
            return
        if time.monotonic() > deadline:
            break
    raise SystemExit(f"bench: the scheduler did not print {text!r} in {timeout:g}s ({proc.poll()=})")


def proc_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and the children it waited for, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICK  # utime stime cutime cstime


def next_minute(after: float) -> float:
    return (int(after) // 60 + 1) * 60.0


def sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 1.0))


def ledger(url: str, since: float, slots: list[float]) -> tuple[list[Any], int, set[tuple[str, float]]]:
    """The started events since ``since``, the count of misfired slots among
    ``slots``, and those (job, slot) pairs."""
    with open_store(url) as store:
        started = store.events(EventQuery(kinds=[EventKind.STARTED], since=since, limit=10_000_000,
                                          newest_first=False))  # fmt: skip
        misfired = store.events(EventQuery(kinds=[EventKind.MISFIRED], since=since, limit=10_000_000))
    decided = {(e.job, float(e.data["slot"])) for e in misfired if e.data.get("slot") in slots}
    return started, len(decided), decided


def floor(url: str, n: int = 300) -> tuple[float, float]:
    """Seconds of CPU of a bare fork+exec of ``true`` (waited for), and of two
    store round trips (a slot claim and a lease read), each the mean of ``n``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    mine = time.process_time()
    for _ in range(n):
        pid = os.posix_spawn(TRUE, [TRUE], {})
        os.waitpid(pid, 0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawn = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
             + time.process_time() - mine) / n  # fmt: skip
    with open_store(url) as store:
        store.claim_slot("floor", -5.0, "bench", 3600)  # connect, migrate
        mine = time.process_time()
        for i in range(n):
            store.claim_slot("floor", float(i), "bench", 3600)
            store.lease("floor")
        trips = (time.process_time() - mine) / n
    return spawn, trips


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def first_slot() -> float:
    """The first slot measured: the next minute's when it is 45 s away or
    more, else the one after, from 15 s past this minute (past the 10 s
    grace, so that minute's slot is not fired): time enough to load the jobs
    before it."""
    now = time.time()
    boundary = next_minute(now)
    if boundary - now < 45:
        sleep_until(boundary + 15)
        boundary += 60
    return boundary


def start_between_minutes(
    config: Path, url: str, minutes: int, *, stop_timeout: float
) -> tuple[subprocess.Popen[str], float]:
    """One scheduler for ``minutes`` slots from ``first_slot()``, returned
    with that slot once its jobs are loaded."""
    boundary = first_slot()
    proc = start(config, url, "--for", f"{boundary + minutes * 60 - 20 - time.time():.0f}s",
                 "--stop-timeout", f"{stop_timeout:g}s")  # fmt: skip
    wait_line(proc, "job(s) from", timeout=max(40.0, boundary - time.time() - 2))
    return proc, boundary


def single(store: str, jobs: int, minutes: int, out: dict[str, Any]) -> bool:
    unique = uuid.uuid4().hex[:10]
    tmp = Path(tempfile.mkdtemp(prefix="cw-bench-sched-"))
    url = url_for(store, unique, tmp)
    config = tmp / "cronwarden.toml"
    write_config(config, jobs)
    try:
        spawn, trips = floor(url)
        proc, boundary = start_between_minutes(config, url, minutes, stop_timeout=30.0)
        sleep_until(boundary - 1)
        cpu0 = proc_cpu(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        cpu = usage.ru_utime + usage.ru_stime - cpu0
        proc.returncode = os.waitstatus_to_exitcode(status)
        slots = [boundary + 60 * m for m in range(minutes)]
        started, misfired, _ = ledger(url, boundary - 5, slots)
        ran: dict[tuple[str, float], list[float]] = {}
        for e in started:
            slot = e.data.get("slot")
            if slot in slots:
                ran.setdefault((e.job, float(slot)), []).append(e.at - float(slot))
        late = [min(v) for v in ran.values()]
        expected = jobs * minutes
        missed = expected - len(ran)
        doubles = sum(len(v) > 1 for v in ran.values())
        fires = len(started)
        per_fire = cpu / fires if fires else float("nan")
        floor_cpu = spawn + trips
        result = {
            "store": store, "jobs": jobs, "minutes": minutes, "expected": expected, "missed": missed,
            "misfired": misfired, "doubles": doubles, "p50": pct(late, 0.5), "p90": pct(late, 0.9),
            "p99": pct(late, 0.99), "max": max(late, default=float("nan")), "fires": fires,
            "cpu_s": cpu, "cpu_per_fire_ms": per_fire * 1000, "floor_ms": floor_cpu * 1000,
            "floor_spawn_ms": spawn * 1000, "floor_trips_ms": trips * 1000,
            "ratio": per_fire / floor_cpu, "exit": proc.returncode, "load": os.getloadavg(),
            "cpu_per_decision_ms": cpu / max(1, fires + misfired) * 1000,
        }  # fmt: skip
        out.setdefault("single", []).append(result)
        ok = missed == 0 and result["p99"] <= 1.0 and result["ratio"] <= 3.0
        print(f"{store}: {jobs} jobs x {minutes} min: missed {missed} of {expected} (misfired {misfired}), "
              f"doubles {doubles}; lateness p50/p90/p99/max {result['p50']:.2f} / {result['p90']:.2f} / "
              f"{result['p99']:.2f} / {result['max']:.2f} s; CPU per fire {per_fire * 1000:.2f} ms vs floor "
              f"{floor_cpu * 1000:.2f} ms (fork+exec {spawn * 1000:.2f} + 2 round trips {trips * 1000:.2f}) "
              f"= {result['ratio']:.1f}x (per slot decided, run or misfired: "
              f"{result['cpu_per_decision_ms']:.2f} ms); exit {proc.returncode}; load "
              f"{os.getloadavg()[0]:.2f} [{'ok' if ok else 'TARGET MISSED'}]", flush=True)  # fmt: skip
        return ok
    finally:
        cleanup(store, unique)
        shutil.rmtree(tmp, ignore_errors=True)


def multi(store: str, jobs: int, minutes: int, out: dict[str, Any]) -> bool:
    unique = uuid.uuid4().hex[:10]
    tmp = Path(tempfile.mkdtemp(prefix="cw-bench-sched-"))
    url = url_for(store, unique, tmp)
    config = tmp / "cronwarden.toml"
    write_config(config, jobs)
    procs: list[subprocess.Popen[str]] = []
    try:
        boundary = first_slot()
        end = boundary + minutes * 60 - 20
        for n in range(3):
            procs.append(
                start(
                    config, url, "--for", f"{end - time.time():.0f}s", "--id", f"inst-{n}", grace=MULTI_GRACE
                )
            )
        for p in procs:
            wait_line(p, "job(s) from", timeout=max(40.0, boundary - time.time() - 2))
        # The kill: in the second minute's slot, once its first starts are in.
        doomed_slot = boundary + 60 if minutes > 1 else boundary
        sleep_until(doomed_slot + 0.3)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        killed_at = time.time()
        procs[0] = start(
            config, url, "--for", f"{end - time.time():.0f}s", "--id", "inst-0-again", grace=MULTI_GRACE
        )
        wait_line(procs[0], "job(s) from", timeout=120)
        for p in procs:
            p.wait(timeout=end - time.time() + 120)
        slots = [boundary + 60 * m for m in range(minutes)]
        started, misfired, decided = ledger(url, boundary - 5, slots)
        ran: dict[tuple[str, float], int] = {}
        for e in started:
            slot = e.data.get("slot")
            if slot in slots:
                ran[(e.job, float(slot))] = ran.get((e.job, float(slot)), 0) + 1
        expected = jobs * minutes
        missed = expected - len(ran)
        doubles = sum(v > 1 for v in ran.values())
        # A slot with neither a run nor a misfired record: lost (a claim
        # whose instance died before the run started).
        lost = expected - len(set(ran) | decided)
        result = {"store": store, "jobs": jobs, "minutes": minutes, "expected": expected, "missed": missed,
                  "lost": lost, "misfired": misfired, "doubles": doubles,
                  "killed_after_slot_s": killed_at - doomed_slot,
                  "exits": [p.returncode for p in procs], "load": os.getloadavg()}  # fmt: skip
        out.setdefault("multi", []).append(result)
        ok = missed == 0 and doubles == 0 and lost == 0
        print(f"{store}: 3 instances, {jobs} jobs x {minutes} min, one kill -9'd "
              f"{killed_at - doomed_slot:.1f} s into a slot and restarted: double fires {doubles}, missed "
              f"{missed} of {expected} (misfired {misfired}, lost with no record {lost}); exits "
              f"{result['exits']}; load {os.getloadavg()[0]:.2f} [{'ok' if ok else 'TARGET MISSED'}]",
              flush=True)  # fmt: skip
        return ok
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        cleanup(store, unique)
        shutil.rmtree(tmp, ignore_errors=True)


def add_long_jobs(path: Path, jobs: int, every: int, seconds: float, ttl: str) -> list[str]:
    """Put one long job per ``every`` jobs at the head of the config:
    ``sleep seconds`` every minute with a ttl well under its length, so
    each of its runs lives only by its renewals (the scheduler's batched
    heartbeat), through the fires of all the others. At the head: a slot's
    fires start in config order, and at the tail the long ones would be the
    first misfired when the others are not all started within the grace.
    Their names."""
    names = [f"long{n:04d}" for n in range(jobs // every)]
    head = "".join(f'[jobs.{name}]\nevery = "1m"\nttl = "{ttl}"\ncommand = ["sleep", "{seconds:g}"]\n\n'
                   for name in names)  # fmt: skip
    path.write_text(head + path.read_text())
    return names


def long_runs(store: str, jobs: int, minutes: int, every: int, seconds: float, ttl: str,
              out: dict[str, Any]) -> bool:  # fmt: skip
    """``--long-every``: the single instance's ``jobs`` plus one long job per
    ``every``; from the ledger, how the long runs started in the window
    ended (target: each succeeded, after its full length, 0 ``lease_lost``)
    and what the other jobs' slots got meanwhile."""
    unique = uuid.uuid4().hex[:10]
    tmp = Path(tempfile.mkdtemp(prefix="cw-bench-sched-"))
    url = url_for(store, unique, tmp)
    config = tmp / "cronwarden.toml"
    write_config(config, jobs)
    names = add_long_jobs(config, jobs, every, seconds, ttl)
    proc: subprocess.Popen[str] | None = None
    try:
        # The last slot's long runs end on their own within the stop timeout.
        proc, boundary = start_between_minutes(config, url, minutes, stop_timeout=seconds + 30)
        proc.wait()
        slots = [boundary + 60 * m for m in range(minutes)]
        started, misfired, _ = ledger(url, boundary - 5, slots)
        long_set = set(names)
        short = {(e.job, float(e.data["slot"])) for e in started
                 if e.job not in long_set and e.data.get("slot") in slots}  # fmt: skip
        with open_store(url) as s:
            lost = s.events(EventQuery(kinds=[EventKind.LEASE_LOST, EventKind.ABANDONED], since=boundary - 5,
                                       limit=1_000_000))  # fmt: skip
            runs = [r for name in names for r in s.runs(name, 100) if r.slot in slots]
            skipped = s.events(EventQuery(kinds=[EventKind.SKIPPED], since=boundary - 5, limit=1_000_000))
        outcomes: dict[str, int] = {}
        for r in runs:
            name = r.outcome.value if r.outcome else "open"
            outcomes[name] = outcomes.get(name, 0) + 1
        full = [r.duration for r in runs if r.duration is not None]
        held = sum(1 for e in skipped if e.job in long_set)
        expected = jobs * minutes
        result = {
            "store": store, "jobs": jobs, "long_jobs": len(names), "long_seconds": seconds, "long_ttl": ttl,
            "minutes": minutes, "long_runs": len(runs), "long_outcomes": outcomes,
            "long_duration_min": min(full, default=None), "long_duration_max": max(full, default=None),
            "long_slots_skipped_held": held, "lease_lost_or_abandoned": len(lost),
            "short_missed": expected - len(short), "short_expected": expected, "misfired": misfired,
            "exit": proc.returncode, "load": os.getloadavg(),
        }  # fmt: skip
        out.setdefault("long", []).append(result)
        ok = bool(runs) and outcomes == {"succeeded": len(runs)} and not lost
        print(f"{store}: {jobs} jobs + {len(names)} long ({seconds:g} s, ttl {ttl}) x {minutes} min: "
              f"{len(runs)} long runs {outcomes}, durations {result['long_duration_min'] or 0:.1f}-"
              f"{result['long_duration_max'] or 0:.1f} s, {held} long slots skipped (held by the previous "
              f"run); lease_lost/abandoned {len(lost)}; other jobs missed {result['short_missed']} of "
              f"{expected} (misfired {misfired}); exit {proc.returncode}; load {os.getloadavg()[0]:.2f} "
              f"[{'ok' if ok else 'TARGET MISSED'}]", flush=True)  # fmt: skip
        return ok
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        cleanup(store, unique)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("single", "multi"), default="single")
    ap.add_argument("--store", default=None, help="comma-separated: sqlite, postgres, redis "
                    "(default: sqlite,postgres single; postgres,redis multi)")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=None, help="default 10000 single, 2000 multi")
    ap.add_argument("--minutes", type=int, default=5)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    ap.add_argument("--sqlite-sync", choices=("full", "normal"), default="full",
                    help="the SQLite store's synchronous (default full: each commit fsynced)")  # fmt: skip
    ap.add_argument("--long-every", type=int, metavar="N", help="single: add one long job per N jobs and "
                    "judge how its runs end (long_runs)")  # fmt: skip
    ap.add_argument("--long-seconds", type=float, default=60.0, help="the long jobs' length (default 60)")
    ap.add_argument("--long-ttl", default="15s", help="the long jobs' ttl (default 15s: renewed every 5 s)")
    args = ap.parse_args()
    global SQLITE_SYNC
    SQLITE_SYNC = args.sqlite_sync
    stores = (args.store or ("sqlite,postgres" if args.mode == "single" else "postgres,redis")).split(",")
    jobs = args.jobs or (10_000 if args.mode == "single" else 2_000)
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores", flush=True)
    out: dict[str, Any] = {}
    ok = True
    for store in stores:
        if args.long_every:
            ok = long_runs(store.strip(), jobs, args.minutes, args.long_every, args.long_seconds,
                           args.long_ttl, out) and ok  # fmt: skip
            continue
        run = single if args.mode == "single" else multi
        ok = run(store.strip(), jobs, args.minutes, out) and ok
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
