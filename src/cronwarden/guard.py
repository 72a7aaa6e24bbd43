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

import math
import os
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, NamedTuple, ParamSpec, TypeVar

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.config.settings import DEFAULT_MAX_PENDING, DEFAULT_REPLACE_GRACE, DEFAULT_TTL, check_name
from cronwarden.durations import MAX_DURATION, format_duration
from cronwarden.errors import (
    Interrupted,
    LeaseLost,
    LeaseRevoked,
    NotStarted,
    StoreError,
    StoreUnavailable,
    TimedOut,
    UsageError,
)
from cronwarden.events import Outcome, new_id
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

P = ParamSpec("P")
R = TypeVar("R")


def this_host() -> str:
    """The host name runs are recorded under (``CRONWARDEN_HOST`` overrides).
    It is printed by ``status`` and the dashboard: a newline or an escape
    sequence in it would break their tables or clear a terminal."""
    given = os.environ.get("CRONWARDEN_HOST")
    if given and (not given.isprintable() or len(given) > 255):
        raise UsageError(f"CRONWARDEN_HOST must be a host name of at most 255 printable characters, "
                         f"got {given[:80]!r}")  # fmt: skip
    return given or os.uname().nodename


class Options:
    """How one job is guarded: validated when made, and immutable (``replace``
    makes a validated copy). Durations are seconds, or text like ``"2m"``.
    Defaults are the config's (``cronwarden.config.settings``)."""

    __slots__ = (
        "allow_unpartitioned",
        "max_pending",
        "max_runtime",
        "policy",
        "renew_every",
        "replace_grace",
        "shard",
        "slot",
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
    ) -> None:
        if not isinstance(policy, str):
            raise UsageError(f"policy must be one of {', '.join(p.value for p in Policy)}, got {policy!r}")
        if shard is not None and not isinstance(shard, str):
            raise UsageError(f"shard must be a name like 'eu', got {shard!r}")
        if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int | float)):
            raise UsageError(f"slot must be a time in epoch seconds, got {slot!r}")
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
        if isinstance(pending, bool) or not isinstance(pending, int) or pending < 1:
            raise UsageError(f"max_pending must be a whole number of at least 1, got {self.max_pending!r}")
        if self.replace_grace < 0:
            raise UsageError(f"replace grace must not be negative, got {self.replace_grace:g}s")
        if self.shard is not None:
            check_name(self.shard, "shard")
        if self.policy is Policy.ALLOW and self.shard is None and not self.allow_unpartitioned:
            raise UsageError(
                "policy allow needs a partition: give --shard KEY, or set allow_unpartitioned = true "
                "with a reason if overlapping runs are really safe"
            )

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

    def check(self) -> None:
        """Raise ``LeaseLost`` (or ``LeaseRevoked``/``TimedOut``) if this run
        must stop. Call it between units of work."""
        why = self.lost_reason()
        if why is not None:
            raise why


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

    # -- acquiring --------------------------------------------------------

    def _start(self, run_id: str | None = None) -> Start:
        o = self.options
        # A shard is the partition policy allow promises to work once at a
        # time: a second start on a held shard is refused and recorded like a
        # skip. The store's allow (side lease + overlap) is for unpartitioned
        # jobs only.
        policy = Policy.SKIP if o.policy is Policy.ALLOW and o.shard is not None else o.policy
        return Start(
            job=self.job, key=self.key, run_id=run_id or new_id(), host=self.warden.host,
            pid=os.getpid(), ttl=o.ttl, at=self.clock.wall(), policy=policy, slot=o.slot,
            max_pending=o.max_pending,
        )  # fmt: skip

    def acquire(self) -> Run | Refused:
        """Try to start a run: the run, or the store's refusal (already
        recorded in the ledger, with the holder)."""
        start = self._start()
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
        return run

    # -- ending -----------------------------------------------------------

    def outcome(
        self,
        run: Run,
        error: BaseException | None,
        *,
        exit_code: int | None = None,
        stopped_by: LeaseLost | None = None,
    ) -> End:
        """Judge how the run ended. Lease trouble outranks the work's own
        result: work finished without a believed lease is not a success.
        ``exit_code`` and ``stopped_by`` come from a supervisor: the child's
        exit status, and why it had to stop the child, if it did."""
        why = stopped_by or run.lost_reason()
        if why is None and isinstance(error, LeaseLost):
            why = error
        at = self.clock.wall()
        if isinstance(why, LeaseRevoked):
            return End(outcome=Outcome.REPLACED, at=at, exit_code=exit_code, detail=str(why),
                       replaced_by=why.by_run_id)  # fmt: skip
        if isinstance(why, TimedOut):
            return End(outcome=Outcome.TIMED_OUT, at=at, exit_code=exit_code, detail=str(why))
        if why is not None:
            return End(outcome=Outcome.LEASE_LOST, at=at, exit_code=exit_code, detail=str(why))
        if isinstance(error, Interrupted):
            return End(outcome=Outcome.INTERRUPTED, at=at, exit_code=exit_code, detail=str(error)[:500])
        if isinstance(error, KeyboardInterrupt):  # Ctrl-C in a with block or a decorated function
            detail = "SIGINT (KeyboardInterrupt)"
            return End(outcome=Outcome.INTERRUPTED, at=at, exit_code=exit_code, detail=detail)
        if error is not None:
            detail = f"{type(error).__name__}: {error}"[:500]
            return End(outcome=Outcome.FAILED, at=at, exit_code=exit_code, detail=detail)
        if exit_code:
            return End(outcome=Outcome.FAILED, at=at, exit_code=exit_code, detail=f"exit status {exit_code}")
        return End(outcome=Outcome.SUCCEEDED, at=at, exit_code=exit_code)

    def end(
        self,
        run: Run,
        error: BaseException | None = None,
        *,
        exit_code: int | None = None,
        stopped_by: LeaseLost | None = None,
        again: bool = False,
    ) -> Ending:
        """Record the terminal outcome and release. With ``again`` (policy
        queue), start the next pending run on the same lease, in the same
        step, and return it in ``Ending.next``."""
        # Judge first: stopping the heartbeat may wait for a renewal in flight,
        # and the outcome is how the run stood when its work ended.
        end = self.outcome(run, error, exit_code=exit_code, stopped_by=stopped_by)
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
                    print(f"cronwarden: could not record the end of run {lease.run_id}: {e}",
                          file=sys.stderr)  # fmt: skip
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
        """``with warden.guard("reconcile", ttl=120) as run: ...``

        Options are those of ``Options`` (ttl, policy, shard, renew_every,
        max_runtime, max_pending, replace_grace, allow_unpartitioned, slot).
        A refused start is recorded and raises ``NotStarted``.
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

    def job(
        self, name: str | None = None, **options: Any
    ) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
        """Decorator: the function runs under the job's lease; a refused start
        is recorded, reported on stderr, and returns None. With policy queue
        the function runs again while starts are pending."""
        opts = _options(options)

        def wrap(fn: Callable[P, R]) -> Callable[P, R | None]:
            job_name = name or fn.__name__

            def guarded(*args: P.args, **kwargs: P.kwargs) -> R | None:
                guard = Guard(self, job_name, opts)
                started = guard.acquire()
                if isinstance(started, Refused):
                    self.report_refusal(job_name, started)
                    return None
                run: Run | None = started
                result: R | None = None
                while run is not None:
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException as e:
                        guard.end(run, e)
                        raise
                    run = guard.end(run, again=opts.policy is Policy.QUEUE).next
                return result

            guarded.__name__ = getattr(fn, "__name__", job_name)
            guarded.__doc__ = fn.__doc__
            return guarded

        return wrap

    def report_refusal(self, job: str, refused: Refused) -> None:
        if not self.quiet:
            print(describe_refusal(job, refused, self.clock.wall()), file=sys.stderr)

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
        raise UsageError(f"unknown guard option {unknown[0]!r}{hint}")
    return Options(**options)


def describe_refusal(job: str, refused: Refused, now: float) -> str:
    h = refused.holder
    what = {
        Refusal.SKIPPED: "skipped",
        Refusal.QUEUED: "queued",
        Refusal.QUEUE_FULL: "not queued (queue full)",
        Refusal.REVOKING: "skipped (holder did not stop)",
    }[refused.refusal]
    from time import localtime, strftime

    since = strftime("%Y-%m-%d %H:%M:%S", localtime(h.started_at))
    return (
        f"cronwarden: {job} {what}: run {h.run_id} (host {h.host}, pid {h.pid}) has held it "
        f"since {since}, {format_duration(max(0.0, now - h.started_at))} ago; this slot did no work"
    )
