"""The read side: open runs, runs, one run, events with their filters, a
lease, and jobs. Reads return frozen records and never change the ledger."""

from __future__ import annotations

import pytest

from cronwarden.events import Event, EventKind, JobInfo, Outcome
from cronwarden.stores.base import EventQuery, Store

from . import LONG_TTL, assert_one_terminal_per_start, end, granted, ledger, start

T0 = 1_750_000_000.0


def test_open_runs_lists_unfinished_runs_oldest_first(store: Store) -> None:
    older = granted(store.acquire(start("backup", at=T0))).lease
    newer = granted(store.acquire(start("report", at=T0 + 60))).lease
    done = granted(store.acquire(start("vacuum", at=T0 + 30))).lease
    store.finish(done, end(at=T0 + 31))

    assert [r.run_id for r in store.open_runs()] == [older.run_id, newer.run_id]
    store.finish(older, end())
    assert [r.run_id for r in store.open_runs()] == [newer.run_id]
    store.finish(newer, end())
    assert store.open_runs() == []
    assert_one_terminal_per_start(store)


def test_open_runs_give_the_time_left_on_a_live_lease(store: Store) -> None:
    lease = granted(store.acquire(start(ttl=LONG_TTL))).lease

    [run] = store.open_runs()

    assert run.run_id == lease.run_id
    assert run.expires_in is not None and 0 < run.expires_in <= LONG_TTL
    assert (run.outcome, run.ended_at) == (None, None)
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_open_run_whose_lease_expired_shows_no_time_left(store: Store, lapse) -> None:
    lease = granted(store.acquire(start(ttl=lapse.ttl))).lease
    lapse.expire(store, lease)

    [run] = store.open_runs()

    assert run.run_id == lease.run_id
    assert run.expires_in is not None and run.expires_in <= 0
    store.finish(lease, end(Outcome.LEASE_LOST))
    assert_one_terminal_per_start(store)


def test_open_runs_filter_by_job(store: Store) -> None:
    backup = granted(store.acquire(start("backup"))).lease
    report = granted(store.acquire(start("report"))).lease

    assert [r.run_id for r in store.open_runs("backup")] == [backup.run_id]
    assert [r.run_id for r in store.open_runs("report")] == [report.run_id]
    assert store.open_runs("absent") == []
    store.finish(backup, end())
    store.finish(report, end())
    assert_one_terminal_per_start(store)


def test_runs_are_newest_first(store: Store) -> None:
    ids = []
    for i in range(5):
        lease = granted(store.acquire(start("backup", at=T0 + i))).lease
        store.finish(lease, end(at=T0 + i + 0.5))
        ids.append(lease.run_id)

    assert [r.run_id for r in store.runs("backup")] == ids[::-1]
    assert_one_terminal_per_start(store)


def test_runs_are_limited_to_the_newest(store: Store) -> None:
    ids = []
    for i in range(5):
        lease = granted(store.acquire(start("backup", at=T0 + i))).lease
        store.finish(lease, end(at=T0 + i + 0.5))
        ids.append(lease.run_id)

    assert [r.run_id for r in store.runs("backup", limit=2)] == [ids[4], ids[3]]
    assert_one_terminal_per_start(store)


def test_runs_are_only_the_jobs_own(store: Store) -> None:
    mine = granted(store.acquire(start("backup", at=T0))).lease
    store.finish(mine, end(at=T0 + 1))
    other = granted(store.acquire(start("report", at=T0 + 2))).lease
    store.finish(other, end(at=T0 + 3))

    assert [r.run_id for r in store.runs("backup")] == [mine.run_id]
    assert store.runs("absent") == []
    assert_one_terminal_per_start(store)


def test_run_returns_the_whole_record(store: Store) -> None:
    s = start("backup", key="backup:eu", host="db-7", pid=777, slot=T0, at=T0 + 2)
    lease = granted(store.acquire(s)).lease
    store.finish(lease, end(Outcome.FAILED, at=T0 + 12.5, exit_code=3, detail="disk full"))

    record = store.run(s.run_id)

    assert record is not None
    assert (record.run_id, record.job, record.key, record.host, record.pid, record.token) == (
        s.run_id,
        "backup",
        "backup:eu",
        "db-7",
        777,
        lease.token,
    )
    assert record.slot == pytest.approx(T0, abs=1e-3)
    assert record.started_at == pytest.approx(T0 + 2, abs=1e-3)
    assert record.ended_at == pytest.approx(T0 + 12.5, abs=1e-3)
    assert (record.outcome, record.exit_code, record.detail) == (Outcome.FAILED, 3, "disk full")
    assert record.duration == pytest.approx(10.5, abs=1e-3)
    assert_one_terminal_per_start(store)


