"""The chaos checkers and the referee's rules on small, hand-made histories:
each checker finds the violation it names and nothing on a clean history.
(The positive control in test_chaos.py shows the same end to end.)"""

from __future__ import annotations

import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from chaos.referee import ROOT as EMPTY  # noqa: E402
from chaos.referee import RefereeState  # noqa: E402

from chaos import checkers  # noqa: E402
from cronwarden.events import Event, EventKind, Outcome, RunRecord  # noqa: E402


def history(*ops: tuple[str, int, bool]) -> RefereeState:
    """Runs doing read–write pairs through a referee: (run, token, fenced)."""
    state = RefereeState()
    for i, (run, token, fence) in enumerate(ops):
        ok, head = state.read(run, token, fence)
        if ok:
            state.write(run, token, fence, f"{run}/{i}", head)
    return state


def stale_writer(fence: bool) -> RefereeState:
    """A reads, B (newer token) reads and writes, then A writes what it read."""
    state = RefereeState()
    _, a_read = state.read("A", 1, fence)
    _, b_read = state.read("B", 2, fence)
    state.write("B", 2, fence, "B/0", b_read)
    state.write("A", 1, fence, "A/0", a_read)
    state.read("B", 2, fence)
    state.write("B", 2, fence, "B/1", state.head)
    return state


def test_clean_sequential_runs_pass_every_checker() -> None:
    s = history(("A", 1, True), ("A", 1, True), ("B", 2, True), ("C", 3, True))
    tokens = {"A": 1, "B": 2, "C": 3}
    assert checkers.check_a_token_order(s.log, tokens) == []
    assert checkers.check_b_no_interleaving(s.log) == []
    assert checkers.check_c_acknowledged_present(s.log, s.head) == []


def test_the_referee_refuses_a_stale_token_on_reads_and_writes() -> None:
    state = RefereeState()
    assert state.read("B", 2, True)[0]
    assert state.read("A", 1, True) == (False, "2")
    assert state.write("A", 1, True, "A/0", EMPTY) == (False, "2")
    assert state.head == EMPTY


def test_a_stale_writer_is_refused_with_fencing_and_every_checker_stays_clean() -> None:
    s = stale_writer(fence=True)
    assert [e["ok"] for e in s.log if e["run"] == "A"] == [True, False]
    assert checkers.check_a_token_order(s.log, {"A": 1, "B": 2}) == []
    assert checkers.check_b_no_interleaving(s.log) == []
    assert checkers.check_c_acknowledged_present(s.log, s.head) == []


def test_without_fencing_a_stale_writer_trips_a_b_and_c() -> None:
    s = stale_writer(fence=False)
    assert len(checkers.check_a_token_order(s.log, {"A": 1, "B": 2})) == 1
    assert len(checkers.check_b_no_interleaving(s.log)) == 1
    lost = checkers.check_c_acknowledged_present(s.log, s.head)
    assert lost == ["(c) acknowledged write B/0 is not in the final document (overwritten by a stale write)"]


def test_check_a_judges_by_the_token_the_store_granted_not_the_one_sent() -> None:
    state = RefereeState()
    state.write("B", 2, False, "B/0", EMPTY)
    state.write("A", 99, False, "A/0", "B/0")  # A claims a big token; the store gave it 1
    assert checkers.check_a_token_order(state.log, {"A": 1, "B": 2}) != []


def event(kind: EventKind, run: str, seq: int, token: int | None = None) -> Event:
    data: dict[str, Any] = {} if token is None else {"token": token}
    return Event(kind=kind, job="j", at=float(seq), run_id=run, data=data, seq=seq)


def record(run: str, outcome: Outcome | None) -> RunRecord:
    return RunRecord(run_id=run, job="j", key="j", host="h", pid=1, token=1, started_at=0.0, outcome=outcome)


def test_check_d_finds_a_missing_a_double_and_an_orphan_terminal_and_work_without_a_start() -> None:
    events = [
        event(EventKind.STARTED, "ok", 1, 1),
        event(EventKind.SUCCEEDED, "ok", 2),
        event(EventKind.STARTED, "open", 3, 2),
        event(EventKind.STARTED, "twice", 4, 3),
        event(EventKind.ABANDONED, "twice", 5),
        event(EventKind.LEASE_LOST, "twice", 6),
        event(EventKind.FAILED, "ghost", 7),
    ]
    runs = {"ok": record("ok", Outcome.SUCCEEDED), "open": record("open", None),
            "twice": record("twice", Outcome.ABANDONED)}  # fmt: skip
    log = [{"op": "hello", "run": "ok"}, {"op": "hello", "run": "unknown"}]
    found = checkers.check_d_one_terminal(events, runs, log)
    assert len(found) == 4, found
    assert any("open has 0 terminal" in f for f in found)
    assert any("twice has 2 terminal" in f for f in found)
    assert any("ghost has terminal" in f for f in found)
    assert any("unknown, which the ledger never started" in f for f in found)


def test_check_d_finds_a_run_record_that_disagrees_with_the_ledger() -> None:
    events = [event(EventKind.STARTED, "r", 1, 1), event(EventKind.LEASE_LOST, "r", 2)]
    assert checkers.check_d_one_terminal(events, {"r": record("r", Outcome.SUCCEEDED)}, []) != []
    assert checkers.check_d_one_terminal(events, {"r": record("r", Outcome.LEASE_LOST)}, []) == []


def test_check_g_finds_a_grant_that_does_not_exceed_every_earlier_one() -> None:
    rising = [event(EventKind.STARTED, "a", 1, 5), event(EventKind.STARTED, "b", 2, 9)]
    assert checkers.check_g_grant_order(rising) == []
    repeated = [*rising, event(EventKind.STARTED, "c", 3, 9)]
    assert len(checkers.check_g_grant_order(repeated)) == 1
