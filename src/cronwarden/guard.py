"""Guarded runs: ``Warden.guard(job)`` acquires the job's lease by its policy,
keeps it with a heartbeat, and in every case records exactly one terminal
outcome and releases the lease.

The path of one run: ``Guard.acquire`` → ``Store.acquire`` (writes
``started``) → ``Heartbeat`` renews every ttl/3 (on the warden's one
``HeartbeatThread``) → the work (a ``with`` body, a decorated function, or a
child process in ``supervisor``) → ``Guard.end`` → ``Store.finish``
(terminal record + release).
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable, Coroutine, Generator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, Protocol, TypeVar, overload

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.config.settings import DEFAULT_MAX_PENDING, DEFAULT_REPLACE_GRACE, DEFAULT_TTL, check_name
from cronwarden.durations import MAX_DURATION, format_duration
from cronwarden.errors import (
    Interrupted,
    LeaseLost,
    LeaseRevoked,
    NotStarted,
    StopRequested,
    StoreError,
    StoreUnavailable,
    TimedOut,
    UnknownOption,
    UsageError,
    printable,
)
from cronwarden.events import JobInfo, Outcome, new_id
from cronwarden.lease import Heartbeat, HeartbeatThread, Lease, belief
from cronwarden.local import Marker, dead_runs, mark, runtime_dir
from cronwarden.policy import Policy
from cronwarden.stores.base import (
    End,
    Finished,
    Granted,
    Holder,
    Refusal,
    Refused,
    Start,
    Store,
    abandon_expired,
)

if TYPE_CHECKING:
    import asyncio
    import logging

    from cronwarden.schedule import Schedule

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def this_host(environ: Mapping[str, str] | None = None) -> str:
    """The host name runs are recorded under (``CRONWARDEN_HOST`` in
    ``environ``, default ``os.environ``, overrides). It is printed by
    ``status`` and the dashboard: a newline or an escape sequence in it would
    break their tables or clear a terminal."""
    given = (os.environ if environ is None else environ).get("CRONWARDEN_HOST")
    if given and (not given.isprintable() or len(given) > 255):
        raise UsageError(f"CRONWARDEN_HOST must be a host name of at most 255 printable characters, "
                         f"got {given[:80]!r}")  # fmt: skip
    return given or os.uname().nodename


MAX_PENDING = 10_000
"""The most starts policy queue keeps waiting: each is a run to come, and a
larger number is a mistake (the default, 1, coalesces)."""


class Options:
    """How one job is guarded, and what it declares about itself: validated
    when made, and immutable (``replace`` makes a validated copy). Durations
    are seconds, or text like ``"2m"``. Defaults are the config's
    (``cronwarden.config.settings``).

    ``every`` or ``schedule`` (a cron expression, in ``timezone``), ``reason``
    and ``grace`` say what the job is, as ``cronwarden run``'s flags do: the
    guard saves them in the store, so ``audit`` and the monitor judge a
    library job as they judge a command-line one, and a scheduled job's runs
    record the slot they serve."""

    __slots__ = (
        "allow_unpartitioned",
        "every",
        "grace",
        "max_pending",
        "max_runtime",
        "policy",
        "reason",
        "renew_every",
        "replace_grace",
        "schedule",
        "shard",
        "slot",
        "timezone",
        "ttl",
    )
    ttl: float
    policy: Policy
    shard: str | None
    renew_every: float | None
    max_runtime: float | None
    max_pending: int
    replace_grace: float
    allow_unpartitioned: bool
    slot: float | None
    every: float | None
    schedule: str | None
    timezone: str | None
    reason: str
    grace: float | None

    def __init__(
        self,
        *,
        ttl: float | str = DEFAULT_TTL,
        policy: Policy | str = Policy.SKIP,
        shard: str | None = None,
        renew_every: float | str | None = None,
        max_runtime: float | str | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
        replace_grace: float | str = DEFAULT_REPLACE_GRACE,
        allow_unpartitioned: bool = False,
        slot: float | None = None,
        every: float | str | None = None,
        schedule: str | None = None,
        timezone: str | None = None,
        reason: str = "",
        grace: float | str | None = None,
    ) -> None:
        if not isinstance(policy, str):
            raise UsageError(f"policy must be one of {', '.join(p.value for p in Policy)}, got {policy!r}")
        if shard is not None and not isinstance(shard, str):
            raise UsageError(f"shard must be a name like 'eu', got {shard!r}")
        if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int | float)):
            raise UsageError(f"slot must be a time in epoch seconds, got {slot!r}")
        for name, text in (("schedule", schedule), ("timezone", timezone)):
            if text is not None and (not isinstance(text, str) or not text.strip()):
                raise UsageError(f"{name} must be text like {_EXAMPLES[name]}, got {text!r}")
        if not isinstance(reason, str) or "\n" in reason.strip():
            raise UsageError(
                f"reason must be one sentence on one line saying why this policy, got {reason!r}"
            )
        values = {
            "ttl": _seconds(ttl, "ttl"),
            "policy": policy if isinstance(policy, Policy) else Policy.parse(policy),
            "shard": shard,
            "renew_every": None if renew_every is None else _seconds(renew_every, "renew_every"),
            "max_runtime": None if max_runtime is None else _seconds(max_runtime, "max_runtime"),
            "max_pending": max_pending,
            "replace_grace": _seconds(replace_grace, "replace_grace"),
            "allow_unpartitioned": allow_unpartitioned,
            "slot": slot,
            "every": None if every is None else _seconds(every, "every"),
            "schedule": None if schedule is None else schedule.strip(),
            "timezone": None if timezone is None else timezone.strip(),
            "reason": reason.strip(),
            "grace": None if grace is None else _seconds(grace, "grace"),
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self._check()

    def _check(self) -> None:
        if not self.ttl > 0:
            raise UsageError(f"ttl must be greater than zero, got {self.ttl:g}s")
        # The belief lasts belief(ttl) from the last renewal; the work is
        # stopped kill_grace before that. Leave room for two renewal attempts.
        longest = (belief(self.ttl) - self.kill_grace) / 2
        if self.renew_every is not None and not 0 < self.renew_every <= longest:
            raise UsageError(
                f"renew interval must be greater than zero and at most {longest:g}s for a "
                f"{self.ttl:g}s ttl (room for two renewals before the work is stopped), "
                f"got {self.renew_every:g}s"
            )
        if self.max_runtime is not None and self.max_runtime <= 0:
            raise UsageError(f"max_runtime must be greater than zero, got {self.max_runtime:g}s")
        pending = self.max_pending
        if isinstance(pending, bool) or not isinstance(pending, int) or not 1 <= pending <= MAX_PENDING:
            raise UsageError(f"max_pending must be a whole number from 1 to {MAX_PENDING}, got "
                             f"{self.max_pending!r}")  # fmt: skip
        if self.replace_grace < 0:
            raise UsageError(f"replace grace must not be negative, got {self.replace_grace:g}s")
        if self.shard is not None:
            check_name(self.shard, "shard")
        if self.every is not None and self.every <= 0:
            raise UsageError(f"every must be greater than zero, got {self.every:g}s")
        if self.grace is not None and self.grace < 0:
            raise UsageError(f"grace must not be negative, got {self.grace:g}s")
        if self.every is not None and self.schedule is not None:
            raise UsageError("give every (a period like '10m') or schedule (a cron expression), not both")
        if self.timezone is not None and self.schedule is None:
            raise UsageError("timezone applies to a cron schedule; give schedule='CRON' too")
        if self.schedule is not None:
            _schedule(None, self.schedule, self.timezone)  # the expression and the zone
        if self.policy is Policy.ALLOW and self.shard is None and not self.allow_unpartitioned:
            raise UsageError(
                "policy allow needs a partition: give --shard KEY, or set allow_unpartitioned = true "
                "with a reason if overlapping runs are really safe"
            )

    def declares(self) -> bool:
        """Whether these options say anything about the job beyond the
        defaults (as ``cronwarden run`` decides whether to save a job)."""
        return bool(
            self.every is not None or self.schedule is not None or self.reason
            or self.policy is not Policy.SKIP or self.grace is not None
            or self.max_runtime is not None or self.ttl != DEFAULT_TTL
        )  # fmt: skip

    def job_info(self, job: str, now: float) -> JobInfo:
        """What the store keeps of ``job`` as these options declare it."""
        sched = _schedule(self.every, self.schedule, self.timezone)
        text = None if sched is None else sched.text
        if self.schedule is not None and self.timezone:
            text = f"CRON_TZ={self.timezone} {self.schedule}"
        return JobInfo(
            name=job, schedule=text, period=None if sched is None else sched.period(now),
            policy=self.policy.value, reason=self.reason, ttl=self.ttl, grace=self.grace,
            max_runtime=self.max_runtime, updated_at=now,
        )  # fmt: skip

    @property
    def kill_grace(self) -> float:
        """Time between SIGTERM and SIGKILL when the lease is being lost: short
        enough that the child is gone before the lease could expire."""
        return min(10.0, self.ttl / 6)

    def replace(self, **changes: Any) -> Options:
        """A copy with ``changes``, validated like a new one."""
        return Options(**{**self._fields(), **changes})

    def _fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __reduce__(self) -> tuple[Any, ...]:
        # copy, deepcopy and pickle rebuild through the validating constructor.
        return (_options_from, (self._fields(),))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Options are immutable; use options.replace({name}=...)")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Options) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(tuple(self._fields().values()))

    def __repr__(self) -> str:
        return f"Options({', '.join(f'{k}={v!r}' for k, v in self._fields().items())})"


def _options_from(fields: dict[str, Any]) -> Options:
    return Options(**fields)


_EXAMPLES = {"schedule": "'*/10 * * * *'", "timezone": "'Europe/Berlin'"}


@functools.lru_cache(maxsize=64)
def _schedule(every: float | None, cron: str | None, tz: str | None) -> Schedule | None:
    """The job's schedule, made once per declaration (cronsim is imported
    only for a cron expression)."""
    if every is None and cron is None:
        return None
    from cronwarden.schedule import Schedule

    if every is not None:
        return Schedule(text=f"every {format_duration(every)}", every=every)
    assert cron is not None
    return Schedule.cron_(cron, tz)


def _seconds(value: float | str, what: str) -> float:
    if isinstance(value, str):
        from cronwarden.durations import parse_duration

        return parse_duration(value, what=what)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UsageError(f"{what} must be seconds or a duration like 90s or 10m, got {value!r}")
    if value > MAX_DURATION:
        raise UsageError(f"{what} must be at most 100 years (36500d), got {value:g}s")
    return float(value)


class Run:
    """One guarded execution, as the work sees it. ``abandoned`` and
    ``overlapped`` say how it started: the dead runs its start closed, and
    (policy allow without a shard) the run that was open when it began."""

    def __init__(
        self,
        guard: Guard,
        lease: Lease,
        heartbeat: Heartbeat,
        started: float,
        *,
        abandoned: tuple[str, ...] = (),
        overlapped: Holder | None = None,
        marker: Marker | None = None,
    ) -> None:
        self._guard = guard
        self.marker = marker
        """This run's marker on this host (``local``): held by its processes."""
        self.lease = lease
        self.heartbeat = heartbeat
        self.started_monotonic = started
        self.abandoned = abandoned
        self.overlapped = overlapped

    @property
    def run_id(self) -> str:
        return self.lease.run_id

    @property
    def job(self) -> str:
        return self.lease.job

    @property
    def token(self) -> int:
        """The fencing token: pass it to every write you want fenced."""
        return self.lease.token

    @property
    def lost(self) -> threading.Event:
        """Set when the lease is lost, revoked or the run timed out."""
        return self.heartbeat.lost_event

    def lost_reason(self) -> LeaseLost | None:
        """Why the run must stop, or None while the lease is believed. Reads
        the clock itself, so a dead or hung heartbeat thread still counts."""
        hb = self.heartbeat
        if hb.lost is not None:
            return hb.lost
        now = self._guard.clock.monotonic()
        if hb.stop_at is not None and now >= hb.stop_at:
            return TimedOut(self.lease.key, hb.stop_at - hb.started_at)
        if now >= hb.deadline:
            return LeaseLost(self.lease.key, "no renewal succeeded before the deadline")
        return None

    def check(self) -> Checked:
        """Raise ``LeaseLost`` (or ``LeaseRevoked``/``TimedOut``) if this run
        must stop. Call it between units of work. It checks when called; in a
        coroutine ``await run.check()`` reads the same (and does not yield)."""
        why = self.lost_reason()
        if why is not None:
            raise why
        return CHECKED

    def log_extra(self) -> dict[str, object]:
        """The run's structured fields, for ``logger.info(..., extra=...)``:
        the ones cronwarden's own log records carry."""
        return {"job": self.job, "run_id": self.run_id, "token": self.token}


