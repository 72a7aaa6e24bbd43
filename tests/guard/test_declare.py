"""A library job is a job: what ``guard()``/``job()`` declare (schedule,
every, timezone, reason, policy, max_runtime, grace) reaches the store, so
``audit`` and the monitor know it as they know a ``cronwarden run`` job; and
their keywords are checked like a function's."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest
from tests.contract import ledger

from cronwarden import Options, UsageError
from cronwarden.clock import SYSTEM_CLOCK
from cronwarden.events import EventKind
from cronwarden.guard import Warden
from cronwarden.schedule import Schedule
from cronwarden.stores.base import Store


def test_what_a_library_job_declares_reaches_the_store_and_audit(store_url: str) -> None:
    with Warden(store_url, clock=SYSTEM_CLOCK) as w:
        with w.guard("nightly-export", ttl="2m", every="10m", policy="skip", max_runtime="5m",
                     reason="the export takes a table lock; two would deadlock"):  # fmt: skip
            pass

        @w.job("cache-fill", schedule="*/5 * * * *", timezone="UTC", grace="1m")
        async def fill() -> None:
            pass

        asyncio.run(fill())
        export = w.store.job("nightly-export")
        assert export is not None
        assert (export.schedule, export.period, export.policy, export.ttl, export.max_runtime) == (
            "every 10m", 600.0, "skip", 120.0, 300.0)  # fmt: skip
        assert export.reason == "the export takes a table lock; two would deadlock"
        cache = w.store.job("cache-fill")
        assert cache is not None
        assert (cache.schedule, cache.period, cache.grace) == ("CRON_TZ=UTC */5 * * * *", 300.0, 60.0)
    # The command line's audit knows both, as it knows jobs run by cronwarden run.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    audit = subprocess.run([sys.executable, "-m", "cronwarden", "audit", "--store", store_url],
                           capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert audit.returncode in (0, 1), audit.stderr
    assert "no jobs known" not in audit.stdout
    assert "nightly-export" in audit.stdout and "cache-fill" in audit.stdout
    assert "the export takes a table lock" in audit.stdout


def test_a_scheduled_library_run_records_the_slot_it_serves(store_url: str, store: Store) -> None:
    with Warden(store_url, clock=SYSTEM_CLOCK) as w, w.guard("nightly", schedule="0 3 * * *", timezone="UTC"):
        pass
    started = ledger(store, kinds=[EventKind.STARTED])
    assert len(started) == 1
    expected = Schedule.cron_("0 3 * * *", "UTC").slot(started[0].at)
    assert started[0].data["slot"] == expected


def test_a_declaration_is_written_once_and_again_only_when_it_changes(store_url: str) -> None:
    with Warden(store_url, clock=SYSTEM_CLOCK) as w:
        for _ in range(3):
            with w.guard("nightly", every="1h", reason="first"):
                pass
        first = w.store.job("nightly")
        assert first is not None
        with w.guard("nightly", every="1h", reason="second"):
            pass
        second = w.store.job("nightly")
        assert second is not None and second.reason == "second" and second.updated_at > first.updated_at
    # A new process (a new warden) reads the saved declaration and writes nothing.
    with Warden(store_url, clock=SYSTEM_CLOCK) as w2:
        with w2.guard("nightly", every="1h", reason="second"):
            pass
        assert w2.store.job("nightly") == second


def test_a_job_that_declares_nothing_saves_nothing(store_url: str, store: Store) -> None:
    with Warden(store_url, clock=SYSTEM_CLOCK) as w, w.guard("nightly"):
        pass
    assert store.jobs() == []


def test_an_unknown_keyword_is_a_type_error_with_a_did_you_mean() -> None:
    with _memory() as w:
        for call in (lambda: w.guard("x", polcy="skip"), lambda: w.job("x", shedule="* * * * *")):
            with pytest.raises(TypeError) as caught:
                call()
            assert isinstance(caught.value, UsageError)
            message = str(caught.value)
            assert "\n" not in message and "did you mean" in message
        with pytest.raises(TypeError, match="did you mean 'policy'"):
            w.guard("x", polcy="skip")
        with pytest.raises(TypeError, match="did you mean 'schedule'"):
            w.job("x", shedule="* * * * *")


def _memory() -> Warden:
    import tempfile

    return Warden(f"sqlite:///{tempfile.mkdtemp()}/cronwarden.db", clock=SYSTEM_CLOCK)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"every": "10m", "schedule": "* * * * *"}, "not both"),
        ({"timezone": "UTC"}, "timezone applies to a cron schedule"),
        ({"schedule": "61 * * * *"}, "schedule"),
        ({"schedule": "0 3 * * *", "timezone": "Mars/Olympus"}, "Mars/Olympus"),
        ({"every": "soon"}, "every must be a duration like 90s"),
        ({"every": 0}, "every must be greater than zero"),
        ({"grace": "-"}, "grace must be a duration"),
        ({"reason": "one\ntwo"}, "reason must be one sentence on one line"),
        ({"schedule": 5}, "schedule must be text like"),
    ],
)
def test_bad_declarations_are_one_line_usage_errors(bad: dict[str, Any], says: str) -> None:
    with pytest.raises(UsageError) as caught:
        Options(**bad)
    assert says in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
