"""Many processes, one key: 8 workers × 200 attempts, each worker with its own
store. A referee checks the grants the workers report (tokens rise in the
order the holds began, and no two holds overlap in time), and the ledger
(one terminal record per start, one ``skipped`` per refusal).

Workers are separate interpreters started by ``subprocess`` and released
together through their stdin, so they contend from the first attempt.
``time.monotonic`` is CLOCK_MONOTONIC, one clock for every process on the
host, so their intervals can be compared."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections import Counter

from tests.processes import spawn_python

from cronwarden.events import EventKind
from cronwarden.stores.base import Store

from . import assert_one_terminal_per_start, ledger

WORKERS = 8
ATTEMPTS = 200
HOLD = 0.002
"""Seconds a worker holds the lease: long enough for others to collide."""
PAUSE = 0.002
"""Most seconds a worker waits between attempts. Without it the releasing
worker wins the next grant before the others' lock retries wake up, and
the lease never changes hands between processes."""
TTL = 60.0
"""Never expires during the test: every handover is a release."""
JOB = "contended"


def worker(url: str, attempts: int) -> None:
    """Run in a child process: print ``ready``, wait for ``go`` on stdin, then
    try ``attempts`` starts and print one JSON line with what happened."""
    import os
    import random
    import socket

    from cronwarden.events import Outcome, new_id
    from cronwarden.stores import open_store
    from cronwarden.stores.base import End, Granted, Start

    grants: list[tuple[int, float, float, str, int]] = []
    refusals: list[tuple[str, str]] = []
    with open_store(url) as store:
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(attempts):
            s = Start(
                job=JOB,
                key=JOB,
                run_id=new_id(),
                host=socket.gethostname(),
                pid=os.getpid(),
                ttl=TTL,
                at=time.time(),
            )
            result = store.acquire(s)
            if isinstance(result, Granted):
                t_acquired = time.monotonic()  # after the grant: the hold starts no earlier
                time.sleep(HOLD)  # the work
                t_released = time.monotonic()  # before the release: the hold ends no later
                store.finish(result.lease, End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0))
                grants.append((result.lease.token, t_acquired, t_released, s.run_id, os.getpid()))
            else:
                refusals.append((s.run_id, result.refusal.value))
            time.sleep(random.uniform(0, PAUSE))
    print(json.dumps({"grants": grants, "refusals": refusals}), flush=True)


def _spawn(url: str) -> subprocess.Popen[str]:
    return spawn_python(f"from contract.test_many_processes import worker; worker({url!r}, {ATTEMPTS})")


def _run_workers(url: str) -> list[dict[str, list]]:
    procs = [_spawn(url) for _ in range(WORKERS)]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.strip() == "ready", f"worker failed to start: {line!r} {p.stderr and p.stderr.read()}"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        reports = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, f"worker exited {p.returncode}:\n{err}"
            reports.append(json.loads(out.strip().splitlines()[-1]))
        return reports
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_eight_processes_contending_for_one_key_never_hold_it_together(store_url: str, store: Store) -> None:
    began = time.monotonic()
    reports = _run_workers(store_url)
    elapsed = time.monotonic() - began

    grants = sorted(
        (tuple(g) for r in reports for g in r["grants"]), key=lambda g: g[1]
    )  # by the time each hold began
    refusals = [tuple(x) for r in reports for x in r["refusals"]]
    assert len(grants) + len(refusals) == WORKERS * ATTEMPTS
    assert refusals, "no start was ever refused: the test proves nothing"
    assert {kind for _, kind in refusals} == {"skipped"}
    # Referee: each grant's token is larger than every earlier one, and each
    # hold ended before the next began.
    handovers = 0
    for a, b in itertools.pairwise(grants):
        (tok_a, _, released_a, run_a, pid_a), (tok_b, acquired_b, _, run_b, pid_b) = a, b
        assert tok_b > tok_a, f"token went from {tok_a} ({run_a}) to {tok_b} ({run_b})"
        assert acquired_b > released_a, f"holds of {run_a} and {run_b} overlapped"
        handovers += pid_a != pid_b
    assert handovers >= WORKERS, f"the lease changed process only {handovers} times: too little contention"
    assert elapsed < 60

    # Ledger: one start and one terminal per grant, one skipped per refusal.
    started = ledger(store, kinds=[EventKind.STARTED])
    assert sorted(e.run_id for e in started) == sorted(g[3] for g in grants)
    tokens = {e.run_id: e.data["token"] for e in started}
    assert all(tokens[run_id] == token for token, _, _, run_id, _ in grants)
    skipped = Counter(e.run_id for e in ledger(store, kinds=[EventKind.SKIPPED]))
    assert skipped == Counter(run_id for run_id, _ in refusals)
    assert_one_terminal_per_start(store)
