"""How the Redis store writes values into keys and reads them back: times as
order-preserving hex, run and event records as JSON."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

from cronwarden.events import Event, EventKind, Outcome, RunRecord


def ordhex(x: float) -> str:
    """``x`` as 16 hex digits whose string order is the numeric order, so a
    lexicographic index can hold times exactly."""
    (bits,) = struct.unpack(">Q", struct.pack(">d", x + 0.0))
    bits = bits ^ 0xFFFF_FFFF_FFFF_FFFF if bits >> 63 else bits | 1 << 63
    return f"{bits:016x}"


def unordhex(text: str) -> float:
    bits = int(text, 16)
    bits = bits ^ 1 << 63 if bits >> 63 else bits ^ 0xFFFF_FFFF_FFFF_FFFF
    value: float = struct.unpack(">d", struct.pack(">Q", bits))[0]
    return value


def ttl_ms(ttl: float) -> int:
    return max(1, round(ttl * 1000))


def ms(time_reply: tuple[int, int]) -> int:
    """Milliseconds of a ``TIME`` reply."""
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000


def expires_in(
    run_id: str, owner: str | None, exp: str | None, live: str | None, pttl: int, now_ms: int
) -> float | None:
    """Seconds left on ``run_id``'s lease; negative once it has expired, None
    when the lease is no longer this run's."""
    if owner != run_id:
        return None
    if live == owner and pttl >= 0:
        # PTTL rounds down: a key with 0 ms left is still live for up to a
        # millisecond, and must not read as expired.
        return max(pttl, 0.5) / 1000
    # Expired: the live key is gone, the hash remembers when.
    return min((int(exp) - now_ms) / 1000 if exp else -0.001, -0.001)


def finished_runs(records: Mapping[str, str]) -> dict[str, RunRecord]:
    """Finished runs by id from their records in ``P runs``, decoded in one ``json.loads``
    (at thousands of records, a call each costs more than the parsing)."""
    decoded = json.loads("[" + ",".join(records.values()) + "]")
    return {rid: finished_run_of(rid, rec) for rid, rec in zip(records, decoded, strict=True)}


def finished_run_of(run_id: str, rec: Mapping[str, Any]) -> RunRecord:
    """A finished run from its decoded record."""
    return RunRecord(
        run_id=run_id,
        job=rec["job"],
        key=rec["key"],
        host=rec["host"],
        pid=rec["pid"],
        token=rec["token"],
        slot=None if rec["slot"] is None else float(rec["slot"]),
        started_at=float(rec["started_at"]),
        ended_at=float(rec["ended_at"]),
        outcome=Outcome(rec["outcome"]),
        exit_code=rec["exit_code"],
        detail=rec["detail"],
    )


def event(seq: str, raw: str) -> Event:
    """An event from its record in ``P ev``."""
    rec = json.loads(raw)
    return Event(
        seq=int(seq),
        event_id=rec["i"],
        kind=EventKind(rec["k"]),
        job=rec["j"],
        run_id=rec["r"],
        at=float(rec["a"]),
        data=rec["d"],
    )
