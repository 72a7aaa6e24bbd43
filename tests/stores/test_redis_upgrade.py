"""A Redis ledger written by the store as it was before its scripts moved
into files (commit 6a799f1: lean scripts beside general ones, the lease hash
carrying ``rec``/``hold``/``recfor`` for them), read and used by today's
store on the same prefix: the key layout is the same, so there is nothing to
migrate, and this is what holds it to that.

The earlier store is its module's source at that commit (``git show``),
loaded as a module of its own beside today's; both use today's rest of the
package. Every key is under a unique prefix on the shared server, deleted
afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cronwarden.events import Event, EventKind, Outcome
from cronwarden.policy import Policy
from cronwarden.stores import open_store
from cronwarden.stores.base import End, EventQuery, Granted, Refusal, Refused, Start, Store

redis = pytest.importorskip("redis")

pytestmark = pytest.mark.redis

SHARED = os.environ.get("CRONWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")
EARLIER = "6a799f1"
ROOT = Path(__file__).resolve().parents[2]
LONG_TTL = 60.0
HOSTILE = 'a "quoted" \\ host/1'


def unavailable(reason: str) -> None:
    if os.environ.get("CRONWARDEN_REQUIRE_BACKENDS", "") == "1":
        pytest.fail(f"{reason} (CRONWARDEN_REQUIRE_BACKENDS=1)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """``cronwarden/stores/redis.py`` as it was at ``EARLIER``."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{EARLIER}:src/cronwarden/stores/redis.py"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        unavailable(f"the store at {EARLIER} is not in this checkout's history: {done.stderr.strip()}")
    name = f"redis_store_{EARLIER}"
    path = tmp_path_factory.mktemp("earlier") / f"{name}.py"
    path.write_text(done.stdout)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    # The earlier store predates contract steps added since (the dead
    # letters); it is only asked for what it had, so it may be instantiated.
    module.RedisStore.__abstractmethods__ = frozenset()
    return module


