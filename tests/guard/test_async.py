"""asyncio, first class: ``async with warden.guard(...)`` and ``@warden.job``
on an ``async def``, on every store. Store calls run off the event loop; a
run that must stop has its task cancelled before its lease could expire."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from tests.contract import assert_one_terminal_per_start, ledger

from cronwarden import LeaseLost, LeaseRevoked, NotStarted, Outcome, TimedOut, UsageError
from cronwarden.clock import SYSTEM_CLOCK
from cronwarden.events import EventKind
from cronwarden.guard import Warden
from cronwarden.lease import belief


@pytest.fixture
def warden(store_url: str) -> Iterator[Warden]:
    w = Warden(store_url, clock=SYSTEM_CLOCK, host="test-host")
    yield w
    w.close()


async def _guarded(warden: Warden, seconds: float) -> str:
    async with warden.guard("sync-accounts", ttl=30) as run:
        await asyncio.sleep(seconds)
        await run.check()
        return run.run_id


def test_two_gathered_guarded_coroutines_one_runs_one_is_recorded_skipped(warden: Warden) -> None:
    async def main() -> list[str | BaseException]:
        return await asyncio.gather(_guarded(warden, 0.3), _guarded(warden, 0.3), return_exceptions=True)

    results = asyncio.run(main())
    ran = [r for r in results if isinstance(r, str)]
    refused = [r for r in results if isinstance(r, NotStarted)]
    assert len(ran) == 1 and len(refused) == 1, results
    assert refused[0].holder_run_id == ran[0]
    skips = ledger(warden.store, kinds=[EventKind.SKIPPED])
    assert [s.data["holder_run_id"] for s in skips] == ran
    record = warden.store.run(ran[0])
    assert record is not None and record.outcome is Outcome.SUCCEEDED
    assert_one_terminal_per_start(warden.store)


def test_an_async_def_under_job_holds_the_lease_while_it_runs(warden: Warden) -> None:
    seen: list[str | None] = []

    @warden.job("sync-accounts", ttl=30)
    async def sync(n: int) -> int:
        await asyncio.sleep(0.3)
        info = await asyncio.to_thread(warden.store.lease, "sync-accounts")
        seen.append(None if info is None else info.owner)
        return n

    assert inspect.iscoroutinefunction(sync), "frameworks tell coroutine functions apart by this"

    async def main() -> list[int | None]:
        return await asyncio.gather(sync(1), sync(2))

    results = asyncio.run(main())
    assert sorted(results, key=str) == [1, None] or sorted(results, key=str) == [2, None]
    succeeded = ledger(warden.store, kinds=[EventKind.SUCCEEDED])
    assert len(succeeded) == 1 and len(ledger(warden.store, kinds=[EventKind.SKIPPED])) == 1
    # The lease was the run's while the coroutine ran, and the run lasted as
    # long as the coroutine: it was not released before its body ran.
    assert seen == [succeeded[0].run_id]
    assert succeeded[0].data["duration"] >= 0.25
    assert_one_terminal_per_start(warden.store)


# -- renewals failing: each store made unreachable for real ------------------


@contextmanager
def _sqlite_locked(url: str) -> Iterator[None]:
    """Another process's write transaction: every write waits, then fails."""
    db = sqlite3.connect(urlsplit(url).path, isolation_level=None, timeout=10)
    try:
        db.execute("BEGIN EXCLUSIVE")
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


