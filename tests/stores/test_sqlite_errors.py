"""The SQLite store's errors: each says what was wrong, with the exit status
that fits it (75 only for what a later try can get past)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cronwarden.errors import StoreError, StoreUnavailable
from cronwarden.events import Outcome
from cronwarden.stores.base import End, Granted, Start
from cronwarden.stores.sqlite import SqliteStore


def test_a_write_the_ledger_refuses_is_a_store_error_not_unavailable(tmp_path: Path) -> None:
    """A constraint the ledger enforces (here: a run id already used) is no
    busy store: exit 2 with what was refused, not 75 ("try again later")."""
    with SqliteStore(str(tmp_path / "cw.db")) as store:
        start = Start(job="j", key="j", run_id="r1", host="h", pid=1, ttl=60.0, at=1_750_000_000.0)
        granted = store.acquire(start)
        assert isinstance(granted, Granted)
        store.finish(granted.lease, End(outcome=Outcome.SUCCEEDED, at=1_750_000_001.0, exit_code=0))
        with pytest.raises(StoreError) as caught:
            store.acquire(start)
    assert not isinstance(caught.value, StoreUnavailable) and caught.value.exit_code == 2
    assert "UNIQUE constraint failed: runs.run_id" in str(caught.value)
