"""The dashboard's front page on every store: each job's strip of its last
slots agrees with the ledger and with its verdict, the filters narrow the
list through plain query parameters (no JavaScript), and the jobs come a
page at a time."""

from __future__ import annotations

import re

import pytest

from conftest import POSTGRES_URL
from cronwarden.clock import Clock, FakeClock
from cronwarden.events import EventKind
from cronwarden.monitor import Monitor
from cronwarden.stores.base import EventQuery, Store
from cronwarden.web import Dashboard
from fleet import ADHOC, BACKUP, EXPORT, MISSED, PLAINFAIL, SLOTS, STEADY, fleet

ALL = sorted((BACKUP, PLAINFAIL, EXPORT, ADHOC, *STEADY))


@pytest.fixture
def mclock(clock: Clock) -> FakeClock:
    from monitor_history import history_clock

    return history_clock(clock)


@pytest.fixture
def dashboard(store: Store, mclock: FakeClock) -> Dashboard:
    fleet(store, mclock)
    return Dashboard(Monitor(store, clock=mclock), refresh=0)


def front(dashboard: Dashboard, target: str = "/", status: int = 200) -> str:
    response = dashboard.handle("GET", target)
    assert response.status == status, response.body[:300]
    return response.body.decode()


def rows(text: str) -> dict[str, str]:
    """The jobs table's rows by job."""
    jobs = text[text.index("<h2>Jobs</h2>") : text.index("<h2>Findings</h2>")]
    found = re.findall(r'<tr><td><a href="/jobs/([^"]+)">[^<]*</a></td>(.*?)</tr>', jobs)
    return dict(found)


def cells(row: str) -> list[str]:
    strip = re.search(r'<span class="strip"[^>]*>(.*?)</span>', row)
    assert strip, row
    return re.findall(r'<i class="(\w+)"', strip.group(1))


def test_each_job_has_a_strip_of_its_last_slots_as_the_ledger_has_them(dashboard: Dashboard) -> None:
    by_job = rows(front(dashboard))
    assert sorted(by_job) == ALL
    backup = cells(by_job[BACKUP])
    assert len(backup) == SLOTS
    assert [i for i, c in enumerate(backup) if c != "ok"] == list(MISSED)
    assert {backup[i] for i in MISSED} == {"missed"}
    plainfail = cells(by_job[PLAINFAIL])
    assert [i for i, c in enumerate(plainfail) if c == "bad"] == [3, 7, SLOTS - 2, SLOTS - 1]
    assert cells(by_job[EXPORT])[-2:] == ["run", "skipped"]
    assert cells(by_job[STEADY[0]]) == ["ok"] * SLOTS
    # No schedule: its last runs, as many as the strip holds.
    assert cells(by_job[ADHOC]) == ["ok"] * SLOTS
    assert 'title="' in by_job[BACKUP] and "missed" in by_job[BACKUP]


def test_a_failing_job_is_marked_failing_not_ok(dashboard: Dashboard) -> None:
    by_job = rows(front(dashboard))
    assert 'class="badge failing">failing<' in by_job[PLAINFAIL]
    assert cells(by_job[PLAINFAIL])[-1] == "bad"
    assert 'class="badge ok">ok<' in by_job[STEADY[0]]
    assert 'class="badge unscheduled">unscheduled<' in by_job[ADHOC]


def test_filters_narrow_the_list_by_verdict_and_text(dashboard: Dashboard) -> None:
    assert sorted(rows(front(dashboard, "/?verdict=failing"))) == [PLAINFAIL]
    assert sorted(rows(front(dashboard, "/?q=REPORT-"))) == sorted(STEADY)
    assert sorted(rows(front(dashboard, "/?verdict=ok&q=report-1"))) == ["report-1"]
    both = sorted(rows(front(dashboard, "/?verdict=failing&verdict=unscheduled")))
    assert both == sorted([PLAINFAIL, ADHOC])
    assert sorted(rows(front(dashboard, "/?verdict=failing,unscheduled"))) == both
    none = front(dashboard, "/?q=nothing-like-it")
    assert rows(none) == {} and "No job matches these filters." in none
    # The form says what is filtered, and the verdict chips are links to their filter.
    text = front(dashboard, "/?verdict=failing&q=plain")
    assert '<option value="failing" selected>' in text and 'name="q" value="plain"' in text
    assert 'href="/?verdict=failing"' in front(dashboard)


def test_findings_follow_the_filters(dashboard: Dashboard) -> None:
    text = front(dashboard, "/?q=report-")
    findings = text[text.index("<h2>Findings</h2>") : text.index("<h2>Open runs</h2>")]
    assert PLAINFAIL not in findings
    assert f'href="/jobs/{PLAINFAIL}"' in front(dashboard, "/?q=plain")


