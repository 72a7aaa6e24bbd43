"""The scheduler: fires each configured job's command at its scheduled times,
from one host or several, at most once per slot (G8).

Every instance reads the same config, so every instance computes the same
fire times. At each one it claims the slot in the store
(``Store.claim_slot``, keyed by job and fire time): the instance whose claim
is first starts the run, the others note which instance did and go on. No
leader, no election: an instance that stops or dies loses nothing but the
fires it would have won, and the others win those.

A run is a child ``cronwarden run --slot T`` process, so a scheduled run has
everything a cron-line run has (lease and policy, heartbeat, supervision,
the ledger, the sinks) and the scheduler itself holds no lease: a run that
outlives its scheduler stays guarded.

A slot is fired only within ``misfire_grace`` of its time. An instance that
wakes later (the host was suspended or overloaded, the instance was down)
does not start old work; it prints what it did not fire, and the monitor
records those slots ``missed``. A slot still within the grace when an
instance starts is fired (the claim tells whether another instance already
did), so restarting the only instance loses no slot. Claims are kept
``keep`` (default a day): far longer than the grace plus any clock skew
between the instances, so no instance can claim a slot again after it ran.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.config import JobSettings
from cronwarden.errors import StoreError, StoreUnavailable
from cronwarden.schedule import Schedule
from cronwarden.stores.base import Store

DEFAULT_MISFIRE_GRACE = 60.0
DEFAULT_KEEP = 86400.0
DEFAULT_STOP_TIMEOUT = 30.0
MAX_WAIT = 60.0
"""Longest sleep between looks at the clock: a wall-clock step (NTP, a
resumed host) is noticed within this."""
MISSED_LISTED = 3
"""Missed slots named one by one; more are counted."""


@dataclass(frozen=True)
class ScheduledJob:
    settings: JobSettings
    schedule: Schedule

    @property
    def name(self) -> str:
        return self.settings.name

    @classmethod
    def from_settings(cls, settings: JobSettings) -> ScheduledJob:
        return cls(settings, Schedule.parse(settings.schedule_text() or ""))


class Child(Protocol):
    """What the scheduler needs of a started run: ``subprocess.Popen``."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


Launch = Callable[[ScheduledJob, float, str | None], Child]
"""Starts the run of a job for a slot (and shard); see ``RunLauncher``."""


@dataclass
class Started:
    job: str
    slot: float
    shard: str | None
    child: Child


