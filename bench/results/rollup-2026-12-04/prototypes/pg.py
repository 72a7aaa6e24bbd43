# ruff: noqa  (a scratch prototype, kept with the numbers it printed: notes.txt)
import statistics
import sys
import time
import uuid

sys.path.insert(0, "/work/wt-rollup/bench")
import psycopg

import audit
import rollup as rb
from cronwarden.events import Outcome, new_id
from cronwarden.policy import Policy
from cronwarden.stores import open_store
from cronwarden.stores.base import End, Start


def make(mode):
    if mode in ("on", "off", "counter"):
        return rb._end_store("postgres", "/tmp", mode)
    schema = f"cw_proto_{uuid.uuid4().hex[:10]}"
    store = open_store(f"{audit.POSTGRES_URL}?schema={schema}")
    s = f'"{schema}"'
    sql = open(mode).read().replace("{s}", s)
    with psycopg.connect(audit.POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql)
    return store, lambda: audit._drop_schema(schema)


modes = sys.argv[1].split(",")
ends, rounds = int(sys.argv[2]), int(sys.argv[3])
stores = []
took = [[] for _ in modes]
t = time.time() - 86400
try:
    for m in modes:
        stores.append(make(m))
    for n in range(60 + ends * rounds):
        for i in range(len(modes)):
            k = (n + i) % len(modes)
            store = stores[k][0]
            g = store.acquire(Start("bench", "bench", new_id(), "bench", 1, 60, t + n * 10, Policy.SKIP))
            end = End(Outcome.SUCCEEDED if n % 7 else Outcome.FAILED, t + n * 10 + 1.5 + n % 5, 0)
            b = time.perf_counter()
            store.finish(g.lease, end)
            if n >= 60:
                took[k].append(time.perf_counter() - b)
    off = statistics.median(took[modes.index("off")])
    for m, x in zip(modes, took, strict=False):
        print(f"{m:<30} {statistics.median(x) * 1000:.3f} ms x{statistics.median(x) / off:.2f}")
    print(stores[0][0].rollups()["bench"].p95)
    with psycopg.connect(audit.POSTGRES_URL, autocommit=True) as conn:
        for st, m in zip(stores, modes, strict=False):
            sch = st[0]._schema if hasattr(st[0], "_schema") else None
            print(m, sch)
finally:
    for s, c in stores:
        s.close()
        c()
