# ruff: noqa  (a scratch prototype, kept with the numbers it printed: notes.txt)
import sys, time, uuid

sys.path.insert(0, "/work/wt-rollup/bench")
import psycopg, audit
from cronwarden.events import Outcome, new_id
from cronwarden.policy import Policy
from cronwarden.stores import open_store
from cronwarden.stores.base import End, Start

schema = f"cw_proto_{uuid.uuid4().hex[:10]}"
try:
    store = open_store(f"{audit.POSTGRES_URL}?schema={schema}")
    t = time.time() - 86400
    for n in range(60):
        g = store.acquire(
            Start("bench", "bench", new_id(), "bench", 1, 60, t + n * 10 + n * 0.123456789, Policy.SKIP)
        )
        store.finish(
            g.lease,
            End(
                Outcome.SUCCEEDED if n % 7 else Outcome.FAILED, t + n * 10 + 1.5 + n % 5 + n * 0.1234567891, 0
            ),
        )
    store.close()
    with psycopg.connect(audit.POSTGRES_URL, autocommit=True) as conn:
        cols = [
            "outcomes",
            "skip_times",
            "w_outcomes",
            "w_durations",
            "attempts",
            "w_starts",
            "w_ends",
            "w_results",
            "w_flags",
            "w_sorted",
        ]
        row = conn.execute(
            "SELECT pg_column_size(r.*), "
            + ", ".join(f"pg_column_size({c}), octet_length({c}::text)" for c in cols)
            + f' FROM "{schema}".rollups r'
        ).fetchone()
        print("row", row[0])
        for i, c in enumerate(cols):
            print(f"{c:<12} stored {row[1 + 2 * i]:>5}  text {row[2 + 2 * i]:>5}")
        print(
            conn.execute(
                f"SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = '\"{schema}\".rollups'::regclass"
            ).fetchone()
        )
finally:
    audit._drop_schema(schema)
