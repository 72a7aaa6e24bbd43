"""The Redis store: leases, fencing and the ledger in one Redis database.

Every write is one Lua script, so each contract step is atomic and one round
trip: ``acquire`` (lease check, abandoned detection, fencing, ``started`` or
the refusal event, policy branch, retention), ``finish`` (terminal record,
release, the queued ``then`` start), ``renew`` (owner-checked ``PEXPIRE``),
``record``, the outbox's two, the bare lock's three and ``claim_slot``. The
scripts are the ``.lua`` files beside this module, one per step, built on
shared parts (``scripts.py`` says how) and called through redis-py's
``Script`` (``EVALSHA``, loaded again on ``NOSCRIPT``) on the client's
connection pool (``client.py``). Every key a script touches is passed in
``KEYS``. Key layout, retention and what is not guaranteed are in
``docs/stores/redis.md``.

A lease is two keys. ``lease:<key>`` is a hash that never expires: owner,
fencing token, pending count, revocation, and the open run's start (job,
host, pid, start time, slot), so a later start can still name and close an
owner whose lease ran out (recorded ``abandoned``, and named in the
refusal). ``live:<key>`` holds the owner's run id with ``PX``: while the
hash names an owner, the lease is live while this key exists (every grant
sets both in one script), so expiry is judged by the server's clock, never
a host's. A release removes the owner and leaves the live key to
expire: nothing reads it without an owner.

Fencing: a grant takes the stored token + 1 while the server process that
granted the previous token is still the one answering (its ``run_id`` is
stored with the token; the script reads the id of the process running it
with ``INFO server``, ``fence.lua``). Otherwise -- first grant of a key, a
restart that lost the data, a restore of an older snapshot, a failover to a
replica -- the token is ``max(stored + 1, server TIME in microseconds)``.
Every grant takes more than a microsecond of server time, so ``first TIME +
grants`` never overtakes the clock: tokens never go backwards unless the
server's clock steps back across the restart.

Sending a script twice. redis-py sends a call again on a connection error
(``client.py``), and a connection can break after the server ran the
script, so every script is safe to run again with the same arguments:
``acquire`` finds what its first try recorded under this call's event ids
(the ``started`` event, kept in the lease hash as ``sid`` too, or the
refusal), whatever happened to the lease since, and answers as the first
try did; ``finish`` finds the run record it wrote, or the run it handed over
to; ``record`` remembers event ids; ``renew``, ``renew_lock``,
``claim_slot`` and the outbox's are idempotent. A ``lock`` retried after its
first try answers "not granted" (the lock it took expires by its ttl); an
``unlock`` retried after its first try released answers "not held". Neither
grants a lock twice.

The ``clock`` given to the store is kept for the interface but never read for
expiry: only the server's clock decides.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from redis import exceptions as redis_errors

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.errors import LeaseLost, StoreError, StoreUnavailable, mask_password
from cronwarden.events import Event, EventKind, JobInfo, Outcome, RunRecord, new_id
from cronwarden.lease import Lease, margin
from cronwarden.policy import Policy
from cronwarden.stores.base import (
    DEAD_LETTERS_KEPT,
    KEEP_ALL,
    NEW_SINK_BACKFILL,
    PRUNE_BUDGET,
    End,
    EventQuery,
    Finished,
    Granted,
    Holder,
    LeaseInfo,
    Pruned,
    Refusal,
    Refused,
    Retention,
    Start,
    Store,
    Tally,
    is_side_lease,
    pruned_kinds,
    revocation,
    side_lease_key,
    stop_mark,
)

from .client import (
    DEFAULT_EVENTS_PER_JOB,
    DEFAULT_PREFIX,
    DEFAULT_RUNS_PER_JOB,
    DEFAULT_WAIT_TIMEOUT,
    Settings,
    own_client,
    renewer,
    where,
)
from .records import event, expires_in, finished_runs, ms, ordhex, ttl_ms, unordhex
from .scripts import Limits, Scripts

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline
    from redis.commands.core import Script

    from cronwarden.stores.rollup import Rollup

__all__ = [
    "DEFAULT_EVENTS_PER_JOB",
    "DEFAULT_PREFIX",
    "DEFAULT_RUNS_PER_JOB",
    "RECORDED_IDS_KEPT",
    "RedisStore",
]

SETTLE_SEQS = 4096
"""Seqs a retention step moves one sink's mark over at most: 16 reads of 256
fields, a few milliseconds of the server's time."""
RECORDED_IDS_KEPT = 86_400
"""Seconds ``record`` remembers an event id, so that a retried call is a
no-op (the contract): a day, far longer than any retry takes."""

NEWEST_KEYS = 256
"""Job indexes per call of ``newest.lua``: a call makes a few hundred reads,
a millisecond or so of the server's time, not a whole pass's thousands."""

_ATTEMPTS = ',"attempts":'
"""What a rollup's summary ends with, before its attempts and the closing brace."""

_LEASE_FIELDS = ("owner", "token", "job", "host", "pid", "started", "slot")


_packed = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
"""The texts a script decodes from its one argument (``cjson.decode``): one
argument costs the client far less to send than many (redis-py builds a
command argument by argument), and any text goes through as it is."""


