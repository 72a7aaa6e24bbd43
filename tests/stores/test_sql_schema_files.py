"""The SQL files' loader (``stores/sql.py``): named queries, numbered
migrations with gaps, the one placeholder conversion, and every query of
each store's files being one the store uses."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from cronwarden.errors import StoreError
from cronwarden.stores import sql
from cronwarden.stores.sql import migrations, parse_queries, placeholders, queries

STORES = Path(sql.__file__).parent


def test_named_queries_are_split_at_their_headers_without_comments_or_semicolon() -> None:
    text = (
        "-- The file's own comment.\n"
        "\n"
        "-- name: first --\n"
        "-- What it does.\n"
        "SELECT 1\n"
        "  -- an aside\n"
        "FROM t;\n"
        "\n"
        "-- name: second --\n"
        "UPDATE t SET a = ? -- why, on the line\n"
        "WHERE b = ?;\n"
    )

    assert parse_queries(text, "x.sql") == {
        "first": "SELECT 1\nFROM t",
        "second": "UPDATE t SET a = ? -- why, on the line\nWHERE b = ?",
    }


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("-- name: a --\nSELECT 1;\n-- name: a --\nSELECT 2;\n", "query 'a' is defined twice"),
        ("-- name: a --\n-- only a comment\n-- name: b --\nSELECT 2;\n", "query 'a' is empty"),
        ("-- name: not a name --\nSELECT 1;\n", "does not name a query"),
    ],
)
def test_a_broken_queries_file_is_refused_with_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(StoreError, match=why):
        parse_queries(text, "x.sql")


def test_a_queries_file_is_read_once_per_process(tmp_path: Path) -> None:
    path = tmp_path / "q.sql"
    path.write_text("-- name: a --\nSELECT 1;\n")
    first = queries(str(path))
    path.write_text("-- name: a --\nSELECT 2;\n")

    assert queries(str(path)) is first and first == {"a": "SELECT 1"}


def test_migrations_are_ordered_by_number_and_may_have_gaps(tmp_path: Path) -> None:
    for name in ["0010_later.sql", "0002_second.sql", "0001_first.sql", "README.txt"]:
        (tmp_path / name).write_text("SELECT 1;")

    found = migrations(str(tmp_path))

    assert list(found) == [1, 2, 10]
    assert [os.path.basename(p) for p in found.values()] == [
        "0001_first.sql",
        "0002_second.sql",
        "0010_later.sql",
    ]


def test_two_migrations_with_one_number_are_refused(tmp_path: Path) -> None:
    (tmp_path / "0003_mine.sql").write_text("SELECT 1;")
    (tmp_path / "0003_yours.sql").write_text("SELECT 1;")

    with pytest.raises(StoreError, match=re.escape("0003_mine.sql and 0003_yours.sql share version 3")):
        migrations(str(tmp_path))


def test_a_migration_without_a_number_is_refused(tmp_path: Path) -> None:
    (tmp_path / "add_index.sql").write_text("SELECT 1;")

    with pytest.raises(StoreError, match=re.escape("expected a name like 0001_what_it_does.sql")):
        migrations(str(tmp_path))


def test_missing_sql_files_say_the_package_data_is_missing(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="package data"):
        queries(str(tmp_path / "absent.sql"))
    with pytest.raises(StoreError, match="package data"):
        migrations(str(tmp_path / "absent"))


def test_placeholders_become_the_drivers_own() -> None:
    statement = "SELECT a FROM t WHERE b = %s AND c LIKE 'x%%' LIMIT %s"

    assert placeholders(statement, "?") == "SELECT a FROM t WHERE b = ? AND c LIKE 'x%' LIMIT ?"
    assert placeholders(statement, "%s") == statement


OWN = ("self._q", "q")
"""How a store's code names its own statements (its ``queries.sql``)."""
SHARED = ("self._shared",)
"""How the shared code names the statements both SQL stores run."""


def _names_used(module: Path, targets: tuple[str, ...]) -> set[str]:
    """String subscripts of ``targets`` (e.g. ``self._q[...]``) in a module."""
    used = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target = ast.unparse(node.value)
            if target in targets and isinstance(node.slice.value, str):
                used.add(node.slice.value)
    return used


