"""Old against new ``rollup_start`` on one PostgreSQL server, interleaved: two
schemas made by this tree's code, one with the start and refusal triggers'
functions of schema version 20 (commit 1009861) put back; the server's time
per call from ``pg_stat_user_functions`` (the server needs
``track_functions = pl``; the script resets its statistics).

    python bench/results/retention-year-2026-12-04/rollup_start_ab.py [CYCLES] [URL]
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))

import psycopg

from cronwarden.events import Outcome, new_id
from cronwarden.stores import open_store
from cronwarden.stores.base import End, Granted, Start

ROOT = Path(__file__).resolve().parents[3]
OLD = "1009861:src/cronwarden/stores/postgres/functions.sql"


def function(text: str, name: str) -> str:
    """One function's whole definition in ``text``, as a CREATE OR REPLACE."""
    begin = text.index(f"CREATE FUNCTION {{s}}.{name}()")
    end = text.index("END $$;", begin) + len("END $$;")
    return text[begin:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


def main() -> None:
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    base = sys.argv[2] if len(sys.argv) > 2 else "postgresql://postgres@127.0.0.1:27200/test"
    shown = subprocess.run(["git", "-C", str(ROOT), "show", OLD], check=True, capture_output=True, text=True)
    old_sql = shown.stdout
    tags = {k: f"cw_ab_{k}_{uuid.uuid4().hex[:6]}" for k in ("old", "new")}
    stores = {k: open_store(f"{base}?schema={t}") for k, t in tags.items()}
    with psycopg.connect(base, autocommit=True) as c:
        for name in ("rollup_start", "rollup_refusal"):
            c.execute(function(old_sql, name).replace("{s}", f'"{tags["old"]}"'))
        c.execute("SELECT pg_stat_reset()")
    t0 = time.time() - 10 * 86400
    for i in range(cycles):
        for k in ("old", "new") if i % 2 else ("new", "old"):
            job, at = f"job{i % 10}", t0 + i * 60
            start = Start(job=job, key=job, run_id=new_id(), host="ab", pid=1, ttl=60.0, at=at)
            granted = stores[k].acquire(start)
            assert isinstance(granted, Granted)
            stores[k].finish(granted.lease, End(Outcome.SUCCEEDED, at=at + 5, exit_code=0))
    for store in stores.values():
        store.close()
    time.sleep(1)  # the backends report their function statistics as they go idle
    with psycopg.connect(base, autocommit=True) as c:
        rows = c.execute(
            "SELECT schemaname, funcname, calls, self_time, total_time FROM pg_stat_user_functions "
            "WHERE schemaname LIKE 'cw_ab_%' ORDER BY 1, 2"
        ).fetchall()
        for t in tags.values():
            c.execute(f'DROP SCHEMA "{t}" CASCADE')
    which = {t: k for k, t in tags.items()}
    for schema, name, calls, self_ms, total_ms in rows:
        print(f"{which[schema]:4} {name:15} calls {calls:6}  self {1000 * self_ms / calls:7.1f} µs  "
              f"total {1000 * total_ms / calls:7.1f} µs")  # fmt: skip
    print("load", " ".join(Path("/proc/loadavg").read_text().split()[:3]))


if __name__ == "__main__":
    main()
