"""The house's layering, read from the source: no import cycle anywhere in
``src/cronwarden``, and the library never imports the command line (the
dashboard, the monitor and the stores are usable without it).

Every import statement counts, at module level or inside a function (a lazy
import is still a dependency), except those of the package's own face
(``cronwarden/__init__.py``, which only names the public API for type
checkers and loads it by name on first use)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "cronwarden"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    found = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The package's modules that ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".rstrip(".")
            # ``from a import b`` imports module ``a.b`` when there is one, else names of ``a``.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            if target in known and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: set() if name == PACKAGE else set(imported(name, path, known)) for name, path in known.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_sees_the_package() -> None:
    edges = graph()
    # A reader that found no imports would pass every test below: check it reads them.
    assert "cronwarden.stores.base" in edges["cronwarden.guard"]
    assert "cronwarden.cli.args" in edges["cronwarden.cli.run"]


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package() -> None:
    assert cycles(graph()) == []


def test_the_library_imports_nothing_from_the_command_line() -> None:
    edges = graph()
    library = [m for m in edges if m != "cronwarden.__main__" and not m.startswith("cronwarden.cli")]
    assert {"cronwarden.web.dashboard", "cronwarden.monitor", "cronwarden.scheduler"} <= set(library)
    offending = {m: sorted(t for t in edges[m] if t.startswith("cronwarden.cli")) for m in library}
    assert {m: t for m, t in offending.items() if t} == {}