def test_run_of_an_unknown_id_is_none(store: Store) -> None:
    assert store.run("00000000-0000-4000-8000-000000000000") is None


# -- events ------------------------------------------------------------------


def _event(kind: EventKind, job: str, at: float, run_id: str | None = None, **data: object) -> Event:
    return Event(kind=kind, job=job, at=at, run_id=run_id, data=data)


@pytest.fixture
def recorded(store: Store) -> list[Event]:
    """Six events, one second apart, over two jobs and two runs."""
    events = [
        _event(EventKind.MISSED, "backup", T0 + 0, slot=T0),
        _event(EventKind.SLOW, "backup", T0 + 1, "r-1", state="raised", p95=12.5),
        _event(EventKind.MISSED, "report", T0 + 2),
        _event(EventKind.STUCK, "backup", T0 + 3, "r-2", state="raised"),
        _event(EventKind.SLOW, "report", T0 + 4, "r-2", state="resolved"),
        _event(EventKind.MISSED, "backup", T0 + 5, nested={"a": [1, 2]}),
    ]
    for e in events:
        store.record(e)
    return events


def _ids(events: list[Event]) -> list[str]:
    return [e.event_id for e in events]


def test_recorded_event_reads_back_unchanged(store: Store) -> None:
    event = _event(EventKind.SLOW, "backup", T0, "r-1", state="raised", p95=12.5, nested={"a": [1, 2]})
    store.record(event)

    [back] = store.events(EventQuery())

    assert back.seq is not None
    assert back.at == pytest.approx(event.at, abs=1e-3)
    assert back._replace(seq=None, at=event.at) == event


def test_events_are_newest_first_by_default(store: Store, recorded: list[Event]) -> None:
    assert _ids(store.events(EventQuery())) == _ids(recorded[::-1])


def test_events_oldest_first_on_request(store: Store, recorded: list[Event]) -> None:
    assert _ids(store.events(EventQuery(newest_first=False))) == _ids(recorded)


def test_events_filter_by_job(store: Store, recorded: list[Event]) -> None:
    got = store.events(EventQuery(job="report", newest_first=False))

    assert _ids(got) == _ids([e for e in recorded if e.job == "report"])


def test_events_filter_by_kinds(store: Store, recorded: list[Event]) -> None:
    got = store.events(EventQuery(kinds=[EventKind.SLOW, EventKind.STUCK], newest_first=False))

    assert _ids(got) == _ids([e for e in recorded if e.kind in (EventKind.SLOW, EventKind.STUCK)])


def test_events_filter_by_run_id(store: Store, recorded: list[Event]) -> None:
    got = store.events(EventQuery(run_id="r-2", newest_first=False))

    assert _ids(got) == _ids([e for e in recorded if e.run_id == "r-2"])


def test_events_filter_by_since(store: Store, recorded: list[Event]) -> None:
    got = store.events(EventQuery(since=T0 + 2.5, newest_first=False))

    assert _ids(got) == _ids(recorded[3:])


def test_events_since_includes_an_event_at_exactly_since(store: Store, recorded: list[Event]) -> None:
    got = store.events(EventQuery(since=T0 + 3, newest_first=False))

    assert _ids(got) == _ids(recorded[3:])


def test_events_limit_keeps_the_newest(store: Store, recorded: list[Event]) -> None:
    assert _ids(store.events(EventQuery(limit=2))) == _ids([recorded[5], recorded[4]])


def test_events_limit_oldest_first_keeps_the_oldest(store: Store, recorded: list[Event]) -> None:
    assert _ids(store.events(EventQuery(limit=2, newest_first=False))) == _ids(recorded[:2])


def test_events_filters_combine(store: Store, recorded: list[Event]) -> None:
    got = store.events(EventQuery(job="backup", kinds=[EventKind.MISSED], since=T0 + 0.5))

    assert _ids(got) == [recorded[5].event_id]


def test_events_with_no_match_are_empty(store: Store, recorded: list[Event]) -> None:
    assert store.events(EventQuery(job="absent")) == []


# -- lease -------------------------------------------------------------------


def test_lease_of_an_unknown_key_is_none(store: Store) -> None:
    assert store.lease("never-acquired") is None


def test_lease_shows_the_live_holder(store: Store) -> None:
    lease = granted(store.acquire(start(ttl=LONG_TTL))).lease

    info = store.lease(lease.key)

    assert info is not None
    assert (info.key, info.owner, info.token, info.pending, info.revoked_by) == (
        lease.key,
        lease.run_id,
        lease.token,
        0,
        None,
    )
    assert info.expires_in is not None and 0 < info.expires_in <= LONG_TTL
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


