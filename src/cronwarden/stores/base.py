"""The store contract, written once: ``Store``'s abstract methods each say
what they do, return and raise. Every backend (SQLite, PostgreSQL, Redis)
implements exactly this; the contract suite in ``tests/contract`` checks each
against a real server.

What every store guarantees:

- **Ownership.** Only the run a lease was granted to can renew or release
  it: each step compares the owner and acts in one atomic step. A release by
  a run that no longer owns the lease changes nothing and says so; it never
  deletes another run's lease.
- **Fencing.** Every grant of a key carries a fencing token greater than
  every earlier grant's. Releasing keeps the counter; durable stores keep it
  across restarts.
- **The store's clock.** Whether a lease has expired is judged by the
  store's own clock, never by a client's wall clock: clients whose clocks
  are hours apart see the same leases. The times a client passes in
  (``Start.at``, ``End.at``) are for the ledger, for people to read.
- **One terminal record per start.** Every run that started ends with
  exactly one of ``succeeded``, ``failed``, ``lease_lost``, ``replaced``,
  ``timed_out`` or ``abandoned`` (written by whoever finds its lease expired
  with no end recorded).
- **No silent skip.** A start refused because another run holds the lease
  is recorded, naming the holder: its run id, host, pid, start and age.
- **At most one run per slot.** However many schedulers fire a job's slot,
  one claim wins (``claim_slot``).
- **Nothing lost.** The ledger is the outbox: every event reaches every sink
  at least once, and an event is in the ledger once, whatever the retries.

Each method is one atomic step in the store (one transaction or one
script) and, on the network stores, one round trip. Errors: a store that
cannot be reached or is busy right now raises ``StoreUnavailable`` (retry
later; a guarded start fails closed with exit status 75); a store that is
not usable as configured, or refuses a request outright, raises
``StoreError`` (retrying will not help).
"""

import abc
import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Self

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.errors import LeaseLost, LeaseRevoked, StopRequested, StoreUrlError
from cronwarden.events import Event, EventKind, JobInfo, Outcome, RunRecord
from cronwarden.lease import Lease
from cronwarden.policy import Policy

if TYPE_CHECKING:  # the cron wrapper's path does not import the rollup
    from cronwarden.stores.rollup import Rollup


class Start(NamedTuple):
    """A request to start one run."""

    job: str
    key: str
    """The lease key: the job's name, or ``job:shard``."""
    run_id: str
    host: str
    pid: int
    ttl: float
    """Seconds the lease lasts unless renewed, by the store's clock."""
    at: float
    """Wall-clock time of the request (for the ledger, never for expiry)."""
    policy: Policy = Policy.SKIP
    """What to do if another run holds the lease (``Store.acquire``)."""
    slot: float | None = None
    """The scheduled fire time this start serves, if any (epoch seconds)."""
    max_pending: int = 1
    """Policy queue: how many starts may wait for the lease."""


class Holder(NamedTuple):
    """Who holds a lease, as a refusal reports it."""

    run_id: str
    host: str
    pid: int
    started_at: float
    token: int
    expires_in: float
    """Seconds left on the holder's lease by the store's clock."""

    def age(self, now: float) -> float:
        return now - self.started_at


class Granted(NamedTuple):
    """``acquire``'s answer when the run may start."""

    lease: Lease
    abandoned: tuple[str, ...] = ()
    """Runs this start found with an expired lease and no terminal record,
    and recorded ``abandoned``."""
    overlapped: Holder | None = None
    """Policy allow: the run that still holds the key (``lease`` is then a
    side lease, see ``side_lease_key``)."""


class Refusal(enum.StrEnum):
    """Why ``acquire`` did not grant the lease."""

    SKIPPED = "skipped"
    """Policy skip: recorded ``skipped``; the slot did no work."""
    QUEUED = "queued"
    """Policy queue: one more start waits; the holder's ``finish`` starts it."""
    QUEUE_FULL = "queue_full"
    """Policy queue, with ``max_pending`` starts already waiting."""
    REVOKING = "revoking"
    """Policy replace: the holder was asked to stop; ask again until granted."""


