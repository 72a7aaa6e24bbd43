"""The Redis store's guarded cycle against the same store at an earlier
commit, paired: both against the raw floor of ``redis_lease.py`` (``SET NX
PX`` + Lua compare-and-delete) in the same interleaved rounds, beside the
locks users already run (python-redis-lock, redis-py's ``Lock``). One run of
``redis_lease.py`` cannot tell a 0.1x change from its noise; this can.

The earlier store is ``src/cronwarden/stores/redis.py`` (a module) or
``src/cronwarden/stores/redis/`` (a package, with its ``.lua`` files) at
``--against``, taken with ``git`` and loaded under a name of its own beside
the current one; both use the current rest of the package, so only the store
differs.

    python bench/redis_ab.py --against 6a799f1        # about 60 s
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from comparison import Candidate, interleave, print_footer, print_header, print_table, rows
from redis_lease import REDIS_URL, TTL, Floor, Peers, cleanup

ROOT = Path(__file__).resolve().parent.parent
STORE = "src/cronwarden/stores/redis"


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def store_at(commit: str, url: str) -> Any:
    """``RedisStore.from_url(url)`` of the store as it was at ``commit``."""
    name = f"redis_store_{commit}"
    where = Path(tempfile.mkdtemp(prefix="cw-bench-ab-"))
    files = git("ls-tree", "-r", "--name-only", commit, "--", f"{STORE}.py", f"{STORE}/").split()
    if f"{STORE}.py" in files:
        path = where / f"{name}.py"
        path.write_text(git("show", f"{commit}:{STORE}.py"))
        spec = importlib.util.spec_from_file_location(name, path)
    else:
        package = where / name
        for file in files:
            target = package / Path(file).relative_to(STORE)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(git("show", f"{commit}:{file}"))
        spec = importlib.util.spec_from_file_location(name, package / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.RedisStore.from_url(url)


def cycle(store: Any) -> Any:
    from cronwarden.events import Outcome, new_id
    from cronwarden.stores.base import End, Granted, Start

    def op() -> None:
        start = Start(job="ab", key="ab", run_id=new_id(), host="bench", pid=1, ttl=TTL, at=time.time())
        granted = store.acquire(start)
        assert isinstance(granted, Granted), "lease refused: another holder?"
        store.finish(granted.lease, End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0))

    return op


def guard(store: Any) -> Any:
    from cronwarden.guard import Warden

    warden = Warden(store, quiet=True)

    def op() -> None:
        with warden.guard("ab-guard", ttl=TTL):
            pass

    return op


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, metavar="COMMIT", help="the earlier commit, e.g. 6a799f1")
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    from cronwarden.stores.redis import RedisStore

    prefix = f"cw-bench-ab-{uuid.uuid4().hex[:8]}:"
    print_header(f"Redis ({REDIS_URL}): the store's guarded cycle now and at {args.against}, paired")
    floor, peers = Floor(prefix), Peers(prefix)
    old = store_at(args.against, f"{REDIS_URL}?prefix={prefix}old:")
    new = RedisStore.from_url(f"{REDIS_URL}?prefix={prefix}new:")
    try:
        base = Candidate("floor: SET NX PX + Lua compare-and-delete", floor.cycle)
        cands = [
            *peers.candidates(),
            Candidate(f"store at {args.against}: acquire + finish", cycle(old)),
            Candidate("store now: acquire + finish", cycle(new)),
            Candidate(f"store at {args.against}: Warden.guard enter/exit", guard(old)),
            Candidate("store now: Warden.guard enter/exit", guard(new)),
        ]
        started = time.monotonic()
        n = interleave(base, cands, min_rounds=30, budget=args.seconds)
        print_table("one guarded cycle", rows(base, cands))
        print_footer(n, started)
    finally:
        cleanup(prefix)
        old.close()
        new.close()
        floor.close()
        peers.close()


if __name__ == "__main__":
    main()
