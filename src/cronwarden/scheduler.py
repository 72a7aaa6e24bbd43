"""The scheduler: fires each configured job's command at its scheduled times,
from one host or several, at most once per slot.

Every instance reads the same config, so every instance computes the same
fire times. At each one it claims the slot in the store
(``Store.claim_slot``, keyed by job and fire time): the instance whose claim
is first starts the run, the others note which instance did and go on. No
leader, no election: an instance that stops or dies loses nothing but the
fires it would have won, and the others win those.

A fire runs in the scheduler's process (``InProcess``): a start queue served
by a bounded number of workers, each taking the run's lease through the same
``Guard`` as ``cronwarden run``, supervising the command with the same
``Supervisor`` (its own process group, a keeper that dies with the
scheduler, forked by a small launcher process rather than by the scheduler
itself: see ``keeper``) and recording its end; every run's lease is renewed by the
warden's one heartbeat. No interpreter per fire. A job with ``detach = true``
is fired as a ``cronwarden run --slot T`` child in a session of its own
(``RunLauncher``), which outlives the scheduler.

A slot is fired only within ``misfire_grace`` of its time, judged when its
run is about to start (a start queue that fell behind records the slots it
reached too late ``misfired``). An instance that wakes later (the host was
suspended or overloaded, the instance was down) does not start old work:
only the latest slot due may still run, and the earlier ones are printed as
not started late. A slot still within the grace when an instance starts is
fired (the claim tells whether another instance already did), so restarting
the only instance loses no slot. Claims are kept ``keep`` (default a day):
far longer than the grace plus any clock skew between the instances, so no
instance can claim a slot again after it ran.
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.config import ENV_SCHEDULER_STORE, WITHHELD_FROM_COMMAND, JobSettings
from cronwarden.errors import CronwardenError, StoreError, StoreUnavailable
from cronwarden.events import Event, EventKind
from cronwarden.keeper import Launcher
from cronwarden.schedule import Schedule
from cronwarden.stores.base import Store

DEFAULT_MISFIRE_GRACE = 60.0
DEFAULT_KEEP = 86400.0
DEFAULT_STOP_TIMEOUT = 30.0
DEFAULT_CONCURRENCY = 32
"""Runs starting or running at once in one scheduler; more wait in its start queue."""
MAX_WAIT = 60.0
"""Longest sleep between looks at the clock: a wall-clock step (NTP, a
resumed host) is noticed within this."""
MISSED_LISTED = 3
"""Slots not started late that are named in the message; more are "and more"."""
POLL = 0.1
"""Seconds between looks at the runs while stopping (a signal or a run's
end wakes the sleep sooner)."""
_COUNT = threading.Lock()
"""Guards ``Scheduler.fired``, counted by the fires' worker threads."""
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

    @functools.cached_property
    def offset(self) -> float:
        """Seconds after each fire time that the job starts (``jitter``)."""
        return jitter_offset(self.name, self.settings.jitter)

    def window(self, misfire_grace: float) -> float:
        """How late a slot of this job may still start: the misfire grace, or
        with ``catchup = "latest"|"all"`` its ``catchup_window`` when set."""
        st = self.settings
        if st.catchup == "skip" or st.catchup_window is None:
            return misfire_grace
        return st.catchup_window