@contextmanager
def _postgres_locked(url: str) -> Iterator[None]:
    """The leases table locked by another session: renewals wait on it."""
    import psycopg
    from psycopg import sql

    schema = dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["schema"]
    with psycopg.connect(url.split("?")[0], autocommit=False) as db:
        db.execute(sql.SQL("LOCK TABLE {}.leases IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema)))
        try:
            yield
        finally:
            db.rollback()


@contextmanager
def _redis_paused(pid: int) -> Iterator[None]:
    """The server stopped (SIGSTOP): calls hang until the client's timeout."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture
def failing(backend: str, store_url: str, tmp_path: Path) -> Iterator[tuple[str, Callable[[], object]]]:
    """A store URL, and how to make that store fail every renewal for real."""
    if backend == "sqlite":
        yield store_url, lambda: _sqlite_locked(store_url)
    elif backend == "postgres":
        yield store_url, lambda: _postgres_locked(store_url)
    else:
        # A private server: pausing the shared one would stall every other test.
        from tests.redisserver import RedisServer

        server = RedisServer(tmp_path / "redis", port=27140)
        server.start()
        try:
            yield server.url(prefix="cw_async:"), lambda: _redis_paused(server.pid)
        finally:
            server.stop()


def test_failing_renewals_cancel_the_task_before_the_ttl(failing: tuple[str, Callable[[], object]]) -> None:
    url, make_fail = failing
    ttl = 3.0
    measured: dict[str, float] = {}

    async def main(w: Warden) -> None:
        async with w.guard("sync-accounts", ttl=ttl) as run:
            hb = run.heartbeat
            while hb.renewals < 1:  # one renewal through, then the store fails
                await asyncio.sleep(0.02)
            with make_fail():  # type: ignore[attr-defined]
                last_sent = hb.deadline - belief(ttl)
                try:
                    await asyncio.sleep(10 * ttl)
                except asyncio.CancelledError:
                    measured["cancelled_after"] = time.monotonic() - last_sent
                    raise

    with Warden(url, clock=SYSTEM_CLOCK) as w:
        with pytest.raises(LeaseLost) as lost:
            asyncio.run(main(w))
        assert not isinstance(lost.value, LeaseRevoked | TimedOut)
        after = measured["cancelled_after"]
        print(f"cancelled {after:.3f}s after the last renewal was sent (ttl {ttl:g}s)")
        # Before the holder stops believing (which is before the store's
        # expiry), with the kill grace to spare, less what a busy host adds.
        assert after < belief(ttl), after
        assert after < ttl - min(10.0, ttl / 6) + 0.2, after
        records = w.store.runs("sync-accounts")
        assert [r.outcome for r in records] == [Outcome.LEASE_LOST]
        assert_one_terminal_per_start(w.store)


# -- the rest on SQLite: the async machinery is the same for every store ------


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cronwarden.db'}"


def test_store_calls_do_not_block_the_event_loop(sqlite_url: str) -> None:
    ticks: list[float] = []

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    async def main(w: Warden) -> None:
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        with _sqlite_locked(sqlite_url):
            guarded = asyncio.create_task(_guarded(w, 0.0))
            await asyncio.sleep(0.5)  # the acquire waits on the lock meanwhile
            assert not guarded.done()
        await guarded
        stop.set()
        await tick

    with Warden(sqlite_url, clock=SYSTEM_CLOCK) as w:
        w.store.lease("x")  # the schema exists before the lock is taken
        asyncio.run(main(w))
    assert len(ticks) >= 20, f"the loop ran {len(ticks)} times in 0.5s while the store was locked"


def test_a_task_cancelled_from_outside_is_recorded_interrupted(sqlite_url: str) -> None:
    async def main(w: Warden) -> str:
        ids: list[str] = []

        async def work() -> None:
            async with w.guard("sync-accounts", ttl=30) as run:
                ids.append(run.run_id)
                await asyncio.sleep(30)

        task = asyncio.create_task(work())
        while not ids:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return ids[0]

    with Warden(sqlite_url, clock=SYSTEM_CLOCK) as w:
        run_id = asyncio.run(main(w))
        record = w.store.run(run_id)
        assert record is not None and record.outcome is Outcome.INTERRUPTED
        assert record.detail == "the task was cancelled"
        info = w.store.lease("sync-accounts")
        assert info is not None and info.owner is None


def test_a_cancel_while_the_lease_is_being_taken_leaves_no_lease_held(sqlite_url: str) -> None:
    async def main(w: Warden) -> None:
        with _sqlite_locked(sqlite_url):
            task = asyncio.create_task(_guarded(w, 30))
            await asyncio.sleep(0.2)  # its acquire is waiting on the lock
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with Warden(sqlite_url, clock=SYSTEM_CLOCK) as w:
        w.store.lease("x")
        asyncio.run(main(w))
        runs = w.store.runs("sync-accounts")
        assert [r.outcome for r in runs] == [Outcome.INTERRUPTED]
        info = w.store.lease("sync-accounts")
        assert info is not None and info.owner is None


def test_a_replaced_run_is_cancelled_at_once_and_raises_lease_revoked(sqlite_url: str) -> None:
    async def holder(w: Warden, started: asyncio.Event) -> None:
        async with w.guard("sync-accounts", ttl=30, renew_every=0.1, policy="replace"):
            started.set()
            await asyncio.sleep(30)

    async def main(w: Warden, other: Warden) -> float:
        started = asyncio.Event()
        task = asyncio.create_task(holder(w, started))
        await started.wait()
        t0 = time.monotonic()
        async with other.guard("sync-accounts", ttl=30, policy="replace", replace_grace=5):
            took = time.monotonic() - t0
        with pytest.raises(LeaseRevoked):
            await task
        return took

    with Warden(sqlite_url, clock=SYSTEM_CLOCK) as w, Warden(sqlite_url, clock=SYSTEM_CLOCK) as other:
        took = asyncio.run(main(w, other))
        assert took < 3, f"the replacement waited {took:.2f}s: the old task was not cancelled"
        outcomes = sorted(r.outcome.value for r in w.store.runs("sync-accounts"))
        assert outcomes == ["replaced", "succeeded"]


def test_max_runtime_cancels_the_coroutine_and_records_timed_out(sqlite_url: str) -> None:
    with Warden(sqlite_url, clock=SYSTEM_CLOCK) as w:

        @w.job("sync-accounts", ttl=30, max_runtime="300ms")
        async def slow() -> None:
            await asyncio.sleep(30)

        t0 = time.monotonic()
        with pytest.raises(TimedOut):
            asyncio.run(slow())
        assert time.monotonic() - t0 < 5
        assert [r.outcome for r in w.store.runs("sync-accounts")] == [Outcome.TIMED_OUT]


def test_policy_queue_reruns_an_async_job_while_starts_are_pending(sqlite_url: str) -> None:
    calls: list[int] = []
    with Warden(sqlite_url, clock=SYSTEM_CLOCK) as w:

        @w.job("sync-accounts", ttl=30, policy="queue")
        async def work() -> None:
            calls.append(1)
            await asyncio.sleep(0.3)

        async def main() -> None:
            await asyncio.gather(work(), work())

        asyncio.run(main())
        assert len(calls) == 2
        assert [r.outcome for r in w.store.runs("sync-accounts")] == [Outcome.SUCCEEDED] * 2


def test_awaitables_are_never_wrapped_unguarded(sqlite_url: str) -> None:
    with Warden(sqlite_url, clock=SYSTEM_CLOCK) as w:
        with pytest.raises(UsageError, match="generator"):

            @w.job("gen")
            async def gen() -> object:  # an async generator
                yield 1

        async def coro() -> int:
            return 1

        @w.job("indirect")
        def indirect() -> object:  # a plain function handing back a coroutine
            return coro()

        with pytest.raises(UsageError, match="returned an awaitable"):
            indirect()
        assert [r.outcome for r in w.store.runs("indirect")] == [Outcome.FAILED]

        async def queued() -> None:
            async with w.guard("q", policy="queue"):
                pass

        with pytest.raises(UsageError, match="policy queue"):
            asyncio.run(queued())
