"""Scripted ledgers for the monitor, report and audit tests: runs written
through the store contract at the times a test chooses, so a history of
weeks takes milliseconds and no test sleeps."""

from __future__ import annotations

import time

from cronwarden.clock import Clock, FakeClock
from cronwarden.events import JobInfo, Outcome, new_id
from cronwarden.lease import Lease
from cronwarden.policy import Policy
from cronwarden.stores.base import End, Granted, Refused, Start, Store

PERIOD = 600.0
"""Every test job runs every 10 minutes unless it says otherwise."""


def history_clock(clock: Clock) -> FakeClock:
    """The clock the monitor reads. On SQLite it is the store's own fake
    clock (so lease expiry moves with it); the servers judge expiry by their
    own clocks, so there the monitor gets a fake clock of its own, started now."""
    return clock if isinstance(clock, FakeClock) else FakeClock(start=time.time())


def aligned(t: float, period: float = PERIOD) -> float:
    """The slot of ``t``: schedules ``every N`` fire on multiples of N."""
    return (t // period) * period


def describe(store: Store, job: str, *, period: float = PERIOD, at: float = 0.0, **fields: object) -> JobInfo:
    from cronwarden.durations import format_duration

    info = JobInfo(name=job, schedule=f"every {format_duration(period)}", period=period, updated_at=at,
                   **fields)  # type: ignore[arg-type]  # fmt: skip
    store.save_job(info)
    return info


def begin(
    store: Store,
    job: str,
    at: float,
    *,
    ttl: float = 3600.0,
    policy: Policy = Policy.SKIP,
    key: str | None = None,
    run_id: str | None = None,
) -> Granted | Refused:
    return store.acquire(
        Start(
            job=job,
            key=key or job,
            run_id=run_id or new_id(),
            host="host-a",
            pid=4242,
            ttl=ttl,
            at=at,
            policy=policy,
            slot=aligned(at),
        )
    )


def lease_of(result: Granted | Refused) -> Lease:
    assert isinstance(result, Granted), f"expected a grant, got {result}"
    return result.lease


def end(store: Store, lease: Lease, at: float, outcome: Outcome = Outcome.SUCCEEDED) -> None:
    finished = store.finish(lease, End(outcome=outcome, at=at, exit_code=0 if outcome == "succeeded" else 1))
    assert finished.recorded


def run(store: Store, job: str, at: float, duration: float, outcome: Outcome = Outcome.SUCCEEDED) -> Lease:
    """One complete guarded run: started at ``at``, ended ``duration`` later."""
    lease = lease_of(begin(store, job, at))
    end(store, lease, at + duration, outcome)
    return lease


def runs_every_period(
    store: Store, job: str, first: float, durations: list[float], period: float = PERIOD
) -> float:
    """One run per slot from ``first``; returns the start of the next slot."""
    t = first
    for d in durations:
        run(store, job, t, d)
        t += period
    return t
