# ruff: noqa  (a scratch prototype, kept with the numbers it printed: notes.txt)
"""The finish script's parts on Redis: each in an EVAL loop of 1,000, time per operation."""

import json
import time

import redis

r = redis.Redis()
ent = [[1796266115.1668327 + i * 10, 1796266117.1668327 + i * 10, "succeeded", 0] for i in range(50)]
w = json.dumps(ent)
d = json.dumps(sorted([1.5 + i % 5 + 0.123456789 for i in range(50)]))
pf = json.dumps(
    {
        "starts": [e[0] for e in ent],
        "ends": [e[1] for e in ent],
        "results": [e[2] for e in ent],
        "flags": [e[3] for e in ent],
    }
)
tests = {
    "decode_win": "local x for i=1,1000 do x = cjson.decode(ARGV[1]) end return 0",
    "decode_durs": "local x for i=1,1000 do x = cjson.decode(ARGV[2]) end return 0",
    "encode_durs": "local d = cjson.decode(ARGV[2]) local x for i=1,1000 do local p = {} for j, v in ipairs(d) do p[j] = string.format('%.17g', v) end x = '[' .. table.concat(p, ',') .. ']' end return 0",
    "fmt1": "local x for i=1,1000 do x = string.format('%.17g', 1796266115.1668327 + i) end return 0",
    "decode_perfield": "local x for i=1,1000 do x = cjson.decode(ARGV[3]) end return 0",
}
for k, src in tests.items():
    sha = r.script_load(src)
    r.evalsha(sha, 0, w, d, pf)
    b = time.perf_counter()
    for _ in range(3):
        r.evalsha(sha, 0, w, d, pf)
    print(f"{k:<16} {(time.perf_counter() - b) / 3 / 1000 * 1e6:.2f} us per op")
