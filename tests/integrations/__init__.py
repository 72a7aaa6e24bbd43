"""The examples under ``examples/``, each run with its real framework as a
user would run it. Helpers shared by their tests live here."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_env(store_url: str, **more: str) -> dict[str, str]:
    """The environment of an example's process: this one's, without the
    tester's own ``CRONWARDEN_*`` settings, with the test's store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    env["CRONWARDEN_STORE"] = store_url
    env.update(more)
    return env


SPAN = re.compile(r"pid (\d+) \S+ .*?(\d+\.\d+)-(\d+\.\d+)")


def spans(output: str) -> list[tuple[float, float, int]]:
    """The ``pid N <did> <what> START-END`` lines examples print for each run
    that worked: (start, end, pid), in order of start."""
    found = [(float(m[2]), float(m[3]), int(m[1])) for m in SPAN.finditer(output)]
    return sorted(found)


def assert_never_concurrent(found: list[tuple[float, float, int]]) -> None:
    for (_s1, e1, p1), (s2, _e2, p2) in itertools.pairwise(found):
        assert s2 >= e1, f"pid {p2} started at {s2:.3f} while pid {p1} worked until {e1:.3f}"
