"""Plain-text output of the command line."""

from __future__ import annotations

from cronwarden.errors import printable


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell; every cell as ``printable``
    shows it (values from the store may hold a newline or an escape)."""
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)