class Refused(NamedTuple):
    """``acquire``'s answer when another run holds the lease."""

    refusal: Refusal
    holder: Holder
    abandoned: tuple[str, ...] = ()


class End(NamedTuple):
    """How a run ended, as the guard reports it to ``finish``."""

    outcome: Outcome
    at: float
    """Wall-clock time of the end (for the ledger and the run's duration)."""
    exit_code: int | None = None
    detail: str = ""
    replaced_by: str | None = None
    """Outcome replaced: the run that took over."""
    data: Mapping[str, object] | None = None
    """More fields of the end event, kept with the others in its data:
    outcome interrupted by a signal, ``signal`` (what is known of it: the
    signal, its sender, the grace, whether SIGKILL followed); outcome
    stopped, ``by`` and ``reason`` (who asked, why: as the request said)."""


class Finished(NamedTuple):
    """``finish``'s answer."""

    owned: bool
    """False when the lease was no longer this run's at release."""
    recorded: bool
    """False when the run already had a terminal record (e.g. ``abandoned``)."""
    next: Lease | None = None
    """The lease handed to ``finish``'s ``then`` start, if it was."""


class LeaseInfo(NamedTuple):
    """A lease as ``Store.lease`` reads it."""

    key: str
    owner: str | None
    """The run holding it; None once released."""
    token: int
    """The latest grant's fencing token (kept after release)."""
    expires_in: float | None
    """Seconds left by the store's clock: positive while live, zero or
    negative once expired; None once released."""
    pending: int = 0
    """Policy queue: starts waiting for the lease."""
    revoked_by: str | None = None
    """Policy replace: the run that asked the owner to stop."""


class Tally(NamedTuple):
    """What ``Store.tally`` counts for one job."""

    events: Mapping[str, int]
    """Event kind -> how many the ledger holds."""
    durations: tuple[float, ...]
    """Durations of the job's completed runs the ledger holds."""


class EventQuery(NamedTuple):
    """What ``Store.events`` reads: the filters are combined (AND); a filter
    left at None (or ``kinds`` empty) matches everything."""

    job: str | None = None
    kinds: Sequence[EventKind] | None = None
    run_id: str | None = None
    since: float | None = None
    """Events whose ``at`` is at or after this wall-clock time."""
    limit: int = 100
    """At most this many events: the newest ones, or with ``newest_first``
    False the oldest ones."""
    newest_first: bool = True


NEW_SINK_BACKFILL = 3600.0
"""Seconds of history a newly registered sink is given (see ``undelivered``)."""
DEAD_LETTERS_KEPT = 1000
"""Dead letters a sink keeps at most (see ``Store.reject``): a receiver that
rejects everything (a wrong URL path answering 404) sets aside its newest
thousand events, not the ledger."""


PRUNE_BUDGET = 200
"""Events one ``Store.prune`` step deletes at most (with the runs whose
``started`` they are): a step costs a few milliseconds, so the end of a run
and a monitoring pass can afford one (``bench/retention.py`` measures it)."""


AGE_OUT_FREELY = frozenset(
    {EventKind.STARTED, *(o.event for o in Outcome), EventKind.SKIPPED, EventKind.QUEUED,
     EventKind.QUEUE_FULL, EventKind.PAUSED, EventKind.MISFIRED, EventKind.BACKFILLED,
     EventKind.SINK_FAILED, EventKind.SINK_RECOVERED, EventKind.SINK_REJECTED, EventKind.TRIGGERED,
     EventKind.STOP_REQUESTED}
)  # fmt: skip
"""The kinds retention deletes. Every other kind (the monitor's findings,
operators' decisions: a state that holds until a later event says
otherwise) is kept whatever its age: such events record changes of state,
a few per job and week, and deleting an old one could make a finding that
was resolved look raised again, or one that is raised look gone."""


def pruned_kinds() -> list[str]:
    """``AGE_OUT_FREELY``'s values, sorted: each store's prune step walks
    the events of these kinds only, so the kinds kept take no part of its
    budget however many and old they are."""
    return sorted(k.value for k in AGE_OUT_FREELY)