class Checked:
    """What ``Run.check`` returns when the run may go on: awaitable, so a
    coroutine may write ``await run.check()``."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        return
        yield  # a generator that yields nothing: awaiting it does not suspend


CHECKED = Checked()


class Ending(NamedTuple):
    """What ``Guard.end`` did: how the run ended (as recorded, or as attempted
    if the store could not be reached), the store's answer (None then), and
    the next run on the same lease (policy queue), if one started."""

    end: End
    finished: Finished | None
    next: Run | None = None


class Guard:
    """One job's guarded starts: ``acquire`` a run, ``end`` it. Also the
    context manager ``Warden.guard`` returns."""

    def __init__(self, warden: Warden, job: str, options: Options) -> None:
        self.warden = warden
        self.clock = warden.clock
        self.job = check_name(job, "job name")
        self.options = options
        self.key = job if options.shard is None else f"{job}:{options.shard}"
        self._run: Run | None = None
        """The run of the with block, between __enter__ and __exit__."""
        self._watch: Watch | None = None
        """The async with block's watch, which cancels its task when the run
        must stop."""

    # -- acquiring --------------------------------------------------------

    def _start(self, run_id: str | None = None) -> Start:
        o = self.options
        # A shard is the partition policy allow promises to work once at a
        # time: a second start on a held shard is refused and recorded like a
        # skip. The store's allow (side lease + overlap) is for unpartitioned
        # jobs only.
        policy = Policy.SKIP if o.policy is Policy.ALLOW and o.shard is not None else o.policy
        at = self.clock.wall()
        slot = o.slot
        if slot is None and (o.every is not None or o.schedule is not None):
            schedule = _schedule(o.every, o.schedule, o.timezone)
            assert schedule is not None
            slot = schedule.slot(at)  # the fire time this start serves, as cronwarden run records it
        return Start(
            job=self.job, key=self.key, run_id=run_id or new_id(), host=self.warden.host,
            pid=os.getpid(), ttl=o.ttl, at=at, policy=policy, slot=slot, max_pending=o.max_pending,
        )  # fmt: skip

    def acquire(self, run_id: str | None = None) -> Run | Refused:
        """Try to start a run: the run, or the store's refusal (already
        recorded in the ledger, with the holder). ``run_id``: the id the
        start is recorded under, granted or refused (default: a new one)."""
        if self.options.declares():
            self.warden.declare(self.job, self.options)
        start = self._start(run_id)
        sharded_or_allow = self.key != self.job or self.options.policy is Policy.ALLOW
        swept = self._close_dead_here(start)
        if sharded_or_allow:
            swept += self._sweep_other_keys(start)
        sent = self.clock.monotonic()
        result = self.warden.store.acquire(start)
        if swept:
            result = result._replace(abandoned=(*swept, *result.abandoned))
        if isinstance(result, Refused) and result.refusal is Refusal.REVOKING:
            result, sent = self._wait_for_replaced(start, result)
        if isinstance(result, Refused):
            return result
        return self._begin(result, sent)

    def _close_dead_here(self, start: Start) -> list[str]:
        """Runs of this job on this host whose processes are all gone
        (``local``: their markers are unlocked) get their ``abandoned``
        record now, and their leases are released through the store's
        compare of the owner, so this start need not wait for them to
        expire. Returns the runs closed."""
        closed = []
        for dead in dead_runs(self.warden.runtime_dir, self.job):
            lease = Lease(key=dead.key, job=self.job, run_id=dead.run_id, token=dead.token, ttl=0.0)
            end = End(outcome=Outcome.ABANDONED, at=start.at,
                      detail=f"no process of the run is left on host {self.warden.host}; "
                      f"found by run {start.run_id}")  # fmt: skip
            try:
                finished = self.warden.store.finish(lease, end)
            except StoreError:
                dead.close()  # the marker stays for the next start; this one fails on the store too
                continue
            if finished.recorded:
                closed.append(dead.run_id)
            dead.forget()
        return closed

    def _sweep_other_keys(self, start: Start) -> list[str]:
        """A side lease (policy allow) or a shard may never be started again
        by its key, so no start would find its run dead there: a start of the
        job gives the job's dead runs on other keys their ``abandoned``
        record, before it takes a lease of its own. Best effort: the monitor
        does the same, so a store error here only leaves them to it."""
        store = self.warden.store
        try:
            others = [r for r in store.open_runs(self.job) if r.key != self.key]
            return abandon_expired(store, others, start.at, f"run {start.run_id}")
        except StoreError:
            return []

    def _wait_for_replaced(self, start: Start, refused: Refused) -> tuple[Granted | Refused, float]:
        """Policy replace: the holder was asked to stop through the store; it
        notices within one renew interval, stops its work within the replace
        grace, and releases. A dead holder's lease expires within a ttl."""
        o = self.options
        give_up = self.clock.monotonic() + refused.holder.expires_in + o.replace_grace + 1.0
        interval = min(0.25, o.ttl / 20)
        result: Granted | Refused = refused
        sent = self.clock.monotonic()
        while isinstance(result, Refused) and result.refusal is Refusal.REVOKING:
            if self.clock.monotonic() >= give_up:
                # The holder would not let go: record the slot as skipped.
                skip = start._replace(policy=Policy.SKIP, at=self.clock.wall())
                return self.warden.store.acquire(skip), sent
            self.clock.sleep(interval)
            sent = self.clock.monotonic()
            # Same run id (the revocation names it), but the time of this
            # attempt: the run starts when it is granted, not when it asked.
            start = start._replace(at=self.clock.wall())
            result = self.warden.store.acquire(start)
        return result, sent

    def _begin(self, granted: Granted, sent: float) -> Run:
        lease = granted.lease
        hb = Heartbeat(
            store=self.warden.store,
            lease=lease,
            ttl=self.options.ttl,
            interval=self.options.renew_every,
            clock=self.clock,
            started_at=sent,
            stop_at=None if self.options.max_runtime is None else sent + self.options.max_runtime,
            thread=self.warden.heartbeats,
        )
        marker = mark(self.warden.runtime_dir, self.job, lease.key, lease.run_id, lease.token)
        run = Run(self, lease, hb, sent, abandoned=granted.abandoned, overlapped=granted.overlapped,
                  marker=marker)  # fmt: skip
        hb.start(lease.key)
        logger = log()
        if logger is not None:
            logger.debug(
                "%s run %s started (token %d)", self.job, run.run_id, run.token, extra=run.log_extra()
            )
        return run

    # -- ending -----------------------------------------------------------

    def outcome(
        self,
        run: Run,
        error: BaseException | None,
        *,
        exit_code: int | None = None,
        stopped_by: LeaseLost | None = None,
        interrupted: str | None = None,
    ) -> End:
        """Judge how the run ended. Lease trouble outranks the work's own
        result: work finished without a believed lease is not a success.
        ``exit_code`` and ``stopped_by`` come from a supervisor: the child's
        exit status, and why it had to stop the child, if it did.
        ``interrupted`` says who told the work to stop from outside (a
        cancelled task): recorded ``interrupted``, not ``failed``."""
        why = stopped_by or run.lost_reason()
        if why is None and isinstance(error, LeaseLost):
            why = error
        at = self.clock.wall()
        if isinstance(why, StopRequested):
            detail, asked = self._stopped_by(run)
            return End(outcome=Outcome.STOPPED, at=at, exit_code=exit_code, detail=detail, data=asked)
        if isinstance(why, LeaseRevoked):
            return End(outcome=Outcome.REPLACED, at=at, exit_code=exit_code, detail=str(why),
                       replaced_by=why.by_run_id)  # fmt: skip
        if isinstance(why, TimedOut):
            return End(outcome=Outcome.TIMED_OUT, at=at, exit_code=exit_code, detail=str(why))
        if why is not None:
            return End(outcome=Outcome.LEASE_LOST, at=at, exit_code=exit_code, detail=str(why))
        if interrupted is not None:
            return End(outcome=Outcome.INTERRUPTED, at=at, exit_code=exit_code, detail=interrupted[:500])
        if isinstance(error, Interrupted):
            return End(outcome=Outcome.INTERRUPTED, at=at, exit_code=exit_code, detail=str(error)[:500],
                       data={"signal": error.fields()})  # fmt: skip
        if isinstance(error, KeyboardInterrupt):  # Ctrl-C in a with block or a decorated function
            detail = "SIGINT (KeyboardInterrupt)"
            return End(outcome=Outcome.INTERRUPTED, at=at, exit_code=exit_code, detail=detail)
        if error is not None:
            detail = f"{type(error).__name__}: {error}"[:500]
            return End(outcome=Outcome.FAILED, at=at, exit_code=exit_code, detail=detail)
        if exit_code:
            return End(outcome=Outcome.FAILED, at=at, exit_code=exit_code, detail=f"exit status {exit_code}")
        return End(outcome=Outcome.SUCCEEDED, at=at, exit_code=exit_code)

    def _stopped_by(self, run: Run) -> tuple[str, dict[str, object] | None]:
        """Who asked the run to stop, and why, from the stop request's event:
        the end's detail, and its ``by`` and ``reason`` (None when unknown)."""
        from cronwarden.events import EventKind
        from cronwarden.stores.base import EventQuery

        query = EventQuery(run_id=run.run_id, kinds=(EventKind.STOP_REQUESTED,), limit=1, newest_first=False)
        try:
            asked = self.warden.store.events(query)
        except StoreError:
            return "stop requested (cronwarden stop); who asked could not be read from the store", None
        if not asked:
            return "stop requested (cronwarden stop)", None
        data = asked[0].data
        by, reason = str(data.get("by") or ""), str(data.get("reason") or "")
        why = f": {reason}" if reason else ""
        return f"stopped by {by or 'someone'}{why}"[:500], {"by": by, "reason": reason}

    def end(
        self,
        run: Run,
        error: BaseException | None = None,
        *,
        exit_code: int | None = None,
        stopped_by: LeaseLost | None = None,
        interrupted: str | None = None,
        again: bool = False,
    ) -> Ending:
        """Record the terminal outcome and release. With ``again`` (policy
        queue), start the next pending run on the same lease, in the same
        step, and return it in ``Ending.next``."""
        # Judge first: stopping the heartbeat may wait for a renewal in flight,
        # and the outcome is how the run stood when its work ended.
        end = self.outcome(run, error, exit_code=exit_code, stopped_by=stopped_by, interrupted=interrupted)
        run.heartbeat.stop()
        # A pending start asked for a run after this one; the work failing
        # does not cancel that request. Lease trouble does: this process no
        # longer has a lease to hand on (replaced, lost) or was stopped.
        drain = again and end.outcome in (Outcome.SUCCEEDED, Outcome.FAILED)
        then = self._start() if drain else None
        sent = 0.0 if then is None else self.clock.monotonic()
        finished = self._finish_with_retries(run.lease, end, then)
        if run.marker is not None:
            if finished is not None:
                run.marker.release()
            else:  # unrecorded: once this process is gone, the next start here records abandoned
                run.marker.close()
        logger = log()
        if logger is not None:
            level = _LEVELS.get(end.outcome, _LEVELS_DEFAULT)
            extra = {**run.log_extra(), "outcome": end.outcome.value}
            said = f": {end.detail}" if end.detail else ""
            logger.log(level, "%s run %s %s%s", self.job, run.run_id, end.outcome.value, said, extra=extra)
        nxt = None
        if finished is not None and finished.next is not None:
            nxt = self._begin(Granted(lease=finished.next), sent)
        return Ending(end=end, finished=finished, next=nxt)

    def _finish_with_retries(self, lease: Lease, end: End, then: Start | None) -> Finished | None:
        """The terminal record matters more than promptness: retry a locked or
        unreachable store for up to a ttl. If it still fails, the next start
        (or the monitor) finds the lease expired and records ``abandoned``."""
        give_up = None
        delay = 0.05
        while True:
            try:
                return self.warden.store.finish(lease, end, then)
            except StoreUnavailable as e:
                now = self.clock.monotonic()
                if give_up is None:
                    give_up = now + max(self.options.ttl, 5.0)
                if now + delay >= give_up:
                    extra = {"job": lease.job, "run_id": lease.run_id, "token": lease.token}
                    cronwarden_logger().error(
                        "could not record the end of run %s: %s", lease.run_id, e, extra=extra
                    )
                    return None
                self.clock.sleep(delay)
                delay = min(delay * 2, 1.0)

    # -- the with statement ----------------------------------------------

    def __enter__(self) -> Run:
        if self.options.policy is Policy.QUEUE:
            raise UsageError(
                "policy queue re-runs the work while starts are pending: use @warden.job(...) "
                "or cronwarden run, not a with block"
            )
        run = self.acquire()
        if isinstance(run, Refused):
            self.warden.report_refusal(self.job, run)
            raise NotStarted(self.job, run.refusal.value, run.holder.run_id)
        self._run = run
        return run

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        run, self._run = self._run, None
        if run is not None:
            self.end(run, exc)

    # -- the async with statement ----------------------------------------
    # Store calls in a worker thread, and the block's task cancelled when the
    # run must stop (the asyncio section below).

    async def __aenter__(self) -> Run:
        run, self._watch = await _aenter(self)
        self._run = run
        return run

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        run, self._run = self._run, None
        watch, self._watch = self._watch, None
        if run is not None and watch is not None:
            await _aleave(self, run, watch, exc)


