# ruff: noqa  (a scratch prototype, kept with the numbers it printed: notes.txt)
"""What computing the window's statistics when reading would cost: 2,000 jobs' windows decoded and folded in Python."""

import json
import random
import time

jobs = 2000
rings = [
    json.dumps(
        [[1.7e9 + random.random() * 1e6, 1.7e9 + random.random() * 1e6, "succeeded", 0] for _ in range(50)]
    )
    for _ in range(jobs)
]
durs = [json.dumps(sorted(random.random() * 500 for _ in range(50))) for _ in range(jobs)]
t = time.perf_counter()
json.loads("[" + ",".join(rings) + "]")
print("ring loads", time.perf_counter() - t)
t = time.perf_counter()
json.loads("[" + ",".join(durs) + "]")
print("durs loads", time.perf_counter() - t)
t = time.perf_counter()
for r in json.loads("[" + ",".join(rings) + "]"):
    d = sorted(e - s for s, e, o, f in r if o in ("succeeded", "failed", "timed_out"))
    outs = {}
    for e in r:
        outs[e[2]] = outs.get(e[2], 0) + 1
    mn = min(e[0] for e in r)
    fl = sum(e[3] for e in r)
print("ring full compute", time.perf_counter() - t)
