"""The SQLite store's threads share commits: a write that ends while others
wait for the connection leaves its transaction for them, and one commit
covers them all. Each write still returns only once it is committed, and one
that fails undoes only its own statements."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from tests.contract import end, granted, start

from cronwarden.errors import StoreError
from cronwarden.events import Event, EventKind
from cronwarden.stores.base import EventQuery
from cronwarden.stores.sqlite import SqliteStore

THREADS = 16
WRITES = 25


def _together(work: list[threading.Thread]) -> None:
    for t in work:
        t.start()
    for t in work:
        t.join(60)
        assert not t.is_alive()


def test_every_write_of_many_threads_is_committed_when_it_returns(tmp_path: Path) -> None:
    path = str(tmp_path / "cw.db")
    unseen: list[str] = []
    with SqliteStore(path) as store, SqliteStore(path) as other:
        go = threading.Barrier(THREADS)

        def write(n: int) -> None:
            go.wait()
            for i in range(WRITES):
                job = f"j{n}"
                lease = granted(store.acquire(start(job))).lease
                store.record(Event(EventKind.MISFIRED, job, 1_750_000_000.0 + i, data={"i": i}))
                store.finish(lease, end())
                # Another connection (as another process would) sees it all.
                if other.open_runs(job) or len(other.runs(job, limit=WRITES)) != i + 1:
                    unseen.append(f"{job} #{i}")

        _together([threading.Thread(target=write, args=(n,)) for n in range(THREADS)])
        commits = store._lock.epoch
    assert unseen == []
    with SqliteStore(path) as store:
        events = store.events(EventQuery(kinds=[EventKind.MISFIRED], limit=10_000))
        assert len(events) == THREADS * WRITES
        assert all(len(store.runs(f"j{n}", limit=100)) == WRITES for n in range(THREADS))
    # Shared: fewer commits than the 3 writes per step of each thread.
    assert commits < 3 * THREADS * WRITES


def test_a_write_that_fails_among_shared_ones_undoes_only_its_own(tmp_path: Path) -> None:
    """A start refused by the ledger (its run id is taken) granted the lease
    before it failed: that grant is undone, while the other threads' writes
    in the same transaction are committed."""
    path = str(tmp_path / "cw.db")
    with SqliteStore(path) as store:
        used = start("taken")
        store.finish(granted(store.acquire(used)).lease, end())
        go = threading.Barrier(THREADS + 1)
        failures: list[BaseException] = []

        def write(n: int) -> None:
            go.wait()
            for i in range(WRITES):
                store.record(Event(EventKind.MISFIRED, f"j{n}", 1_750_000_000.0 + i, data={"i": i}))

        def refused() -> None:
            go.wait()
            for _ in range(WRITES):
                try:
                    store.acquire(start("taken", run_id=used.run_id))
                except StoreError as e:
                    failures.append(e)

        _together([threading.Thread(target=write, args=(n,)) for n in range(THREADS)]
                  + [threading.Thread(target=refused)])  # fmt: skip
        assert len(failures) == WRITES
        assert all("UNIQUE constraint failed: runs.run_id" in str(e) for e in failures)
        # The lease was never left granted: the next start gets the token after the first.
        assert store.open_runs("taken") == []
        assert granted(store.acquire(start("taken"))).lease.token == 2
    with SqliteStore(path) as store:
        events = store.events(EventQuery(kinds=[EventKind.MISFIRED], limit=10_000))
        assert len(events) == THREADS * WRITES


@pytest.mark.parametrize("writers", [1, THREADS])
def test_a_renewal_between_shared_writes_commits_them_first(tmp_path: Path, writers: int) -> None:
    """The heartbeat's renewal runs its own transaction: one left open for
    waiting writes is committed before it, never nested."""
    path = str(tmp_path / "cw.db")
    with SqliteStore(path) as store:
        leases = [granted(store.acquire(start(f"long{n}"))).lease for n in range(4)]
        go = threading.Barrier(writers + 1)
        errors: list[BaseException] = []

        def write(n: int) -> None:
            go.wait()
            for i in range(WRITES):
                store.record(Event(EventKind.MISFIRED, f"j{n}", 1_750_000_000.0 + i, data={"i": i}))

        def renew() -> None:
            go.wait()
            for _ in range(WRITES):
                try:
                    assert store.renew_many(leases) == [None] * len(leases)
                    store.renew(leases[0])
                except BaseException as e:
                    errors.append(e)

        _together([threading.Thread(target=write, args=(n,)) for n in range(writers)]
                  + [threading.Thread(target=renew)])  # fmt: skip
        assert errors == []
    with SqliteStore(path) as store:
        assert len(store.events(EventQuery(kinds=[EventKind.MISFIRED], limit=10_000))) == writers * WRITES
