"""The lease a run holds, and the heartbeat that keeps it.

A holder believes it owns its lease only until ``t_sent + belief(ttl)``,
where ``t_sent`` is this process's monotonic time taken *before* the last
successful renewal was sent. The store's clock may be ahead of ours by the
request's latency, never behind; starting the count before sending makes our
belief end no later than the store's expiry. The rest of the ttl,
``margin(ttl)``, absorbs clock-rate differences and a late wake-up of a
process on a busy host.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

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
    ``renew``/``finish``. Only the run named ``run_id`` can act on it."""

    key: str
    job: str
    run_id: str
    token: int
    """Fencing token: larger than every earlier grant of ``key``."""
    ttl: float


_EVENTS = threading.Lock()
"""Orders ``Heartbeat.lost`` and the making of its ``lost_event``."""

BATCH_MAX = 1000
"""Most leases one ``renew_many`` call carries: a batch is one statement or
one script, and a Redis script holds the server while it runs (1,000
renewals are a few milliseconds of it)."""

EARLY = 0.1
"""A renewal due within this part of its interval is sent with the batch
going now rather than on its own a moment later: renewing early is always
safe (the deadline counts from the send), and it keeps batches full."""


def renew_interval(ttl: float) -> float:
    return ttl / 3


class Renews(Protocol):
    """What a batched heartbeat renews through: a store (``Store.renew_many``
    is the contract)."""

    def renew_many(self, leases: Sequence[Lease]) -> list[LeaseLost | None]: ...


class Heartbeat:
    """Renews one lease every ``interval``, from a ``HeartbeatThread``.

    Given ``store`` and ``lease`` (and no ``renew``), the thread renews the
    lease together with every other lease of that store due at the same
    time, in one ``store.renew_many`` round trip; given ``renew``, it calls
    that alone. Either way the deadline counts from the moment the renewal
    that succeeded was sent.

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
        renew: Callable[[], None] | None = None,
        *,
        ttl: float,
        interval: float | None = None,
        clock: Clock,
        started_at: float,
        on_lost: Callable[[LeaseLost], None] | None = None,
        stop_at: float | None = None,
        thread: HeartbeatThread | None = None,
        store: Renews | None = None,
        lease: Lease | None = None,
    ) -> None:
        if renew is None and (store is None or lease is None):
            raise TypeError("Heartbeat needs renew, or store and lease")
        self._renew = renew
        self.store = store
        self.lease = lease
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
        self._key = "?" if lease is None else lease.key
        self._next_at = started_at + self.interval
        self._entry = 0
        """Which of the thread's queue entries for this heartbeat is current."""
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

    def _early(self) -> float:
        """How early a renewal may go: only batched ones gain by it."""
        return self.interval * EARLY if self._renew is None else 0.0

    def _check(self, now: float, early: float = 0.0) -> bool | None:
        """What is due at ``now``: False when this heartbeat is done (timed
        out or lost, declared here), True when nothing is due yet, None when
        a renewal is due (or due within ``early`` seconds)."""
        if self.stop_at is not None and now >= self.stop_at:
            self._declare_lost(TimedOut(self._key, self.stop_at - self.started_at))
            return False
        if now >= self.deadline:
            self._declare_lost(
                LeaseLost(self._key, self.last_error or "no renewal succeeded before the deadline")
            )
            return False
        if now < self._next_at - early:
            return True
        return None

    def _step(self) -> bool:
        """One step on the heartbeat thread when due: renew (this lease
        alone), or declare the lease lost. Returns False when this heartbeat
        is done."""
        going = self._check(self.clock.monotonic())
        if going is not None:
            return going
        sent = self.sending_since = self.clock.monotonic()
        try:
            if self._renew is not None:
                self._renew()
                why = None
            else:
                assert self.store is not None and self.lease is not None
                why = self.store.renew_many([self.lease])[0]
        except LeaseLost as e:
            why = e
        except CronwardenError as e:
            return self._failed(e)
        finally:
            self.sending_since = None
        return self._answered(sent, why)

    def _failed(self, e: CronwardenError) -> bool:
        """A renewal that failed for now: retry soon, but never past the deadline."""
        self.last_error = str(e)
        self._next_at = self.clock.monotonic() + min(self.interval, self.ttl / 10)
        return True

    def _answered(self, sent: float, why: LeaseLost | None) -> bool:
        """The store's answer to the renewal sent at ``sent``: renewed
        (None), or refused."""
        if why is not None:
            self._declare_lost(why)
            return False
        self.renewals += 1
        self.last_error = None
        self.deadline = sent + belief(self.ttl)
        self._next_at = sent + self.interval
        if self.on_renewed is not None:
            self.on_renewed()
        return True


def _renew_batch(beats: Sequence[Heartbeat]) -> list[bool]:
    """Renew the leases of ``beats`` (one store, one clock) in one
    ``renew_many`` round trip; whether each heartbeat goes on."""
    first = beats[0]
    assert first.store is not None
    leases = [b.lease for b in beats]
    sent = first.clock.monotonic()
    for b in beats:
        b.sending_since = sent
    try:
        answers = first.store.renew_many(leases)  # type: ignore[arg-type]
    except CronwardenError as e:  # LeaseLost is never raised for a batch
        return [b._failed(e) for b in beats]
    finally:
        for b in beats:
            b.sending_since = None
    return [b._answered(sent, why) for b, why in zip(beats, answers, strict=True)]