_LEVELS = {Outcome.SUCCEEDED: 10, Outcome.FAILED: 20, Outcome.INTERRUPTED: 20, Outcome.ABANDONED: 20}
"""Log level of each run's end (logging.DEBUG, INFO; WARNING for the rest):
a failure is the work's own exception, which its caller sees; lease trouble
is cronwarden's to tell."""

_LEVELS_DEFAULT = 30


def log() -> logging.Logger | None:
    """The library's logger, ``cronwarden``; None when nothing in this
    process imported ``logging``. Such a process has no handler for the
    records, and importing logging would cost every ``cronwarden run`` tick
    ~10 ms (the command line prints its own lines). An application that
    configures logging has imported it."""
    import sys

    return cronwarden_logger() if "logging" in sys.modules else None


def cronwarden_logger() -> logging.Logger:
    """The library's logger, importing logging: for what must be told."""
    import logging

    return logging.getLogger("cronwarden")


class Warden:
    """Entry point of the library.

    ``store`` is a URL (opened here, closed by ``close``) or a ``Store``
    object (the caller keeps ownership). Defaults to ``CRONWARDEN_STORE`` or
    the embedded SQLite file in the user's state directory.
    """

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        host: str | None = None,
        quiet: bool = False,
    ) -> None:
        self.clock = clock
        self.host = host or this_host()
        self.quiet = quiet
        self.heartbeats = HeartbeatThread()
        self._runtime_dir: str | None = None
        """One thread renews the leases of all this warden's runs."""
        self._options: dict[tuple[tuple[str, Any], ...], Options] = {}
        """Validated options by the keywords that made them: a job guarded in
        a loop is validated once."""
        self._declared: dict[str, JobInfo] = {}
        """What this warden last saved (or found saved) of each job: a job
        guarded in a loop asks the store once, and writes only after a change."""
        self._declare_lock = threading.Lock()
        if store is None or isinstance(store, str):
            from cronwarden.stores import open_store, resolve_url

            url = resolve_url(store)
            self.store: Store = open_store(url, clock=clock)
            self._owns_store = True
        else:
            self.store = store
            self._owns_store = False

    @property
    def runtime_dir(self) -> str:
        """Where this host's runs leave their markers (``local``)."""
        if self._runtime_dir is None:
            self._runtime_dir = runtime_dir(self.store.url, self.host)
        return self._runtime_dir

    def guard(self, job: str, **options: Any) -> Guard:
        """``with warden.guard("reconcile", ttl=120) as run: ...``, or
        ``async with`` in a coroutine.

        Options are those of ``Options``: how the job is guarded (ttl, policy,
        shard, renew_every, max_runtime, max_pending, replace_grace,
        allow_unpartitioned, slot) and what it is (every or schedule,
        timezone, reason, grace), saved in the store for ``audit`` and the
        monitor. A refused start is recorded and raises ``NotStarted``.
        """
        key = tuple(options.items())
        try:
            opts = self._options.get(key)
        except TypeError:  # an unhashable value: validate every time
            return Guard(self, job, _options(options))
        if opts is None:
            opts = _options(options)
            if len(self._options) >= 64:
                self._options.clear()
            self._options[key] = opts
        return Guard(self, job, opts)

    def job(self, name: str | None = None, **options: Any) -> JobDecorator:
        """Decorator: the function runs under the job's lease; a refused start
        is recorded, logged, and returns None. With policy queue the function
        runs again while starts are pending. An ``async def`` is guarded in
        its event loop (``cronwarden.aio``): calling it returns a coroutine
        that takes the lease when awaited. Options are ``guard``'s."""
        opts = _options(options)

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            job_name = name or fn.__name__
            import inspect

            if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
                raise UsageError(
                    f"@warden.job cannot guard {job_name!r}: it is a generator, whose work runs after "
                    "the call returns; guard the loop that consumes it instead (with warden.guard(...))"
                )
            if inspect.iscoroutinefunction(fn):
                return _guard_coroutine_function(self, lambda: Guard(self, job_name, opts), fn)

            def guarded(*args: Any, **kwargs: Any) -> Any:
                guard = Guard(self, job_name, opts)
                started = guard.acquire()
                if isinstance(started, Refused):
                    self.report_refusal(job_name, started)
                    return None
                run: Run | None = started
                result: Any = None
                while run is not None:
                    try:
                        result = fn(*args, **kwargs)
                        if hasattr(result, "__await__"):
                            _refuse_awaitable(job_name, result)
                    except BaseException as e:
                        guard.end(run, e)
                        raise
                    run = guard.end(run, again=opts.policy is Policy.QUEUE).next
                return result

            guarded.__name__ = getattr(fn, "__name__", job_name)
            guarded.__doc__ = fn.__doc__
            guarded.__wrapped__ = fn  # type: ignore[attr-defined]
            return guarded

        return wrap

    def declare(self, job: str, options: Options) -> None:
        """Save what ``options`` declare of ``job`` (schedule, policy, reason,
        …) in the store, as ``cronwarden run`` does for its flags and config,
        so ``audit`` and the monitor know the job. Asks the store once per job
        and warden, and writes only when the declaration changed."""
        now = self.clock.wall()
        info = options.job_info(job, now)
        with self._declare_lock:
            last = self._declared.get(job)
            if last is not None and last._replace(updated_at=now) == info:
                return
            known = self.store.job(job) if last is None else last
            if known is None or known._replace(updated_at=now) != info:
                self.store.save_job(info)
                known = info
            self._declared[job] = known

    def report_refusal(self, job: str, refused: Refused) -> None:
        """Log a refused start (it is already in the ledger) at INFO, with
        the job, the refusal and the holder as fields."""
        if not self.quiet:
            h = refused.holder
            logger = log()
            if logger is None:
                return
            logger.info(describe_refusal(job, refused, self.clock.wall()).removeprefix("cronwarden: "),
                       extra={"job": job, "refusal": refused.refusal.value, "holder_run_id": h.run_id,
                              "holder_host": h.host, "holder_pid": h.pid})  # fmt: skip

    def close(self) -> None:
        self.heartbeats.close()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Warden:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _options(options: dict[str, Any]) -> Options:
    unknown = sorted(set(options) - set(Options.__slots__))
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], Options.__slots__, n=1)
        known = ", ".join(sorted(Options.__slots__))
        hint = f"; did you mean {close[0]!r}?" if close else f"; expected one of {known}"
        raise UnknownOption(f"unknown guard option {unknown[0]!r}{hint}")
    return Options(**options)


