"""Operators' controls, through the store, so they hold on every host: pause
and resume a job, ask an open run to stop, start a job by hand.

- A pause is a ``job_paused`` event and a resume a ``job_resumed`` one
  (``Store.pause_state`` reads which holds), each with who and why. Every
  start that would serve a slot while the job is paused, the scheduler's
  and ``cronwarden run``'s, records the slot ``paused`` instead (one
  decision per slot: its event id is made from the job and the slot).
- A stop is ``Store.request_stop``: the run's lease is marked revoked, as
  policy replace marks it, so the heartbeat of the run sees it at its next
  renewal wherever it runs; its supervisor stops the command and records
  ``stopped`` naming who asked and why.
- A manual run (``cronwarden trigger``) is a start like any other, through
  the job's lease and policy, serving no slot; a ``triggered`` event with
  the same run id says who started it and why.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from cronwarden.errors import UsageError
from cronwarden.events import Event, EventKind, RunRecord
from cronwarden.stores.base import EventQuery, Store

DEFAULT_STOP_GRACE = 30.0
"""Seconds from a stop's SIGTERM to its SIGKILL (``cronwarden stop --grace``)."""


def operator() -> str:
    """Who is acting, as the ledger records it: ``user@host`` (the host
    from ``CRONWARDEN_HOST`` if set, as runs record theirs)."""
    import getpass

    from cronwarden.guard import this_host

    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container with an unnamed uid)
        user = f"uid{os.getuid()}"
    return f"{user}@{this_host()}"


def one_sentence(text: str, what: str) -> str:
    """``text`` stripped, if it is one non-empty line; else a usage error."""
    said = text.strip()
    if not said or "\n" in said:
        raise UsageError(f"{what} must be one sentence on one line saying why, got {text!r}")
    return said


def pause(store: Store, job: str, *, by: str, reason: str, at: float) -> Event:
    """Pause ``job`` from now on: its ``job_paused`` event, recorded."""
    event = Event(EventKind.JOB_PAUSED, job, at, data={"by": by, "reason": reason})
    store.record(event)
    return event


def resume(store: Store, job: str, *, by: str, reason: str, at: float) -> Event:
    """End ``job``'s pause: its ``job_resumed`` event, recorded."""
    event = Event(EventKind.JOB_RESUMED, job, at, data={"by": by, "reason": reason})
    store.record(event)
    return event


def paused_slot(job: str, slot: float | None, pause: Event, *, decided_by: str, at: float,
                event_id: str = "") -> Event:  # fmt: skip
    """The ``paused`` decision of a start that did not run because ``pause``
    holds: for ``slot`` (None for a start serving none), naming who paused
    the job and why. ``event_id``: the slot decision's (the scheduler's
    ``slot_event_id``), so that every instance records it once."""
    data = {"slot": slot, "by": pause.data.get("by", ""), "reason": pause.data.get("reason", ""),
            "paused_at": pause.at, "decided_by": decided_by}  # fmt: skip
    return Event(EventKind.PAUSED, job, at, data=data, event_id=event_id)


def describe_pause(pause: Event) -> str:
    """``paused by alice@web-1 at 2026-12-03T10:00:00Z: the reason``."""
    from cronwarden.monitor.views import when

    why = f": {pause.data['reason']}" if pause.data.get("reason") else ""
    return f"paused by {pause.data.get('by') or 'someone'} at {when(pause.at)}{why}"


def paused_item(job: str, pause: Event) -> dict[str, object]:
    """A paused job as ``status --json`` lists it: who paused it, why, since when."""
    return {"type": "paused", "job": job, "by": pause.data.get("by"), "reason": pause.data.get("reason"),
            "since": pause.at}  # fmt: skip


def paused_jobs(store: Store, jobs: Iterable[str]) -> dict[str, Event]:
    """Of ``jobs``, those paused now, with the ``job_paused`` event that holds."""
    out = {}
    for job in jobs:
        pause = store.pause_state(job)
        if pause is not None:
            out[job] = pause
    return out


def open_run(store: Store, target: str) -> RunRecord:
    """The open run ``target`` names: a run id, or a job with exactly one
    open run. A usage error (exit 2) says what was found otherwise."""
    runs = store.open_runs()
    by_id = [r for r in runs if r.run_id == target]
    if by_id:
        return by_id[0]
    of_job = [r for r in runs if r.job == target]
    if len(of_job) == 1:
        return of_job[0]
    if of_job:
        listed = ", ".join(f"{r.run_id} (host {r.host})" for r in of_job)
        raise UsageError(f"job {target} has {len(of_job)} open runs: {listed}; give the run id to stop")
    ended = store.run(target) if len(target) == 36 else None
    if ended is not None:
        raise UsageError(f"run {target} of job {ended.job} is not open (it ended {ended.outcome})")
    raise UsageError(f"no open run has the id or job name {target!r}; expected a run id or job name "
                     "from cronwarden status")  # fmt: skip


def request_stop(store: Store, run: RunRecord, *, by: str, reason: str, grace: float, at: float) -> bool:
    """Ask ``run`` to stop (``Store.request_stop``), recording who and why;
    whether it was asked (False: it ended or is being replaced meanwhile)."""
    data = {"by": by, "reason": reason, "grace": grace, "host": run.host, "pid": run.pid}
    event = Event(EventKind.STOP_REQUESTED, run.job, at, run_id=run.run_id, data=data)
    return store.request_stop(run.key, run.run_id, grace, event)


def stop_requests(store: Store, runs: Sequence[RunRecord]) -> Mapping[str, Event]:
    """The first stop request of each of ``runs`` that has one, by run id:
    one read of the ledger's stop requests since the oldest run started."""
    if not runs:
        return {}
    since = min(r.started_at for r in runs)
    wanted = {r.run_id for r in runs}
    query = EventQuery(kinds=(EventKind.STOP_REQUESTED,), since=since, limit=10_000, newest_first=False)
    out: dict[str, Event] = {}
    for e in store.events(query):
        if e.run_id in wanted and e.run_id not in out:
            out[e.run_id] = e
    return out


def triggered(job: str, run_id: str, *, by: str, reason: str, at: float) -> Event:
    """The ``triggered`` event of a manual start ``run_id``."""
    return Event(EventKind.TRIGGERED, job, at, run_id=run_id, data={"by": by, "reason": reason})
