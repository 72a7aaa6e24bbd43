"""The PostgreSQL store's schema is written twice, as ``schema.sql`` +
``functions.sql`` (what a new schema gets) and as the migrations (what an
older one goes through): a schema brought up from any earlier version has
the same catalog as one made from the two files (tables, columns, types,
defaults, indexes, constraints, triggers, sequences, and each function's
whole definition), and so does a new store's."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cronwarden.stores.sql import migrations, read_sql
from pgserver import unavailable

psycopg = pytest.importorskip("psycopg")
postgres_store = pytest.importorskip("cronwarden.stores.postgres")

pytestmark = pytest.mark.postgres

SHARED = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

Catalog = dict[str, Any]


@pytest.fixture
def schemas() -> Iterator[Callable[[], str]]:
    """New schema names, each dropped afterwards."""
    try:
        with psycopg.connect(SHARED, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as e:
        unavailable(f"PostgreSQL not reachable at {SHARED}: {str(e).splitlines()[0]}")
    made: list[str] = []

    def new() -> str:
        made.append(f"cw_schema_{uuid.uuid4().hex[:12]}")
        return made[-1]

    yield new
    with psycopg.connect(SHARED, autocommit=True, connect_timeout=5) as conn:
        for name in made:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def execute(schema: str, scripts: list[str], version: int) -> None:
    """Apply ``scripts`` to a new schema, in one transaction, as the store
    does, with its version in ``meta``."""
    s = f'"{schema}"'
    with psycopg.connect(SHARED, autocommit=True) as conn, conn.transaction():
        conn.execute(f"CREATE SCHEMA {s}")
        conn.execute(f"CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL)")
        for script in scripts:
            conn.execute(script.replace("{s}", s))
        conn.execute(f"INSERT INTO {s}.meta VALUES ('schema_version', %s)", (str(version),))


def from_schema_files(schema: str) -> str:
    execute(
        schema,
        [read_sql(postgres_store.SCHEMA), read_sql(postgres_store.FUNCTIONS)],
        postgres_store.SCHEMA_VERSION,
    )
    return schema


def at_version(schema: str, version: int) -> str:
    """A schema as a cronwarden that knew up to ``version`` left it."""
    files = migrations(postgres_store.MIGRATIONS_DIR)
    execute(schema, [read_sql(f) for v, f in files.items() if v <= version], version)
    return schema


def open_and_close(schema: str) -> str:
    postgres_store.PostgresStore.from_url(f"{SHARED}?schema={schema}").close()
    return schema


CATALOG_QUERIES = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, coalesce(c.reloptions, '{}')::text
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s ORDER BY c.relname""",
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,
               a.attcollation::regcollation::text,
               row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = %(s)s AND c.relkind IN ('r', 'p', 'v', 'm') AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY c.relname, a.attnum""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %(s)s
        ORDER BY tablename, indexname""",
    "constraints": """
        SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid), k.condeferrable
        FROM pg_constraint k
        JOIN pg_namespace n ON n.oid = k.connamespace
        LEFT JOIN pg_class c ON c.oid = k.conrelid
        WHERE n.nspname = %(s)s ORDER BY c.relname, k.conname""",
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s AND NOT t.tgisinternal ORDER BY c.relname, t.tgname""",
    "sequences": """
        SELECT sequencename, data_type::text, start_value, min_value, max_value, increment_by, cycle,
               cache_size
        FROM pg_sequences WHERE schemaname = %(s)s ORDER BY sequencename""",
    "sequence_owners": """
        SELECT s.relname, t.relname, a.attname
        FROM pg_depend d
        JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
        JOIN pg_class t ON t.oid = d.refobjid
        JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = d.refobjsubid
        JOIN pg_namespace n ON n.oid = s.relnamespace
        WHERE n.nspname = %(s)s AND d.deptype IN ('a', 'i') ORDER BY s.relname""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(s)s ORDER BY p.proname, 2""",
    "types": """
        SELECT t.typname, t.typtype FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = %(s)s ORDER BY t.typname""",
}


def catalog(schema: str) -> Catalog:
    """What the schema defines, with its own name written as ``{s}`` so two
    schemas compare."""

    def unnamed(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(f'"{schema}"', "{s}").replace(schema, "{s}")
        return value

    with psycopg.connect(SHARED, autocommit=True) as conn:
        return {
            name: [tuple(unnamed(v) for v in row) for row in conn.execute(sql, {"s": schema}).fetchall()]
            for name, sql in CATALOG_QUERIES.items()
        }


def differences(a: Catalog, b: Catalog) -> dict[str, tuple[list[Any], list[Any]]]:
    """Per part of the catalog, the rows only in ``a`` and only in ``b``:
    an assertion message a person can read."""
    out = {}
    for part in a:
        only_a = [r for r in a[part] if r not in b[part]]
        only_b = [r for r in b[part] if r not in a[part]]
        if only_a or only_b or a[part] != b[part]:
            out[part] = (only_a, only_b)
    return out


@pytest.mark.parametrize(
    "start", [v for v in migrations(postgres_store.MIGRATIONS_DIR) if v < postgres_store.SCHEMA_VERSION]
)
def test_a_schema_migrated_from_an_earlier_version_has_the_catalog_of_the_schema_files(
    schemas: Callable[[], str], start: int
) -> None:
    migrated = open_and_close(at_version(schemas(), start))  # the store's own upgrade

    assert differences(catalog(migrated), catalog(from_schema_files(schemas()))) == {}


def test_a_new_store_has_the_catalog_of_the_schema_files(schemas: Callable[[], str]) -> None:
    new = open_and_close(schemas())

    assert differences(catalog(new), catalog(from_schema_files(schemas()))) == {}


def test_the_catalog_comparison_sees_a_changed_function_body(schemas: Callable[[], str]) -> None:
    # The positive control: a function the migrations left in another
    # version than functions.sql's is reported, down to its text.
    changed = from_schema_files(schemas())
    with psycopg.connect(SHARED, autocommit=True) as conn:
        conn.execute(
            f'CREATE OR REPLACE FUNCTION "{changed}".outbox_settled() RETURNS boolean '
            "LANGUAGE plpgsql AS $$\nBEGIN\n    RETURN true;\nEND $$"
        )

    found = differences(catalog(changed), catalog(from_schema_files(schemas())))

    assert list(found) == ["functions"]
    assert [row[0] for row in found["functions"][0]] == ["outbox_settled"]