@pytest.mark.parametrize(
    ("files", "modules", "targets"),
    [
        # The shared code may run a statement each store writes its own way.
        (["sqlite/queries.sql"], ["sqlite/__init__.py", "sql.py"], OWN),
        (["postgres/queries.sql"], ["postgres/__init__.py", "sql.py"], OWN),
        (["queries.sql"], ["sql.py"], SHARED),
    ],
    ids=["sqlite", "postgres", "shared"],
)
def test_every_named_query_is_used_and_every_used_name_exists(
    files: list[str], modules: list[str], targets: tuple[str, ...]
) -> None:
    defined = {name for f in files for name in parse_queries((STORES / f).read_text(), f)}
    used = {name for m in modules for name in _names_used(STORES / m, targets)}

    assert used == defined


# A JOIN LATERAL names no table: the FROM inside its subquery does.
TABLE = re.compile(
    r"\b(?:(?<!epoch )FROM|INTO|(?<!DO )UPDATE|JOIN(?!\s+LATERAL)|TABLE(?: IF NOT EXISTS)?)\s+([^\s(]+)"
)


@pytest.mark.parametrize("file", ["queries.sql", "postgres/queries.sql"])
def test_every_statement_names_its_schema(file: str) -> None:
    # No statement may rely on the session's search_path (a pooler may hand
    # out any connection): every table and function is written {s}.name.
    found = parse_queries((STORES / file).read_text(), file)
    for name, statement in found.items():
        named = TABLE.findall(statement) + re.findall(r"SELECT (\S+)\(", statement)
        # A WITH query's own names (``due AS (…)``, ``r(job) AS (…)``) are no tables.
        ctes = set(re.findall(r"(?:WITH(?: RECURSIVE)?|,)\s*(\w+)(?:\([^)]*\))?\s+AS\s*\(", statement))
        builtin = {
            "set_config",
            "pg_advisory_xact_lock",
            "count",
            "min",
            "max",
            "sum",
            "coalesce",
            "unnest",
            "jsonb_each_text",
        }
        named = [t.rstrip("),;") for t in named]
        unqualified = [t for t in named if not t.startswith("{s}.") and t not in builtin | ctes]
        assert unqualified == [], name
    assert sum("{s}." in statement for statement in found.values()) > len(found) / 2


def _selected(statement: str) -> list[str]:
    """The columns a SELECT lists, without table aliases."""
    listed = statement.split("SELECT", 1)[1].split("FROM", 1)[0]
    return [c.strip().split(".")[-1] for c in listed.split(",")]


def _all_queries() -> dict[tuple[str, str], str]:
    files = ["queries.sql", "sqlite/queries.sql", "postgres/queries.sql"]
    return {(f, n): q for f in files for n, q in parse_queries((STORES / f).read_text(), f).items()}


@pytest.mark.parametrize(
    ("names", "columns"),
    [
        (["runs", "run", "open_runs", "open_runs_of_job"], sql.RUN_COLUMNS),
        (["events", "undelivered"], sql.EVENT_COLUMNS),
        (["jobs", "job"], sql.JOB_COLUMNS),
    ],
    ids=["runs", "events", "jobs"],
)
def test_every_read_lists_the_columns_in_the_order_its_record_is_built_from(
    names: list[str], columns: tuple[str, ...]
) -> None:
    reads = {key: q for key, q in _all_queries().items() if key[1] in names and q.startswith("SELECT ")}
    for key, statement in reads.items():
        if _selected(statement) == ["*"]:  # a function's result: its RETURNS TABLE says the order
            continue
        assert tuple(_selected(statement)[: len(columns)]) == columns, key
    assert len(reads) >= len(names)


def test_save_job_writes_the_columns_in_jobinfo_order() -> None:
    statement = parse_queries((STORES / "queries.sql").read_text(), "queries.sql")["save_job"]
    listed = statement.split("(", 1)[1].split(")", 1)[0]

    assert tuple(c.strip() for c in listed.split(",")) == sql.JOB_COLUMNS
