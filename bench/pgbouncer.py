"""The PostgreSQL store's guarded cycle (``acquire`` + ``finish``) through a
PgBouncer in transaction mode against the same cycle direct, in interleaved
rounds on the same server: the latency a pooler adds, as a ratio.

The PgBouncer is a private one (Debian's ``pgbouncer``), started on a port
of its own in front of ``$CRONWARDEN_TEST_POSTGRES`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and stopped by its pid.

    python bench/pgbouncer.py            # about 30 s
    python bench/pgbouncer.py --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.pgbouncer import pgbouncer, why_not

from cronwarden.events import (
    Outcome,
    new_id,
)
from cronwarden.stores import open_store
from cronwarden.stores.base import End, Granted, Start, Store

POSTGRES = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def cycle(store: Store) -> float:
    t = time.perf_counter()
    s = Start(
        job="bench", key="bench", run_id=new_id(), host="bench", pid=os.getpid(), ttl=30.0, at=time.time()
    )
    result = store.acquire(s)
    assert isinstance(result, Granted), result
    store.finish(result.lease, End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0))
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    why = why_not()
    if why is not None:
        print(f"cannot run: {why}")
        return 2
    rounds, per_round = (5, 20) if args.quick else (20, 50)
    schema = f"cw_bench_{uuid.uuid4().hex[:10]}"
    sep = "&" if "?" in POSTGRES else "?"
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with pgbouncer(POSTGRES) as bouncer:
        direct = open_store(f"{POSTGRES}{sep}schema={schema}")
        pooled = open_store(bouncer.url(schema=schema))
        try:
            times: dict[str, list[float]] = {"direct": [], "pgbouncer": []}
            for r in range(rounds):
                order = [("direct", direct), ("pgbouncer", pooled)]
                for name, store in order if r % 2 == 0 else order[::-1]:
                    times[name] += [cycle(store) for _ in range(per_round)]
        finally:
            direct.close()
            pooled.close()
            import psycopg

            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    d, p = statistics.median(times["direct"]), statistics.median(times["pgbouncer"])
    print(f"acquire+finish, median of {len(times['direct'])} each: direct {d * 1e3:.2f} ms, "
          f"through PgBouncer (transaction mode) {p * 1e3:.2f} ms: ratio {p / d:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
