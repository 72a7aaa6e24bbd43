"""The store's Lua scripts: one ``.lua`` file per contract step, beside this
module, registered with redis-py (``Redis.register_script``).

A script's first line may name the shared parts it is built on, in order:
``-- with: limits, fence, ledger``. Each part but ``limits`` is a file
(``fence.lua``: the server's clock and identity and the fencing rule;
``ledger.lua``: the event writes and retention; ``outbox.lua``: the walk over
the records); ``limits`` is one line of retention constants the store writes
(``RUNS_MAX``, ``EVENTS_MAX``, …), so a store's limits are part of its
scripts' text, not an argument of every call. The parts are prepended to the
script, then the check of its keys' types (its ``-- types:`` line,
``TYPES``): one text, one SHA1, loaded by the server as one script.

The files are read once per process, when the first store is opened.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

HERE = Path(__file__).parent
WITH = "-- with:"
TYPES = "-- types:"
"""A script's second line (or first, without parts): the Redis type of each
of its KEYS in order (``hash string zset``; a last ``...`` repeats the list),
checked before the script writes anything (``types.lua``)."""


class Limits(NamedTuple):
    """The retention constants the ledger scripts are written with. Trims go
    in batches so that most calls only count; a job's retention is checked
    every ``check`` events written, so each limit is exceeded by at most that
    many between checks (exact when a limit is below 16)."""

    runs_max: int
    events_max: int
    runs_batch: int
    events_batch: int
    check: int

    @classmethod
    def of(cls, runs_per_job: int, events_per_job: int) -> Limits:
        runs_batch, events_batch = min(32, runs_per_job // 8), min(32, events_per_job // 8)
        return cls(
            runs_per_job, events_per_job, runs_batch, events_batch, max(1, min(runs_batch, events_batch))
        )

    def lua(self) -> str:
        return (
            "local RUNS_MAX, EVENTS_MAX, RUNS_BATCH, EVENTS_BATCH, CHECK = "
            f"{self.runs_max}, {self.events_max}, {self.runs_batch}, {self.events_batch}, {self.check}"
        )


@cache
def source(name: str) -> str:
    """The text of ``name.lua``, read once per process."""
    return (HERE / f"{name}.lua").read_text(encoding="utf-8")


def text(name: str, limits: Limits) -> str:
    """Script ``name`` whole: its shared parts, the check of its keys' types
    (its ``-- types:`` line, ``types.lua``), then its own file."""
    own = source(name)
    header = own.split("\n", 2)[:2]
    first = header[0]
    parts = [p.strip() for p in first.removeprefix(WITH).split(",")] if first.startswith(WITH) else []
    check = []
    declared = next((line.removeprefix(TYPES) for line in header if line.startswith(TYPES)), None)
    if declared is not None:
        names = declared.split()
        cycle = names[-1:] == ["..."]
        listed = ", ".join(f"'{t}'" for t in names[: -1 if cycle else None])
        check = [source("types"), f"do local wrong = wrong_type({{{listed}}}, {str(cycle).lower()}) "
                 "if wrong then return redis.error_reply(wrong) end end"]  # fmt: skip
    return "\n".join([*(limits.lua() if p == "limits" else source(p) for p in parts), *check, own])


class Scripts:
    """Every script of the store, registered with ``client``. Calling one
    (``scripts.acquire(keys=…, args=…)``) sends ``EVALSHA``, and on
    ``NOSCRIPT`` (first use on a server, a restart, ``SCRIPT FLUSH``) loads
    it and sends it again: redis-py's ``Script``."""

    def __init__(self, client: redis.Redis, limits: Limits) -> None:
        def register(name: str) -> Script:
            return client.register_script(text(name, limits))

        self.acquire = register("acquire")
        self.finish = register("finish")
        self.renew = register("renew")
        self.renew_many = register("renew_many")
        self.record = register("record")
        self.request_stop = register("request_stop")
        self.undelivered = register("undelivered")
        self.mark_delivered = register("mark_delivered")
        self.reject = register("reject")
        self.forget_rejected = register("forget_rejected")
        self.lock = register("lock")
        self.renew_lock = register("renew_lock")
        self.unlock = register("unlock")
        self.claim_slot = register("claim_slot")
        self.save_rollup = register("save_rollup")
        self.prune = register("prune")
        self.settle = register("settle")
        self.newest = register("newest")