def jitter_offset(name: str, jitter: float) -> float:
    """A job's offset in [0, ``jitter``): the same on every instance and at
    every start (a hash of the name, not Python's per-process ``hash``),
    spread evenly over the names."""
    if jitter <= 0:
        return 0.0
    import hashlib

    fraction = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2**64
    return round(fraction * jitter, 3)


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
    detached: bool = False
    """A ``detach = true`` run: stopping the scheduler leaves it running."""


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
    claims_at_start: Callable[[ScheduledJob], bool] | None = None
    """Jobs whose fires claim their slot when they leave the start queue
    (``claim_at_start``, given to ``InProcess``) rather than when due."""

    def __post_init__(self) -> None:
        if not self.misfire_grace > 0 or not self.keep > self.misfire_grace:
            raise ValueError("misfire_grace must be positive and less than keep")
        self.owner = f"{self.instance}#{secrets.token_hex(4)}"
        self._due_at: dict[str, float] = {}
        """Each job's next slot plus its offset: when it is due."""
        self._plan(self.jobs, self.clock.wall())

    def _plan(self, jobs: Sequence[ScheduledJob], now: float) -> None:
        for job in jobs:
            # The latest slot due, if still within the job's window: a
            # restart between a fire time and its grace loses nothing (the
            # claim says whether another instance fired it already). With
            # ``catchup = "all"`` the first slot within the window, and the
            # walk forward in ``_due`` fires each from there.
            due = now - job.offset
            back = due - job.window(self.misfire_grace)
            first = job.schedule.slot(back if job.settings.catchup == "all" else due)
            self._set_next(job, first if first >= back else job.schedule.next_fire(first))

    def _set_next(self, job: ScheduledJob, slot: float) -> None:
        self._next[job.name] = slot
        self._due_at[job.name] = slot + job.offset

    def next_fire(self) -> float:
        return min(self._due_at.values(), default=math.inf)

    def tick(self) -> float:
        """Fire every slot that is due, reap finished runs; the time of the
        next fire."""
        self.reap()
        for job in self.jobs:
            # The clock is read per job: claims take store round trips, and
            # a long loop must not judge its last jobs by its start time.
            now = self.clock.wall()
            if self._due_at[job.name] <= now:
                self._due(job, now)
        return self.next_fire()

    def reload(self, jobs: Sequence[ScheduledJob]) -> tuple[list[str], list[str], list[str]]:
        """Fire ``jobs`` from now on (a reloaded config): the names added,
        removed and changed. A job whose schedule, jitter and catch-up are
        unchanged keeps its next slot, so a reload loses and repeats none; an
        added or rescheduled one starts at its next slot after now (a slot
        before the reload was not its own). Runs already going keep the
        settings they started with."""
        now = self.clock.wall()
        old = {j.name: j for j in self.jobs}
        new = {j.name: j for j in jobs}
        added = [n for n in new if n not in old]
        removed = [n for n in old if n not in new]
        changed = [n for n in new if n in old and _same(new[n]) != _same(old[n])]
        for name in removed:
            del self._next[name], self._due_at[name]
        for name, job in new.items():
            was = old.get(name)
            if was is not None and _timing(was) == _timing(job):
                self._set_next(job, self._next[name])
            else:
                self._set_next(job, job.schedule.next_fire(now - job.offset))
        self.jobs = list(jobs)
        return added, removed, changed

    def _due(self, job: ScheduledJob, now: float) -> None:
        """The job's slots due by ``now``: those past its window are not
        started late (said), and of those within it ``catchup`` chooses: the
        latest (``skip``, ``latest``) or each (``all``)."""
        window = job.window(self.misfire_grace)
        passed, due, last = self._walk(job, self._next[job.name], now - job.offset, now - job.offset - window)
        fire = due if job.settings.catchup == "all" else due[-1:]
        passed += [t for t in due if t not in fire]
        if passed:
            # A late tick (a suspended host, a long stall) or a start after
            # a time down: these are not started late.
            listed = ", ".join(_when(t) for t in passed[:MISSED_LISTED])
            more = " and more" if len(passed) > MISSED_LISTED else ""
            why = "a later slot is due" if fire else f"past the window {window:g}s"
            self.say(f"{_when(now)} {job.name}: not started late: {listed}{more} ({why})")
        for slot in fire:
            self._fire(job, slot)
        self._set_next(job, job.schedule.next_fire(last))

    def _walk(self, job: ScheduledJob, first: float, horizon: float,
              cutoff: float) -> tuple[list[float], list[float], float]:  # fmt: skip
        """The fire times from ``first`` to ``horizon``: those before
        ``cutoff`` (at most MISSED_LISTED + 1 of them), those from it (at most
        MAX_WALK), and the last one. Forward, because that is how fire times
        are made: in a repeated hour (daylight saving ends) ``slot(now)``,
        which looks back, gives the first pass of the hour, a slot already
        fired. A very long gap is jumped over."""
        passed: list[float] = []
        t = first
        for _ in range(MAX_WALK):
            if t >= cutoff:
                break
            nxt = job.schedule.next_fire(t)
            if nxt > horizon:
                break
            if len(passed) <= MISSED_LISTED:
                passed.append(t)
            t = nxt
        else:
            t = max(t, job.schedule.slot(cutoff))
        due: list[float] = []
        last = t
        while t <= horizon and len(due) < MAX_WALK:
            if t >= cutoff:
                due.append(t)
            elif len(passed) <= MISSED_LISTED:
                passed.append(t)
            last = t
            t = job.schedule.next_fire(t)
        return passed, due, last

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

    def claim_at_start(self, job: ScheduledJob, slot: float, shard: str | None) -> str | None:
        """The slot's claim, taken by a fire as it leaves the start queue: None
        when this instance won it (and the job is not paused), else what to
        say ("" when said already). Taken then, not when the
        slot fell due, the claim covers a run about to start: an instance
        killed with a long queue leaves the slots it had not reached to the
        others, and instances that share the store share a slot's jobs by
        whichever reaches each first. (A slot's shards claim it each; a claim
        asked again by its owner answers the same.)"""
        try:
            owner = self._claim(job, slot)
        except StoreError as e:
            return f"not fired: {e}"
        if owner != self.owner:
            return f"fired by {owner}"
        if self._paused(job, slot):
            return ""  # recorded paused, and said
        if shard is None or shard == job.settings.shards[0]:
            with _COUNT:
                self.fired += 1
        return None

    def _fire(self, job: ScheduledJob, slot: float) -> None:
        # An in-process fire claims its slot itself as it leaves the start
        # queue (claim_at_start); any other fire is claimed here, now.
        if self.claims_at_start is None or not self.claims_at_start(job):
            try:
                owner = self._claim(job, slot)
            except StoreError as e:
                # Fail closed, like a run: no claim, no run. The next slot tries again.
                self._say(job.name, None, slot, f"not fired: {e}")
                return
            if owner != self.owner:
                self._say(job.name, None, slot, f"fired by {owner}")
                return
            if self._paused(job, slot):
                return
            self.fired += 1
        for shard in job.settings.shards or (None,):
            try:
                child = self.launch(job, slot, shard)
            except (OSError, ValueError, subprocess.SubprocessError) as e:
                self._say(job.name, shard, slot, f"could not start: {e}")
                continue
            self.running.append(Started(job.name, slot, shard, child, job.settings.detach))
            if not isinstance(child, Fire):  # a fire says itself when it starts
                self._say(job.name, shard, slot, f"started, pid {child.pid}")

    def _paused(self, job: ScheduledJob, slot: float) -> bool:
        """Whether the job is paused (``cronwarden pause``): then its slot,
        claimed by this instance, is recorded ``paused``, not fired. A store
        that cannot say fails closed, as the claim does."""
        from cronwarden.control import describe_pause, paused_slot

        try:
            pause = self.store.pause_state(job.name)
            if pause is None:
                return False
            event_id = slot_event_id(EventKind.PAUSED, job.name, slot)
            event = paused_slot(job.name, slot, pause, decided_by=self.instance, at=self.clock.wall(),
                                event_id=event_id)  # fmt: skip
            self.store.record(event)
        except StoreError as e:
            self._say(job.name, None, slot, f"not fired: {e}")
            return True
        self._say(job.name, None, slot, f"not fired: {describe_pause(pause)}")
        return True

    def reap(self) -> None:
        """Forget finished runs, saying how each ended."""
        still: list[Started] = []
        for s in self.running:
            code = s.child.poll()
            if code is None:
                still.append(s)
                continue
            if not isinstance(s.child, Fire):  # a fire said how it ended
                self._say(s.job, s.shard, s.slot, f"ended, exit status {_status(code)}")
        self.running = still

    def _say(self, job: str, shard: str | None, slot: float, what: str) -> None:
        on = f" shard {shard}" if shard else ""
        self.say(f"{_when(self.clock.wall())} {job}{on}: slot {_when(slot)} {what}")

    def serve(
        self, sleep: Callable[[float], None], stop: Callable[[], bool], until: float | None = None,
        between: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        """Tick until ``stop()`` or ``until`` (wall time). Between ticks,
        ``sleep(seconds)`` until the next fire, at most MAX_WAIT; it may
        return early (a run ended, a signal arrived: see ``Wakeup``), and
        ``between()`` is called before the next tick (a reload)."""
        while not stop():
            if between is not None:
                between()
            nxt = self.tick()
            if until is not None and self.clock.wall() >= until:
                return
            horizon = nxt if until is None else min(nxt, until)
            sleep(max(0.0, min(horizon - self.clock.wall(), MAX_WAIT)))

    def wait_runs(self, timeout: float, sleep: Callable[[float], None], stop: Callable[[], int]) -> None:
        """Wait up to ``timeout`` for the runs still going to end on their
        own, or until ``stop()`` counts a signal; then ``stop_runs``."""
        self._wait(timeout, sleep, lambda: stop() >= 1, attached_only=True)
        self.stop_runs(timeout, sleep, stop)

    def stop_runs(self, timeout: float, sleep: Callable[[float], None], stop: Callable[[], int]) -> None:
        """Ask every running run to stop (SIGTERM: it stops its command and
        records how it ended) and wait up to ``timeout`` for all of them, or
        until ``stop()`` counts a second signal; SIGKILL whatever is left
        (its lease then expires and the next start of the job records it
        ``abandoned``). Detached runs (``detach = true``) are left running,
        guarded by their own ``cronwarden run``."""
        for s in self.running:
            if s.detached and s.child.poll() is None:
                self._say(s.job, s.shard, s.slot, f"left running, pid {s.child.pid} (detach)")
        self.running = [s for s in self.running if not s.detached]
        for s in self.running:
            if s.child.poll() is None:
                s.child.send_signal(signal.SIGTERM)
        self._wait(timeout, sleep, lambda: stop() >= 2)
        for s in self.running:
            if s.child.poll() is None:
                s.child.kill()
                s.child.wait()
        self.reap()

    def _wait(self, timeout: float, sleep: Callable[[float], None], hurry: Callable[[], bool],
              attached_only: bool = False) -> None:  # fmt: skip
        """Until no run is going (but detached ones, with ``attached_only``),
        ``timeout`` has passed or ``hurry()``."""
        deadline = self.clock.monotonic() + timeout
        waited = [s for s in self.running if not (attached_only and s.detached)]
        while any(s.child.poll() is None for s in waited) and not hurry():
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return
            sleep(min(POLL, left))


class Fire:
    """One fire of ``InProcess``, as the scheduler sees it (a ``Child``):
    waiting in the start queue, running, or done. ``pid`` is the keeper's
    once the command started (0 before)."""

    def __init__(
        self, job: ScheduledJob, slot: float, shard: str | None, backfill: str | None = None
    ) -> None:
        from cronwarden.supervisor import SignalRelay

        self.job = job
        self.slot = slot
        self.shard = shard
        self.backfill = backfill
        """Who asked, for a past slot fired by ``cronwarden backfill``: no
        lateness limit, and the run recorded ``backfilled``."""
        self.pid = 0
        self.relay = SignalRelay()
        """Never entered: the scheduler's main thread has the signal
        handlers; ``send_signal`` passes a signal on as they would."""
        self.returncode: int | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Still queued: it will not start. Running: the command's group gets
        ``sig`` and the run records how it ended."""
        with self._lock:
            self.relay.signalled = sig
            child = self.relay.child
        if child is not None:
            child.signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        self._done.wait(timeout)
        return -1 if self.returncode is None else self.returncode

    def _end(self, code: int) -> None:
        self.returncode = code
        self._done.set()


class InProcess:
    """Runs fires in this process: a start queue served by at most
    ``concurrency`` worker threads (started as needed), each doing what
    ``cronwarden run`` does for one slot: the misfire grace judged now, the
    lease through ``Guard`` by the job's policy, the command under a
    ``Supervisor``, the end recorded. The warden's one heartbeat thread
    renews every run's lease. ``__call__`` is a ``Launch``."""

    def __init__(
        self,
        warden: Any,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        misfire_grace: float = DEFAULT_MISFIRE_GRACE,
        instance: str = "",
        say: Callable[[str], None] = print,
        ended: Callable[[], None] | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        """``ended`` is called after each run's end is recorded (the
        scheduler delivers to the sinks then, as ``cronwarden run`` does).
        ``launcher`` forks the commands' keepers (see ``keeper``); without
        one each is a fork of this process."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.warden = warden
        self.clock: Clock = warden.clock
        self.concurrency = concurrency
        self.misfire_grace = misfire_grace
        self.instance = instance
        self.say = say
        self.ended = ended
        self.launcher = launcher
        self.claim: Callable[[ScheduledJob, float, str | None], str | None] | None = None
        """``Scheduler.claim_at_start``, when the scheduler leaves the claims
        to the fires."""
        self.queue: deque[Fire] = deque()
        self.environ = {k: v for k, v in os.environ.items() if k not in WITHHELD_FROM_COMMAND}
        """The commands' environment but the run's own variables: this
        process's, less what may hold a password, read once (decoding
        ``os.environ`` anew was a fifth of a fire's own CPU)."""
        self._cond = threading.Condition()
        self._workers = 0
        self._idle = 0
        self._closed = False

    def __call__(
        self, job: ScheduledJob, slot: float, shard: str | None, *, backfill: str | None = None
    ) -> Fire:
        fire = Fire(job, slot, shard, backfill)
        with self._cond:
            if self._closed:
                raise ValueError("the scheduler is stopping")
            self.queue.append(fire)
            if self._idle == 0 and self._workers < self.concurrency:
                self._workers += 1
                threading.Thread(target=self._work, name="cronwarden-fire", daemon=True).start()
            else:
                self._cond.notify()
        return fire

    def close(self) -> None:
        """Workers end once the queue is empty."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self.queue and not self._closed:
                    self._cond.wait()
                self._idle -= 1
                if not self.queue:
                    self._workers -= 1
                    return
                fire = self.queue.popleft()
            code = 1
            try:
                code = self._fire(fire)
            except BaseException as e:  # a worker never dies silently with a fire in hand
                self._say(fire, f"not run: {type(e).__name__}: {e}")
            finally:
                fire._end(code)

    def _say(self, fire: Fire, what: str) -> None:
        on = f" shard {fire.shard}" if fire.shard else ""
        self.say(f"{_when(self.clock.wall())} {fire.job.name}{on}: slot {_when(fire.slot)} {what}")

    def _fire(self, fire: Fire) -> int:
        """One slot, start to end; the command's exit status (0 when it did
        not start)."""
        from cronwarden.guard import Guard, describe_refusal
        from cronwarden.preflight import job_options
        from cronwarden.stores.base import Refused

        job = fire.job
        if fire.relay.signalled is not None:
            self._say(fire, "not started: the scheduler is stopping")
            return 0
        if self.claim is not None and fire.backfill is None:
            lost = self.claim(job, fire.slot, fire.shard)
            if lost is not None:
                if lost:
                    self._say(fire, lost)
                return 0
        now = self.clock.wall()
        late = now - fire.slot - job.offset
        window = job.window(self.misfire_grace)
        if late > window and fire.backfill is None:
            # Judged here, at this fire's own start: a queue that fell behind
            # does not start work later than a late wake-up would.
            what = "misfire grace" if window == self.misfire_grace else "catch-up window"
            self._say(fire, f"not started: {late:.0f}s late, past the {what} {window:g}s")
            self._record(EventKind.MISFIRED, fire, {"late_by": round(late, 3)})
            return 0
        st = job.settings
        try:
            options = job_options(st, shard=fire.shard, slot=fire.slot)
            guard = Guard(self.warden, job.name, options)
            started = guard.acquire()
        except CronwardenError as e:
            self._say(fire, f"not started: {e}")
            return 0
        if isinstance(started, Refused):
            said = describe_refusal(job.name, started, self.clock.wall())
            self._say(fire, said.removeprefix(f"cronwarden: {job.name} "))
            return 0
        run: Any = started
        if fire.backfill is not None:
            self._record(EventKind.BACKFILLED, fire, {"run_id": run.run_id, "asked_by": fire.backfill})
        code = 0
        while run is not None:  # policy queue: the pending starts, on the same lease
            exit_code, run = self._supervise(fire, guard, run, options)
            code = code or exit_code
        return code

    def _supervise(self, fire: Fire, guard: Any, run: Any, options: Any) -> tuple[int, Any]:
        """The command of one granted run, to its recorded end: its exit
        status and the next run (policy queue), if one started."""
        from cronwarden.policy import Policy
        from cronwarden.supervisor import Supervisor

        if fire.relay.signalled is not None:
            guard.end(run, InterruptedError(f"signal {fire.relay.signalled} before the command started"))
            self._say(fire, "not started: the scheduler is stopping")
            return 0, None
        env = {
            **self.environ,
            "CRONWARDEN_RUN_ID": run.run_id,
            "CRONWARDEN_JOB": run.job,
            "CRONWARDEN_FENCING_TOKEN": str(run.token),
            "CRONWARDEN_LEASE_KEY": run.lease.key,
            "CRONWARDEN_SLOT": str(int(fire.slot)) if fire.slot == int(fire.slot) else repr(fire.slot),
        }
        if fire.shard:
            env["CRONWARDEN_SHARD"] = fire.shard

        def started(child: Any) -> None:
            fire.pid = child.pid
            self._say(fire, f"started, pid {child.pid}, run {run.run_id}")

        sup = Supervisor(run, fire.job.settings.command, env, kill_grace=options.kill_grace,
                         replace_grace=options.replace_grace, relay=fire.relay,
                         on_started=started, launcher=self.launcher)  # fmt: skip
        try:
            exited = sup.execute()
        except CronwardenError as e:  # the command could not start (127, 126)
            guard.end(run, e)
            self._say(fire, f"could not start: {e}")
            return int(getattr(e, "exit_code", 1) or 1), None
        except BaseException as e:
            guard.end(run, e)
            raise
        again = options.policy is Policy.QUEUE and fire.relay.signalled is None
        ending = guard.end(run, exited.interrupted, exit_code=exited.code, stopped_by=exited.stopped_by,
                           again=again)  # fmt: skip
        self._say(fire, f"ended: {ending.end.outcome.value}, exit status {exited.code}")
        if self.ended is not None:
            self.ended()
        return int(exited.code), ending.next

    def _record(self, kind: EventKind, fire: Fire, data: dict[str, Any]) -> None:
        """A slot decision, once per job, slot and kind: its event id is
        made from them, so two instances (or a retry) record it once."""
        event_id = slot_event_id(kind, fire.job.name, fire.slot)
        data = {"slot": fire.slot, "by": self.instance, **data}
        event = Event(kind, fire.job.name, self.clock.wall(), data=data, event_id=event_id)
        try:
            self.warden.store.record(event)
        except StoreError as e:
            self._say(fire, f"{kind.value} not recorded: {e}")


def _same(job: ScheduledJob) -> JobSettings:
    """A job's settings but where they were read (a line moved is no change)."""
    return job.settings._replace(sources={})


def _timing(job: ScheduledJob) -> tuple[Any, ...]:
    """What decides a job's fire times: unchanged by a reload, its next slot stands."""
    st = job.settings
    return (job.schedule, st.jitter, st.catchup, st.catchup_window)


def slot_event_id(kind: EventKind, job: str, slot: float) -> str:
    """A canonical UUID (version 5's layout) from a slot decision's kind, job
    and slot: the same decision is the same event on every instance."""
    import hashlib

    b = bytearray(hashlib.sha1(f"{kind.value}\0{job}\0{slot!r}".encode()).digest()[:16])
    b[6] = (b[6] & 0x0F) | 0x50
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass(frozen=True)
class RunLauncher:
    """Starts a scheduled run as ``cronwarden run --job NAME --slot T -- COMMAND``
    with the scheduler's config file and store, in a session of its own: a
    ``detach = true`` job's run outlives the scheduler (and a terminal's
    Ctrl-C), guarded by its own lease and heartbeat. The store URL goes
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
                                    env=env, pass_fds=(read,), start_new_session=True)  # fmt: skip
        finally:
            os.close(read)


@dataclass(frozen=True)
class Launchers:
    """In process, or detached for a ``detach = true`` job."""

    in_process: Launch
    detached: Launch

    def __call__(self, job: ScheduledJob, slot: float, shard: str | None) -> Child:
        return (self.detached if job.settings.detach else self.in_process)(job, slot, shard)


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
    return _second(int(t // 1))


@functools.lru_cache(maxsize=1024)
def _second(t: int) -> str:
    """A second in UTC as the lines say it; the same few seconds are said
    for every fire of a slot."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _status(code: int) -> str:
    return f"{code}" if code >= 0 else f"signal {-code}"
