"""Effects mode, short: with the lease in each store, guarded runs increment a
counter in a real PostgreSQL table and a real Redis hash through the fencing
helpers while the holder is frozen (SIGSTOP of its whole group) past its
ttl, between its read and its write. The late write must raise ``Fenced``
and the counters must hold exactly the increments made, in token order; the
positive control (helpers bypassed) must find the lost update. See
chaos/effects.py; the long mode is ``bench/chaos.py --effects``.
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

from chaos.effects import TARGETS, EffectsResult, effects_config, open_lease_backend, run_effects_round  # noqa: E402
from chaos.faults import Backend, Fault  # noqa: E402

from conftest import BackendProbe, unavailable  # noqa: E402

STORES = ("sqlite", "postgres", "redis")
MARKS = [pytest.mark.postgres, pytest.mark.redis]  # the counters live in both, whatever the lease store


@pytest.fixture(scope="module")
def lease_stores(backend_probe: BackendProbe) -> Iterator[Callable[[str], Backend]]:
    """The lease store by name; the counters are on the test servers."""
    opened: dict[str, Backend] = {}

    def get(name: str) -> Backend:
        for module in ("psycopg", "redis"):
            if importlib.util.find_spec(module) is None:
                unavailable(f"effects mode needs {module}, which is missing")
        for backend in TARGETS:
            why = backend_probe.why_not(backend)
            if why is not None:
                unavailable(why)
        if name not in opened:
            opened[name] = open_lease_backend(name)
        return opened[name]

    yield get
    for b in opened.values():
        b.close()


def effects_round(backend: Backend, *, fenced: bool) -> EffectsResult:
    r = run_effects_round(
        backend, effects_config(Fault.PAUSE_LONG, fenced=fenced, ttl=1.0, faults=1, min_cycles=3, gap=(1, 1))
    )
    assert not r.errors, f"the harness could not do its job: {r.errors}"
    assert not r.tracebacks, f"cronwarden run printed a traceback: {r.tracebacks[0]}"
    assert not r.db_errors, r.db_errors
    assert len(r.injections) == 1
    return r


def describe(r: EffectsResult) -> str:
    found = {k: v[:3] for k, v in r.violations.items() if v}
    return (f"{r.store}: violations {found}; counters {r.increments}, recorded {r.recorded}, acknowledged "
            f"{r.acknowledged}, fenced {r.fenced}; expectations {r.expectations}")  # fmt: skip


@pytest.mark.parametrize("store", [pytest.param(s, marks=MARKS) for s in STORES])
def test_fenced_late_writes_are_refused_and_no_increment_is_lost(
    lease_stores: Callable[[str], Backend], store: str
) -> None:
    r = effects_round(lease_stores(store), fenced=True)
    assert r.cycles >= 3
    assert r.safety_violations == 0, describe(r)
    # The frozen holder lost its lease, a newer run wrote, and the thawed
    # holder's write raised Fenced in PostgreSQL and in Redis.
    assert not r.expectations, describe(r)
    assert r.late_fenced >= len(TARGETS), describe(r)
    for target in TARGETS:
        assert r.fenced[target] >= 1, describe(r)
        assert r.increments[target] == r.recorded[target] >= r.cycles - 1, describe(r)
        assert 0 < r.acknowledged[target] <= r.recorded[target], describe(r)


@pytest.mark.postgres
@pytest.mark.redis
def test_positive_control_without_the_helpers_loses_updates(lease_stores: Callable[[str], Backend]) -> None:
    """Whichever store holds the lease, the hazard is in the counters: one
    lease store here keeps the short mode short; the long mode runs the
    control on every store."""
    r = effects_round(lease_stores("sqlite"), fenced=False)
    assert r.found("a", "c") > 0, f"fault injection is broken: no violation without fencing; {describe(r)}"
    assert r.control_hits == 1, describe(r)
    assert sum(r.fenced.values()) == 0
    # The thawed holder's write landed on top of the newer run's: an
    # acknowledged increment is gone in at least one of the databases.
    assert any("(c)" in v for v in r.violations["c"]), describe(r)


def test_the_checkers_pass_a_serial_history_and_find_a_stale_write() -> None:
    from chaos.effects import Write, check_interleaving, check_no_lost_update, check_token_order

    clean = [Write("r1", 1, 0, 1), Write("r1", 1, 1, 2), Write("r2", 2, 0, 3)]
    acked = [("r1", 0, 1), ("r1", 1, 2), ("r2", 0, 3)]
    assert check_token_order("pg", clean) == []
    assert check_interleaving("pg", clean) == []
    assert check_no_lost_update("pg", 3, clean, acked) == []
    # r1 read 2 before it froze; r2 wrote 3; r1 thawed and wrote 3 again from its stale read.
    stale = [*clean, Write("r1", 1, 2, 3)]
    assert len(check_token_order("pg", stale)) == 1 and "r1" in check_token_order("pg", stale)[0]
    assert len(check_interleaving("pg", stale)) == 1
    lost = check_no_lost_update("pg", 3, stale, [*acked, ("r1", 2, 3)])
    assert any("counter is 3 after 4" in v for v in lost) and any("where 4 was due" in v for v in lost)
    # On Redis the stale write replaces the newer one's record of 3: its acknowledgement is gone.
    overwritten = [Write("r1", 1, 0, 1), Write("r1", 1, 1, 2), Write("r1", 1, 2, 3)]
    gone = check_no_lost_update("redis", 3, overwritten, [*acked, ("r1", 2, 3)])
    assert gone == ["(c) redis: run r2's acknowledged write of 3 (step 0) is gone, overwritten by run r1"]
