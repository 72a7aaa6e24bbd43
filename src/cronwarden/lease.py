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

import math
import os
import threading
import time
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


_EVENTS = threading.Lock()
"""Orders ``Heartbeat.lost`` and the making of its ``lost_event``."""


def renew_interval(ttl: float) -> float:
    return ttl / 3


class Heartbeat:
    """Renews one lease every ``interval``, from a ``HeartbeatThread``.

    ``deadline`` is the monotonic time until which the lease may be believed.
    On a definite refusal (owner mismatch, revocation) ``lost`` is set at once
    with the reason; on errors (store unreachable, database locked) the
    heartbeat retries until the deadline and then sets ``lost``. Readers also
    compare ``deadline`` with the clock themselves, so a heartbeat thread that
    died or hangs in a store call still ends the belief on time.

    ``thread`` is shared by the heartbeats of one ``Warden``; without one the
    heartbeat has a thread of its own, which ends when it stops.
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
        thread: HeartbeatThread | None = None,
    ) -> None:
        self._renew = renew
        self.ttl = ttl
        self.interval = renew_interval(ttl) if interval is None else interval
        self.clock = clock
        self.started_at = started_at
        self.deadline = started_at + belief(ttl)
        self.lost: LeaseLost | None = None
        self._lost_event: threading.Event | None = None
        self.on_lost = on_lost
        self.stop_at = stop_at
        """Monotonic time of ``max_runtime``: the run is then declared timed out."""
        self._own_thread = thread is None
        self._thread = HeartbeatThread() if thread is None else thread
        self._key = "?"
        self._next_at = started_at + self.interval
        self.renewals = 0
        self.last_error: str | None = None
        self.sending_since: float | None = None
        """Monotonic time the renewal in flight was sent; None when none is."""
        self.on_renewed: Callable[[], None] | None = None

    @property
    def lost_event(self) -> threading.Event:
        """Set when ``lost`` is. Made on first use: most runs never wait on it."""
        with _EVENTS:
            if self._lost_event is None:
                self._lost_event = threading.Event()
                if self.lost is not None:
                    self._lost_event.set()
            return self._lost_event

    def start(self, key: str) -> None:
        self._key = key
        now = self.clock.monotonic()
        self._next_at = now + self.interval
        self._thread.add(self, self._due() - now)

    def stop(self) -> None:
        """No renewal after this returns (one in flight is waited for)."""
        self._thread.remove(self, wait=self.interval + 1)
        if self._own_thread:
            self._thread.close()

    def believed(self, now: float | None = None) -> bool:
        """True while the lease may still be trusted."""
        t = self.clock.monotonic() if now is None else now
        return self.lost is None and t < self.deadline

    def late_until(self, now: float, within: float) -> float | None:
        """While the renewal due now is only late (this heartbeat's thread
        ran late: the process was frozen, or starved of CPU), the time until
        which it may still land: the deadline, or ``within`` seconds after it
        was sent, whichever is first. None when it is not merely late: it
        failed, or has waited on the store for ``within`` seconds, or nothing
        is due."""
        if self.lost is not None or self.last_error is not None:
            return None
        since = self.sending_since
        if since is None:
            return self.deadline if self._next_at <= now else None
        return min(self.deadline, since + within) if now - since < within else None

    def _declare_lost(self, why: LeaseLost) -> None:
        with _EVENTS:
            if self.lost is not None:
                return
            self.lost = why
            event = self._lost_event
        if event is not None:
            event.set()
        if self.on_lost is not None:
            self.on_lost(why)

    def _due(self) -> float:
        """Monotonic time of this heartbeat's next step."""
        due = min(self._next_at, self.deadline)
        return due if self.stop_at is None else min(due, self.stop_at)

    def _step(self) -> bool:
        """One step on the heartbeat thread when due: renew, or declare the
        lease lost. Returns False when this heartbeat is done."""
        now = self.clock.monotonic()
        if self.stop_at is not None and now >= self.stop_at:
            self._declare_lost(TimedOut(self._key, self.stop_at - self.started_at))
            return False
        if now >= self.deadline:
            self._declare_lost(
                LeaseLost(self._key, self.last_error or "no renewal succeeded before the deadline")
            )
            return False
        if now < self._next_at:
            return True
        sent = self.sending_since = self.clock.monotonic()
        try:
            self._renew()
        except LeaseLost as e:
            self._declare_lost(e)
            return False
        except CronwardenError as e:
            # Transient: retry soon, but never past the deadline.
            self.last_error = str(e)
            self._next_at = self.clock.monotonic() + min(self.interval, self.ttl / 10)
            return True
        finally:
            self.sending_since = None
        self.renewals += 1
        self.last_error = None
        self.deadline = sent + belief(self.ttl)
        self._next_at = sent + self.interval
        if self.on_renewed is not None:
            self.on_renewed()
        return True


