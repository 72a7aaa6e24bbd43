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
does not start old work: only the latest slot due may still run, and the
earlier ones are printed as not started late. A slot still within the grace when an
instance starts is fired (the claim tells whether another instance already
did), so restarting the only instance loses no slot. Claims are kept
``keep`` (default a day): far longer than the grace plus any clock skew
between the instances, so no instance can claim a slot again after it ran.
"""

from __future__ import annotations

import math
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.config import ENV_SCHEDULER_STORE, JobSettings
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
"""Slots not started late that are named in the message; more are "and more"."""
POLL = 0.1
"""Seconds between looks at the runs while stopping (a signal or a run's
end wakes the sleep sooner)."""
MAX_WALK = 10_000
"""Fire times walked over one by one after a late tick; beyond, jumped."""


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
    """This instance's name in messages (``--id``)."""
    clock: Clock = SYSTEM_CLOCK
    misfire_grace: float = DEFAULT_MISFIRE_GRACE
    keep: float = DEFAULT_KEEP
    say: Callable[[str], None] = print
    running: list[Started] = field(default_factory=list)
    fired: int = 0
    """Slots this instance won and started."""
    _next: dict[str, float] = field(default_factory=dict)
    owner: str = ""
    """What this instance claims slots as: its name and a random part, so
    that an instance restarted under the same name (``--id``, a container's
    pid 1) or a second one given the same name never takes the first's
    claim for its own."""

    def __post_init__(self) -> None:
        if not self.misfire_grace > 0 or not self.keep > self.misfire_grace:
            raise ValueError("misfire_grace must be positive and less than keep")
        self.owner = f"{self.instance}#{secrets.token_hex(4)}"
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
        earlier, latest = self._latest(job, self._next[job.name], now)
        if earlier:
            # A late tick (a suspended host, a long stall): only the latest
            # due slot may still run; earlier ones are not started late.
            listed = ", ".join(_when(t) for t in earlier[:MISSED_LISTED])
            more = " and more" if len(earlier) > MISSED_LISTED else ""
            self.say(f"{_when(now)} {job.name}: not started late: {listed}{more} (a later slot is due)")
        if now - latest <= self.misfire_grace:
            self._fire(job, latest)
        else:
            late = f"{now - latest:.0f}s late, past the misfire grace {self.misfire_grace:g}s"
            self._say(job.name, None, latest, f"not fired: {late}")
        self._next[job.name] = job.schedule.next_fire(latest)

    def _latest(self, job: ScheduledJob, first: float, now: float) -> tuple[list[float], float]:
        """The latest fire time at or before ``now``, walking forward from the
        due one ``first``, and the fire times passed on the way (at most
        MISSED_LISTED + 1 of them). Forward, because that is how fire times
        are made: in a repeated hour (daylight saving ends) ``slot(now)``,
        which looks back, gives the first pass of the hour, a slot already
        fired. A very long gap is jumped over."""
        earlier: list[float] = []
        t = first
        for _ in range(MAX_WALK):
            nxt = job.schedule.next_fire(t)
            if nxt > now:
                return earlier, t
            if len(earlier) <= MISSED_LISTED:
                earlier.append(t)
            t = nxt
        return earlier, max(t, job.schedule.slot(now))

    def _claim(self, job: ScheduledJob, slot: float) -> str:
        try:
            return self.store.claim_slot(job.name, slot, self.owner, self.keep)
        except StoreUnavailable:
            if self.store.url.startswith("sqlite:"):
                raise  # no connection to lose: locked, and waited for busy_timeout already
            # Once more, at once: a daemon's connection may have died while
            # idle (a server's, a pooler's or a firewall's idle timeout),
            # which the first call finds out and the second replaces. Safe:
            # a claim asked again by its owner answers the same.
            return self.store.claim_slot(job.name, slot, self.owner, self.keep)

    def _fire(self, job: ScheduledJob, slot: float) -> None:
        try:
            owner = self._claim(job, slot)
        except StoreError as e:
            # Fail closed, like a run: no claim, no run. The next slot tries again.
            self._say(job.name, None, slot, f"not fired: {e}")
            return
        if owner != self.owner:
            self._say(job.name, None, slot, f"fired by {owner}")
            return
        self.fired += 1
        for shard in job.settings.shards or (None,):
            try:
                child = self.launch(job, slot, shard)
            except (OSError, ValueError, subprocess.SubprocessError) as e:
                self._say(job.name, shard, slot, f"could not start: {e}")
                continue
            self.running.append(Started(job.name, slot, shard, child))
            self._say(job.name, shard, slot, f"started, pid {child.pid}")

    def reap(self) -> None:
        """Forget finished runs, saying how each ended."""
        still: list[Started] = []
        for s in self.running:
            code = s.child.poll()
            if code is None:
                still.append(s)
                continue
            self._say(s.job, s.shard, s.slot, f"ended, exit status {_status(code)}")
        self.running = still

    def _say(self, job: str, shard: str | None, slot: float, what: str) -> None:
        on = f" shard {shard}" if shard else ""
        self.say(f"{_when(self.clock.wall())} {job}{on}: slot {_when(slot)} {what}")

    def serve(
        self, sleep: Callable[[float], None], stop: Callable[[], bool], until: float | None = None
    ) -> None:
        """Tick until ``stop()`` or ``until`` (wall time). Between ticks,
        ``sleep(seconds)`` until the next fire, at most MAX_WAIT; it may
        return early (a run ended, a signal arrived: see ``Wakeup``)."""
        while not stop():
            nxt = self.tick()
            if until is not None and self.clock.wall() >= until:
                return
            horizon = nxt if until is None else min(nxt, until)
            sleep(max(0.0, min(horizon - self.clock.wall(), MAX_WAIT)))

    def wait_runs(self, timeout: float, sleep: Callable[[float], None], stop: Callable[[], int]) -> None:
        """Wait up to ``timeout`` for the runs still going to end on their
        own, or until ``stop()`` counts a signal; then ``stop_runs``."""
        self._wait(timeout, sleep, lambda: stop() >= 1)
        self.stop_runs(timeout, sleep, stop)

    def stop_runs(self, timeout: float, sleep: Callable[[float], None], stop: Callable[[], int]) -> None:
        """Ask every running run to stop (SIGTERM: it stops its command and
        records how it ended) and wait up to ``timeout`` for all of them, or
        until ``stop()`` counts a second signal; SIGKILL whatever is left
        (its lease then expires and the next start of the job records it
        ``abandoned``)."""
        for s in self.running:
            if s.child.poll() is None:
                s.child.send_signal(signal.SIGTERM)
        self._wait(timeout, sleep, lambda: stop() >= 2)
        for s in self.running:
            if s.child.poll() is None:
                s.child.kill()
                s.child.wait()
        self.reap()

    def _wait(self, timeout: float, sleep: Callable[[float], None], hurry: Callable[[], bool]) -> None:
        """Until no run is going, ``timeout`` has passed or ``hurry()``."""
        deadline = self.clock.monotonic() + timeout
        while any(s.child.poll() is None for s in self.running) and not hurry():
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return
            sleep(min(POLL, left))


