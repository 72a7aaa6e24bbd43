"""Would a leaner Redis key layout meet issue 3's full-cycle target (<= 1.3x)?

A prototype of the layout session 4 proposed, measured against the same
floor as ``redis_lease.py`` (raw ``SET NX PX`` + Lua compare-and-delete) and
the minimal ledger, in interleaved rounds. It is not the store: it keeps
what a run needs and nothing more, so it is the best such a layout could do.

- acquire, one script: ``HMGET`` of the lease hash, ``PTTL`` of the live key
  when it names an owner, ``TIME``, ``SET PX`` of the live key, one ``HSET``
  of the lease hash (owner, token, server id, expiry, the run's start as one
  JSON field), ``HSET`` of the open-runs hash, and the ``started`` event as
  one ``XADD`` to the job's stream (``MAXLEN ~``: the stream is the event
  index, the outbox's order and its own retention). The event's JSON is
  built by the client; the script only puts the token in.
- finish, one script: ``HMGET`` of the lease hash, ``HDEL`` of its owner,
  ``HDEL`` of the open run, ``HSET`` of the finished run record, ``XADD`` of
  the terminal event.

Seven calls and five, against the store's nine and nine (see bench/README,
"Session 5"). The clients are redis-py's ``Script`` for all three rows, as
the floor's is.

    python bench/redis_lean_layout.py            # about 30 s
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid

from comparison import Candidate, interleave, print_footer, print_header, print_table, rows
from redis_lease import FULL, REDIS_URL, TTL_MS, Floor, MinimalLedger, cleanup

LEAN_ACQUIRE = """
local h = redis.call('HMGET', KEYS[1], 'owner', 'token', 'srv')
if h[1] and redis.call('PTTL', KEYS[2]) ~= -2 then return false end
local t = redis.call('TIME')
local ts = string.format('%d', tonumber(h[2] or '0') + 1)
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', ts, 'srv', ARGV[3], 'exp', t[1], 'run', ARGV[4])
redis.call('HSET', KEYS[3], ARGV[1], KEYS[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '10000', '*', 'e', ARGV[5] .. ts .. ARGV[6])
return ts
"""

LEAN_FINISH = """
local h = redis.call('HMGET', KEYS[1], 'owner', 'run')
if h[1] ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'owner')
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[5], ARGV[1], h[2] .. ARGV[2])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '10000', '*', 'e', ARGV[3])
return 1
"""


class LeanLayout:
    def __init__(self, prefix: str, server: str = REDIS_URL) -> None:
        import redis

        self.client = redis.Redis.from_url(server)
        self.acquire = self.client.register_script(LEAN_ACQUIRE)
        self.finish = self.client.register_script(LEAN_FINISH)
        p = f"{prefix}lean:"
        self.acquire_keys = [p + "lease:j", p + "live:j", p + "open", p + "ev:j"]
        self.finish_keys = [*self.acquire_keys, p + "runs"]

    def cycle(self) -> None:
        run_id, at = str(uuid.uuid4()), time.time()
        start = json.dumps({"job": "j", "host": "h", "pid": os.getpid(), "started_at": at, "slot": None})
        head = f'{{"i":"{uuid.uuid4()}","k":"started","j":"j","r":"{run_id}","a":{at!r},"d":{{"token":'
        token = self.acquire(
            keys=self.acquire_keys, args=[run_id, TTL_MS, "srv", start, head, ',"key":"j"}}']
        )
        assert token, "lean layout lease refused: another holder?"
        ended = time.time()
        ending = f',"outcome":"succeeded","ended_at":{ended!r},"exit_code":0,"detail":""}}'
        event = (
            f'{{"i":"{uuid.uuid4()}","k":"succeeded","j":"j","r":"{run_id}","a":{ended!r},'
            f'"d":{{"exit_code":0,"token":{int(token)}}}}}'
        )
        self.finish(keys=self.finish_keys, args=[run_id, ending, event])

    def close(self) -> None:
        self.client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    prefix = f"cw-bench-lean-{uuid.uuid4().hex[:8]}:"
    print_header(f"Redis ({REDIS_URL}): a lean key layout's full cycle vs the raw floor")
    floor, minimal, lean = Floor(prefix), MinimalLedger(prefix), LeanLayout(prefix)
    try:
        cands = [
            Candidate("ref: minimal ledger, 2 Lua calls", minimal.cycle, note="(the least a ledger costs)"),
            Candidate("lean layout prototype: 7 + 5 calls, XADD per event", lean.cycle, target=FULL),
        ]
        base = Candidate("(a) floor: SET NX PX + Lua compare-and-delete", floor.cycle)
        started = time.monotonic()
        n = interleave(base, cands, min_rounds=30, budget=args.seconds)
        print_table("uncontended: one acquire+release cycle on a kept connection", rows(base, cands))
        print_footer(n, started)
    finally:
        cleanup(prefix)
        lean.close()
        minimal.close()


if __name__ == "__main__":
    main()
