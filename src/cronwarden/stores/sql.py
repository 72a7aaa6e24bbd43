"""What the SQLite and PostgreSQL stores share: SQL kept in ``.sql`` files
(named queries, a schema, numbered migrations), and the read side written
once over both drivers.

A queries file is a sequence of sections, each opened by a header line::

    -- name: grant_free --
    -- What it does (comment lines are dropped from the statement).
    INSERT INTO leases … RETURNING token;

Lines before the first header are the file's own comments. A file is read
once per process, on the first store opened; filling in a schema or a
driver's placeholders is a string replacement per store.

Shared statements (``stores/queries.sql``) name their tables ``{s}.table``
and write parameters as ``%s``: each store gives the schema (``main`` on
SQLite, the quoted schema name on PostgreSQL) and its driver's placeholder,
and ``placeholders`` is the one place that converts them. The schema is in
every statement, never in session state (no ``SET search_path``), so each
statement means the same on any connection a pooler hands out.
"""

from __future__ import annotations

import abc
import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cronwarden.errors import StoreError
from cronwarden.events import Event, EventKind, JobInfo, Outcome, RunRecord
from cronwarden.stores.base import PRUNE_BUDGET, EventQuery, Pruned, Retention, Store, Tally, pruned_kinds_sql

if TYPE_CHECKING:
    from cronwarden.stores.rollup import Entry, Rollup

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = "-- name:"

_loaded: dict[str, dict[str, str]] = {}
"""Parsed queries files by path: each is read once per process."""


def read_sql(path: str) -> str:
    """The text of one of cronwarden's SQL files."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise StoreError(
            f"cannot read {path}: {e.strerror}; is cronwarden installed with its package data?"
        ) from None


def queries(path: str) -> dict[str, str]:
    """The named queries of the file at ``path``, by name. Parsed on the
    first call in a process; later calls return the same dict (callers
    must not change it)."""
    found = _loaded.get(path)
    if found is None:
        found = _loaded[path] = parse_queries(read_sql(path), path)
    return found


def parse_queries(text: str, where: str) -> dict[str, str]:
    """Named queries from a file's ``text`` (see the module docstring). Split
    with string methods: no regular expression to compile on the cron
    wrapper's path."""
    found: dict[str, str] = {}
    for section in ("\n" + text).split("\n" + HEADER)[1:]:
        header, _, body = section.partition("\n")
        header = header.strip()
        name = header[:-2].strip()
        if not header.endswith("--") or not name.isidentifier():
            raise StoreError(
                f"{where}: {HEADER}{header!r} does not name a query (expected -- name: some_name --)"
            )
        lines = [line for line in body.split("\n") if line and not line.lstrip().startswith("--")]
        statement = "\n".join(lines).strip().rstrip(";").rstrip()
        if not statement:
            raise StoreError(f"{where}: query {name!r} is empty")
        if name in found:
            raise StoreError(f"{where}: query {name!r} is defined twice")
        found[name] = statement
    return found


def migrations(directory: str) -> dict[int, str]:
    """The migration files in ``directory`` by version, lowest first.

    A file is ``NNNN_what_it_does.sql``; its number is its version. Numbers
    may have gaps (migrations written in parallel take numbers assigned in
    advance, and one may never land), but not repeats. A store at version
    ``v`` applies every file numbered above ``v`` in order; the schema's
    current version is the highest number."""
    found: dict[int, str] = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError as e:
        raise StoreError(
            f"cannot read {directory}: {e.strerror}; is cronwarden installed with its package data?"
        ) from None
    for name in names:
        if not name.endswith(".sql"):
            continue
        number, sep, _ = name.partition("_")
        if not sep or not number.isdigit():
            raise StoreError(f"{os.path.join(directory, name)}: expected a name like 0001_what_it_does.sql")
        version = int(number)
        if version in found:
            raise StoreError(
                f"{directory}: {os.path.basename(found[version])} and {name} share version {version}"
            )
        found[version] = os.path.join(directory, name)
    if not found:
        raise StoreError(f"{directory} holds no migrations; is cronwarden installed with its package data?")
    return dict(sorted(found.items()))


