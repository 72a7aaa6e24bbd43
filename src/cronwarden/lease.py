"""The lease a run holds, and the heartbeat that keeps it (G3).

A holder believes it owns its lease only until ``t_sent + belief(ttl)``,
where ``t_sent`` is this process's monotonic time taken *before* the last
successful renewal was sent. The store's clock may be ahead of ours by the
request's latency, never behind; starting the count before sending makes our
belief end no later than the store's expiry. The rest of the ttl,
``margin(ttl)``, absorbs clock-rate differences and a late wake-up of a
process on a busy host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

from cronwarden.clock import Clock
from cronwarden.errors import CronwardenError, LeaseLost, TimedOut


def margin(ttl: float) -> float:
    """The part of the ttl a holder does not trust: a tenth, but at least a
    quarter second where the ttl allows (short ttls on a loaded host wake up
    late by that much; measured by the chaos harness)."""
    return max(ttl * 0.1, min(0.25, ttl * 0.3))


def belief(ttl: float) -> float:
    """How long after sending a successful renewal the holder trusts it."""
    return ttl - margin(ttl)


class Lease(NamedTuple):
    """Proof of ownership, returned by ``Store.acquire`` and presented to
    ``renew``/``finish``. Only the run named ``run_id`` can act on it (G1)."""

    key: str
    job: str
    run_id: str
    token: int
    """Fencing token: larger than every earlier grant of ``key`` (G2)."""
    ttl: float


def renew_interval(ttl: float) -> float:
    return ttl / 3


class Heartbeat:
    """Renews a lease every ``interval`` from a daemon thread.

    ``deadline`` is the monotonic time until which the lease may be believed.
    On a definite refusal (owner mismatch, revocation) ``lost`` is set at once
    with the reason; on errors (store unreachable, database locked) the
    heartbeat retries until the deadline and then sets ``lost``. Readers also
    compare ``deadline`` with the clock themselves, so a heartbeat thread that
    died or hangs in a store call still ends the belief on time.
    """

    def __init__(
        self,
        renew: Callable[[], None],
        *,
        ttl: float,
        interval: float | None = None,
        clock: Clock,
        started_at: float,
        on_lost: Callable[[LeaseLost], None] | None = None,
        stop_at: float | None = None,
    ) -> None:
        self._renew = renew
        self.ttl = ttl
        self.interval = renew_interval(ttl) if interval is None else interval
        self.clock = clock
        self.started_at = started_at
        self.deadline = started_at + belief(ttl)
        self.lost: LeaseLost | None = None
        self.lost_event = threading.Event()
        self.on_lost = on_lost
        self.stop_at = stop_at
        """Monotonic time of ``max_runtime``: the run is then declared timed out."""
        self._stop = threading.Event()
        self._key = "?"
        self._thread = threading.Thread(target=self._loop, name="cronwarden-heartbeat", daemon=True)
        self.renewals = 0
        self.last_error: str | None = None

    def start(self, key: str) -> None:
        self._key = key
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.interval + 1)

    def believed(self, now: float | None = None) -> bool:
        """True while the lease may still be trusted."""
        t = self.clock.monotonic() if now is None else now
        return self.lost is None and t < self.deadline

    def _declare_lost(self, why: LeaseLost) -> None:
        if self.lost is None:
            self.lost = why
            self.lost_event.set()
            if self.on_lost is not None:
                self.on_lost(why)

    def _loop(self) -> None:
        try:
            next_at = self.clock.monotonic() + self.interval
            while not self._stop.is_set():
                now = self.clock.monotonic()
                if self.stop_at is not None and now >= self.stop_at:
                    self._declare_lost(TimedOut(self._key, self.stop_at - self.started_at))
                    return
                if now >= self.deadline:
                    why = self.last_error or "no renewal succeeded before the deadline"
                    self._declare_lost(LeaseLost(self._key, why))
                    return
                wait = min(next_at, self.deadline, self.stop_at or next_at) - now
                if wait > 0 and self._stop.wait(wait):
                    return
                if self.clock.monotonic() < next_at:
                    continue
                sent = self.clock.monotonic()
                try:
                    self._renew()
                except LeaseLost as e:
                    self._declare_lost(e)
                    return
                except CronwardenError as e:
                    # Transient: retry soon, but never past the deadline.
                    self.last_error = str(e)
                    next_at = self.clock.monotonic() + min(self.interval, self.ttl / 10)
                    continue
                self.renewals += 1
                self.last_error = None
                self.deadline = sent + belief(self.ttl)
                next_at = sent + self.interval
        except BaseException as e:  # a dead heartbeat is a lost lease, never silence
            self._declare_lost(LeaseLost(self._key, f"heartbeat thread died: {e!r}"))
            raise