class HeartbeatThread:
    """One daemon thread that renews the leases of many heartbeats, each when
    it is due. Adding and removing a heartbeat is a lock and a set operation;
    starting a thread per run and joining it cost more than the run's two
    commits on a fast disk.

    The heartbeats wait in a queue ordered by when each is due (one per
    clock), so finding what is due costs O(log n) per renewal, not a look at
    every lease held. When the thread wakes it takes every heartbeat due
    (and those due within ``EARLY`` of their interval) and renews the leases
    of each store in one ``renew_many`` call per ``BATCH_MAX`` leases.

    The thread starts with the first heartbeat, and ends when it has had none
    for ``idle`` seconds or is closed, so an unclosed ``Warden`` leaves no
    thread behind for long. Batches go one at a time: a store call that
    hangs delays the other renewals, but never their belief, which every
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
        self._beats: set[Heartbeat] = set()
        self._queues: dict[int, tuple[Clock, list[tuple[float, int, int, Heartbeat]]]] = {}
        """Per clock (by id): heap of (wake time, entry, tie-break, heartbeat)."""
        self._order = itertools.count()
        self._current: set[Heartbeat] = set()
        """The heartbeats being stepped (their renewals in flight)."""
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

    def _push(self, beat: Heartbeat) -> None:
        """Queue ``beat`` for its next step (called with the lock held)."""
        beat._entry += 1
        queue = self._queues.get(id(beat.clock))
        if queue is None:
            queue = self._queues[id(beat.clock)] = (beat.clock, [])
        heapq.heappush(queue[1], (beat._due(), beat._entry, next(self._order), beat))

    def add(self, beat: Heartbeat, due_in: float) -> None:
        """Renew ``beat`` from now on; its first step is ``due_in`` seconds away."""
        if self._pid != os.getpid():
            self._reset()  # forked: the thread and the heartbeats were the parent's
        now = time.monotonic()
        wake = now + due_in
        with self._wake:
            self._busy_at = now
            self._closed = False
            self._beats.add(beat)
            self._push(beat)
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
            self._beats.discard(beat)  # its queue entry is dropped when reached
            if beat not in self._current or self._thread is threading.current_thread():
                return
            give_up = time.monotonic() + wait
            while beat in self._current and (left := give_up - time.monotonic()) > 0:
                self._done.wait(left)

    def close(self) -> None:
        """End the thread once it has no heartbeats left."""
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _take(self) -> tuple[list[Heartbeat], float]:
        """The heartbeats due now, with those due within ``EARLY`` of their
        interval (called with the lock held), or none and how long to sleep
        (real seconds): until the first is due, exactly."""
        due: list[Heartbeat] = []
        sleep = math.inf
        for clock_id, (clock, heap) in list(self._queues.items()):
            now = clock.monotonic()
            while heap:
                at, entry, _, beat = heap[0]
                if beat._entry != entry or beat not in self._beats:
                    heapq.heappop(heap)  # removed, or queued again since
                    continue
                if at > now and beat._next_at - beat._early() > now:
                    # Woken by the first due; the next due within EARLY go along.
                    sleep = min(sleep, at - now)
                    break
                heapq.heappop(heap)
                due.append(beat)
            if not heap:
                del self._queues[clock_id]
        return due, (0.0 if due else sleep)

    def _loop(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                with self._wake:
                    due, sleep = self._take()
                    if not due:
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
                    self._current = set(due)
                # If this raises, the handler below still sees them as current.
                going = self._serve(due)
                with self._wake:
                    self._current = set()
                    for beat, more in zip(due, going, strict=True):
                        if not more:
                            self._beats.discard(beat)
                        elif beat in self._beats:
                            self._push(beat)
                    self._done.notify_all()
        except BaseException as e:  # a dead heartbeat is a lost lease, never silence
            with self._wake:
                beats = [*self._beats, *(b for b in self._current if b not in self._beats)]
                self._beats.clear()
                self._queues.clear()
                self._current = set()
                if self._thread is me:
                    self._thread = None
                self._done.notify_all()
            for b in beats:
                b._declare_lost(LeaseLost(b._key, f"heartbeat thread died: {e!r}"))
            raise

    @staticmethod
    def _serve(due: list[Heartbeat]) -> list[bool]:
        """Step each heartbeat in ``due``; the leases of one store go in
        batches. Returns, in order, whether each goes on."""
        going: dict[int, bool] = {}
        batches: dict[tuple[int, int], list[Heartbeat]] = {}
        for beat in due:
            if beat._renew is not None:
                going[id(beat)] = beat._step()
                continue
            state = beat._check(beat.clock.monotonic(), beat._early())
            if state is not None:
                going[id(beat)] = state
            else:
                batches.setdefault((id(beat.store), id(beat.clock)), []).append(beat)
        for beats in batches.values():
            for i in range(0, len(beats), BATCH_MAX):
                chunk = beats[i : i + BATCH_MAX]
                for beat, more in zip(chunk, _renew_batch(chunk), strict=True):
                    going[id(beat)] = more
        return [going[id(b)] for b in due]
