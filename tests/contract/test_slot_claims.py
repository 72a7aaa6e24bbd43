"""The scheduler's slot claim (``Store.claim_slot``, G8): the first owner of
a ``(job, slot)`` is every caller's answer, its own included, until the
claim is forgotten ``keep`` seconds later by the store's clock. A claim
writes nothing to the ledger, and a job's old claims do not pile up.

Time is handled as in ``test_lock``: SQLite's fake clock is advanced; on a
server the keep is short and real, and the test polls the behaviour under
test with a deadline."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from tests.processes import spawn_python

from cronwarden.clock import Clock, FakeClock
from cronwarden.stores import open_store
from cronwarden.stores.base import Store

from . import LONG_TTL, ledger

KEEP = LONG_TTL
"""Keep of a claim a test needs to stay held throughout."""
SLOT = 1_700_000_040.0
JOB = "nightly"
WORKERS = 8
ROUNDS = 50
"""Slots every worker claims, one after another: fifty races, not one."""
STEP = 0.02
"""Seconds between the workers' claims of one slot and of the next. Without
a common start per slot the first worker to get going claims every slot
before the others ask."""
POSTGRES_URL = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CRONWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")


def short_keep(clock: Clock) -> float:
    return 30.0 if isinstance(clock, FakeClock) else 0.3


def forget(store: Store, clock: Clock, job: str, slot: float, keep: float) -> None:
    """Let the claim of ``(job, slot)`` be forgotten by the store's clock and
    claim it as ``late-owner``. A fake clock is advanced; on a server the
    test polls ``claim_slot`` itself (the behaviour under test) with a
    deadline."""
    if isinstance(clock, FakeClock):
        clock.advance(keep + 1.0)
        assert store.claim_slot(job, slot, "late-owner", keep) == "late-owner"
        return
    deadline = time.monotonic() + keep + 10.0
    while store.claim_slot(job, slot, "late-owner", keep) != "late-owner":
        if time.monotonic() > deadline:
            pytest.fail(f"slot {slot} of {job!r} still claimed {keep + 10.0:g}s after its keep")
        time.sleep(0.02)


def stored_claims(backend: str, store: Store, job: str) -> int:
    """How many claims of ``job`` the store holds, read past the contract
    (what pruning is for is not visible through it)."""
    if backend == "sqlite":
        from cronwarden.stores.sqlite import SqliteStore

        assert isinstance(store, SqliteStore)
        with sqlite3.connect(store.path) as db:
            return int(db.execute("SELECT count(*) FROM slot_claims WHERE job = ?", (job,)).fetchone()[0])
    if backend in ("postgres", "pgbouncer"):
        import psycopg

        from cronwarden.stores.postgres import PostgresStore

        assert isinstance(store, PostgresStore)
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            sql = f'SELECT count(*) FROM "{store.schema}".slot_claims WHERE job = %s'
            row = conn.execute(sql, (job,)).fetchone()
        assert row is not None
        return int(row[0])
    import redis

    from cronwarden.stores.redis import RedisStore

    assert isinstance(store, RedisStore)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return sum(1 for _ in client.scan_iter(match=f"{store.prefix}slot:{job}:*"))
    finally:
        client.close()


def test_the_first_claim_wins_and_a_second_owner_is_told_the_first(store: Store) -> None:
    assert store.claim_slot(JOB, SLOT, "a", KEEP) == "a"
    assert store.claim_slot(JOB, SLOT, "b", KEEP) == "a"


def test_the_same_owner_asking_again_is_answered_with_itself(store: Store) -> None:
    # A retry after a lost reply: the caller fires once, on whichever answer it reads.
    assert store.claim_slot(JOB, SLOT, "a", KEEP) == "a"
    assert store.claim_slot(JOB, SLOT, "a", KEEP) == "a"
    assert store.claim_slot(JOB, SLOT, "b", KEEP) == "a"
    assert store.claim_slot(JOB, SLOT, "a", KEEP) == "a"


def test_different_slots_and_different_jobs_are_claimed_apart(store: Store) -> None:
    assert store.claim_slot(JOB, SLOT, "a", KEEP) == "a"

    assert store.claim_slot(JOB, SLOT + 60, "b", KEEP) == "b"
    assert store.claim_slot(JOB, SLOT + 0.5, "c", KEEP) == "c", "a fraction of a second is another slot"
    assert store.claim_slot("hourly", SLOT, "d", KEEP) == "d"
    assert store.claim_slot(JOB, SLOT, "e", KEEP) == "a"
    assert store.claim_slot(JOB, SLOT + 60, "e", KEEP) == "b"
    assert store.claim_slot("hourly", SLOT, "e", KEEP) == "d"


def test_a_claim_writes_nothing_to_the_ledger(store: Store) -> None:
    for i in range(3):
        store.claim_slot(JOB, SLOT + 60 * i, "a", KEEP)
        store.claim_slot(JOB, SLOT + 60 * i, "b", KEEP)

    assert ledger(store) == []
    assert store.runs(JOB) == []
    assert store.open_runs() == []
    assert store.lease(JOB) is None


def test_a_claim_is_held_until_keep_by_the_stores_clock(store: Store, clock: Clock) -> None:
    if not isinstance(clock, FakeClock):
        pytest.skip("needs a clock the test moves: the SQLite store's injected clock")
    assert store.claim_slot(JOB, SLOT, "a", 30.0) == "a"
    clock.advance(29.0)
    assert store.claim_slot(JOB, SLOT, "b", 30.0) == "a", "claimed at t=0 for 30 s: held at t=29"
    clock.advance(2.0)

    assert store.claim_slot(JOB, SLOT, "b", 30.0) == "b"


def test_a_claim_is_forgotten_after_keep_and_the_slot_claimed_again(store: Store, clock: Clock) -> None:
    keep = short_keep(clock)
    assert store.claim_slot(JOB, SLOT, "a", keep) == "a"
    assert store.claim_slot(JOB, SLOT, "b", keep) == "a"

    forget(store, clock, JOB, SLOT, keep)

    assert store.claim_slot(JOB, SLOT, "a", keep) == "late-owner", "the new claim holds in turn"


def test_a_jobs_old_claims_are_pruned_so_storage_stays_bounded(
    store: Store, clock: Clock, backend: str
) -> None:
    keep = short_keep(clock)
    for i in range(5):
        store.claim_slot(JOB, SLOT + i, "a", keep)
    store.claim_slot("hourly", SLOT, "a", KEEP)

    # Once the five are older than keep, one more claim leaves only itself
    # (SQL stores prune the job's claims in that call; Redis expires keys).
    if isinstance(clock, FakeClock):
        clock.advance(keep + 1.0)
    deadline = time.monotonic() + keep + 10.0
    while True:
        store.claim_slot(JOB, SLOT + 100, "a", keep)
        if (left := stored_claims(backend, store, JOB)) == 1:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"{left} claims of {JOB!r} still stored {keep + 10.0:g}s after their keep")
        time.sleep(0.02)
    assert stored_claims(backend, store, "hourly") == 1, "another job's live claim is not touched"


def test_a_claim_of_an_earlier_boot_is_judged_by_this_boots_clock(tmp_path: Path) -> None:
    # SQLite only: CLOCK_BOOTTIME starts again at a reboot, so an earlier
    # boot's claim time cannot be compared with this boot's. It is kept
    # while this boot is younger than keep (less may have passed since it),
    # and forgotten once this boot is older (more has, whatever its time).
    url = f"sqlite:///{tmp_path / 'boots.db'}"
    with open_store(url, clock=FakeClock(start=1_000_000.0, boot="boot-1")) as first:
        assert first.claim_slot(JOB, SLOT, "a", 30.0) == "a"
    this_boot = FakeClock(start=5.0, boot="boot-2")
    with open_store(url, clock=this_boot) as second:
        assert second.claim_slot(JOB, SLOT, "b", 30.0) == "a"
        this_boot.advance(26.0)

        assert second.claim_slot(JOB, SLOT, "b", 30.0) == "b"


def claimer(url: str, owner: str) -> None:
    """Run in a child process: print ``ready``, read a start time on stdin
    (``time.monotonic``, CLOCK_MONOTONIC: one clock for every process on the
    host), then claim slot i of JOB as ``owner`` at start + i * STEP, and
    print the answers as one JSON line."""
    answers = []
    with open_store(url) as store:
        print("ready", flush=True)
        begin = float(sys.stdin.readline())
        for i in range(ROUNDS):
            time.sleep(max(0.0, begin + i * STEP - time.monotonic()))
            answers.append(store.claim_slot(JOB, SLOT + i, owner, KEEP))
    print(json.dumps(answers), flush=True)


def _spawn(url: str, owner: str) -> subprocess.Popen[str]:
    return spawn_python(f"from contract.test_slot_claims import claimer; claimer({url!r}, {owner!r})")


def test_eight_processes_racing_for_a_slot_agree_on_one_owner(store_url: str, store: Store) -> None:
    owners = [f"scheduler-{i}-{uuid.uuid4().hex[:6]}" for i in range(WORKERS)]
    procs = [_spawn(store_url, owner) for owner in owners]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.strip() == "ready", f"worker failed to start: {line!r} {p.stderr and p.stderr.read()}"
        begin = time.monotonic() + 0.2  # time for every worker to read it
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{begin!r}\n")
            p.stdin.flush()
        answers = {}
        for owner, p in zip(owners, procs, strict=True):
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, f"worker exited {p.returncode}:\n{err}"
            answers[owner] = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    winners: list[str] = []
    for i in range(ROUNDS):
        told = {owner: answers[owner][i] for owner in owners}
        fired = [owner for owner, answer in told.items() if answer == owner]
        assert len(fired) == 1, f"slot {i}: {len(fired)} workers were answered with themselves: {told}"
        assert set(told.values()) == set(fired), f"slot {i}: workers disagree on the owner: {told}"
        winners.append(fired[0])
    assert len(set(winners)) > 1, "one worker won every slot: the workers never raced"
    # A store opened afresh (the store's own clock, as the workers had) agrees.
    with open_store(store_url) as referee:
        assert [referee.claim_slot(JOB, SLOT + i, "referee", KEEP) for i in range(ROUNDS)] == winners
    assert ledger(store) == []
