# ruff: noqa  (a scratch prototype, kept with the numbers it printed: notes.txt)
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, "/work/wt-rollup/bench")
import rollup as rb
from cronwarden.events import Outcome, new_id
from cronwarden.policy import Policy
from cronwarden.stores import open_store
from cronwarden.stores.base import End, Start


def variant(store, mode):
    scripts, client = store._scripts, store._client
    src = scripts.finish.script
    upkeep = "ROLLUPS = {KEYS[9], KEYS[10], KEYS[11]}"
    if mode == "off":
        src = src.replace(upkeep, "ROLLUPS = false")
    elif mode == "on":
        pass
    else:
        for a, b in MODS[mode]:
            assert a in src, (mode, a[:60])
            src = src.replace(a, b)
    scripts.finish = client.register_script(src)


MODS = {}
if os.environ.get("MODS"):
    exec(open(os.environ["MODS"]).read())


def main():
    modes = sys.argv[1].split(",")
    ends, rounds = int(sys.argv[2]), int(sys.argv[3])
    stores = []
    for m in modes:
        prefix = f"cw-proto-{uuid.uuid4().hex[:8]}:"
        s = open_store(f"{rb.REDIS_URL}?prefix={prefix}")
        variant(s, m)
        stores.append((s, prefix))
    took = [[] for _ in modes]
    t = time.time() - 86400
    try:
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
        r = stores[0][0]
        print(r.rollups()["bench"])
    finally:
        for s, p in stores:
            s.close()
            rb._redis_cleanup(p)


main()