def pruned_kinds_sql() -> str:
    """``pruned_kinds`` as an SQL list of literals (enum values: letters
    and ``_`` only), for the SQL stores' prune statements: each kind is an
    index range of (job, kind, at)."""
    return ", ".join(f"'{k}'" for k in pruned_kinds())


class Retention(NamedTuple):
    """How much of the ledger a store keeps: ``retention = "90d"`` and
    ``keep_runs = 1000`` in the config file or the store URL. Either, both
    (whichever prunes more), or neither (nothing is pruned)."""

    max_age: float | None = None
    """Seconds: events older than this, and finished runs started before it, go."""
    keep_runs: int | None = None
    """Finished runs kept per job, newest first (and the events of the runs that go)."""

    @property
    def active(self) -> bool:
        return self.max_age is not None or self.keep_runs is not None


KEEP_ALL = Retention()
"""No retention: nothing is pruned (the default)."""
RETENTION_PARAMS = ("retention", "keep_runs")
"""The store URL's retention parameters, the same on every store."""


def retention_of(url: str, params: dict[str, str]) -> Retention:
    """The ``retention`` and ``keep_runs`` parameters of a store URL, taken
    out of ``params`` (so the store sees only its own)."""
    from cronwarden.durations import parse_positive_duration
    from cronwarden.errors import StoreUrlError, UsageError

    age, keep = params.pop("retention", None), params.pop("keep_runs", None)
    try:
        max_age = None if age is None else parse_positive_duration(age, what="retention")
    except UsageError as e:
        raise StoreUrlError(url, str(e)) from None
    if keep is not None and (not keep.isdigit() or not 1 <= int(keep) <= 10**9):
        raise StoreUrlError(url, f"keep_runs must be a whole number of runs from 1 to 10^9, got {keep!r}")
    return Retention(max_age, None if keep is None else int(keep))


class Pruned(NamedTuple):
    """What a ``Store.prune`` step deleted (or, dry, would delete)."""

    runs: int = 0
    events: int = 0
    done: bool = True
    """False when the step stopped at its budget with more due: call again."""


def side_lease_key(key: str, run_id: str) -> str:
    """The key of the side lease policy allow grants ``run_id`` while another
    run holds ``key``: a lease of the run's own, so it has one to renew, that
    nobody else is ever granted."""
    return f"{key}+{run_id}"


def is_side_lease(key: str, run_id: str) -> bool:
    """Whether ``key`` is ``run_id``'s side lease. Its record is deleted when
    the run finishes: no other start will ever ask for that key."""
    return "+" in key and key.endswith("+" + run_id)


STOP_MARK = "stop:"
"""How a lease revoked by ``Store.request_stop`` is marked (policy replace
marks it with the replacing run's id, a UUID, which never starts so)."""


def stop_mark(grace: float) -> str:
    """The revocation mark of a stop request: it carries the grace, so the
    run's supervisor knows it at the renewal that finds the mark, with no
    further read."""
    return f"{STOP_MARK}{grace!r}"


def revocation(key: str, revoked_by: str) -> LeaseRevoked:
    """What a renewal refused by a revocation raises: ``StopRequested`` for
    a stop request's mark, ``LeaseRevoked`` for policy replace's."""
    if revoked_by.startswith(STOP_MARK):
        try:
            grace = float(revoked_by.removeprefix(STOP_MARK))
        except ValueError:
            grace = 0.0
        return StopRequested(key, revoked_by, grace)
    return LeaseRevoked(key, revoked_by)


PAUSE_KINDS = (EventKind.JOB_PAUSED, EventKind.JOB_RESUMED)
PAUSE_READ = 16
"""Pause and resume events ``Store.pause_state`` reads, newest by time first."""