# -- jobs --------------------------------------------------------------------


def test_saved_jobs_read_back_unchanged(store: Store) -> None:
    backup = JobInfo(
        name="backup",
        schedule="10 2 * * *",
        policy="skip",
        reason="two snapshots would double the bill",
        ttl=300.0,
        grace=60.0,
        max_runtime=3600.0,
        updated_at=T0,
    )
    report = JobInfo(name="report", period=600.0, policy="queue", updated_at=T0 + 1)

    store.save_job(report)
    store.save_job(backup)

    assert sorted(store.jobs(), key=lambda j: j.name) == [backup, report]


def test_saving_a_job_again_replaces_it(store: Store) -> None:
    store.save_job(JobInfo(name="backup", schedule="10 2 * * *", ttl=300.0, updated_at=T0))
    newer = JobInfo(name="backup", period=900.0, policy="replace", reason="latest wins", updated_at=T0 + 5)

    store.save_job(newer)

    assert store.jobs() == [newer]


def test_jobs_of_an_empty_store_are_empty(store: Store) -> None:
    assert store.jobs() == []


def test_one_job_reads_back_by_name_and_an_unknown_one_is_none(store: Store) -> None:
    backup = JobInfo(name="backup", schedule="10 2 * * *", ttl=300.0, grace=60.0, updated_at=T0)
    report = JobInfo(name="report", period=600.0, policy="queue", reason="a start is a batch", updated_at=T0)
    store.save_job(backup)
    store.save_job(report)

    assert store.job("report") == report
    assert store.job("backup") == backup
    assert store.job("back") is None  # a prefix is not a name
    store.save_job(report._replace(period=900.0, updated_at=T0 + 1))
    assert store.job("report") == report._replace(period=900.0, updated_at=T0 + 1)


def test_reads_do_not_change_the_ledger(store: Store, recorded: list[Event]) -> None:
    lease = granted(store.acquire(start("backup"))).lease
    before = ledger(store)

    store.open_runs()
    store.runs("backup")
    store.run(lease.run_id)
    store.lease(lease.key)
    store.jobs()
    store.job("backup")
    store.events(EventQuery(job="backup"))

    assert ledger(store) == before
    store.finish(lease, end())
    assert_one_terminal_per_start(store)


def test_ledger_jobs_names_every_job_with_runs_or_events_saved_or_not(store: Store) -> None:
    assert store.ledger_jobs() == []
    granted(store.acquire(start("zeta", at=T0)))
    store.finish(granted(store.acquire(start("alpha", at=T0 + 1))).lease, end(at=T0 + 2))
    store.record(Event(kind=EventKind.SNOOZED, job="mid", at=T0 + 3, data={"by": "ops"}))
    store.record(Event(kind=EventKind.SINK_FAILED, job="sink:hooks", at=T0 + 4, data={"sink": "hooks"}))
    store.save_job(JobInfo(name="described-only", updated_at=T0))

    assert store.ledger_jobs() == ["alpha", "mid", "zeta"]


def test_tally_counts_a_jobs_events_by_kind_and_its_completed_durations(store: Store) -> None:
    assert store.tally("backup") == ({}, ())
    for i, outcome in enumerate([Outcome.SUCCEEDED, Outcome.FAILED, Outcome.LEASE_LOST]):
        lease = granted(store.acquire(start("backup", at=T0 + 100 * i))).lease
        store.finish(lease, end(outcome=outcome, at=T0 + 100 * i + 10 + i))
    store.record(Event(kind=EventKind.SKIPPED, job="backup", at=T0 + 500, data={}))
    granted(store.acquire(start("other", at=T0)))

    t = store.tally("backup")

    assert dict(t.events) == {"started": 3, "succeeded": 1, "failed": 1, "lease_lost": 1, "skipped": 1}
    assert sorted(t.durations) == [10.0, 11.0]  # lease_lost was cut short: not a completed run