@functools.lru_cache(maxsize=256)
def _kinds_in(kinds: tuple[EventKind | str, ...]) -> str:
    """``kind IN ('a', 'b')``: the kinds as sorted literals (EventKind values
    are lowercase words: nothing to escape)."""
    listed = ", ".join(f"'{k}'" for k in sorted({EventKind(k).value for k in kinds}))
    return f"kind IN ({listed})"


def placeholders(sql: str, param: str) -> str:
    """``sql`` written with ``%s`` parameters, for a driver whose parameter
    is ``param`` (``?`` for sqlite3, ``%s`` for psycopg)."""
    if param == "%s":
        return sql
    return sql.replace("%%", "\0").replace("%s", param).replace("\0", "%")


# -- the read side ------------------------------------------------------------

RUN_COLUMNS = ("run_id", "job", "key", "host", "pid", "token", "slot", "started_at", "ended_at",
               "outcome", "exit_code", "detail")  # fmt: skip
"""The ``runs`` columns ``run_from_row`` reads, in this order (the order of
the table's columns too)."""
EVENT_COLUMNS = ("seq", "event_id", "kind", "job", "run_id", "at", "data")
"""The ``events`` columns ``event_from_row`` reads, in this order."""
JOB_COLUMNS = JobInfo._fields
"""The ``jobs`` columns, named and ordered as ``JobInfo``'s fields."""


def run_from_row(row: Sequence[Any], expires_in: float | None = None) -> RunRecord:
    """A run record from the ``runs`` columns in ``RUN_COLUMNS`` order."""
    run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome, exit_code, detail = row
    return RunRecord(
        run_id=run_id, job=job, key=key, host=host, pid=pid, token=token, slot=slot, started_at=started_at,
        ended_at=ended_at, outcome=None if outcome is None else Outcome(outcome), exit_code=exit_code,
        detail=detail, expires_in=expires_in,
    )  # fmt: skip


def event_from_row(row: Sequence[Any], data: Mapping[str, Any]) -> Event:
    """An event from the ``events`` columns in ``EVENT_COLUMNS`` order, with
    its ``data`` already decoded (JSON text on SQLite, jsonb on PostgreSQL)."""
    seq, event_id, kind, job, run_id, at, _ = row
    return Event(seq=seq, event_id=event_id, kind=EventKind(kind), job=job, run_id=run_id, at=at, data=data)