class Store(abc.ABC):
    """A place that keeps leases and the ledger: runs, events, jobs, each
    sink's outbox. Open one with ``cronwarden.stores.open_store(url)``."""

    url: str
    """Where the store is, as a URL (without a password)."""
    retention: Retention = KEEP_ALL
    """What its URL says to keep (``?retention=90d&keep_runs=1000``);
    nothing is pruned unless someone calls ``prune`` with it."""

    # -- opening by URL -----------------------------------------------------

    @classmethod
    def parse_url(cls, url: str) -> Any:
        """What ``url`` says to this store, read without connecting to
        anything; ``StoreUrlError`` naming what is wrong (a malformed part, an
        unknown option, a bad value). ``from_url`` opens what this returns,
        and ``config check`` calls it alone (``cronwarden.stores.check_url``),
        so the two refuse the same URLs."""
        raise StoreUrlError(url, f"{cls.__name__} is not opened by URL")

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK) -> Self:
        """The store ``url`` names (read by ``parse_url``), connected."""
        raise StoreUrlError(url, f"{cls.__name__} is not opened by URL")

    # -- leases and runs ----------------------------------------------------

    @abc.abstractmethod
    def acquire(self, start: Start) -> Granted | Refused:
        """Try to start a run: take the lease on ``start.key`` for
        ``start.run_id``, judged by the store's clock, in one atomic step.

        1. If the lease's owner has expired and its run has no terminal
           record, record ``abandoned`` for that run and name it in
           ``abandoned``.
        2. If the lease is free or expired, grant it: expiry now +
           ``start.ttl``, a fencing token greater than every earlier grant of
           the key (exactly one greater while the store keeps its counter;
           Redis without persistence, finding its counter lost, jumps to the
           server's microsecond clock), no revocation; write the run and its
           ``started`` event.
        3. If another run holds it, act by ``start.policy``:

           - skip: record ``skipped`` naming the holder.
           - queue: if fewer than ``start.max_pending`` starts wait, add one
             and record ``queued``; otherwise record ``queue_full``.
           - replace: mark the lease revoked by ``start.run_id`` (the
             holder's next ``renew`` raises ``LeaseRevoked``, and the holder
             records ``replaced``); no event. The caller asks again until
             granted.
           - allow: record ``overlap`` naming both runs, and grant the run
             a side lease (``side_lease_key``) so it has a lease to renew.

        :return: ``Granted`` (for allow, with ``overlapped`` set), or
            ``Refused`` saying why, with the holder
        :raises StoreUnavailable: the store cannot be reached or is busy
            right now; nothing was written
        :raises StoreError: the store refused the start (e.g. its run id is
            already in the ledger) or is not usable
        """

    @abc.abstractmethod
    def renew(self, lease: Lease) -> None:
        """Extend the lease's expiry to now + ``lease.ttl`` by the store's
        clock, if and only if ``lease.run_id`` still owns it, it has not
        expired and no one revoked it.

        :raises LeaseRevoked: the run still owns the lease, but a start with
            policy replace asked it to stop
        :raises LeaseLost: the lease expired, or another run holds it
        :raises StoreUnavailable: the store cannot be reached or is busy
            right now; retry until the lease's deadline
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def renew_many(self, leases: Sequence[Lease]) -> list[LeaseLost | None]:
        """Renew every lease in ``leases`` as ``renew`` would, each judged on
        its own (owner, expiry, revocation, by the store's clock), all in one
        atomic step and one round trip: one heartbeat of a process renews
        every lease it holds that is due. The cost per lease is constant
        (each is found by its key), not a scan of the leases held. A lease
        the store refuses is lost; the others are renewed all the same.

        :return: one entry per lease, in order: None if it was renewed,
            otherwise what ``renew`` would have raised for it
            (``LeaseRevoked``, or ``LeaseLost``)
        :raises StoreUnavailable: the store cannot be reached or is busy
            right now; none of the leases may be counted as renewed (retry
            until each lease's deadline)
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def finish(self, lease: Lease, end: End, then: Start | None = None) -> Finished:
        """End a run, in one atomic step: record its terminal outcome unless
        it already has one (exactly one per start), and release the lease if
        and only if ``lease.run_id`` still owns it. A release by a run that
        no longer owns the lease changes nothing and never deletes another
        run's lease; the fencing counter stays. A side lease (policy allow)
        is deleted.

        If ``then`` is given, the lease is still owned and starts wait for
        it (policy queue): take one from the waiting count and, in the same
        step, start ``then`` on the same key with the next token. A retried
        call whose first try made that hand-over reports it again.

        :return: whether the lease was still owned, whether this call wrote
            the terminal record, and ``then``'s lease if it was started
        :raises StoreUnavailable: the store cannot be reached or is busy
            right now (the call may be retried: it records at most once)
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def request_stop(self, key: str, run_id: str, grace: float, request: Event) -> bool:
        """Ask the run ``run_id``, holding the lease on ``key``, to stop,
        on whatever host it runs, in one atomic step: if ``run_id`` owns the
        lease and it is live by the store's clock, mark it revoked with
        ``stop_mark(grace)`` and record ``request`` (its ``stop_requested``
        event, as ``record`` would). From then on the run's renewals raise
        ``StopRequested`` (``renew``, ``renew_many``), the way a replace's
        revocation raises ``LeaseRevoked``; its supervisor stops the command
        (SIGTERM, SIGKILL after the grace) and records ``stopped``.

        A lease already revoked by a replacing start keeps that mark (the run
        is stopping already: it records ``replaced``), and the request is
        refused. Asking again while a stop request stands records the new
        request and keeps the first mark.

        :return: whether the run was asked (False, and nothing written,
            when it does not own a live lease on ``key`` or is being replaced)
        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def record(self, event: Event) -> None:
        """Append ``event`` to the ledger, once per ``event_id``: recording
        again an event ``record`` wrote changes nothing and is no error, so a
        call retried after its reply was lost cannot write it twice (sinks
        deduplicate by the same id). On SQLite and PostgreSQL this holds for
        any id in the ledger; on Redis for the ids ``record`` wrote within a
        day (``RECORDED_IDS_KEPT``), far longer than any retry takes.

        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    # -- the read side --------------------------------------------------------
    # Reads return frozen records and never change the ledger.

    @abc.abstractmethod
    def open_runs(self, job: str | None = None) -> list[RunRecord]:
        """The runs with no terminal record (of ``job``, or of every job),
        oldest start first.

        Each has ``expires_in``: the seconds left on its lease by the store's
        clock when read, positive while live, zero or negative once expired
        (the run is then abandoned, whoever finds it records so); None if
        the run no longer owns its lease.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def runs(self, job: str, limit: int = 50) -> list[RunRecord]:
        """The job's latest ``limit`` runs, open or ended, newest start
        first (``expires_in`` is not read: None; ``open_runs`` has it).

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """

    def latest_runs(self, jobs: Sequence[str], limit: int) -> dict[str, list[RunRecord]]:
        """For each of ``jobs``, what ``runs(job, limit)`` returns, by job. A
        store with a round trip per read answers in one (the monitor reads
        the windows of the jobs whose rollup cannot say if they are
        failing). Here: one ``runs`` read per job.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """
        return {job: self.runs(job, limit) for job in jobs}

    @abc.abstractmethod
    def run(self, run_id: str) -> RunRecord | None:
        """One run's record (``expires_in`` None), or None if no run has
        that id.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def events(self, query: EventQuery) -> list[Event]:
        """Events of the ledger that match ``query`` (each with ``seq``
        set), ordered by ``at``: newest first unless
        ``query.newest_first`` is False, and events with the same ``at`` in
        the order they were written (ascending ``seq``) either way. At most
        ``query.limit`` of them, from the start of that order.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """

    def latest_events(
        self, jobs: Sequence[str], kinds: Sequence[EventKind], limit: int
    ) -> dict[str, list[Event]]:
        """For each of ``jobs``, what ``events(EventQuery(job=job,
        kinds=kinds, limit=limit))`` returns (newest first), by job. A store
        that can answers in one read: every pass of the monitor reads every
        job's finding states. Here: one ``events`` read per job.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """
        return {job: self.events(EventQuery(job=job, kinds=kinds, limit=limit)) for job in jobs}

    def latest_since(self, since: Mapping[str, float], kinds: Sequence[EventKind]) -> dict[str, Event]:
        """For each job of ``since``, its newest event of ``kinds`` at or
        after ``since[job]`` (the first of ``events(EventQuery(job=job,
        kinds=kinds, since=since[job], limit=1))``), by job; a job with none
        is left out. Each job's read is bounded by its own time, so a store
        can answer for every job in one read that grows with what is that
        recent, not with the ledger (the monitor asks whether a manual start
        is among the attempts a rollup keeps). Here: one ``events`` read per
        job.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """
        found = {}
        for job, at in since.items():
            newest = self.events(EventQuery(job=job, kinds=kinds, since=at, limit=1))
            if newest:
                found[job] = newest[0]
        return found

    @abc.abstractmethod
    def lease(self, key: str) -> LeaseInfo | None:
        """The lease on ``key`` as the store holds it now, or None if it was
        never granted (see ``LeaseInfo``).

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def save_job(self, job: JobInfo) -> None:
        """Save what is known of a job's schedule and policy, replacing what
        was saved under its name before.

        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def jobs(self) -> list[JobInfo]:
        """Every saved job, by name.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def ledger_jobs(self) -> list[str]:
        """The name of every job with a run or an event in the ledger,
        sorted, whether or not it was ever saved (``save_job``): a bare
        ``cronwarden run --job x`` is a job too. Not the ``sink:NAME`` names
        delivery events are recorded under. One indexed step per job, not a
        scan of the ledger.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def tally(self, job: str) -> Tally:
        """How many events of each kind the ledger holds for ``job``, and
        the durations of its completed runs (``succeeded``, ``failed``,
        ``timed_out``), in no particular order: what Prometheus counters are
        made of. They only grow while the ledger keeps everything; retention,
        and a Redis store's per-job cap, bound them.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """

    def job(self, name: str) -> JobInfo | None:
        """One job's saved settings, or None if it was never saved. Reads
        that job only: every scheduled ``cronwarden run`` asks for its own.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """
        # Each cronwarden store reads the one row; this serves any other.
        return next((j for j in self.jobs() if j.name == name), None)

    def pause_state(self, job: str) -> Event | None:
        """The ``job_paused`` event that holds now, or None when the job is
        not paused: of the job's ``job_paused`` and ``job_resumed`` events,
        the one written last decides (pausing and resuming are ``record`` of
        those events, so the who and why of each is in the ledger; retention
        keeps them). Written last by the ledger's order, ``seq``, among the
        newest few by time: a resume from a host whose clock is behind the
        pauser's still ends the pause. One indexed read of the job's two kinds.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """
        latest = self.events(EventQuery(job=job, kinds=PAUSE_KINDS, limit=PAUSE_READ))
        last = max(latest, key=lambda e: (e.seq or 0, e.at), default=None)
        return last if last is not None and last.kind is EventKind.JOB_PAUSED else None

    # -- rollups --------------------------------------------------------------

    def rollups(self) -> "dict[str, Rollup] | None":
        """Every job's rollup (``stores/rollup.py``), by job: kept in the
        same atomic step as each write it counts (a run's start and end, a
        refused or overlapping start), so it never disagrees with the
        ledger it summarises. A row marked ``stale`` predates part of its
        job's ledger and is not to be read until ``rebuild_rollups``.
        None: this store keeps no rollups (the monitor reads the ledger).

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """
        return None

    def rebuild_rollups(self, jobs: Sequence[str] | None = None) -> int:
        """Fold each job's ledger (``jobs``, or every job with a run or a
        refused start) into its rollup again, with ``stores.rollup.fold``,
        replacing the row. A job whose row changes while its ledger is read
        (a run ends meanwhile) is read again. Returns the jobs written; 0 on
        a store that keeps no rollups.

        :raises StoreUnavailable: the store cannot be reached right now
        :raises StoreError: the store is not usable
        """
        return 0

    # -- the outbox -----------------------------------------------------------
    # Each sink's outbox is the ledger minus what that sink has acknowledged:
    # no copy of the events, no separate queue. Delivery is at least once:
    # the caller delivers, then acknowledges; a crash in between delivers
    # again, so receivers deduplicate by ``event_id``.

    @abc.abstractmethod
    def undelivered(self, sink: str, limit: int, *, backfill: float = NEW_SINK_BACKFILL) -> list[Event]:
        """Up to ``limit`` events the sink has not acknowledged, across all
        jobs, oldest first (ascending ``seq``, each with ``seq`` set).

        The first call for a sink name registers it: its outbox starts just
        before the first event, in ledger order, whose ``at`` is within
        ``backfill`` seconds of now, so a new sink sees the run that is
        ending (``cronwarden run`` flushes after its terminal record) but not
        years of history. Later calls ignore ``backfill``; the registration
        is as durable as the ledger.

        Never misses an event that becomes visible *after* later events were
        acknowledged (PostgreSQL sequence values commit out of order): a
        store keeps per sink a mark below which everything is acknowledged,
        plus the acknowledged events above it, and moves the mark only over
        events that no transaction still in flight could precede.

        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def mark_delivered(self, sink: str, event_ids: Sequence[str]) -> None:
        """Acknowledge events for the sink: ``undelivered(sink, …)`` never
        returns them again. Idempotent and order-free: acknowledging twice,
        or a later event before an earlier one, is fine; ids not in the
        ledger are ignored. In the same step, moves the sink's mark over the
        acknowledged prefix and forgets the acknowledgements below it, so
        what is kept stays small.

        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    # -- dead letters -----------------------------------------------------------
    # An event a sink refused for good (an HTTP 4xx other than 401, 403, 407,
    # 408 and 429) is set aside, so the sink goes on with the rest: it leaves
    # the sink's outbox and joins the sink's dead letters, until a replay
    # (``cronwarden flush --retry-rejected``) delivers it. Dead letters are a
    # sink's seqs of ledger events, as acknowledgements are: no copy.

    @abc.abstractmethod
    def reject(self, sink: str, event_id: str, rejection: Event | None) -> None:
        """Set one event aside for the sink, in one step: acknowledge it (as
        ``mark_delivered``), keep it among the sink's dead letters, and
        record ``rejection`` (its ``sink_rejected`` event; None records
        nothing) as ``record`` does, once per event id. A sink keeps at most
        ``DEAD_LETTERS_KEPT`` dead letters: setting aside one more forgets the
        oldest (its ``sink_rejected`` event stays in the ledger). Idempotent;
        an ``event_id`` not in the ledger is ignored, and ``rejection`` is
        recorded all the same.

        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def rejected(self, sink: str, limit: int) -> list[Event]:
        """Up to ``limit`` of the sink's dead letters, oldest first (ascending
        ``seq``, each with ``seq`` set), as the ledger holds them; a dead
        letter whose event the ledger no longer holds is left out.

        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def forget_rejected(self, sink: str, event_ids: Sequence[str]) -> None:
        """Take events out of the sink's dead letters (a replay delivered
        them). Ids that are not among them are ignored. The events stay
        acknowledged: ``undelivered`` does not return them either.

        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def rejected_counts(self) -> dict[str, int]:
        """How many dead letters each sink keeps, for every sink that keeps
        any (a dead letter whose event retention removed still counts until
        it is forgotten or pushed out by newer ones).

        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    # -- the bare lock ----------------------------------------------------------
    # A fenced lease with no ledger, one round trip per call, for what must
    # not write a run per renewal (the scheduler's leader lease) and callers
    # that only need a fenced mutex. Locks live in their own namespace: a
    # lock named like a job's lease key is a different lease. Ownership,
    # fencing and the store's clock hold as for leases.

    @abc.abstractmethod
    def lock(self, key: str, owner: str, ttl: float) -> int | None:
        """If ``key`` is free, or expired by the store's clock, grant it to
        ``owner`` until now + ``ttl``. Not re-entrant: the owner asking again
        is refused like anyone else.

        :return: the fencing token (greater than every earlier grant of the
            key; the counter survives ``unlock``), or None when another
            grant is live, and nothing changed
        :raises StoreUnavailable: the store cannot be reached or is busy
            right now (if the reply was lost, asking again is refused until
            the ttl passes: a lost reply costs at most one ttl, never two
            holders)
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def renew_lock(self, key: str, owner: str, ttl: float) -> bool:
        """Extend the lock's expiry to now + ``ttl`` if and only if ``owner``
        holds it and it has not expired.

        :return: whether it did
        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def unlock(self, key: str, owner: str) -> bool:
        """Release the lock if and only if ``owner`` still holds it and it has
        not expired (a stale unlock, or one after the ttl even if nobody took
        the key since, changes nothing).

        :return: whether it did
        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    # -- the scheduler's slot claim -------------------------------------------

    @abc.abstractmethod
    def claim_slot(self, job: str, slot: float, owner: str, keep: float) -> str:
        """Claim the fire time ``slot`` (epoch seconds) of ``job`` for
        ``owner`` (a scheduler instance), atomically: the first caller for a
        ``(job, slot)`` gets it, and every caller, the first included, is
        answered with the owner of that first claim. The caller fires if and
        only if the answer is its own ``owner``, so a retry after a lost
        reply fires once.

        A claim is kept at least ``keep`` seconds after it was made and may
        be forgotten after: the caller must not claim a slot it could have
        claimed more than ``keep`` seconds earlier (the scheduler claims
        only within its misfire grace, far less). Writes nothing to the
        ledger: the run it fires does.

        :return: the owner of the slot's claim
        :raises StoreUnavailable: the store cannot be reached or is busy
            right now
        :raises StoreError: the store is not usable
        """

    # -- retention ----------------------------------------------------------

    @abc.abstractmethod
    def prune(self, retention: Retention, now: float, *, jobs: Sequence[str] | None = None,
              budget: int = PRUNE_BUDGET, dry_run: bool = False) -> Pruned:  # fmt: skip
        """Delete, oldest first, at most ``budget`` events that ``retention``
        no longer keeps as of wall-clock ``now``, with the finished runs
        whose ``started`` event they are: a bounded step (call again while
        ``done`` is False), so no call pays for a year at once.

        Never deleted, whatever their age: an open run and its events;
        events of the kinds not in ``AGE_OUT_FREELY`` (findings, operators'
        decisions), so an unresolved finding stays raised; any table but the runs, the events and each
        sink's dead letters and acknowledgments of the events deleted (the
        leases, fencing counters, jobs, marks, slot claims; and rows other
        tables keep, such as per-job rollups). Only ``jobs`` are looked at
        (None: every job in the ledger, delivery's ``sink:NAME`` included);
        each step reads the jobs' indexes, never a scan of the ledger.
        A sink that has not delivered an event before it ages out does not
        get it. With ``dry_run`` nothing is deleted and the counts are of
        everything due, not bounded by ``budget`` (on Redis, by each job's
        caps).

        Atomic per step: a step deletes its events and their runs together
        or not at all.

        :raises StoreUnavailable: the store cannot be reached or is busy
        :raises StoreError: the store is not usable
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store's connections. The store must not be used
        afterwards."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def abandon_expired(
    store: Store,
    runs: Sequence[RunRecord],
    at: float,
    found_by: str,
    why: str = "lease expired with no terminal record",
) -> list[str]:
    """Record ``abandoned`` for each open run among ``runs`` whose lease has
    expired, as the next start on its lease key would: for runs no start
    comes back to (policy allow's side leases, a shard not started again,
    report-only runs, any run when the monitor looks). ``finish`` compares
    the owner, so a lease another run took meanwhile is never released.
    Returns the runs closed."""
    done = []
    for r in runs:
        if r.outcome is not None or r.expires_in is None or r.expires_in > 0:
            continue
        lease = Lease(key=r.key, job=r.job, run_id=r.run_id, token=r.token, ttl=0.0)
        end = End(
            outcome=Outcome.ABANDONED,
            at=at,
            detail=f"{why}; found by {found_by}",
        )
        if store.finish(lease, end).recorded:
            done.append(r.run_id)
    return done


def holder_data(holder: Holder, now: float) -> dict[str, object]:
    """The holder fields every refusal event carries."""
    return {
        "holder_run_id": holder.run_id,
        "holder_host": holder.host,
        "holder_pid": holder.pid,
        "holder_started_at": holder.started_at,
        "holder_age": round(now - holder.started_at, 3),
        "holder_token": holder.token,
    }