@dataclass(frozen=True)
class RunLauncher:
    """Starts a scheduled run as ``cronwarden run --job NAME --slot T -- COMMAND``
    with the scheduler's config file and store, in the scheduler's process
    group (a terminal's Ctrl-C reaches the runs too). The store URL goes
    through an inherited pipe named in ``ENV_SCHEDULER_STORE``, not on the
    command line, where every local user could read its password in ``ps``,
    nor in the environment."""

    store_url: str
    config_path: str | None

    def __call__(self, job: ScheduledJob, slot: float, shard: str | None) -> Child:
        argv = [sys.executable, "-m", "cronwarden", "run", "--job", job.name, "--slot", repr(slot)]
        if self.config_path:
            argv += ["--config", self.config_path]
        if shard:
            argv += ["--shard", shard]
        # The URL through a pipe the run inherits (see ENV_SCHEDULER_STORE).
        read, write = os.pipe()
        try:
            os.write(write, self.store_url.encode())  # far below a pipe's buffer
            os.close(write)
            env = {**os.environ, ENV_SCHEDULER_STORE: f"fd:{read}"}
            return subprocess.Popen([*argv, "--", *job.settings.command], stdin=subprocess.DEVNULL,
                                    env=env, pass_fds=(read,))  # fmt: skip
        finally:
            os.close(read)


class Wakeup:
    """Sleeps until a timeout or a signal, whichever is first. Signals are
    noted by ``signal.set_wakeup_fd`` writing to a pipe the sleep selects on:
    a handler that set a ``threading.Event`` could block forever on the
    event's lock, held by the very wait it interrupted. For the main thread
    of a program that has no wakeup fd of its own (asyncio's would be
    displaced while this is open): ``cronwarden scheduler``."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._previous = signal.set_wakeup_fd(self._write)

    def sleep(self, seconds: float) -> None:
        ready, _, _ = select.select([self._read], [], [], seconds)
        if ready:
            try:
                while os.read(self._read, 512):
                    pass
            except BlockingIOError:
                pass  # drained

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous)
        os.close(self._read)
        os.close(self._write)


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int) -> str:
    return f"{code}" if code >= 0 else f"signal {-code}"