class SqlStore(Store):
    """The read side and ``save_job`` of the SQL stores, written once over
    the tables both schemas share (``runs``, ``events``, ``jobs``).

    A subclass calls ``_use_shared_queries`` with its schema and placeholder
    when it opens, and says how it runs a read, a write, and how its driver
    gives back an event's ``data``."""

    _shared: dict[str, str]
    _param: str
    _q: dict[str, str]
    """The store's own statements (its ``queries.sql``): ``latest_since``'s
    differs, each walking its own index of the events."""

    def _use_shared_queries(self, schema: str, param: str) -> None:
        self._param = param
        self._shared = {
            name: placeholders(sql.replace("{s}", schema), param)
            for name, sql in queries(os.path.join(HERE, "queries.sql")).items()
        }

    @abc.abstractmethod
    def _prune_step(self, job: str, bound: float, limit: int) -> tuple[int, int, int]:
        """One retention step in one transaction: ``job``'s oldest ``limit``
        events due before ``bound``, with the finished runs whose ``started``
        they are, the sinks' dead letters and acknowledgments of them.
        Returns (runs, events, events chosen).

        :raises StoreUnavailable: the store cannot be reached for now
        :raises StoreError: anything else the store refused
        """

    def prune(self, retention: Retention, now: float, *, jobs: Sequence[str] | None = None,
              budget: int = PRUNE_BUDGET, dry_run: bool = False) -> Pruned:  # fmt: skip
        if not retention.active:
            return Pruned()
        runs = events = 0
        left = budget
        for job, bound in self._bounds(retention, now, jobs):
            if dry_run:
                sql = self._shared["count_due"].replace("{pruned}", pruned_kinds_sql())
                [(e, r)] = self._fetch(sql, (job, bound))
                runs, events = runs + int(r), events + int(e)
                continue
            r, e, chosen = self._prune_step(job, bound, left)
            runs, events, left = runs + r, events + e, left - chosen
            if left <= 0:
                return Pruned(runs, events, done=False)
        return Pruned(runs, events)

    def _bounds(
        self, retention: Retention, now: float, jobs: Sequence[str] | None
    ) -> list[tuple[str, float]]:
        """Each job's retention bound: what started (or happened) before it
        is due. The later of the age's cutoff and the start of the oldest
        run ``keep_runs`` keeps."""
        if jobs is None:
            jobs = [str(row[0]) for row in self._fetch(self._shared["ledger_jobs"], ())]
        cutoff = None if retention.max_age is None else now - retention.max_age
        found = []
        for job in jobs:
            bound = cutoff
            if retention.keep_runs is not None:
                oldest_kept = self._fetch(self._shared["keep_runs_cutoff"], (job, retention.keep_runs - 1))
                if oldest_kept:
                    kept_from = float(oldest_kept[0][0])
                    bound = kept_from if bound is None else max(bound, kept_from)
            if bound is not None:
                found.append((job, bound))
        return found

    @abc.abstractmethod
    def _fetch(self, sql: str, args: Sequence[Any]) -> list[Any]:
        """Every row of one read-only statement.

        :raises StoreUnavailable: the store cannot be reached for now
        :raises StoreError: anything else the store refused
        """

    @abc.abstractmethod
    def _write(self, sql: str, args: Sequence[Any]) -> int:
        """One statement that writes, committed on its own (as in the
        ``Store`` methods it serves, one atomic step); the rows it changed.

        :raises StoreUnavailable: the store cannot be reached for now
        :raises StoreError: anything else the store refused
        """

    @abc.abstractmethod
    def _event_data(self, raw: Any) -> Mapping[str, Any]:
        """An event's ``data`` column as the driver returned it, decoded."""

    def _events_of(self, rows: list[Any]) -> list[Event]:
        return [event_from_row(row, self._event_data(row[6])) for row in rows]

    def runs(self, job: str, limit: int = 50) -> list[RunRecord]:
        return [run_from_row(row) for row in self._fetch(self._shared["runs"], (job, limit))]

    def run(self, run_id: str) -> RunRecord | None:
        rows = self._fetch(self._shared["run"], (run_id,))
        return run_from_row(rows[0]) if rows else None

    def events(self, query: EventQuery) -> list[Event]:
        return self._events_of(self._fetch(*self._events_sql(query)))

    def latest_events(
        self, jobs: Sequence[str], kinds: Sequence[EventKind], limit: int
    ) -> dict[str, list[Event]]:
        if not kinds:
            return super().latest_events(jobs, kinds, limit)
        found: dict[str, list[Event]] = {job: [] for job in jobs}
        sql = self._shared["latest_events"].replace("{kinds}", _kinds_in(tuple(kinds)))
        for e in self._events_of(self._fetch(sql, (limit,))):
            if e.job in found:
                found[e.job].append(e)
        return found

    def latest_since(self, since: Mapping[str, float], kinds: Sequence[EventKind]) -> dict[str, Event]:
        if not since or not kinds:
            return super().latest_since(since, kinds)
        sql = self._q["latest_since"].replace("{kinds}", _kinds_in(tuple(kinds)))
        return {e.job: e for e in self._events_of(self._fetch(sql, (json.dumps(dict(since)),)))}

    def _events_sql(self, query: EventQuery) -> tuple[str, list[Any]]:
        """The statement and arguments of ``events(query)``."""
        # The filters are AND-ed; each one is a column the indexes of
        # schema.sql lead with (job) or the ledger's own order (at, seq).
        where: list[str] = []
        args: list[Any] = []
        if query.job is not None:
            where.append("job = %s")
            args.append(query.job)
        if query.run_id is not None:
            where.append("run_id = %s")
            args.append(query.run_id)
        if query.kinds:
            # Literals, sorted, not parameters: a partial index on a set of
            # kinds (the monitor's findings, the dashboard's trouble) is used
            # only by a query whose kind list is the index's own, as written.
            where.append(_kinds_in(tuple(query.kinds)))
        if query.since is not None:
            where.append("at >= %s")
            args.append(query.since)
        sql = self._shared["events"]
        if where:
            sql += " WHERE " + placeholders(" AND ".join(where), self._param)
        # Ties in time keep the order they were written in, either way.
        sql += f" ORDER BY at {'DESC' if query.newest_first else 'ASC'}, seq LIMIT {self._param}"
        args.append(query.limit)
        return sql, args

    def save_job(self, job: JobInfo) -> None:
        self._write(self._shared["save_job"], tuple(job))

    def jobs(self) -> list[JobInfo]:
        return [JobInfo._make(row) for row in self._fetch(self._shared["jobs"], ())]

    def ledger_jobs(self) -> list[str]:
        # ":" cannot occur in a job name: those are delivery events' sink:NAME.
        return [row[0] for row in self._fetch(self._shared["ledger_jobs"], ()) if ":" not in row[0]]

    def tally(self, job: str) -> Tally:
        events = {kind: int(n) for kind, n in self._fetch(self._shared["tally_events"], (job,))}
        durations = tuple(float(d) for (d,) in self._fetch(self._shared["tally_durations"], (job,)))
        return Tally(events=events, durations=durations)

    def job(self, name: str) -> JobInfo | None:
        rows = self._fetch(self._shared["job"], (name,))
        return JobInfo._make(rows[0]) if rows else None

    def rejected(self, sink: str, limit: int) -> list[Event]:
        if limit < 1:
            return []
        return self._events_of(self._fetch(self._shared["rejected"], (sink, limit)))

    def rejected_counts(self) -> dict[str, int]:
        return {str(sink): int(n) for sink, n in self._fetch(self._shared["rejected_counts"], ())}

    @abc.abstractmethod
    def _save_rollup(self, rollup: Rollup, recent: list[Entry], seen: tuple[Any, ...] | None) -> bool:
        """Write a rebuilt rollup and its window's entries if the job's row
        is still what ``rollup_version`` read before the ledger was
        (``seen``; None: there was no row), in one transaction. False: it
        changed meanwhile."""

    def rollups(self) -> dict[str, Rollup] | None:
        from cronwarden.stores.rollup import from_rows

        return from_rows(sorted(self._fetch(self._shared["rollups"], ()), key=lambda row: str(row[0])))

    def rebuild_rollups(self, jobs: Sequence[str] | None = None) -> int:
        from cronwarden.stores.rollup import ROLLUP_EVENT_KINDS, fold

        names = [r[0] for r in self._fetch(self._shared["rollup_jobs"], ())] if jobs is None else jobs
        for job in names:
            for _ in range(REBUILD_TRIES):
                seen = self._fetch(self._shared["rollup_version"], (job,))
                runs = self.runs(job, 2**62)
                ended = sorted((r for r in runs if r.outcome is not None), key=_end_order)
                events = self.events(
                    EventQuery(job=job, kinds=ROLLUP_EVENT_KINDS, newest_first=False, limit=2**62)
                )
                rollup, recent = fold(job, runs, ended, events)
                if self._save_rollup(rollup, recent, tuple(seen[0]) if seen else None):
                    break
            else:
                raise StoreError(
                    f"the rollup of job {job!r} changed {REBUILD_TRIES} times while being rebuilt"
                )
        return len(names)


REBUILD_TRIES = 20


def _end_order(r: RunRecord) -> tuple[float, float, str]:
    """The order a rebuild folds ended runs in: the order they ended."""
    return (r.ended_at or 0.0, r.started_at, r.run_id)