def _refuse_awaitable(job: str, result: object) -> None:
    """A plain function that returned an awaitable (a coroutine, a task):
    its work would run after the lease is released. Refuse it loudly."""
    close = getattr(result, "close", None)
    if callable(close):
        close()  # never awaited: no "coroutine was never awaited" warning on top
    raise UsageError(
        f"@warden.job: {job!r} returned an awaitable, whose work would run after its lease is "
        "released; decorate the async def itself, so it is guarded in its event loop"
    )


class JobDecorator(Protocol):
    """What ``Warden.job(...)`` returns: a plain function stays plain, and
    returns None when its start is refused; an ``async def`` stays a
    coroutine function."""

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Callable[P, Coroutine[Any, Any, R | None]]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R | None]: ...


# -- asyncio ----------------------------------------------------------------
# ``async with warden.guard(...)`` and ``@warden.job`` on an ``async def``.
# asyncio is imported by the functions that use it: ``cronwarden run`` never
# pays for it.
#
# **Store calls run in a worker thread** (``asyncio.to_thread``), never on the
# event loop. The stores are synchronous, and each ``acquire`` and ``finish``
# is one round trip whose atomicity lives in one SQL function or Lua script per
# store; a thread hop costs tens of microseconds against that round trip, and
# keeps one implementation of every step instead of a second, asynchronous
# one per store that could drift from the first (SQLite has no asynchronous
# driver at all). Renewals already run on the warden's heartbeat thread, so a
# busy or blocked event loop cannot delay them. ``to_thread`` copies the
# task's context variables, so log records written in the thread carry what
# the task bound (structlog's ``contextvars``).
#
# **When the run must stop, its task is cancelled**, as the supervisor stops a
# command: at once when the lease is refused or revoked, or ``max_runtime``
# has passed; ``kill_grace`` before the belief deadline when renewals keep
# failing, so the task's own cleanup (its ``finally`` blocks, its
# ``CancelledError`` handlers) has that long before the lease could expire
# and be granted to another run. The guarded block then raises the reason
# (``LeaseLost``, ``LeaseRevoked`` or ``TimedOut``) in place of the
# ``CancelledError``. A task cancelled by anyone else (a service shutting
# down) is recorded ``interrupted`` and stays cancelled.
#
# **The terminal record outranks promptness**: a cancellation that arrives
# while the store is being asked to start or end the run is held until the
# store has answered, then delivered. Otherwise a start granted in the thread
# would be left renewing with no task to end it.


