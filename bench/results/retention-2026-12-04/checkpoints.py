"""Which calls of a retention run on SQLite ran a WAL checkpoint, and what
they cost: the wal-index's backfill count (the ``-shm`` file, offset 96)
read before and after each call; each prune step's CPU time too.

    python bench/results/retention-2026-12-04/checkpoints.py DAYS EVERY [base|checkpoint-each-step]

``checkpoint-each-step``: a ``PRAGMA wal_checkpoint(PASSIVE)`` after each
prune step (the variant tried and not kept)."""

from __future__ import annotations

import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))

import retention as R
from cronwarden.stores import open_store
from cronwarden.stores.base import PRUNE_BUDGET
from cronwarden.stores.sqlite import SqliteStore


def main() -> None:
    days, every = int(sys.argv[1]), float(sys.argv[2])
    variant = sys.argv[3] if len(sys.argv) > 3 else "base"
    if variant == "checkpoint-each-step":
        step_alone = SqliteStore._prune_step

        def with_checkpoint(self: SqliteStore, job: str, bound: float, limit: int) -> tuple[int, int, int]:
            done = step_alone(self, job, bound, limit)
            with self._lock:
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            return done

        SqliteStore._prune_step = with_checkpoint  # type: ignore[method-assign]
    path = f"{tempfile.mkdtemp(prefix='cw-ckpt-')}/ledger.db"
    store = open_store(f"sqlite:///{path}?synchronous=normal")
    shm = os.open(path + "-shm", os.O_RDONLY)

    def backfill() -> int:
        return int(struct.unpack("=I", os.pread(shm, 4, 96))[0])

    t0 = time.time() - days * R.DAY
    per_day = int(R.DAY // every)
    calls: dict[tuple[str, bool], list[float]] = {
        (k, c): [] for k in ("step", "cycle") for c in (False, True)
    }
    cpu: list[float] = []
    for day in range(days):
        base = t0 + day * R.DAY
        for k in range(per_day):
            for j in range(10):
                before = backfill()
                took = R._cycle(store, f"job{j}", base + k * every)
                after = backfill()
                calls["cycle", after != before and after > 0].append(took)
        while True:
            before, began, cpu0 = backfill(), time.perf_counter(), time.thread_time()
            step = store.prune(R.RETENTION, base + R.DAY, budget=PRUNE_BUDGET)
            took, after = time.perf_counter() - began, backfill()
            cpu.append(time.thread_time() - cpu0)
            calls["step", after != before and after > 0].append(took)
            if step.done or not (step.events or step.runs):
                break
    print(f"{days} days every {every:g}s, 10 jobs, variant {variant}")
    print(f"step CPU: median {1000 * statistics.median(cpu):.2f} p99 {1000 * R._p99(cpu):.2f} "
          f"max {1000 * max(cpu):.2f} ms")  # fmt: skip
    for (kind, ran), xs in calls.items():
        if xs:
            print(f"{kind:5} checkpoint={'yes' if ran else 'no ':3} n={len(xs):>8,}  median "
                  f"{1000 * statistics.median(xs):7.2f}  p99 {1000 * R._p99(xs):7.2f}  "
                  f"max {1000 * max(xs):7.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
