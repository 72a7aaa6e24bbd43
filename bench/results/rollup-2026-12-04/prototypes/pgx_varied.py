# ruff: noqa  (a scratch prototype, kept with the numbers it printed: notes.txt)
"""Server-side time of the end's trigger: EXPLAIN ANALYZE of the terminal UPDATE, rolled back."""

import re, statistics, sys, time, uuid

sys.path.insert(0, "/work/wt-rollup/bench")
import psycopg
from cronwarden.events import Outcome, new_id
from cronwarden.policy import Policy
from cronwarden.stores import open_store
from cronwarden.stores.base import End, Start
import audit

variants = sys.argv[1].split(",")
reps = int(sys.argv[2])
schemas = []
try:
    for v in variants:
        schema = f"cw_proto_{uuid.uuid4().hex[:10]}"
        schemas.append(schema)
        store = open_store(f"{audit.POSTGRES_URL}?schema={schema}")
        with psycopg.connect(audit.POSTGRES_URL, autocommit=True) as conn:
            if v != "on":
                conn.execute(open(v).read().replace("{s}", f'"{schema}"'))
        t = time.time() - 86400
        for n in range(60):
            g = store.acquire(
                Start("bench", "bench", new_id(), "bench", 1, 60, t + n * 10 + n / 3.0, Policy.SKIP)
            )
            store.finish(
                g.lease,
                End(
                    Outcome.SUCCEEDED if n % 7 else Outcome.FAILED,
                    t + n * 10 + 1.5 + (n * 7919 % 1000) / 7.0,
                    0,
                ),
            )
        store.close()
    res = {v: [] for v in variants}
    with psycopg.connect(audit.POSTGRES_URL, autocommit=True) as conn:
        for i in range(reps):
            for v, schema in zip(variants, schemas):
                s = f'"{schema}"'
                with conn.transaction(force_rollback=True):
                    conn.execute(
                        f"INSERT INTO {s}.runs (run_id, job, key, host, pid, token, started_at) VALUES ('x', 'bench', 'bench', 'h', 1, 1, %s)",
                        (time.time(),),
                    )
                    plan = conn.execute(
                        f"EXPLAIN (ANALYZE, FORMAT TEXT) UPDATE {s}.runs SET outcome = 'succeeded', ended_at = %s WHERE run_id = 'x'",
                        (time.time() + 2.5,),
                    ).fetchall()
                    txt = "\n".join(r[0] for r in plan)
                    m = re.search(r"Trigger rollup_(?:end|floor|x): time=([\d.]+)", txt)
                    res[v].append(float(m.group(1)))
    for v in variants:
        print(
            f"{v:<30} trigger median {statistics.median(res[v]) * 1000:.0f} us  min {min(res[v]) * 1000:.0f} us"
        )
finally:
    for schema in schemas:
        audit._drop_schema(schema)
