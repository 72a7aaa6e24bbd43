"""A small fleet for the dashboard's front page: jobs whose last slots say
different things (all ran, two missed, failing, a skip behind an open run,
no schedule), written through the store contract at scripted times."""

from __future__ import annotations

from cronwarden.clock import FakeClock
from cronwarden.events import Outcome
from cronwarden.stores.base import Store
from monitor_history import PERIOD, aligned, begin, describe, lease_of, run

BACKUP, PLAINFAIL, EXPORT, ADHOC = "backup", "plainfail", "export", "adhoc"
STEADY = tuple(f"report-{i}" for i in range(6))
SLOTS = 20
MISSED = (12, 15)
"""``backup``'s slots with no start."""


def fleet(store: Store, clock: FakeClock) -> float:
    """Writes the fleet and moves ``clock`` to just after its last slot;
    returns that slot. Every scheduled job has ``SLOTS`` slots of 10 minutes:
    ``backup`` ran in all but ``MISSED``; ``plainfail`` failed in slots 3 and
    7 and in the last two (failing); ``export``'s second-to-last run is still
    open and refused the last slot's start (skipped); each of ``STEADY``
    succeeded every time; ``adhoc`` has no schedule, its runs succeeded."""
    last = aligned(clock.wall()) + PERIOD
    clock.advance(last + 30 - clock.wall())
    first = last - (SLOTS - 1) * PERIOD
    for job in (BACKUP, PLAINFAIL, EXPORT, *STEADY):
        describe(store, job, at=first - PERIOD)
    for i in range(SLOTS):
        slot = first + i * PERIOD
        if i not in MISSED:
            run(store, BACKUP, slot + 2, 30.0)
        bad = i in (3, 7) or i >= SLOTS - 2
        run(store, PLAINFAIL, slot + 1, 5.0, Outcome.FAILED if bad else Outcome.SUCCEEDED)
        for job in STEADY:
            run(store, job, slot + 3, 20.0)
        run(store, ADHOC, slot + 4, 1.0)
        if i < SLOTS - 2:
            run(store, EXPORT, slot + 1, 60.0)
    lease_of(begin(store, EXPORT, last - PERIOD + 1))
    begin(store, EXPORT, last + 1)  # refused: the run before is still open
    return last
