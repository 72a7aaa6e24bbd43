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
scheduler) and recording its end; every run's lease is renewed by the
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

import math
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.config import ENV_SCHEDULER_STORE, WITHHELD_FROM_COMMAND, JobSettings
from cronwarden.errors import CronwardenError, StoreError, StoreUnavailable
from cronwarden.events import Event, EventKind
from cronwarden.schedule import Schedule
from cronwarden.stores.base import Store

if TYPE_CHECKING:
    from cronwarden.guard import Options

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
        for job in self.jobs:
            # The clock is read per job: claims take store round trips, and
            # a long loop must not judge its last jobs by its start time.
            now = self.clock.wall()
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
            self.running.append(Started(job.name, slot, shard, child, job.settings.detach))
            if not isinstance(child, Fire):  # a fire says itself when it starts
                self._say(job.name, shard, slot, f"started, pid {child.pid}")

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

    def __init__(self, job: ScheduledJob, slot: float, shard: str | None) -> None:
        from cronwarden.supervisor import SignalRelay

        self.job = job
        self.slot = slot
        self.shard = shard
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


def job_options(st: JobSettings, *, shard: str | None = None, slot: float | None = None) -> Options:
    """How a configured job is guarded and what it declares, as the guard
    takes it: each fire's (with its shard and slot), and the scheduler's
    declaration of the job at start, which makes the fires' own a no-op."""
    from cronwarden.guard import Options

    return Options(
        ttl=st.ttl, policy=st.policy, shard=shard, max_runtime=st.max_runtime,
        max_pending=st.max_pending, replace_grace=st.replace_grace, renew_every=st.renew_every,
        allow_unpartitioned=st.allow_unpartitioned, slot=slot,
        every=st.every, schedule=st.schedule, timezone=st.timezone or None, reason=st.reason,
        grace=st.grace,
    )  # fmt: skip


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
    ) -> None:
        """``ended`` is called after each run's end is recorded (the
        scheduler delivers to the sinks then, as ``cronwarden run`` does)."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.warden = warden
        self.clock: Clock = warden.clock
        self.concurrency = concurrency
        self.misfire_grace = misfire_grace
        self.instance = instance
        self.say = say
        self.ended = ended
        self.queue: deque[Fire] = deque()
        self._cond = threading.Condition()
        self._workers = 0
        self._idle = 0
        self._closed = False

    def __call__(self, job: ScheduledJob, slot: float, shard: str | None) -> Fire:
        fire = Fire(job, slot, shard)
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
        from cronwarden.stores.base import Refused

        job = fire.job
        if fire.relay.signalled is not None:
            self._say(fire, "not started: the scheduler is stopping")
            return 0
        now = self.clock.wall()
        late = now - fire.slot
        if late > self.misfire_grace:
            # Judged here, at this fire's own start: a queue that fell behind
            # does not start work later than a late wake-up would.
            self._say(fire, f"not started: {late:.0f}s late, past the misfire grace {self.misfire_grace:g}s")
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
            **{k: v for k, v in os.environ.items() if k not in WITHHELD_FROM_COMMAND},  # may hold a password
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
                         on_started=started)  # fmt: skip
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
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int) -> str:
    return f"{code}" if code >= 0 else f"signal {-code}"
