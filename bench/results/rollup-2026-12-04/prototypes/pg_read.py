# ruff: noqa  (a scratch prototype)
"""PostgreSQL: Store.rollups() and Monitor.audit() at 2,000 jobs with w_sorted filled (after) and
emptied (the row as wide as before migration 19), interleaved, median of 15 each."""

import statistics, sys, time, uuid

sys.path.insert(0, "/work/wt-rollup/bench")
import psycopg
import audit, rollup as rb
from cronwarden.monitor import Monitor
from cronwarden.stores import open_store

schema = f"cw_proto_{uuid.uuid4().hex[:10]}"
url = f"{audit.POSTGRES_URL}?schema={schema}"
try:
    open_store(url).close()
    rb._pg_set_triggers(schema, False)
    audit._postgres_fill(url, schema, 2000, 60, time.time())
    rb._pg_set_triggers(schema, True)
    store = open_store(url)
    store.rebuild_rollups()
    full = {}
    with psycopg.connect(audit.POSTGRES_URL, autocommit=True) as conn:
        for job, ws in conn.execute(f'SELECT job, w_sorted FROM "{schema}".rollups'):
            full[job] = ws
        print("w_sorted elements, mean:", sum(len(v) for v in full.values()) / len(full))
        res = {"after (w_sorted filled)": ([], []), "before width (w_sorted empty)": ([], [])}
        monitor = Monitor(store)
        for i in range(15):
            for name in res:
                if name.startswith("before"):
                    conn.execute(f"UPDATE \"{schema}\".rollups SET w_sorted = '{{}}'")
                else:
                    conn.execute(
                        f"UPDATE \"{schema}\".rollups r SET w_sorted = x.w FROM (SELECT job, coalesce((SELECT array_agg(e - s ORDER BY e - s) FROM unnest(w_starts, w_ends, w_results) t(s, e, o) WHERE o IN ('succeeded', 'failed', 'timed_out')), '{{}}') AS w FROM \"{schema}\".rollups) x WHERE x.job = r.job"
                    )
                conn.execute(f'VACUUM "{schema}".rollups')
                b = time.perf_counter()
                store.rollups()
                res[name][0].append(time.perf_counter() - b)
                b = time.perf_counter()
                monitor.audit()
                res[name][1].append(time.perf_counter() - b)
        for name, (r, a) in res.items():
            print(
                f"{name:<32} rollups() {statistics.median(r) * 1000:.1f} ms   audit() {statistics.median(a) * 1000:.1f} ms"
            )
    store.close()
finally:
    audit._drop_schema(schema)
