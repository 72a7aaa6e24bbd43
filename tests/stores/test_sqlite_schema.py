"""The SQLite store's schema is written twice, as ``schema.sql`` (what a new
file gets) and as the migrations (what an older file goes through): a file
brought up from any earlier version has the same catalog as one made from
``schema.sql``, and a new store is made from ``schema.sql`` itself."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from cronwarden.clock import FakeClock
from cronwarden.stores.sql import migrations, read_sql
from cronwarden.stores.sqlite import MIGRATIONS_DIR, SCHEMA, SCHEMA_VERSION, SqliteStore, statements

Catalog = dict[str, object]


def normalised(sql: str | None) -> str | None:
    """A ``CREATE`` statement as ``sqlite_master`` keeps it, without what
    does not change its meaning: comments, spacing, quotes around names
    (``ALTER TABLE … RENAME`` writes ``"runs"``)."""
    if sql is None:
        return None
    sql = re.sub(r"--[^\n]*", " ", sql)
    sql = sql.replace('"', "")
    sql = " ".join(sql.split())
    return re.sub(r"\s*([(),])\s*", r"\1", sql)


def catalog(path: Path) -> Catalog:
    """Everything the schema defines: each object's normalised SQL, and per
    table its columns, indexes and index columns as SQLite reports them.

    Not ``sqlite_sequence``: SQLite made it for version 1's AUTOINCREMENT and
    never drops it (nor lets anyone), so upgraded files keep an unused one."""
    db = sqlite3.connect(path)
    try:
        objects = {
            (kind, name): (table, normalised(sql))
            for kind, name, table, sql in db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")
            if name != "sqlite_sequence"
        }
        tables = sorted(name for kind, name in objects if kind == "table")
        columns = {t: db.execute(f"PRAGMA table_xinfo('{t}')").fetchall() for t in tables}
        indexes = {t: sorted(db.execute(f"PRAGMA index_list('{t}')").fetchall()) for t in tables}
        index_columns = {
            row[1]: db.execute(f"PRAGMA index_xinfo('{row[1]}')").fetchall()
            for rows in indexes.values()
            for row in rows
        }
        version = db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()
    return {
        "objects": objects,
        "columns": columns,
        "indexes": indexes,
        "index_columns": index_columns,
        "version": version,
    }


def from_schema_sql(path: Path) -> Path:
    """A file made by applying ``schema.sql`` and setting the version."""
    db = sqlite3.connect(path, isolation_level=None)
    for statement in statements(read_sql(SCHEMA)):
        db.execute(statement)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    db.close()
    return path


def at_version(path: Path, version: int) -> Path:
    """A file as a cronwarden that knew up to ``version`` left it: the
    migrations up to it, applied from the first."""
    db = sqlite3.connect(path, isolation_level=None)
    for v, file in migrations(MIGRATIONS_DIR).items():
        if v <= version:
            for statement in statements(read_sql(file)):
                db.execute(statement)
    db.execute(f"PRAGMA user_version = {version}")
    db.close()
    return path


@pytest.mark.parametrize("start", [v for v in migrations(MIGRATIONS_DIR) if v < SCHEMA_VERSION])
def test_a_file_migrated_from_an_earlier_version_has_the_catalog_of_schema_sql(
    tmp_path: Path, start: int
) -> None:
    old = at_version(tmp_path / f"v{start}.db", start)
    SqliteStore(old, clock=FakeClock()).close()  # the store's own upgrade

    assert catalog(old) == catalog(from_schema_sql(tmp_path / "schema.db"))


def test_the_newest_migration_alone_is_the_schema_sql_catalog_too(tmp_path: Path) -> None:
    # The whole chain, written out by the test rather than by the store.
    assert catalog(at_version(tmp_path / "chain.db", SCHEMA_VERSION)) == catalog(
        from_schema_sql(tmp_path / "schema.db")
    )


def test_a_new_file_is_made_from_schema_sql(tmp_path: Path) -> None:
    SqliteStore(tmp_path / "new.db", clock=FakeClock()).close()
    db = sqlite3.connect(tmp_path / "new.db")
    try:
        kept = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())
    finally:
        db.close()

    assert catalog(tmp_path / "new.db") == catalog(from_schema_sql(tmp_path / "schema.db"))
    # SQLite keeps each CREATE as written: schema.sql's comments inside the
    # statement show it was schema.sql, not the migrations, that made it.
    assert "-- the fencing counter" in kept["leases"]


def test_the_catalog_comparison_sees_a_missing_index(tmp_path: Path) -> None:
    # The positive control: a difference the migrations could introduce is
    # one this comparison reports.
    broken = from_schema_sql(tmp_path / "broken.db")
    db = sqlite3.connect(broken, isolation_level=None)
    db.execute("DROP INDEX runs_open")
    db.close()

    assert catalog(broken) != catalog(from_schema_sql(tmp_path / "schema.db"))