@dataclass
class Scheduler:
    """Fires ``jobs`` through ``launch``. ``tick`` is one look at the clock;
    ``serve`` loops until asked to stop."""

    store: Store
    jobs: Sequence[ScheduledJob]
    launch: Launch
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    clock: Clock = SYSTEM_CLOCK
    misfire_grace: float = DEFAULT_MISFIRE_GRACE
    keep: float = DEFAULT_KEEP
    say: Callable[[str], None] = print
    running: list[Started] = field(default_factory=list)
    fired: int = 0
    """Slots this instance won and started."""
    _next: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.misfire_grace > 0 or not self.keep > self.misfire_grace:
            raise ValueError("misfire_grace must be positive and less than keep")
        now = self.clock.wall()
        for job in self.jobs:
            # The latest slot, if it is still within the grace: a restart
            # between a fire time and its grace loses nothing (the claim
            # says whether another instance fired it already).
            latest = job.schedule.slot(now)
            in_grace = now - latest <= self.misfire_grace
            self._next[job.name] = latest if in_grace else job.schedule.next_fire(now)

    def next_fire(self) -> float:
        return min(self._next.values(), default=math.inf)

    def tick(self) -> float:
        """Fire every slot that is due, reap finished runs; the time of the
        next fire."""
        self.reap()
        now = self.clock.wall()
        for job in self.jobs:
            if self._next[job.name] <= now:
                self._due(job, now)
        return self.next_fire()

    def _due(self, job: ScheduledJob, now: float) -> None:
        first = self._next[job.name]
        latest = job.schedule.slot(now)
        missed = self._slots(job, first, latest)
        if now - latest <= self.misfire_grace:
            self._fire(job, latest)
        else:
            missed.append(latest)
        if missed:
            self._report_missed(job, missed, now)
        self._next[job.name] = job.schedule.next_fire(latest)

    def _slots(self, job: ScheduledJob, first: float, before: float) -> list[float]:
        """The fire times from ``first`` up to (not including) ``before``;
        at most MISSED_LISTED + 1 of them when there are more (the count
        is reported, not each)."""
        out: list[float] = []
        t = first
        while t < before and len(out) <= MISSED_LISTED:
            out.append(t)
            t = job.schedule.next_fire(t)
        return out

    def _report_missed(self, job: ScheduledJob, missed: list[float], now: float) -> None:
        listed = ", ".join(_when(t) for t in missed[:MISSED_LISTED])
        more = " and more" if len(missed) > MISSED_LISTED else ""
        self.say(
            f"{_when(now)} {job.name}: not fired: {listed}{more} (later than the misfire grace "
            f"{self.misfire_grace:g}s; the monitor records missed slots)"
        )

    def _claim(self, job: ScheduledJob, slot: float) -> str:
        try:
            return self.store.claim_slot(job.name, slot, self.instance, self.keep)
        except StoreUnavailable:
            # Once more, at once: a daemon's connection may have been closed
            # while idle (a server or pooler idle timeout), which the first
            # call finds out and the second replaces. Safe: a claim asked
            # again by its owner answers the same (see Store.claim_slot).
            return self.store.claim_slot(job.name, slot, self.instance, self.keep)

    def _fire(self, job: ScheduledJob, slot: float) -> None:
        try:
            owner = self._claim(job, slot)
        except StoreError as e:
            # Fail closed, like a run: no claim, no run. The next slot tries again.
            self.say(f"{_when(self.clock.wall())} {job.name}: slot {_when(slot)} not fired: {e}")
            return
        if owner != self.instance:
            self.say(f"{_when(self.clock.wall())} {job.name}: slot {_when(slot)} fired by {owner}")
            return
        self.fired += 1
        for shard in job.settings.shards or (None,):
            try:
                child = self.launch(job, slot, shard)
            except OSError as e:
                self.say(f"{_when(self.clock.wall())} {job.name}: slot {_when(slot)} could not start: {e}")
                continue
            self.running.append(Started(job.name, slot, shard, child))
            on = f" shard {shard}" if shard else ""
            now = _when(self.clock.wall())
            self.say(f"{now} {job.name}{on}: slot {_when(slot)} started, pid {child.pid}")

    def reap(self) -> None:
        """Forget finished runs, saying how each ended."""
        still: list[Started] = []
        for s in self.running:
            code = s.child.poll()
            if code is None:
                still.append(s)
                continue
            on = f" shard {s.shard}" if s.shard else ""
            self.say(f"{_when(self.clock.wall())} {s.job}{on}: slot {_when(s.slot)} ended, "
                     f"exit status {_status(code)}")  # fmt: skip
        self.running = still

    def serve(self, wake: threading.Event, stop: Callable[[], bool], until: float | None = None) -> None:
        """Tick until ``stop()`` or ``until`` (wall time): sleeps on
        ``wake`` until the next fire, at most MAX_WAIT; set ``wake`` to look
        again at once (a child ended, a signal arrived)."""
        while not stop():
            nxt = self.tick()
            if until is not None and self.clock.wall() >= until:
                return
            horizon = nxt if until is None else min(nxt, until)
            wake.wait(max(0.0, min(horizon - self.clock.wall(), MAX_WAIT)))
            wake.clear()

    def wait_runs(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the runs still going to end on their
        own; stop those that did not (``stop_runs``, ``timeout`` again)."""
        deadline = self.clock.monotonic() + timeout
        for s in self.running:
            try:
                s.child.wait(max(0.0, deadline - self.clock.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self.stop_runs(timeout)

    def stop_runs(self, timeout: float) -> None:
        """Ask every running run to stop (SIGTERM: it stops its command and
        records how it ended) and wait up to ``timeout`` for all of them;
        SIGKILL whatever is left (its lease then expires and the next start
        records it ``abandoned``)."""
        for s in self.running:
            if s.child.poll() is None:
                s.child.send_signal(signal.SIGTERM)
        deadline = self.clock.monotonic() + timeout
        for s in self.running:
            try:
                s.child.wait(max(0.0, deadline - self.clock.monotonic()))
            except subprocess.TimeoutExpired:
                s.child.kill()
                s.child.wait()
        self.reap()


@dataclass(frozen=True)
class RunLauncher:
    """Starts a scheduled run as ``cronwarden run --job NAME --slot T -- COMMAND``
    with the scheduler's config file and store, in the scheduler's process
    group (a terminal's Ctrl-C reaches the runs too)."""

    store_url: str
    config_path: str | None

    def __call__(self, job: ScheduledJob, slot: float, shard: str | None) -> Child:
        argv = [sys.executable, "-m", "cronwarden", "run", "--job", job.name, "--slot", repr(slot),
                "--store", self.store_url]  # fmt: skip
        if self.config_path:
            argv += ["--config", self.config_path]
        if shard:
            argv += ["--shard", shard]
        return subprocess.Popen([*argv, "--", *job.settings.command], stdin=subprocess.DEVNULL)


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int) -> str:
    return f"{code}" if code >= 0 else f"signal {-code}"