def test_latest_events_of_every_job_are_what_each_jobs_own_read_gives(store: Store) -> None:
    """``latest_events`` (the monitor's finding states, one read per pass)
    returns for each job what ``events(job=…, kinds, limit)`` does: the
    newest first, ties in time in the order written, at most ``limit``."""
    import random

    rng = random.Random(16)
    kinds = (EventKind.SLOW, EventKind.MISSED, EventKind.SNOOZED)
    for i in range(120):
        job = rng.choice(("backup", "report", "vacuum"))
        kind = rng.choice((*kinds, EventKind.SKIPPED))  # a kind not asked for, too
        at = T0 + rng.randrange(40)  # ties in time
        store.record(Event(kind=kind, job=job, at=at, data={"state": "raised", "i": i}))
    jobs = ["backup", "report", "vacuum", "never-ran"]
    for limit in (1, 7, 500):
        found = store.latest_events(jobs, kinds, limit)
        assert set(found) == set(jobs)
        for job in jobs:
            one = store.events(EventQuery(job=job, kinds=kinds, limit=limit))
            assert [e.data for e in found[job]] == [e.data for e in one], (job, limit)
        assert found["never-ran"] == []
        assert all(len(found[job]) <= limit for job in jobs)
    assert all(len(store.latest_events(jobs[:3], kinds, 1)[job]) == 1 for job in jobs[:3])


def test_latest_runs_of_many_jobs_are_what_each_jobs_own_read_gives(store: Store) -> None:
    """``latest_runs`` (the windows of the jobs whose rollup cannot say if
    they are failing, one read per pass) returns for each job what
    ``runs(job, limit)`` does: the newest start first, open runs too, at
    most ``limit``."""
    import random

    rng = random.Random(16)
    jobs = ["backup", "report", "vacuum"]
    for i in range(36):
        job = jobs[i % 3]
        g = granted(store.acquire(start(job, at=T0 + 10 * i + rng.random())))
        if i < 33:  # the last run of each job stays open
            outcome = rng.choice((Outcome.SUCCEEDED, Outcome.FAILED))
            store.finish(g.lease, end(outcome, at=T0 + 10 * i + 5, exit_code=int(outcome is Outcome.FAILED)))
    asked = ["vacuum", "never-ran", "backup"]
    for limit in (1, 5, 50):
        found = store.latest_runs(asked, limit)
        assert set(found) == set(asked) and found["never-ran"] == []
        for job in asked:
            assert found[job] == store.runs(job, limit), (job, limit)
        assert len(found["backup"]) == min(limit, 12) and found["backup"][0].outcome is None
    assert store.latest_runs([], 50) == {}


def test_latest_since_gives_each_jobs_newest_event_of_the_kinds_since_its_own_time(store: Store) -> None:
    """``latest_since`` (whether a manual start is among the attempts a
    rollup keeps, for every job in one read) returns for each job the first
    of ``events(job=…, kinds, since=its time, limit=1)``, and leaves out a
    job with none that recent."""
    import random

    rng = random.Random(16)
    kinds = (EventKind.TRIGGERED,)
    for i in range(90):
        job = rng.choice(("backup", "report", "vacuum"))
        kind = rng.choice((EventKind.TRIGGERED, EventKind.SKIPPED, EventKind.STARTED))
        store.record(Event(kind=kind, job=job, at=T0 + rng.randrange(60), data={"i": i}))  # ties in time
    for since in ({"backup": T0 + 30, "report": T0, "vacuum": T0 + 59, "never-ran": T0},
                  {"backup": T0 + 1000.0}, {}):  # fmt: skip
        found = store.latest_since(since, kinds)
        want = {
            job: store.events(EventQuery(job=job, kinds=kinds, since=at, limit=1))
            for job, at in since.items()
        }
        assert {job: e.data for job, e in found.items()} == {
            job: es[0].data for job, es in want.items() if es
        }
        assert all(e.kind is EventKind.TRIGGERED and e.at >= since[job] for job, e in found.items())
    assert set(store.latest_since({"backup": T0, "report": T0}, kinds)) == {"backup", "report"}


def test_latest_reads_of_hundreds_of_jobs_answer_for_each(store: Store) -> None:
    """``latest_events``, ``latest_since`` and ``latest_runs`` over more jobs
    than a store reads in one step (Redis: a script call per few hundred
    jobs) answer for every job, each with its own."""
    jobs = [f"job-{i:03d}" for i in range(300)]
    for i, job in enumerate(jobs):
        store.record(Event(kind=EventKind.TRIGGERED, job=job, at=T0 + i, data={"i": i}))
    found = store.latest_events(jobs, (EventKind.TRIGGERED,), 1)
    assert [found[job][0].data["i"] for job in jobs] == list(range(300))
    since = store.latest_since({job: T0 + 150 for job in jobs}, (EventKind.TRIGGERED,))
    assert sorted(since) == jobs[150:] and all(since[job].job == job for job in since)
    assert store.latest_runs(jobs, 5) == {job: [] for job in jobs}