_CANCELLED = "the task was cancelled"
"""The detail of an ``interrupted`` run whose task someone else cancelled."""


class Watch:
    """Cancels ``task`` when ``run`` must stop (see the comment above). Lives
    on the event loop: the heartbeat thread only schedules a look."""

    def __init__(self, run: Run, task: asyncio.Task[Any] | None, kill_grace: float) -> None:
        import asyncio

        self.run = run
        self.task = task
        self.kill_grace = kill_grace
        self.loop = asyncio.get_running_loop()
        self.why: LeaseLost | None = None
        """Why the task was cancelled, once it was."""
        self.pending = False
        """Cancelled by this watch and not yet taken back (``uncancel``)."""
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        run.heartbeat.on_lost = self._lost_in_thread
        self._look()  # lost before on_lost was set: seen now

    def _lost_in_thread(self, _why: LeaseLost) -> None:
        # On the heartbeat thread, which must never die of this: a closed
        # loop (its task is gone) has no one left to cancel.
        try:
            self.loop.call_soon_threadsafe(self._look)
        except RuntimeError:
            pass

    def _look(self) -> None:
        if self._closed or self.why is not None:
            return
        run, hb = self.run, self.run.heartbeat
        now = hb.clock.monotonic()
        why = run.lost_reason()
        wake_at = hb.deadline - self.kill_grace
        if why is None and now >= wake_at:
            # As the supervisor: a renewal that is only late (this process was
            # starved) may still land; one that failed or hangs on the store
            # will not, and the task needs its grace before the deadline.
            late_until = hb.late_until(now, within=self.kill_grace)
            if late_until is None:
                why = LeaseLost(run.lease.key, hb.last_error or "renewal overdue")
            else:
                wake_at = late_until
        if why is None:
            if hb.stop_at is not None:
                wake_at = min(wake_at, hb.stop_at)
            self._arm(max(0.0, min(wake_at - now, hb.interval)))
            return
        self.why = why
        cronwarden_logger().warning("stopping %s run %s: %s", run.job, run.run_id, why, extra=run.log_extra())
        if self.task is not None and not self.task.done():
            self.task.cancel(f"cronwarden: {why}")
            self.pending = True

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay, self._look)

    def close(self) -> None:
        """No more looks; take back a cancellation not yet delivered."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self.run.heartbeat.on_lost = None


async def _insist(call: Callable[[], T]) -> tuple[T, bool]:
    """``call()`` in a worker thread, waited for to its end even if this task
    is cancelled meanwhile: its result, and whether a cancellation arrived
    that the caller must deliver (raise) once it has dealt with the result."""
    import asyncio

    future = asyncio.ensure_future(asyncio.to_thread(call))
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled = True
    return future.result(), cancelled and _still_cancelling()


def _still_cancelling() -> bool:
    """Whether this task is still asked to stop (not only by a watch's
    cancellation that it took back)."""
    import asyncio

    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


async def _astart(guard: Guard) -> Run | Refused:
    """``guard.acquire()`` off the event loop. Cancelled meanwhile, a run
    the store granted is ended (``interrupted``) before the cancellation is
    delivered: nothing else would end it."""
    import asyncio

    started, cancelled = await _insist(guard.acquire)
    if cancelled:
        if not isinstance(started, Refused):
            await _insist(functools.partial(guard.end, started, None, interrupted=_CANCELLED))
        raise asyncio.CancelledError
    return started


def _watch(run: Run, options: Options) -> Watch:
    import asyncio

    return Watch(run, asyncio.current_task(), options.kill_grace)


async def _aenter(guard: Guard) -> tuple[Run, Watch]:
    """``async with warden.guard(...)``: the run, and the watch on its task."""
    if guard.options.policy is Policy.QUEUE:
        raise UsageError(
            "policy queue re-runs the work while starts are pending: use @warden.job(...) "
            "on the async def, or cronwarden run, not an async with block"
        )
    started = await _astart(guard)
    if isinstance(started, Refused):
        guard.warden.report_refusal(guard.job, started)
        raise NotStarted(guard.job, started.refusal.value, started.holder.run_id)
    return started, _watch(started, guard.options)


async def _aleave(
    guard: Guard, run: Run, watch: Watch, exc: BaseException | None, *, again: bool = False
) -> Ending:
    """End ``run`` after its block or coroutine ended with ``exc`` (None:
    it returned). Raises the reason in place of this watch's own
    cancellation; otherwise the caller re-raises ``exc``."""
    import asyncio

    watch.close()
    task = asyncio.current_task()
    ours = False
    if watch.pending and task is not None:
        task.uncancel()
        watch.pending = False
        # Delivered as exc, or still to come (the body ended before its next
        # await): insist swallows it then, as nobody else asked to cancel.
        ours = isinstance(exc, asyncio.CancelledError) and task.cancelling() == 0
    interrupted = None
    error = exc
    if isinstance(exc, asyncio.CancelledError):
        error = None
        if not ours:
            interrupted = _CANCELLED
    ending, cancelled = await _insist(
        functools.partial(guard.end, run, error, stopped_by=watch.why, interrupted=interrupted, again=again)
    )
    if cancelled:
        # Asked to stop while the end was being recorded: a next run (policy
        # queue) would be left renewing, so it ends here, interrupted.
        if ending.next is not None:
            await _insist(functools.partial(guard.end, ending.next, None, interrupted=_CANCELLED))
        raise asyncio.CancelledError
    if ours:
        assert watch.why is not None
        raise watch.why from exc
    return ending


def _guard_coroutine_function(
    warden: Warden, new_guard: Callable[[], Guard], fn: Callable[..., Coroutine[Any, Any, R]]
) -> Callable[..., Coroutine[Any, Any, R | None]]:
    """``@warden.job`` on an ``async def``: each call's coroutine takes the
    lease (a ``new_guard()``) when awaited, runs ``fn`` in the same task
    under the watch, and records its end; a refused start is recorded,
    logged, and returns None."""

    @functools.wraps(fn)
    async def guarded(*args: Any, **kwargs: Any) -> R | None:
        guard = new_guard()
        job, options = guard.job, guard.options
        started = await _astart(guard)
        if isinstance(started, Refused):
            warden.report_refusal(job, started)
            return None
        run: Run | None = started
        result: R | None = None
        while run is not None:
            w = _watch(run, options)
            try:
                result = await fn(*args, **kwargs)
            except BaseException as e:
                await _aleave(guard, run, w, e)
                raise
            run = (await _aleave(guard, run, w, None, again=options.policy is Policy.QUEUE)).next
        return result

    return guarded


def describe_refusal(job: str, refused: Refused, now: float, *, manual: bool = False) -> str:
    """The one line a refused start says. ``manual``: a start by hand
    (``cronwarden trigger``), which serves no slot: the line says what
    refused it and what was recorded instead."""
    h = refused.holder
    from time import localtime, strftime

    since = strftime("%Y-%m-%d %H:%M:%S", localtime(h.started_at))
    age = format_duration(max(0.0, now - h.started_at))
    if manual:
        held = (f"run {h.run_id} holds the lease (host {printable(h.host)}, pid {h.pid}, since {since}, "
                f"{age} ago)")  # fmt: skip
        said = {
            Refusal.SKIPPED: f"refused because {held}; per policy skip, recorded as skipped",
            Refusal.QUEUED: f"queued because {held}; per policy queue, it runs when that run ends",
            Refusal.QUEUE_FULL: f"refused because {held} and its queue is full; recorded as queue_full",
            Refusal.REVOKING: f"refused because {held} and did not stop when replaced; recorded as skipped",
        }[refused.refusal]
        return f"cronwarden: manual start of {job} {said}"
    what = {
        Refusal.SKIPPED: "skipped",
        Refusal.QUEUED: "queued",
        Refusal.QUEUE_FULL: "not queued (queue full)",
        Refusal.REVOKING: "skipped (holder did not stop)",
    }[refused.refusal]
    return (
        f"cronwarden: {job} {what}: run {h.run_id} (host {printable(h.host)}, pid {h.pid}) has held it "
        f"since {since}, {age} ago; this slot did no work"
    )