def test_jobs_come_a_page_at_a_time(dashboard: Dashboard) -> None:
    seen: list[str] = []
    target = "/?per_page=4"
    pages = 0
    while target:
        text = front(dashboard, target.replace("&amp;", "&"))
        listed = list(rows(text))
        assert 0 < len(listed) <= 4
        seen += listed
        pages += 1
        nxt = re.search(r'<a rel="next" href="([^"]+)"', text)
        target = nxt.group(1) if nxt else ""
    assert seen == ALL and pages == 3
    last = front(dashboard, "/?per_page=4&page=3")
    assert f"jobs 9–{len(ALL)} of {len(ALL)}" in last and 'rel="prev" href="/?per_page=4&amp;page=2"' in last
    # Past the last page: the last page. Filters are kept from page to page.
    assert rows(front(dashboard, "/?per_page=4&page=99")) == rows(last)
    text = front(dashboard, "/?q=report&per_page=2")
    assert 'href="/?q=report&amp;per_page=2&amp;page=2"' in text


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("/?verdict=great", "verdict='great' is no verdict; expected one of failing, overlapping"),
        ("/?page=0", "page='0': expected a whole number from 1"),
        ("/?per_page=5000", "per_page='5000': expected a whole number from 1 to 1000"),
        ("/?q=a&q=b", "q given 2 times; give it once"),
    ],
)
def test_bad_filters_are_400_saying_what_is_expected(dashboard: Dashboard, target: str, said: str) -> None:
    text = front(dashboard, target, status=400)
    assert said in text.replace("&#x27;", "'")


def plan(store: Store, backend: str, query: EventQuery | tuple[EventKind, ...] | None) -> str:
    """How the store's database would read ``store.events(query)``, or
    (``query`` None, or kinds) every job's finding states, or latest events
    of those kinds (``latest_events``)."""
    if not isinstance(query, EventQuery):
        from cronwarden.monitor import STATE_KINDS
        from cronwarden.stores.sql import _kinds_in

        kinds = _kinds_in(query or STATE_KINDS)
        sql = store._shared["latest_events"].replace("{kinds}", kinds)  # type: ignore[attr-defined]
        args: list[object] = [500]
    else:
        sql, args = store._events_sql(query)  # type: ignore[attr-defined]
    if backend == "sqlite":
        return " / ".join(str(row[-1]) for row in store._fetch("EXPLAIN QUERY PLAN " + sql, args))  # type: ignore[attr-defined]
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")  # an index it can use, it then uses
        return " / ".join(str(row[0]) for row in conn.execute("EXPLAIN " + sql, args).fetchall())


SQL_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
def test_the_reads_of_every_job_use_their_indexes(store: Store, backend: str) -> None:
    """A pass reads each job's finding states, the front page the latest
    trouble across jobs: index reads, not scans of the events, whatever
    kinds are added later (a new kind of finding or trouble needs its
    index's list, and a migration, to match)."""
    from cronwarden.monitor import PAUSE_KINDS
    from cronwarden.monitor.rules import FINDING_KINDS
    from cronwarden.monitor.snooze import SNOOZE_KINDS
    from cronwarden.web.dashboard import TROUBLE

    states = plan(store, backend, EventQuery(job="nightly", kinds=(*FINDING_KINDS, *SNOOZE_KINDS), limit=500))
    trouble = plan(store, backend, EventQuery(kinds=TROUBLE, limit=100))
    every_job = plan(store, backend, None)
    pauses = plan(store, backend, PAUSE_KINDS)
    if backend == "sqlite":
        assert "USING INDEX events_findings (job=?)" in states, states
        assert "USING INDEX events_trouble" in trouble, trouble
    else:
        assert "events_job_kind_at" in states or "events_findings" in states, states
        assert "events_trouble" in trouble, trouble
    assert "events_findings" in every_job, every_job
    assert "events_pauses" in pauses, pauses


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_every_jobs_newest_manual_start_is_read_through_its_index(store: Store, backend: str) -> None:
    """A pass asks whether each job had a manual start since a time of its
    own (``latest_since``): on SQLite through the partial index of those
    events, not a walk of each job's window of events."""
    from cronwarden.stores.sql import _kinds_in

    sql = store._q["latest_since"].replace("{kinds}", _kinds_in((EventKind.TRIGGERED,)))  # type: ignore[attr-defined]
    found = " / ".join(str(row[-1]) for row in store._fetch("EXPLAIN QUERY PLAN " + sql, ['{"a": 1.0}']))  # type: ignore[attr-defined]
    assert "USING INDEX events_triggered (job=? AND at>?)" in found, found