class RedisStore(Store):
    """A store in one Redis database, every key under ``prefix``.

    ``client`` may be given (and is then not closed by ``close``); it must
    decode responses (``decode_responses=True``). The store talks to its
    server through a pool of its own with the store's retry settings
    (``client.own_client``), whatever ``client``'s are.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        runs_per_job: int = DEFAULT_RUNS_PER_JOB,
        events_per_job: int = DEFAULT_EVENTS_PER_JOB,
        clock: Clock = SYSTEM_CLOCK,
        url: str | None = None,
        owns_client: bool = False,
        retention: Retention = KEEP_ALL,
        wait_replicas: int = 0,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
    ) -> None:
        if runs_per_job < 1 or events_per_job < 1:
            raise ValueError("runs_per_job and events_per_job must be at least 1")
        # Ours from the URL, or the caller's server on a pool of our own:
        # either way the store's retries, and ``close`` closes it.
        self._client = client if owns_client else own_client(client)
        self._clock = clock  # kept for the interface; expiry is the server's
        kwargs = client.connection_pool.connection_kwargs
        self.address, bare_url = where(client)
        self.url = url or f"{bare_url}{'&' if '?' in bare_url else '?'}prefix={prefix}"
        if wait_replicas < 0 or wait_timeout <= 0:
            raise ValueError("wait_replicas must be at least 0 and wait_timeout greater than 0")
        self.wait_replicas = wait_replicas
        self.wait_timeout = wait_timeout
        self.prefix = prefix
        self.retention = retention
        self.runs_per_job = runs_per_job
        self.events_per_job = events_per_job
        self._timeout: float = kwargs.get("socket_timeout") or math.inf
        self._renewers: dict[float, redis.Redis] = {}
        self._renewers_lock = threading.Lock()
        p = prefix
        self._k_open, self._k_runs, self._k_ev, self._k_ev_run = p + "open", p + "runs", p + "ev", p + "ev:r"
        self._k_ledger_jobs, self._k_jobs = p + "jobs:ev", p + "jobs"
        self._k_job_counts = p + "jobs:n"
        self._k_sinks = p + "outbox:sinks"
        self._k_rollups = [p + "rollup", p + "rollup:d", p + "rollup:w"]
        self._scripts = Scripts(self._client, Limits.of(runs_per_job, events_per_job))

    @classmethod
    def parse_url(cls, url: str) -> Settings:
        return Settings.parse(url)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK) -> RedisStore:
        """A store on the client ``url`` describes (``client.Settings.parse``
        says what a URL may hold)."""
        settings = cls.parse_url(url)
        return cls(
            settings.client(),
            prefix=settings.prefix,
            runs_per_job=settings.runs_per_job,
            events_per_job=settings.events_per_job,
            clock=clock,
            url=mask_password(url),
            owns_client=True,
            retention=settings.retention,
            wait_replicas=settings.wait_replicas,
            wait_timeout=settings.wait_timeout,
        )

    # -- plumbing ---------------------------------------------------------

    def _error(self, e: redis_errors.RedisError) -> StoreError:
        """A redis-py error as the store's one-line error: unavailable when
        trying again later may work, an error otherwise."""
        text = (str(e).strip().splitlines() or [type(e).__name__])[0]
        where = f"Redis store {self.address}"
        refused = (
            redis_errors.AuthenticationError,
            redis_errors.AuthorizationError,
            redis_errors.AuthenticationWrongNumberOfArgsError,
            redis_errors.NoPermissionError,
        )
        if isinstance(e, refused):
            return StoreError(f"{where} refused our credentials or permissions: {text}")
        if isinstance(e, redis_errors.ConnectionError | redis_errors.TimeoutError):
            return StoreUnavailable(f"{where} is unreachable: {text}")
        if isinstance(
            e,
            redis_errors.ReadOnlyError
            | redis_errors.OutOfMemoryError
            | redis_errors.TryAgainError
            | redis_errors.ClusterDownError,
        ) or text.startswith(("BUSY", "LOADING", "MASTERDOWN")):
            return StoreUnavailable(f"{where} cannot serve writes right now: {text}")
        if "DB index" in text:
            return StoreError(f"{where} has no such database: {text}")
        return StoreError(f"{where}: {text}")

    def _call(
        self, script: Script, keys: list[str], args: list[str], client: redis.Redis | None = None
    ) -> Any:
        """Run ``script`` (one round trip; two more on ``NOSCRIPT``)."""
        try:
            return script(keys=keys, args=args, client=client)
        except redis_errors.RedisError as e:
            raise self._error(e) from None

    def _replicated(self, script: Script, keys: list[str], args: list[str]) -> Any:
        """Run ``script``, then ``WAIT`` for ``wait_replicas`` replicas to
        have its writes, both on one connection in one round trip (``WAIT``
        counts the writes of the connection it is sent on). Raises
        ``StoreUnavailable`` when fewer acknowledge within ``wait_timeout``:
        a grant only the master has would be lost by a failover now, and a
        second holder granted. What the script wrote stays (a grant expires
        by its ttl, and the next start records that run ``abandoned``)."""
        for attempt in range(2):
            try:
                pipe = self._client.pipeline(transaction=False)
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                pipe.wait(self.wait_replicas, max(1, round(self.wait_timeout * 1000)))
                reply, acked = pipe.execute(raise_on_error=False)
                if isinstance(reply, redis_errors.NoScriptError) and attempt == 0:
                    self._client.script_load(script.script)  # first use on this server; then once more
                    continue
            except redis_errors.RedisError as e:
                raise self._error(e) from None
            if isinstance(reply, redis_errors.RedisError):
                raise self._error(reply) from None
            if isinstance(acked, redis_errors.RedisError):
                raise self._error(acked) from None
            if int(acked) < self.wait_replicas:
                raise StoreUnavailable(
                    f"Redis store {self.address}: {acked} of {self.wait_replicas} replica(s) acknowledged "
                    f"the write within {self.wait_timeout:g}s (wait_replicas); not trusting it"
                )
            return reply
        raise AssertionError("unreachable: the second try returns or raises")

    def _renewer(self, ttl: float) -> redis.Redis:
        """A client whose calls give up within the belief margin (the part
        of the ttl the holder does not trust, ``lease.margin``): on a hung or
        paused server too, a renew returns within the margin (twice that on
        a connection broken mid-call, which is tried once more), so the
        heartbeat thread gets control back soon after its deadline. Safety
        does not wait for it: the supervisor and ``Run.check`` read the
        deadline themselves. One client per timeout, kept until ``close``."""
        timeout = round(max(0.01, min(margin(ttl), self._timeout)), 3)
        with self._renewers_lock:
            client = self._renewers.get(timeout)
            if client is None:
                client = self._renewers[timeout] = renewer(self._client, timeout)
            return client

    def _index(self, job: str) -> str:
        return f"{self.prefix}job:{job}"

    def _ledger_keys(self, key: str, job: str) -> list[str]:
        """The keys of ``acquire`` and ``finish`` (see their scripts)."""
        p = self.prefix
        return [f"{p}lease:{key}", f"{p}live:{key}", self._k_open, self._k_runs, self._index(job), self._k_ev,
                self._k_ev_run, self._k_job_counts, *self._k_rollups]  # fmt: skip

    @staticmethod
    def _start_fields(start: Start) -> list[str]:
        """A start's 11 fields, in the order ``read_start`` (ledger.lua) reads them."""
        at = float(start.at)
        return [
            start.run_id,
            start.job,
            start.key,
            start.host,
            str(int(start.pid)),
            str(ttl_ms(start.ttl)),
            repr(float(start.ttl)),
            repr(at),
            ordhex(at),
            "null" if start.slot is None else repr(float(start.slot)),
            new_id(),  # its `started` event
        ]

    # -- the contract -----------------------------------------------------

    def acquire(self, start: Start) -> Granted | Refused:
        p = self.prefix
        side = side_lease_key(start.key, start.run_id)
        keys = self._ledger_keys(start.key, start.job)
        if start.policy is Policy.ALLOW:  # the side lease: declared only when it may be touched
            keys += [f"{p}lease:{side}", f"{p}live:{side}"]
        fields = [*self._start_fields(start), start.policy.value, str(start.max_pending), new_id(), side]
        if self.wait_replicas:
            reply = self._replicated(self._scripts.acquire, keys, [_packed(fields)])
        else:
            reply = self._call(self._scripts.acquire, keys, [_packed(fields)])
        if reply[0] == "G":
            lease = Lease(
                key=start.key, job=start.job, run_id=start.run_id, token=int(reply[1]), ttl=start.ttl
            )
            return Granted(lease=lease, abandoned=(reply[2],) if reply[2] else ())
        holder = Holder(
            run_id=reply[2],
            host=reply[3],
            pid=int(reply[4]),
            started_at=float(reply[5]),
            token=int(reply[6]),
            expires_in=max(int(reply[7]), 0.5) / 1000,
        )
        if reply[0] == "O":
            lease = Lease(key=side, job=start.job, run_id=start.run_id, token=int(reply[1]), ttl=start.ttl)
            return Granted(lease=lease, overlapped=holder)
        return Refused(refusal=Refusal(reply[1]), holder=holder)

    def renew(self, lease: Lease) -> None:
        p = self.prefix
        keys = [f"{p}lease:{lease.key}", f"{p}live:{lease.key}"]
        args = [lease.run_id, str(ttl_ms(lease.ttl))]
        reply = self._call(self._scripts.renew, keys, args, self._renewer(lease.ttl))
        if reply[0] == "ok":
            return
        if reply[0] == "revoked":
            raise revocation(lease.key, reply[1])
        raise LeaseLost(lease.key, "expired or taken by another run")

    def renew_many(self, leases: Sequence[Lease]) -> list[LeaseLost | None]:
        if not leases:
            return []
        p = self.prefix
        keys: list[str] = []
        for lease in leases:
            keys += (f"{p}lease:{lease.key}", f"{p}live:{lease.key}")
        args = _packed([x.run_id for x in leases] + [ttl_ms(x.ttl) for x in leases])
        client = self._renewer(min(x.ttl for x in leases))
        reply = self._call(self._scripts.renew_many, keys, [args], client)
        states, revokers = reply[0], iter(reply[1:])
        out: list[LeaseLost | None] = []
        for lease, state in zip(leases, states, strict=True):
            if state == "1":
                out.append(None)
            elif state == "r":
                out.append(revocation(lease.key, next(revokers)))
            else:
                out.append(LeaseLost(lease.key, "expired or taken by another run"))
        return out

    def finish(self, lease: Lease, end: End, then: Start | None = None) -> Finished:
        keys = self._ledger_keys(lease.key, lease.job)
        if then is not None:
            keys.append(self._index(then.job))
        exit_code = "null" if end.exit_code is None else str(int(end.exit_code))
        detail = json.dumps(end.detail) if end.detail else '""'
        at = float(end.at)
        ending = (
            f'"outcome":"{end.outcome.value}","ended_at":{at!r},"exit_code":{exit_code},"detail":{detail}'
        )
        data = f'{{"exit_code":{exit_code},"token":{int(lease.token)}'
        if end.detail:
            data += f',"detail":{detail}'
        if end.replaced_by:
            data += f',"replaced_by":{json.dumps(end.replaced_by)}'
        if end.data:
            data += "," + json.dumps(dict(end.data), separators=(",", ":"))[1:-1]
        side = is_side_lease(lease.key, lease.run_id)
        kind = end.outcome.event.value
        fields = [lease.run_id, lease.job, lease.key, kind, ending, repr(at), ordhex(at), data, new_id(),
                  "1" if side else "0"]  # fmt: skip
        if then is not None:
            fields += self._start_fields(then)
        reply = self._call(self._scripts.finish, keys, [_packed(fields)])
        nxt = None
        if len(reply) > 2 and then is not None:
            nxt = Lease(key=then.key, job=then.job, run_id=then.run_id, token=int(reply[2]), ttl=then.ttl)
        return Finished(owned=reply[0] == 1, recorded=reply[1] == 1, next=nxt)

    def _record_fields(self, event: Event) -> list[str]:
        """``record.lua``'s argument fields for ``event`` (``reject.lua`` reads the same)."""
        at = float(event.at)
        return [
            event.event_id,
            EventKind(event.kind).value,
            event.job,
            event.run_id or "",
            repr(at),
            ordhex(at),
            json.dumps(dict(event.data), separators=(",", ":"), default=str),
            str(RECORDED_IDS_KEPT * 1000),
        ]

    def request_stop(self, key: str, run_id: str, grace: float, request: Event) -> bool:
        p = self.prefix
        keys = [f"{p}lease:{key}", f"{p}live:{key}", self._index(request.job), self._k_ev, self._k_ev_run,
                self._k_job_counts, self._k_runs, f"{p}eid:{request.event_id}", *self._k_rollups]  # fmt: skip
        args = [run_id, stop_mark(grace), _packed(self._record_fields(request))]
        return bool(self._call(self._scripts.request_stop, keys, args))

    def record(self, event: Event) -> None:
        fields = self._record_fields(event)
        keys = [self._index(event.job), self._k_ev, self._k_ev_run, self._k_job_counts, self._k_runs,
                f"{self.prefix}eid:{event.event_id}", *self._k_rollups]  # fmt: skip
        self._call(self._scripts.record, keys, [_packed(fields)])

    # -- the bare lock ----------------------------------------------------

    def _lock_key(self, key: str) -> str:
        return f"{self.prefix}lock:{key}"

    def lock(self, key: str, owner: str, ttl: float) -> int | None:
        keys = [self._lock_key(key), f"{self.prefix}lock-token:{key}"]
        reply = self._call(self._scripts.lock, keys, [owner, str(ttl_ms(ttl))])
        return None if reply is None else int(reply)

    def renew_lock(self, key: str, owner: str, ttl: float) -> bool:
        args = [owner, str(ttl_ms(ttl))]
        return bool(self._call(self._scripts.renew_lock, [self._lock_key(key)], args, self._renewer(ttl)))

    def unlock(self, key: str, owner: str) -> bool:
        return bool(self._call(self._scripts.unlock, [self._lock_key(key)], [owner]))

    # -- the scheduler's slot claim ---------------------------------------

    def claim_slot(self, job: str, slot: float, owner: str, keep: float) -> str:
        key = f"{self.prefix}slot:{job}:{float(slot)!r}"
        # Rounded up: the claim is kept at least ``keep``.
        keep_ms = max(1, math.ceil(keep * 1000))
        return str(self._call(self._scripts.claim_slot, [key], [owner, str(keep_ms)]))

    # -- the read side ----------------------------------------------------

    def _read(self, build: Callable[[Pipeline], object], *, atomic: bool = False) -> list[Any]:
        """Run the commands ``build`` queues in one round trip (in MULTI when
        ``atomic``, for readings that must agree with each other)."""
        try:
            pipe = self._client.pipeline(transaction=atomic)
            build(pipe)
            replies: list[Any] = pipe.execute()
        except redis_errors.RedisError as e:
            raise self._error(e) from None
        return replies

    def _open_records(self, opened: dict[str, str], *, timed: bool) -> list[RunRecord]:
        """Records of open runs (run id -> lease key) from their leases."""
        if not opened:
            return []
        p = self.prefix
        keys = sorted(set(opened.values()))

        def build(pipe: Pipeline) -> None:
            for key in keys:
                pipe.hmget(f"{p}lease:{key}", [*_LEASE_FIELDS, "exp"])
                pipe.get(f"{p}live:{key}")
                pipe.pttl(f"{p}live:{key}")
            pipe.time()

        replies = self._read(build, atomic=True)
        now_ms = ms(replies[-1])
        state = {key: replies[3 * i : 3 * i + 3] for i, key in enumerate(keys)}
        out = []
        for run_id, key in opened.items():
            fields, live, pttl = state[key]
            owner, token, job, host, pid, started, slot, exp = fields
            if owner != run_id or token is None:
                continue  # not open after all (changed between our reads)
            out.append(
                RunRecord(
                    run_id=run_id,
                    job=job,
                    key=key,
                    host=host,
                    pid=int(pid),
                    token=int(token),
                    slot=None if slot in (None, "null") else float(slot),
                    started_at=float(started),
                    expires_in=expires_in(run_id, owner, exp, live, pttl, now_ms) if timed else None,
                )
            )
        return out

    def open_runs(self, job: str | None = None) -> list[RunRecord]:
        [opened] = self._read(lambda pipe: pipe.hgetall(self._k_open))
        runs = [r for r in self._open_records(opened, timed=True) if job is None or r.job == job]
        runs.sort(key=lambda r: (r.started_at, r.run_id))
        return runs

    def _records(self, ids: list[str]) -> dict[str, RunRecord]:
        if not ids:
            return {}
        done, keys = self._read(lambda pipe: (pipe.hmget(self._k_runs, ids), pipe.hmget(self._k_open, ids)))
        out = finished_runs({rid: raw for rid, raw in zip(ids, done, strict=True) if raw is not None})
        opened = {rid: key for rid, key in zip(ids, keys, strict=True) if key is not None and rid not in out}
        out.update((r.run_id, r) for r in self._open_records(opened, timed=False))
        return out

    def runs(self, job: str, limit: int = 50) -> list[RunRecord]:
        if limit == 0:
            return []
        count = limit if limit > 0 else -1
        [members] = self._read(
            lambda pipe: pipe.zrevrangebylex(self._index(job), "(#}", "[#|", start=0, num=count)
        )
        ids = [m.split("|", 2)[2] for m in members]
        found = self._records(ids)
        return [found[rid] for rid in ids if rid in found]

    def latest_runs(self, jobs: Sequence[str], limit: int) -> dict[str, list[RunRecord]]:
        if limit == 0 or not jobs:
            return {job: [] for job in jobs}
        count = limit if limit > 0 else -1

        def build(pipe: Pipeline) -> None:
            for job in jobs:
                pipe.zrevrangebylex(self._index(job), "(#}", "[#|", start=0, num=count)

        listed = self._read(build)
        ids = {job: [m.split("|", 2)[2] for m in members] for job, members in zip(jobs, listed, strict=True)}
        found = self._records([rid for each in ids.values() for rid in each])
        return {job: [found[rid] for rid in each if rid in found] for job, each in ids.items()}

    def run(self, run_id: str) -> RunRecord | None:
        return self._records([run_id]).get(run_id)

    def events(self, query: EventQuery) -> list[Event]:
        if query.limit == 0:
            return []
        limit = query.limit if query.limit > 0 else 2**62
        kinds = sorted({EventKind(k).value for k in query.kinds}) if query.kinds else None
        if query.run_id is not None:
            return self._run_events(query.run_id, query, kinds, limit)
        jobs = [query.job] if query.job is not None else self._ledger_jobs()
        low = "" if query.since is None else ordhex(float(query.since))
        found = self._picks(
            {self._index(job): low for job in jobs}, kinds or ["@"], query.newest_first, limit
        )
        picks = [pick for each in found.values() for pick in each]
        if query.newest_first:
            picks.sort(key=lambda pick: (-pick[0], pick[1]))
        else:
            picks.sort()
        seqs = [seq for _, seq in picks[:limit]]
        if not seqs:
            return []
        [raw] = self._read(lambda pipe: pipe.hmget(self._k_ev, seqs))
        return [event(seq, rec) for seq, rec in zip(seqs, raw, strict=True) if rec is not None]

    # -- retention --------------------------------------------------------

    def prune(self, retention: Retention, now: float, *, jobs: Sequence[str] | None = None,
              budget: int = PRUNE_BUDGET, dry_run: bool = False) -> Pruned:  # fmt: skip
        if not retention.active:
            return Pruned()
        names = self._ledger_jobs() if jobs is None else list(jobs)
        if not names:
            return Pruned()
        cutoff = "" if retention.max_age is None else ordhex(now - retention.max_age)
        # One script per job (its keys declared), all in one round trip, the
        # step's budget shared among them; a dry run looks at everything,
        # which each job's caps bound.
        each = self.runs_per_job + self.events_per_job if dry_run else max(8, budget // len(names))
        pruned = "," + ",".join(pruned_kinds()) + ","
        args = [cutoff, str(retention.keep_runs or 0), str(each), pruned, "1" if dry_run else "0"]
        try:
            pipe = self._client.pipeline(transaction=False)
            for job in names:
                keys = [self._index(job), self._k_ev, self._k_ev_run, self._k_runs, self._k_open]
                self._scripts.prune(keys=keys, args=args, client=pipe)
            replies: list[Any] = pipe.execute()
        except redis_errors.RedisError as e:
            raise self._error(e) from None
        runs = sum(int(r[0]) for r in replies)
        events = sum(int(r[1]) for r in replies)
        settled = True
        if not dry_run:
            if events:
                self._forget_dead_letters_of_pruned()
            if jobs is None:  # a whole step (the monitor's, prune's), not a run's end
                settled = self._settle_outboxes()
        return Pruned(runs, events, done=settled and not any(int(r[2]) for r in replies))

    def _settle_outboxes(self) -> bool:
        """Each registered sink's mark moved over the deleted records above
        it (``settle.lua``), at most ``SETTLE_SEQS`` seqs per sink and step;
        True when no sink has more to pass."""
        sinks, dead = self._read(lambda pipe: (pipe.smembers(self._k_sinks),
                                               pipe.smembers(f"{self.prefix}outbox:rejected")))  # fmt: skip
        names = sorted({*sinks, *dead})
        if not names:
            return True
        seqs = str(SETTLE_SEQS)
        try:
            pipe = self._client.pipeline(transaction=False)
            for sink in names:
                self._scripts.settle(keys=self._outbox_keys(sink), args=[seqs], client=pipe)
            replies: list[Any] = pipe.execute()
        except redis_errors.RedisError as e:
            raise self._error(e) from None
        return not any(int(r[1]) for r in replies)

    def _forget_dead_letters_of_pruned(self) -> None:
        """Each sink's dead letters whose records retention deleted (at most
        DEAD_LETTERS_KEPT per sink to look at); a repeat is harmless."""
        [sinks] = self._read(lambda pipe: pipe.smembers(f"{self.prefix}outbox:rejected"))
        for sink in sorted(sinks):
            deadk = self._rejected_keys(sink)[0]
            [seqs] = self._read(functools.partial(_zrange, deadk, 0, -1))
            if not seqs:
                continue
            [raw] = self._read(functools.partial(_hmget, self._k_ev, seqs))
            gone = [seq for seq, rec in zip(seqs, raw, strict=True) if rec is None]
            if gone:
                self._read(functools.partial(_zrem, deadk, gone))

    def _ledger_jobs(self) -> list[str]:
        """Jobs with a ledger: the keys of the per-job counters, and the set
        that earlier versions of this store kept instead (read, no longer
        written, so that their jobs stay visible)."""
        counted, listed = self._read(
            lambda pipe: (pipe.hkeys(self._k_job_counts), pipe.smembers(self._k_ledger_jobs))
        )
        return sorted({*counted, *listed})

    def _run_events(self, run_id: str, query: EventQuery, kinds: list[str] | None, limit: int) -> list[Event]:
        # Members are ``run_id|seq``; a run id with "|" in it could match
        # another run's members, so records are checked below.
        # A run's first events and those its lease recorded are listed in the
        # field "r:<run id>" of the records hash; others in the run id index.
        members, linked = self._read(
            lambda pipe: (
                pipe.zrangebylex(self._k_ev_run, f"[{run_id}|", f"({run_id}}}"),
                pipe.hget(self._k_ev, f"r:{run_id}"),
            )
        )
        seqs = sorted({*(m.rpartition("|")[2] for m in members), *(linked.split(",") if linked else ())})
        if not seqs:
            return []
        [raw] = self._read(lambda pipe: pipe.hmget(self._k_ev, seqs))
        found = [
            e
            for e in (event(seq, rec) for seq, rec in zip(seqs, raw, strict=True) if rec is not None)
            if e.run_id == run_id
            and (query.job is None or e.job == query.job)
            and (kinds is None or e.kind.value in kinds)
            and (query.since is None or e.at >= query.since)
        ]
        sign = -1 if query.newest_first else 1
        found.sort(key=lambda e: (sign * e.at, e.seq or 0))
        return found[:limit]

    def _picks(
        self, lows: Mapping[str, str], families: list[str], newest_first: bool, limit: int
    ) -> dict[str, list[tuple[float, str]]]:
        """For each job index of ``lows`` (with the ordhex time its events
        start at, or ""), (at, seq) of the first ``limit`` events of each
        family (``@`` for all by time, or a kind), plus every event tied with
        the last one taken, so that ties can be ordered by seq as SQLite does
        (newest first is ``at`` descending, then ``seq`` ascending). Every
        index in the same two round trips."""
        ranges = [(index, family) for index in lows for family in families]

        def first(pipe: Pipeline) -> None:
            for index, family in ranges:
                low = lows[index]
                if newest_first:
                    pipe.zrevrangebylex(index, f"({family}}}", f"[{family}|{low}", start=0, num=limit)
                else:
                    pipe.zrangebylex(index, f"[{family}|{low}", f"({family}}}", start=0, num=limit)

        members: dict[str, list[str]] = {index: [] for index in lows}
        edges: list[tuple[str, str, str]] = []
        for (index, family), got in zip(ranges, self._read(first) if ranges else [], strict=True):
            members[index] += got
            if newest_first and len(got) == limit:
                edges.append((index, family, got[-1].split("|", 2)[1]))

        def ties(pipe: Pipeline) -> None:
            for index, family, hexat in edges:
                pipe.zrangebylex(index, f"[{family}|{hexat}|", f"({family}|{hexat}}}")

        if edges:
            for (index, _, _), got in zip(edges, self._read(ties), strict=True):
                members[index] += got
        return {index: _picked(got) for index, got in members.items()}

    def _newest_picks(
        self, lows: Mapping[str, str], families: list[str], limit: int
    ) -> dict[str, list[tuple[float, str]]]:
        """What ``_picks`` finds newest first, from ``newest.lua``: one
        script call per ``NEWEST_KEYS`` indexes, all in one round trip."""
        indexes = list(lows)
        kinds, count = ",".join(families), str(limit)

        def build(pipe: Pipeline) -> None:
            for i in range(0, len(indexes), NEWEST_KEYS):
                chunk = indexes[i : i + NEWEST_KEYS]
                self._scripts.newest(keys=chunk, args=[kinds, count, *(lows[k] for k in chunk)], client=pipe)

        replies = self._read(build) if indexes else []
        got = [each for reply in replies for each in reply]
        return {index: _picked(members) for index, members in zip(indexes, got, strict=True)}

    def _newest_each(
        self, lows: Mapping[str, str], kinds: Sequence[EventKind], limit: int
    ) -> dict[str, list[Event]]:
        """Each job's newest ``limit`` events of ``kinds`` from its own time
        (``lows``: job to an ordhex time, or ""), in two round trips for
        every job together, ordered as ``events`` orders them."""
        families = sorted({EventKind(k).value for k in kinds})
        job_of = {self._index(job): job for job in lows}
        found = self._newest_picks({index: lows[job] for index, job in job_of.items()}, families, limit)
        chosen: dict[str, list[str]] = {}
        for index, picks in found.items():
            picks.sort(key=lambda pick: (-pick[0], pick[1]))
            chosen[job_of[index]] = [seq for _, seq in picks[:limit]]
        seqs = [seq for each in chosen.values() for seq in each]
        [raw] = self._read(lambda pipe: pipe.hmget(self._k_ev, seqs)) if seqs else [[]]
        recs = dict(zip(seqs, raw, strict=True))
        return {
            job: [event(seq, recs[seq]) for seq in each if recs[seq] is not None]
            for job, each in chosen.items()
        }

    def latest_events(
        self, jobs: Sequence[str], kinds: Sequence[EventKind], limit: int
    ) -> dict[str, list[Event]]:
        if not kinds or limit == 0:
            return super().latest_events(jobs, kinds, limit)
        return self._newest_each(dict.fromkeys(jobs, ""), kinds, limit if limit > 0 else 2**62)

    def latest_since(self, since: Mapping[str, float], kinds: Sequence[EventKind]) -> dict[str, Event]:
        if not kinds:
            return super().latest_since(since, kinds)
        found = self._newest_each({job: ordhex(float(at)) for job, at in since.items()}, kinds, 1)
        return {job: each[0] for job, each in found.items() if each}

    def lease(self, key: str) -> LeaseInfo | None:
        p = self.prefix

        def build(pipe: Pipeline) -> None:
            pipe.hmget(f"{p}lease:{key}", ["owner", "token", "pending", "revoked_by", "exp"])
            pipe.get(f"{p}live:{key}")
            pipe.pttl(f"{p}live:{key}")
            pipe.time()

        (owner, token, pending, revoked_by, exp), live, pttl, now = self._read(build, atomic=True)
        if token is None:
            return None
        return LeaseInfo(
            key=key,
            owner=owner,
            token=int(token),
            expires_in=None if owner is None else expires_in(owner, owner, exp, live, pttl, ms(now)),
            pending=int(pending or 0),
            revoked_by=revoked_by or None,  # '' is "not revoked"
        )

    def save_job(self, job: JobInfo) -> None:
        record = json.dumps(job._asdict(), separators=(",", ":"))
        self._read(lambda pipe: pipe.hset(self._k_jobs, job.name, record))

    def jobs(self) -> list[JobInfo]:
        [raw] = self._read(lambda pipe: pipe.hgetall(self._k_jobs))
        names = sorted(raw)
        # One json.loads for every record: at thousands of jobs, a call per job costs more than the parsing.
        return [JobInfo(**fields) for fields in json.loads("[" + ",".join(raw[name] for name in names) + "]")]

    def ledger_jobs(self) -> list[str]:
        # Every job with a run has events (its start), so the ledger's jobs are the event jobs;
        # ":" cannot occur in a job name: those are delivery events' sink:NAME.
        return [job for job in self._ledger_jobs() if ":" not in job]

    _COMPLETED = frozenset({Outcome.SUCCEEDED, Outcome.FAILED, Outcome.TIMED_OUT})

    def tally(self, job: str) -> Tally:
        # Each event is listed in its job's index under its kind ("kind|at|seq"): one count per kind.
        kinds = [k.value for k in EventKind]
        index = self._index(job)
        counts = self._read(lambda pipe: [pipe.zlexcount(index, f"[{k}|", f"({k}}}") for k in kinds])
        durations = tuple(
            r.duration
            for r in self.runs(job, self.runs_per_job)
            if r.outcome in self._COMPLETED and r.duration is not None
        )
        return Tally(events={k: int(n) for k, n in zip(kinds, counts, strict=True) if n}, durations=durations)

    def job(self, name: str) -> JobInfo | None:
        [raw] = self._read(lambda pipe: pipe.hget(self._k_jobs, name))
        return None if raw is None else JobInfo(**json.loads(raw))

    # -- rollups -----------------------------------------------------------

    def rollups(self) -> dict[str, Rollup] | None:
        from cronwarden.stores.rollup import Rollup

        summaries, durations = self._read(
            lambda pipe: (pipe.hgetall(self._k_rollups[0]), pipe.hgetall(self._k_rollups[1]))
        )
        jobs = sorted(summaries)
        # A summary ends with its attempts (rollup.lua, summary_json): kept as their text, as
        # Rollup has them; the rest of every summary decoded in one json.loads.
        heads, attempts = [], []
        for job in jobs:
            head, mark, tail = summaries[job].rpartition(_ATTEMPTS)
            heads.append(head + "}" if mark else summaries[job])
            attempts.append(tail[:-1] if mark else "[]")
        out = {}
        for job, fields, listed in zip(jobs, json.loads("[" + ",".join(heads) + "]"), attempts, strict=True):
            fields["skip_times"] = tuple(fields["skip_times"])
            fields["attempts"] = listed
            out[job] = Rollup(job=job, w_durations=durations.get(job, "[]"), **fields)
        return out

    def _rollup_seen(self, job: str) -> str | None:
        [seen] = self._read(lambda pipe: pipe.hget(self._k_rollups[0], job))
        return None if seen is None else str(seen)

    def rebuild_rollups(self, jobs: Sequence[str] | None = None) -> int:
        from cronwarden.stores.rollup import ROLLUP_EVENT_KINDS, fold, summary_json

        if jobs is None:
            [known] = self._read(lambda pipe: pipe.hkeys(self._k_rollups[0]))
            jobs = sorted(set(known) | set(self._ledger_jobs()))
        for job in jobs:
            for _ in range(20):
                seen = self._rollup_seen(job)
                runs = self.runs(job, 2**62)
                ended = sorted((r for r in runs if r.outcome is not None),
                               key=lambda r: (r.ended_at or 0.0, r.started_at, r.run_id))  # fmt: skip
                events = self.events(
                    EventQuery(job=job, kinds=ROLLUP_EVENT_KINDS, newest_first=False, limit=2**62)
                )
                rollup, recent = fold(job, runs, ended, events)
                window = json.dumps([list(e) for e in recent])
                args = [job, seen or "", summary_json(rollup), rollup.w_durations, window]
                if self._call(self._scripts.save_rollup, self._k_rollups, args):
                    break
            else:
                raise StoreError(f"the rollup of job {job!r} changed 20 times while being rebuilt")
        return len(jobs)

    # -- the outbox -------------------------------------------------------

    def _outbox_keys(self, sink: str) -> list[str]:
        return [self._k_ev, f"{self.prefix}outbox:{sink}:mark", f"{self.prefix}outbox:{sink}:acks"]

    def undelivered(self, sink: str, limit: int, *, backfill: float = NEW_SINK_BACKFILL) -> list[Event]:
        if limit < 1:
            return []
        keys = [*self._outbox_keys(sink), self._k_sinks]
        reply = self._call(self._scripts.undelivered, keys, [str(limit), sink])
        if reply is None:
            self._register(sink, backfill)
            reply = self._call(self._scripts.undelivered, keys, [str(limit), sink])
        return [event(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]

    def mark_delivered(self, sink: str, event_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(event_ids))
        if not ids:
            return
        keys = self._outbox_keys(sink)
        if self._call(self._scripts.mark_delivered, keys, ids) is None:
            self._register(sink, NEW_SINK_BACKFILL)
            self._call(self._scripts.mark_delivered, keys, ids)

    def _rejected_keys(self, sink: str) -> list[str]:
        """The sink's dead letters (a zset of seqs, score = seq) and the set of
        sinks that have any."""
        return [f"{self.prefix}outbox:{sink}:rejected", f"{self.prefix}outbox:rejected"]

    def reject(self, sink: str, event_id: str, rejection: Event | None) -> None:
        keys = [*self._outbox_keys(sink), *self._rejected_keys(sink)]
        packed = ""
        if rejection is not None:
            packed = _packed(self._record_fields(rejection))
            keys += [self._index(rejection.job), self._k_ev_run, self._k_job_counts, self._k_runs,
                     f"{self.prefix}eid:{rejection.event_id}"]  # fmt: skip
        args = [sink, event_id, str(DEAD_LETTERS_KEPT), packed]
        if self._call(self._scripts.reject, keys, args) is None:
            self._register(sink, NEW_SINK_BACKFILL)
            self._call(self._scripts.reject, keys, args)

    def rejected(self, sink: str, limit: int) -> list[Event]:
        deadk = self._rejected_keys(sink)[0]
        out: list[Event] = []
        chunk = max(limit, 64)
        for start in itertools.count(0, chunk):
            [seqs] = self._read(functools.partial(_zrange, deadk, start, start + chunk - 1))
            if not seqs or len(out) >= limit:
                break
            [raw] = self._read(functools.partial(_hmget, self._k_ev, seqs))
            # A record retention trimmed reads as None and is left out.
            out += [event(seq, rec) for seq, rec in zip(seqs, raw, strict=True) if rec is not None]
        return out[:limit]

    def forget_rejected(self, sink: str, event_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(event_ids))
        if ids:
            self._call(self._scripts.forget_rejected, [self._k_ev, *self._rejected_keys(sink)], [sink, *ids])

    def rejected_counts(self) -> dict[str, int]:
        [sinks] = self._read(lambda pipe: pipe.smembers(f"{self.prefix}outbox:rejected"))
        names = sorted(sinks)
        counts = self._read(lambda pipe: [pipe.zcard(self._rejected_keys(name)[0]) for name in names])
        return {name: int(n) for name, n in zip(names, counts, strict=True) if n}

    def _register(self, sink: str, backfill: float) -> None:
        """A new sink's mark: just before the first event, in seq order, whose
        ``at`` is within ``backfill`` of now (the counter if none). Reads the
        events of that window once, per sink name; ``SET NX`` keeps the first
        registration if two race."""
        cutoff = ordhex(self._clock.wall() - backfill)
        jobs = self._ledger_jobs()
        [top] = self._read(lambda pipe: pipe.hget(self._k_ev, "seq"))
        indexes = [self._index(job) for job in jobs]
        found = self._read(lambda pipe: [pipe.zrangebylex(i, f"[@|{cutoff}", "(@}") for i in indexes])
        seqs = [int(m.split("|", 3)[2]) for members in found for m in members]
        mark = min(seqs) - 1 if seqs else int(top or 0)
        self._read(lambda pipe: (pipe.set(self._outbox_keys(sink)[1], str(mark), nx=True),
                                 pipe.sadd(self._k_sinks, sink)))  # fmt: skip

    def close(self) -> None:
        with self._renewers_lock:
            for client in self._renewers.values():
                client.connection_pool.disconnect()
            self._renewers.clear()
        self._client.close()
        self._client.connection_pool.disconnect()


def _picked(members: Sequence[str]) -> list[tuple[float, str]]:
    """(at, seq) of index members (``kind|at|seq``), each seq once."""
    picks: dict[str, tuple[float, str]] = {}
    for member in members:
        _, hexat, seq = member.split("|", 3)[:3]
        picks[seq] = (unordhex(hexat), seq)
    return list(picks.values())


def _zrange(key: str, start: int, stop: int, pipe: Pipeline) -> None:
    pipe.zrange(key, start, stop)


def _hmget(key: str, fields: list[str], pipe: Pipeline) -> None:
    pipe.hmget(key, fields)


def _zrem(key: str, members: list[str], pipe: Pipeline) -> None:
    pipe.zrem(key, *members)
