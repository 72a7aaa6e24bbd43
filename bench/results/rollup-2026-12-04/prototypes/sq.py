# ruff: noqa  (a scratch prototype, kept with the numbers it printed: notes.txt)
"""Prototype SQLite end triggers, timed as bench/rollup.py times ends."""

import os
import sqlite3
import statistics
import sys
import tempfile
import time

sys.path.insert(0, "/work/wt-rollup/bench")
import rollup as rb
from cronwarden.events import Outcome, new_id
from cronwarden.policy import Policy
from cronwarden.stores import open_store
from cronwarden.stores.base import End, Start

PROTOS = {}


def proto(name):
    def deco(f):
        PROTOS[name] = f
        return f

    return deco


@proto("counter_bigrow")
def _(db):
    db.execute(
        "INSERT INTO rollups (job, w_durations, attempts, skip_times) VALUES ('bench', ?, ?, ?)",
        (
            "[" + ",".join(f"{'%.17g' % (i * 1.37):>24}" for i in range(50)) + "]",
            "[" + ",".join(f"[{1.7e9 + i:.17g},{1.7e9 + i:.17g}]" for i in range(16)) + "]",
            "[]",
        ),
    )
    db.execute(
        "CREATE TRIGGER rollup_floor AFTER UPDATE OF outcome ON runs WHEN old.outcome IS NULL AND new.outcome IS NOT NULL "
        "BEGIN UPDATE rollups SET ended = ended + 1 WHERE job = new.job; END"
    )


@proto("ring_only")
def _(db):
    db.execute("INSERT INTO rollups (job) VALUES ('bench')")
    db.execute("""CREATE TRIGGER rollup_floor AFTER UPDATE OF outcome ON runs WHEN old.outcome IS NULL AND new.outcome IS NOT NULL
    BEGIN
    INSERT OR REPLACE INTO rollup_window (job, place, started_at, ended_at, outcome, flagged)
      SELECT new.job, r.ended % 51, new.started_at, new.ended_at, new.outcome, 0 FROM rollups r WHERE r.job = new.job;
    UPDATE rollups SET ended = ended + 1 WHERE job = new.job; END""")


def extra(path):
    sql = open(os.environ["PROTO_SQL"]).read() if os.environ.get("PROTO_SQL") else None
    return sql


def make(workdir, mode):
    if mode in ("on", "off", "counter"):
        path = os.path.join(workdir, f"ends-{mode}.db")
        store = open_store(f"sqlite:///{path}" + os.environ.get("Q", ""))
        if mode != "on":
            rb._sqlite_set_triggers(
                path, False, [s for s in rb._sqlite_triggers(path) if "rollup_end" in s.split()[2]]
            )
        if mode == "counter":
            PROTOS["counter_bigrow"].__globals__  # noqa
            db = sqlite3.connect(path, isolation_level=None)
            db.execute("INSERT INTO rollups (job) VALUES ('bench')")
            db.execute(
                "CREATE TRIGGER rollup_floor AFTER UPDATE OF outcome ON runs WHEN old.outcome IS NULL AND new.outcome IS NOT NULL "
                "BEGIN UPDATE rollups SET ended = ended + 1 WHERE job = new.job; END"
            )
            db.close()
        return store, lambda: None
    path = os.path.join(workdir, f"ends-{mode}.db")
    store = open_store(f"sqlite:///{path}" + os.environ.get("Q", ""))
    rb._sqlite_set_triggers(
        path, False, [s for s in rb._sqlite_triggers(path) if "rollup_end" in s.split()[2]]
    )
    db = sqlite3.connect(path, isolation_level=None)
    if mode in PROTOS:
        PROTOS[mode](db)
    else:
        db.executescript(open(mode).read())
    db.close()
    return store, lambda: None


def main():
    modes = sys.argv[1].split(",")
    ends, rounds = int(sys.argv[2]), int(sys.argv[3])
    with tempfile.TemporaryDirectory() as wd:
        stores = [make(wd, m) for m in modes]
        took = [[] for _ in modes]
        t = time.time() - 86400
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
            print(f"{m:<40} {statistics.median(x) * 1000:.3f} ms x{statistics.median(x) / off:.2f}")
        for s, c in stores:
            s.close()
            c()


main()