@pytest.fixture
def prefix() -> Iterator[str]:
    unique = f"cw_upgrade_{uuid.uuid4().hex[:12]}:"
    client = redis.Redis.from_url(SHARED, socket_timeout=3, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.exceptions.RedisError as e:
        client.close()
        unavailable(f"shared Redis at {SHARED} not reachable: {e}")
    try:
        yield unique
    finally:
        keys = list(client.scan_iter(match=f"{unique}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


def url(prefix: str, *params: str) -> str:
    return "&".join([f"{SHARED}?prefix={prefix}", *params])


def start(job: str, *, ttl: float = LONG_TTL, policy: Policy = Policy.SKIP, key: str | None = None) -> Start:
    return Start(job=job, key=key or job, run_id=str(uuid.uuid4()), host="upgrade-host", pid=os.getpid(),
                 ttl=ttl, at=time.time(), policy=policy)  # fmt: skip


def end(outcome: Outcome = Outcome.SUCCEEDED) -> End:
    return End(outcome=outcome, at=time.time(), exit_code=0)


def granted(result: Granted | Refused) -> Granted:
    assert isinstance(result, Granted), f"expected a grant, got {result}"
    return result


def wait_expired(store: Store, key: str) -> None:
    deadline = time.monotonic() + 10
    while (info := store.lease(key)) is not None and (info.expires_in or 0) > 0:
        assert time.monotonic() < deadline, f"lease {key} did not expire"
        time.sleep(0.02)


def test_a_ledger_written_by_the_earlier_store_is_read_and_used_as_it_was(
    earlier: ModuleType, prefix: str
) -> None:
    with earlier.RedisStore.from_url(url(prefix)) as old:
        # Finished runs, by the lean scripts and by the general ones.
        done = granted(old.acquire(start("done"))).lease
        old.finish(done, end())
        failed = granted(old.acquire(start("done")._replace(policy=Policy.REPLACE))).lease
        old.finish(failed, End(outcome=Outcome.FAILED, at=time.time(), exit_code=3, detail='é "x"'))
        # A live lease, with a skip and a queued start against it.
        held = granted(old.acquire(start("held"))).lease
        assert isinstance(old.acquire(start("held")), Refused)
        assert isinstance(old.acquire(start("held", policy=Policy.QUEUE)), Refused)
        # A side lease of policy allow, still open.
        side = granted(old.acquire(start("held", policy=Policy.ALLOW))).lease
        # A run whose lease will have expired with no terminal record.
        ghost = granted(old.acquire(start("ghost", ttl=0.05))).lease
        # A run's event recorded on its own, and one for no run.
        old.record(Event(kind=EventKind.SLOW, job="held", at=time.time(), run_id=held.run_id))
        old.record(Event(kind=EventKind.SLOW, job="done", at=time.time(), data={"state": "raised"}))
        # A sink that acknowledged some events, not all; a slot claim; locks.
        assert old.undelivered("hook", 100, backfill=3600)
        old.mark_delivered("hook", [e.event_id for e in old.undelivered("hook", 3)])
        old_outbox = old.undelivered("hook", 100)
        assert old.claim_slot("held", 1_800_000_000.0, "scheduler-a", 3600) == "scheduler-a"
        old_lock = old.lock("leader", "a", LONG_TTL)
        assert old_lock is not None
        released = old.lock("released", "b", LONG_TTL)
        assert released is not None and old.unlock("released", "b")
        everything = old.events(EventQuery(limit=10_000, newest_first=False))
        old_runs = {job: old.runs(job, limit=100) for job in ("done", "held", "ghost")}
        old_open = old.open_runs()
        held_info, done_info = old.lease("held"), old.lease("done")
    client = redis.Redis.from_url(SHARED, decode_responses=True)
    assert client.hget(f"{prefix}lease:held", "rec"), "the premise: the earlier lease fields are there"

    with open_store(url(prefix)) as new:
        # The read side sees the same ledger.
        assert new.events(EventQuery(limit=10_000, newest_first=False)) == everything
        assert {job: new.runs(job, limit=100) for job in old_runs} == old_runs
        assert [r.run_id for r in new.open_runs()] == [r.run_id for r in old_open]
        now_held = new.lease("held")
        assert now_held is not None and held_info is not None and (now_held.expires_in or 0) > 0
        assert now_held._replace(expires_in=None) == held_info._replace(expires_in=None)
        assert new.lease("done") == done_info
        for run_id in {e.run_id for e in everything if e.run_id}:
            by_run = new.events(EventQuery(run_id=run_id, limit=100, newest_first=False))
            assert by_run == [e for e in everything if e.run_id == run_id], run_id
        # The outbox goes on where it was.
        assert new.undelivered("hook", 100) == old_outbox

        # A held lease stays held, by the run the earlier store granted it to.
        refused = new.acquire(start("held"))
        assert isinstance(refused, Refused) and refused.refusal is Refusal.SKIPPED
        assert (refused.holder.run_id, refused.holder.token) == (held.run_id, held.token)
        new.renew(held)
        # Its queued start is handed over with the next token, and both runs close.
        then = start("held", policy=Policy.QUEUE)
        handed = new.finish(held, end(), then=then)
        assert (handed.owned, handed.recorded) == (True, True)
        assert handed.next is not None and handed.next.token == held.token + 1
        assert new.finish(handed.next, end()).recorded
        assert new.finish(side, end()).recorded
        # Released by today's store: the earlier store's lease fields are gone.
        assert not {"rec", "hold", "recfor"} & set(client.hkeys(f"{prefix}lease:held"))
        # Tokens go on by one on a lease the earlier store released.
        again = granted(new.acquire(start("done"))).lease
        assert again.token == failed.token + 1
        new.finish(again, end())
        # The expired run is found abandoned by the next start.
        wait_expired(new, "ghost")
        taker = granted(new.acquire(start("ghost")))
        assert taker.abandoned == (ghost.run_id,) and taker.lease.token == ghost.token + 1
        assert new.finish(ghost, end()).recorded is False
        new.finish(taker.lease, end())
        # Slot claims and locks are kept; the lock counters go on by one.
        assert new.claim_slot("held", 1_800_000_000.0, "scheduler-b", 3600) == "scheduler-a"
        assert new.lock("leader", "c", LONG_TTL) is None
        assert new.renew_lock("leader", "a", LONG_TTL) and new.unlock("leader", "a")
        assert new.lock("leader", "c", LONG_TTL) == old_lock + 1
        assert new.lock("released", "d", LONG_TTL) == released + 1
        # Each start has exactly one terminal record.
        ended = {e.run_id for e in new.events(EventQuery(limit=10_000)) if e.kind.value in
                 ("succeeded", "failed", "abandoned")}  # fmt: skip
        started = {e.run_id for e in new.events(EventQuery(kinds=[EventKind.STARTED], limit=10_000))}
        assert started == ended and new.open_runs() == []
        # The outbox delivers what came since, once.
        fresh = new.undelivered("hook", 1000)
        assert [e.event_id for e in fresh[: len(old_outbox)]] == [e.event_id for e in old_outbox]
        new.mark_delivered("hook", [e.event_id for e in fresh])
        assert new.undelivered("hook", 1000) == []
    client.close()


def test_the_earlier_store_and_todays_share_a_prefix_during_an_upgrade(
    earlier: ModuleType, prefix: str
) -> None:
    """Hosts upgrade one by one: each store refuses, skips against and
    releases the other's leases correctly."""
    with earlier.RedisStore.from_url(url(prefix)) as old, open_store(url(prefix)) as new:
        mine = granted(new.acquire(start("shared"))).lease
        skipped = old.acquire(start("shared"))
        assert isinstance(skipped, Refused) and skipped.holder.run_id == mine.run_id
        assert (skipped.holder.token, skipped.holder.host) == (mine.token, "upgrade-host")
        assert new.finish(mine, end()).recorded
        theirs = granted(old.acquire(start("shared"))).lease
        assert theirs.token == mine.token + 1
        skipped_new = new.acquire(start("shared"))
        assert isinstance(skipped_new, Refused) and skipped_new.holder.run_id == theirs.run_id
        assert old.finish(theirs, end()).recorded
        back = granted(new.acquire(start("shared"))).lease
        assert back.token == theirs.token + 1
        new.finish(back, end())
        runs = new.runs("shared", limit=10)
        assert [r.run_id for r in runs] == [back.run_id, theirs.run_id, mine.run_id]
        assert all(r.outcome is Outcome.SUCCEEDED for r in runs)


def every_way(store: Any) -> None:
    """Runs that start and end every way a run's records are written, with the
    same run ids, times and hosts whatever the store."""
    t = 1_750_000_000.0

    def at(job: str, run_id: str, when: float, policy: Policy = Policy.SKIP, host: str = HOSTILE) -> Start:
        return Start(job=job, key=job, run_id=run_id, host=host, pid=7, ttl=LONG_TTL, at=t + when,
                     policy=policy, slot=t)  # fmt: skip

    def done(when: float) -> End:
        return End(outcome=Outcome.SUCCEEDED, at=t + when, exit_code=0)

    # A free lease, a skip against its holder, a failed end with a detail to escape.
    a = granted(store.acquire(at("plain", "a", 0))).lease
    assert isinstance(store.acquire(at("plain", "z", 2.5)), Refused)
    assert store.finish(a, End(outcome=Outcome.FAILED, at=t + 4, exit_code=3, detail='é "x" \n')).recorded
    # A lease granted for policy replace, skipped against and released.
    r = granted(store.acquire(at("replace", "r", 0, Policy.REPLACE))).lease
    assert isinstance(store.acquire(at("replace", "y", 1)), Refused)
    assert store.finish(r, done(5)).recorded
    # A queued start handed over (its start is linked by the run id index), then released.
    q = granted(store.acquire(at("queue", "q", 0))).lease
    waiting = at("queue", "w", 1, Policy.QUEUE)
    assert isinstance(store.acquire(waiting), Refused)
    handed = store.finish(q, done(6), then=waiting).next
    assert handed is not None and store.finish(handed, done(7)).recorded
    # The same run id granted twice, the second time with another host.
    g = granted(store.acquire(at("again", "g", 0))).lease
    assert store.finish(g, done(8)).recorded
    g2 = granted(store.acquire(at("again", "g", 10, Policy.QUEUE, host="second"))).lease
    skip = store.acquire(at("again", "x", 11))
    assert isinstance(skip, Refused) and skip.holder.token == g2.token and skip.holder.host == "second"
    assert store.finish(g2, done(12)).recorded
    # An overlap on a side lease, finished.
    o = granted(store.acquire(at("plain", "o", 13)))
    side = granted(store.acquire(at("plain", "s", 14, Policy.ALLOW))).lease
    assert store.finish(side, done(15)).recorded and store.finish(o.lease, done(16)).recorded


EARLIER_ONLY = {"rec", "hold", "recfor"}
"""Lease hash fields only the earlier store wrote (for its lean scripts)."""
TODAY_ONLY = {"sid"}
"""Lease hash fields only today's store writes (the retry check's event id)."""


def keyspace(prefix: str) -> dict[str, object]:
    """Every key under ``prefix``, comparable between two stores: JSON parsed,
    event ids and tokens replaced by their order, server clock times and the
    fields one store writes and the other does not left out."""
    client = redis.Redis.from_url(SHARED, decode_responses=True)
    raw: dict[str, object] = {}
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        kind = client.type(key)
        if kind == "hash":
            raw[key[len(prefix) :]] = client.hgetall(key)
        elif kind == "zset":
            raw[key[len(prefix) :]] = client.zrange(key, 0, -1)
        else:
            assert kind == "string", (key, kind)
            raw[key[len(prefix) :]] = client.get(key)
    client.close()
    text = json.dumps(raw, sort_keys=True)
    ids = {
        u: f"<id {i}>" for i, u in enumerate(dict.fromkeys(re.findall(r"[0-9a-f]{8}-[0-9a-f-]{27}", text)))
    }
    tokens = {tok: f"<token {i}>" for i, tok in enumerate(sorted(set(re.findall(r"\b1[0-9]{15}\b", text))))}
    skip = {"exp", "srv", *EARLIER_ONLY, *TODAY_ONLY}

    def plain(value: object) -> object:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if k not in skip}
        if isinstance(value, list):
            return [plain(v) for v in value]
        if isinstance(value, int) and str(value) in tokens:
            return tokens[str(value)]
        if isinstance(value, str):
            if value.startswith("{") and value.endswith("}"):
                return plain(json.loads(value))
            # cjson writes "/" as "\\/", json.dumps as "/"
            value = value.replace("\\/", "/")
            for old, new in (*ids.items(), *tokens.items()):
                value = value.replace(old, new)
        return value

    return {k: plain(v) for k, v in raw.items()}


def test_todays_store_writes_what_the_earlier_store_wrote(earlier: ModuleType, prefix: str) -> None:
    """The same steps through both stores: every key under the two prefixes is
    the same (records parsed, ids and tokens by order), but for the lease hash
    fields each writes for itself."""
    with earlier.RedisStore.from_url(url(prefix + "old:")) as old, open_store(url(prefix + "new:")) as new:
        every_way(old)
        every_way(new)
    client = redis.Redis.from_url(SHARED, decode_responses=True)
    fields = set(client.hkeys(f"{prefix}old:lease:again")), set(client.hkeys(f"{prefix}new:lease:again"))
    client.close()
    assert fields[0] - fields[1] == EARLIER_ONLY
    assert fields[1] - fields[0] == TODAY_ONLY
    # Today's store also keeps each job's rollup (keys of its own, new since).
    today = keyspace(prefix + "new:")
    rollups = {k for k in today if k.startswith("rollup")}
    assert rollups == {"rollup", "rollup:d", "rollup:w"}
    assert keyspace(prefix + "old:") == {k: v for k, v in today.items() if k not in rollups}
