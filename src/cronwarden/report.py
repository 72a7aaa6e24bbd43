"""Report-only runs: for jobs cronwarden cannot wrap (a vendor's scheduler, a
Kubernetes CronJob you do not own), the job itself reports its start and its
end, and the ledger still sees durations and overlaps.

    reporter = Reporter(store)
    run_id = reporter.start("reconcile").run_id
    ...
    reporter.success("reconcile", run_id)

or ``cronwarden report start|success|fail --job NAME --run-id ID``.

Stored with the existing store contract, nothing new:

- a start is ``acquire`` of the key ``JOB+RUN_ID``: a lease of its own, the
  shape of a policy-allow side lease, so it is always granted, never refuses
  and never blocks a guarded run of the job; the store writes the run row
  and ``started`` in one step, as for a guarded run. The lease's ttl is how
  long the run may go without reporting its end before it is taken as
  abandoned (``--ttl``; default the job's max_runtime, else three periods,
  else a day).
- an end is ``finish`` of that lease: the terminal record, exactly one,
  with the duration; the side lease is deleted.
- after its own start is written, the reporter reads the job's open runs:
  any other open run of the same job (guarded or reported) means this start
  overlapped it, recorded as ``overlap`` naming both run ids. Reading after
  writing means that of two concurrent starts at least the later one sees
  the other. A report-only run whose lease expired is first recorded
  ``abandoned`` (as a guarded start does for the job's own key).

Nothing here holds a lease on the job's key, so a report-only run is never
refused: it is a record of what happened, not a guard.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.errors import StoreError, UsageError
from cronwarden.events import Event, EventKind, JobInfo, Outcome, RunRecord, new_id
from cronwarden.lease import Lease
from cronwarden.policy import Policy
from cronwarden.stores.base import End, Granted, Start, Store, abandon_expired, is_side_lease, side_lease_key

DEFAULT_TTL = 86400.0
"""A report-only run with no max_runtime and no known period may stay open a day."""


@dataclass(frozen=True, kw_only=True)
class Reported:
    """A reported start: its run id and the open runs it overlapped."""

    run_id: str
    overlapped: tuple[str, ...] = ()
    abandoned: tuple[str, ...] = ()
    already_started: bool = False


class Reporter:
    """Writes report-only runs to ``store`` (a ``Store`` the caller owns)."""

    def __init__(self, store: Store, *, clock: Clock = SYSTEM_CLOCK, host: str | None = None) -> None:
        from cronwarden.guard import this_host

        self.store = store
        self.clock = clock
        self.host = host or this_host()

    def _job(self, job: str) -> JobInfo | None:
        return self.store.job(job)

    def _ttl(self, info: JobInfo | None, now: float) -> tuple[float, float | None]:
        """(ttl, slot) from what the store knows of the job."""
        if info is None:
            return DEFAULT_TTL, None
        period: float | None = info.period
        slot: float | None = None
        if info.schedule:
            from cronwarden.monitor import parse_schedule

            try:
                sched = parse_schedule(info.schedule)
                period, slot = sched.period(now), sched.slot(now)
            except UsageError:
                pass
        if info.max_runtime:
            return info.max_runtime, slot
        return (3 * period if period else DEFAULT_TTL), slot

    def start(
        self, job: str, run_id: str | None = None, *, pid: int | None = None, ttl: float | None = None
    ) -> Reported:
        """Record that run ``run_id`` (a new UUID if None) of ``job`` started.
        Starting an already recorded run id again changes nothing."""
        from cronwarden.config.settings import check_name

        check_name(job, "job name")
        run_id = check_name(run_id, "run id") if run_id else new_id()
        if ttl is not None and not ttl > 0:
            raise UsageError(f"--ttl must be greater than zero, got {ttl:g}s")
        existing = self.store.run(run_id)
        if existing is not None:
            if existing.job != job:
                raise UsageError(f"run id {run_id} belongs to job {existing.job!r}, not {job!r}")
            return Reported(run_id=run_id, already_started=True)
        now = self.clock.wall()
        info = self._job(job)
        if info is None:  # so the monitor lists the job even between its runs
            self.store.save_job(JobInfo(name=job, updated_at=now))
        default_ttl, slot = self._ttl(info, now)
        try:
            result = self.store.acquire(
                Start(
                    job=job, key=side_lease_key(job, run_id), run_id=run_id, host=self.host,
                    pid=os.getppid() if pid is None else pid, ttl=ttl or default_ttl, at=now,
                    policy=Policy.ALLOW, slot=slot,
                )
            )  # fmt: skip
        except StoreError:
            # The same run id started by another call since the check above
            # (the store refuses a second run row): that start stands.
            raced = self.store.run(run_id)
            if raced is None or raced.job != job:
                raise
            return Reported(run_id=run_id, already_started=True)
        if not isinstance(result, Granted):  # a fresh key is always free; say so loudly if not
            raise UsageError(f"run id {run_id} of {job!r} could not be recorded: {result}")
        abandoned: list[str] = []
        others: list[RunRecord] = []
        me: RunRecord | None = None
        for r in self.store.open_runs(job):
            if r.run_id == run_id:
                me = r
            elif r.expires_in is not None and r.expires_in <= 0 and is_side_lease(r.key, r.run_id):
                # A report-only run that never reported its end: nobody else will
                # ever acquire its key, so its terminal record is written here.
                abandoned += abandon_expired(self.store, [r], now, f"run {run_id}",
                                             why="no end reported before its ttl")  # fmt: skip
            else:
                others.append(r)
        if me is not None:
            from cronwarden.monitor import partition

            others = [r for r in others if partition(r) == partition(me)]
        if others:
            holder = others[0]
            data: dict[str, Any] = {
                "holder_run_id": holder.run_id,
                "holder_host": holder.host,
                "holder_pid": holder.pid,
                "holder_started_at": holder.started_at,
                "holder_age": round(now - holder.started_at, 3),
                "holder_token": holder.token,
                "run_ids": [*(r.run_id for r in others), run_id],
                "host": self.host,
                "slot": slot,
                "reported": True,
            }
            self.store.record(Event(kind=EventKind.OVERLAP, job=job, run_id=run_id, at=now, data=data))
        return Reported(run_id=run_id, overlapped=tuple(r.run_id for r in others), abandoned=tuple(abandoned))

    def end(
        self, job: str, run_id: str, outcome: Outcome, *, exit_code: int | None = None, detail: str = ""
    ) -> bool:
        """Record how run ``run_id`` ended. False when it already had a
        terminal record (a retried report, or it was found abandoned)."""
        from cronwarden.config.settings import check_name

        check_name(job, "job name")
        check_name(run_id, "run id")
        run = self.store.run(run_id)
        if run is None:
            raise UsageError(
                f"no start recorded for run {run_id} of {job!r}; report the start first "
                f"(cronwarden report start --job {job} --run-id {run_id})"
            )
        if run.job != job:
            raise UsageError(f"run id {run_id} belongs to job {run.job!r}, not {job!r}")
        if run.key != side_lease_key(job, run_id):
            raise UsageError(f"run {run_id} of {job!r} is a guarded run; its wrapper records its end")
        lease = Lease(key=run.key, job=job, run_id=run_id, token=run.token, ttl=0.0)
        end = End(outcome=outcome, at=self.clock.wall(), exit_code=exit_code, detail=detail)
        return self.store.finish(lease, end).recorded

    def success(self, job: str, run_id: str, *, exit_code: int | None = 0) -> bool:
        return self.end(job, run_id, Outcome.SUCCEEDED, exit_code=exit_code)

    def fail(self, job: str, run_id: str, *, exit_code: int | None = None, detail: str = "") -> bool:
        if not detail and exit_code is not None:
            detail = f"exit status {exit_code}"
        return self.end(job, run_id, Outcome.FAILED, exit_code=exit_code, detail=detail)
