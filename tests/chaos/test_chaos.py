"""The chaos harness, short mode: every fault on every store, with real
``cronwarden run`` processes, real signals and private servers, then the
checkers on the recorded history (see chaos/ and docs/RELIABILITY.md).

- Every fenced cell: 0 violations of (a)–(d), (g) grant order and (h) G5 /
  stop-before-expiry, plus the behaviour the fault must produce.
- The positive control: the frozen-holder cells again with fencing off in
  the workers must report (a)/(b) violations, or the injection is broken.

About 4–5 minutes on a 2-core machine; the long mode is ``bench/chaos.py``.
This directory has no ``__init__.py`` on purpose: it would shadow the
top-level ``chaos`` package.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from chaos.faults import KILLS, PAUSES, Backend, Fault, open_backend  # noqa: E402
from chaos.harness import RoundConfig, RoundResult, run_round, table  # noqa: E402

TTL = 1.0
FAULTS_PER_CELL = 2
WORKER_SIDE = [*KILLS, Fault.NONE, Fault.PAUSE_SHORT, *PAUSES]
SUPPORTS = {
    "sqlite": [*WORKER_SIDE, Fault.STORE_PAUSE],
    "postgres": [*WORKER_SIDE, Fault.CONN_KILL, Fault.STORE_RESTART, Fault.STORE_PAUSE],
    "redis": [*WORKER_SIDE, Fault.CONN_KILL, Fault.STORE_RESTART, Fault.STORE_PAUSE],
    # Through a PgBouncer in transaction mode: a killed server connection
    # behind the pooler, and the server paused behind it past the ttl.
    "postgres-pgbouncer": [Fault.KILL_SUPERVISOR, Fault.CONN_KILL, Fault.STORE_PAUSE],
}
MARKS = {
    "sqlite": [],
    "postgres": [pytest.mark.postgres],
    "postgres-pgbouncer": [pytest.mark.postgres],
    "redis": [pytest.mark.redis],
}
NEEDS = {
    "postgres": ("psycopg", "cronwarden.stores.postgres", "tests.pgserver"),
    "postgres-pgbouncer": ("psycopg", "cronwarden.stores.postgres", "tests.pgserver", "tests.pgbouncer"),
    "redis": ("redis", "cronwarden.stores.redis", "tests.redisserver"),
}
"""Driver, store and private-server helper each store's cells import."""


def unavailable(reason: str) -> None:
    """Skip, or fail when CI requires every backend (as tests/conftest.py does)."""
    if os.environ.get("CRONWARDEN_REQUIRE_BACKENDS", "") == "1":
        pytest.fail(f"{reason} (CRONWARDEN_REQUIRE_BACKENDS=1)", pytrace=False)
    pytest.skip(reason)


def cells(fenced: bool) -> list[object]:
    out = []
    for store, faults in SUPPORTS.items():
        for fault in faults:
            if fenced or fault in PAUSES:
                out.append(pytest.param(store, fault, marks=MARKS[store], id=f"{store}-{fault.value}"))
    return out


RESULTS: list[RoundResult] = []


@pytest.fixture(scope="module")
def backends(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Backend]]:
    """One private store per kind for the whole module, opened on first use."""
    opened: dict[str, Backend] = {}

    def get(name: str) -> Backend:
        if name not in opened:
            for module in NEEDS.get(name, ()):
                if importlib.util.find_spec(module) is None:
                    unavailable(f"{name}: module {module} is missing")
            if name == "postgres-pgbouncer":
                from tests.pgbouncer import why_not

                why = why_not()
                if why is not None:
                    unavailable(f"{name}: {why}")
            opened[name] = open_backend(name)
        return opened[name]

    yield get
    for b in opened.values():
        b.close()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None and RESULTS:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            reporter.write_line("chaos short mode (a–d, g, h: violations; takeover s; margin ×ttl):")
            for line in table(RESULTS).splitlines():
                reporter.write_line(line)


def chaos_round(backend: Backend, fault: Fault, *, fenced: bool) -> RoundResult:
    config = RoundConfig(
        fault=fault, fenced=fenced, ttl=TTL, faults=FAULTS_PER_CELL, min_cycles=4,
        # A frozen supervisor's child must still be working when the next run
        # takes over, or there is nothing for the referee to refuse.
        long_work=4.0 if fault is Fault.STALL_SUPERVISOR else 1.5,
    )  # fmt: skip
    result = run_round(backend, config)
    RESULTS.append(result)
    assert not result.errors, f"the harness could not do its job: {result.errors}"
    assert not result.tracebacks, f"cronwarden run printed a traceback: {result.tracebacks[0]}"
    if fault is not Fault.NONE:
        assert len(result.injections) == FAULTS_PER_CELL
    return result


def describe(result: RoundResult) -> str:
    found = {k: v for k, v in result.violations.items() if v}
    return f"{result.store}/{result.config.fault}: violations {found}; expectations {result.expectations}"


@pytest.mark.parametrize(("store", "fault"), cells(fenced=True))
def test_fenced_runs_show_no_violation_under_the_fault(
    backends: Callable[[str], Backend], store: str, fault: Fault
) -> None:
    r = chaos_round(backends(store), fault, fenced=True)
    assert r.cycles >= 4
    assert r.safety_violations == 0, describe(r)
    if fault in KILLS:
        # (e) the next run started within ttl + renew interval + one poll.
        assert len(r.takeover.values) == FAULTS_PER_CELL
        assert not r.takeover_over_bound, r.takeover_over_bound
        # kill -9 of a supervisor: the child died with it and the next start
        # recorded the run abandoned; kill -9 of a child: recorded failed, 137.
        assert not r.expectations, describe(r)
    if fault in PAUSES:
        # The frozen holder lost its lease (exit 3), someone else took over,
        # and its operations after the thaw were refused by the referee.
        assert not r.expectations, describe(r)
        assert r.late_rejected >= FAULTS_PER_CELL, describe(r)
    if fault is Fault.PAUSE_SHORT:
        # Losing the lease to a 0.5×ttl pause is expected only when the pause
        # ends past the holder's belief (see test_pause_budget.py).
        assert r.lost_within_budget == 0, describe(r)
    if fault is Fault.STORE_PAUSE:
        # Paused past the ttl: every holder stopped its work before its lease
        # expired in the store, by a margin ((f), checked in "h" above). The
        # holder may be recorded lease_lost or, when the next run's acquire
        # wins the race at the thaw, abandoned: its supervisor's exit says.
        assert r.stopped_for_lease_loss >= 1, describe(r)
        assert len(r.margin.values) >= 1


@pytest.mark.parametrize(("store", "fault"), cells(fenced=False))
def test_positive_control_without_fencing_finds_violations(
    backends: Callable[[str], Backend], store: str, fault: Fault
) -> None:
    r = chaos_round(backends(store), fault, fenced=False)
    assert r.found("a", "b") > 0, f"fault injection is broken: no violation without fencing; {describe(r)}"
    assert r.control_hits >= 1, describe(r)
