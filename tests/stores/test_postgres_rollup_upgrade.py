"""A PostgreSQL store whose rollups were kept by an earlier version's
functions is upgraded: the version before the window's arrays (one JSON
array of entries, the statistics recomputed at every end) and version 18
(an array per field, the durations searched as JSON). The window survives
the move, and the ends written after the upgrade keep every statistic of an
end equal to the fold of the ledger, across the window's turn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from cronwarden.stores import open_store
from cronwarden.stores.sql import migrations

from .rollup_upgrade import assert_end_fields_fold, assert_ends_carry_on, old_history
from .test_postgres_migrations import SHARED, create_at_version, psycopg, schema, version_of

pytestmark = pytest.mark.postgres
postgres_store = pytest.importorskip("cronwarden.stores.postgres")
BEFORE = max(v for v in migrations(postgres_store.MIGRATIONS_DIR) if v < 18)
"""The newest version before the window's arrays (migration 18)."""

__all__ = ["schema"]  # the fixture


@pytest.mark.parametrize("version", [BEFORE, 18])
def test_rollups_kept_by_an_earlier_version_are_carried_on_by_the_upgraded_ends(
    schema: str, version: int
) -> None:
    create_at_version(schema, version)
    t0 = 1_760_000_000.0
    with psycopg.connect(SHARED, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')

        def execute(sql: str, args: Sequence[Any]) -> None:
            conn.execute(sql.replace("?", "%s"), args)

        old_history(execute, "nightly", 73, t0)  # a full window, 23 ends past its turn
        old_history(execute, "young", 7, t0)

    with open_store(f"{SHARED}?schema={schema}") as store:
        assert version_of(schema) == postgres_store.SCHEMA_VERSION
        assert_end_fields_fold(store, "nightly")
        assert_end_fields_fold(store, "young")
        assert_ends_carry_on(store, "nightly", t0 + 10_000)