class HeartbeatThread:
    """One daemon thread that renews the leases of many heartbeats, each when
    it is due. Adding and removing a heartbeat is a lock and a list operation;
    starting a thread per run and joining it cost more than the run's two
    commits on a fast disk.

    The thread starts with the first heartbeat, and ends when it has had none
    for ``idle`` seconds or is closed, so an unclosed ``Warden`` leaves no
    thread behind for long. Renewals are one at a time: a store call that
    hangs delays the others' renewals, but never their belief, which every
    reader checks against the clock (``Run.lost_reason``). If the thread dies
    (an exception other than the store's own errors), every heartbeat it
    served is declared lost, never left silent; the next ``add`` starts a new
    thread.
    """

    def __init__(self, *, idle: float = 30.0, name: str = "cronwarden-heartbeat") -> None:
        self.idle = idle
        self.name = name
        self._reset()

    def _reset(self) -> None:
        lock = threading.Lock()
        self._wake = threading.Condition(lock)
        """Wakes the thread: a heartbeat due sooner than it planned to wake."""
        self._done = threading.Condition(lock)
        """Wakes ``remove`` waiting for a renewal in flight."""
        self._beats: list[Heartbeat] = []
        self._current: Heartbeat | None = None
        self._thread: threading.Thread | None = None
        self._wake_at = math.inf
        """Real monotonic time the thread will wake at; -inf while it is awake."""
        self._shortest = math.inf
        """The shortest renew interval served: the idle thread wakes that often,
        so a new heartbeat is never due before the thread wakes and ``add``
        need not wake it (a wake-up costs a thread switch, ~0.1-2 ms here)."""
        self._closed = False
        self._busy_at = time.monotonic()
        """The last time the thread had a heartbeat: it ends ``idle`` seconds later."""
        self._pid = os.getpid()

    def add(self, beat: Heartbeat, due_in: float) -> None:
        """Renew ``beat`` from now on; its first step is ``due_in`` seconds away."""
        if self._pid != os.getpid():
            self._reset()  # forked: the thread and the heartbeats were the parent's
        now = time.monotonic()
        wake = now + due_in
        with self._wake:
            self._busy_at = now
            self._closed = False
            self._beats.append(beat)
            self._shortest = min(self._shortest, beat.interval)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._wake_at = -math.inf
                self._thread.start()
            elif wake < self._wake_at:
                self._wake.notify()

    def remove(self, beat: Heartbeat, *, wait: float) -> None:
        """Stop renewing ``beat``; if its renewal is in flight, wait for it
        (at most ``wait`` seconds; not when called from the thread itself)."""
        with self._wake:
            if beat in self._beats:
                self._beats.remove(beat)
            if self._current is not beat or self._thread is threading.current_thread():
                return
            give_up = time.monotonic() + wait
            while self._current is beat and (left := give_up - time.monotonic()) > 0:
                self._done.wait(left)

    def close(self) -> None:
        """End the thread once it has no heartbeats left."""
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _next(self) -> tuple[Heartbeat | None, float]:
        """The heartbeat due now, or None and how long to sleep (real seconds)."""
        sleep = math.inf
        for beat in self._beats:
            left = beat._due() - beat.clock.monotonic()
            if left <= 0:
                return beat, 0.0
            sleep = min(sleep, left)
        return None, sleep

    def _loop(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                with self._wake:
                    beat, sleep = self._next()
                    if beat is None:
                        now = time.monotonic()
                        if self._beats:
                            self._busy_at = now
                        elif self._closed or now - self._busy_at >= self.idle:
                            self._thread = None
                            return
                        else:
                            sleep = min(self._busy_at + self.idle - now, self._shortest)
                        self._wake_at = now + sleep
                        self._wake.wait(sleep)
                        self._wake_at = -math.inf
                        continue
                    self._current = beat
                going = beat._step()  # if it raises, the handler below still sees it as current
                with self._wake:
                    self._current = None
                    if not going and beat in self._beats:
                        self._beats.remove(beat)
                    self._done.notify_all()
        except BaseException as e:  # a dead heartbeat is a lost lease, never silence
            with self._wake:
                beats = [*self._beats]
                if self._current is not None and self._current not in beats:
                    beats.append(self._current)
                self._beats.clear()
                self._current = None
                if self._thread is me:
                    self._thread = None
                self._done.notify_all()
            for b in beats:
                b._declare_lost(LeaseLost(b._key, f"heartbeat thread died: {e!r}"))
            raise
