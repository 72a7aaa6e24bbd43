"""``cronwarden demo`` tells the seed incident truthfully: it runs real
processes, so its summary is measured, not printed from a script."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def test_demo_finds_duplicates_without_the_guard_and_none_with_it() -> None:
    result = subprocess.run([sys.executable, "-m", "cronwarden", "demo"], capture_output=True, text=True,
                            timeout=120, env={**os.environ})  # fmt: skip
    assert result.returncode == 0, result.stderr
    naive = re.search(r"plain cron:\s+10 starts, windows processed twice: (\d+)", result.stdout)
    guarded = re.search(r"cronwarden:\s+(\d+) runs, (\d+) skips recorded, windows processed twice: (\d+)",
                        result.stdout)  # fmt: skip
    assert naive and guarded, result.stdout
    assert int(naive.group(1)) >= 1
    runs, skips, twice = (int(g) for g in guarded.groups())
    assert twice == 0 and skips >= 1 and runs + skips == 10
    assert "temporary files removed" in result.stdout
