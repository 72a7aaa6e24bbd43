"""Effects mode: the proof that the fencing helpers keep a frozen holder's late
writes out of the user's own databases.

A round is a chaos round (``chaos.harness.Round``: real ``cronwarden run``
processes on one job, the lease in any store) whose runs increment a counter
in a real PostgreSQL table and a real Redis hash by read–modify–write
(``chaos/effects_worker.py``), through ``cronwarden.fence``, instead of
writing to the referee. The faults are the frozen-holder ones
(``PAUSES``: whole-group SIGSTOP of supervisor and command, or of the
supervisor alone, for 2–3×ttl), each struck while the target run is between
its read and its write, so the hazard — a write based on a read that a
newer run has since overtaken — is set up in every injection.

Checked on what the databases hold at the end, per counter:

(a) in the order the increments were made (PostgreSQL: the records' serial;
    Redis: the value each set), the tokens never go down (judged with the
    token the lease store granted each run);
(b) each run's increments come in one block: no interleaving;
(c) no lost update: the counter equals the number of increments recorded,
    they set it to 1, 2, … N in order, and every write the database
    acknowledged to a worker is there as that worker wrote it.

With fencing, all three must hold and the frozen holder's writes after the
takeover must have raised ``Fenced``. Without it (the positive control, the
same round with the helpers bypassed) the frozen holder's thawed write lands
on top of the newer run's: (a)–(c) must find it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.faults import PAUSES, WORKER_FAULTS, Backend, Fault, SqliteBackend
from chaos.harness import Round, RoundConfig, RoundResult

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "effects_worker.py")
SQL = os.path.join(HERE, "effects.sql")
TARGETS = ("postgres", "redis")

POSTGRES_URL = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CRONWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")
"""The user's databases, and the lease stores on PostgreSQL and Redis: the
shared test servers, each round in its own schema and key prefix (effects
mode injects no store faults, so it needs no private server)."""


def _with(url: str, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


class SharedPostgres(Backend):
    """Leases on the shared PostgreSQL server, a schema per round."""

    name = "postgres"
    supports = WORKER_FAULTS

    def url(self, namespace: str) -> str:
        return _with(POSTGRES_URL, schema=namespace.replace("-", "_"))

    def forget(self, namespace: str) -> None:
        drop_schema(namespace.replace("-", "_"))


class SharedRedis(Backend):
    """Leases on the shared Redis server, a key prefix per round."""

    name = "redis"
    supports = WORKER_FAULTS

    def url(self, namespace: str) -> str:
        return _with(REDIS_URL, prefix=f"{namespace}:", runs_per_job="1000000", events_per_job="10000000")

    def forget(self, namespace: str) -> None:
        delete_prefix(f"{namespace}:")


def open_lease_backend(name: str) -> Backend:
    if name == "sqlite":
        return SqliteBackend()
    if name == "postgres":
        return SharedPostgres()
    if name == "redis":
        return SharedRedis()
    raise ValueError(f"unknown store {name!r}; expected sqlite, postgres or redis")


@contextlib.contextmanager
def lease_backend(name: str) -> Iterator[Backend]:
    b = open_lease_backend(name)
    try:
        yield b
    finally:
        b.close()


def _queries(conn: Any, schema: str) -> dict[str, str]:
    from psycopg import sql

    from cronwarden.stores.sql import queries

    quoted = sql.Identifier(schema).as_string(conn)
    return {k: v.replace("{schema}", quoted) for k, v in queries(SQL).items()}


def drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(_queries(conn, schema)["drop"].encode())


def delete_prefix(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_timeout=10)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


@dataclass
class EffectsResult(RoundResult):
    increments: dict[str, int] = field(default_factory=dict)
    """Per counter: its final value."""
    recorded: dict[str, int] = field(default_factory=dict)
    """Per counter: the increments recorded in the database."""
    acknowledged: dict[str, int] = field(default_factory=dict)
    """Per counter: the writes the database acknowledged to a worker."""
    fenced: dict[str, int] = field(default_factory=dict)
    """Per counter: reads and writes refused with ``Fenced``."""
    late_fenced: int = 0
    """The frozen holders' operations after the takeover refused with ``Fenced``."""
    db_errors: list[str] = field(default_factory=list)


class EffectsRound(Round):
    """A chaos round whose runs write to PostgreSQL and Redis through the helpers."""

    def __init__(self, backend: Backend, config: RoundConfig) -> None:
        super().__init__(backend, config)
        self.result = EffectsResult(store=backend.name, config=config, job=self.job)
        self.effects = f"cw_fx_{uuid.uuid4().hex[:12]}"
        """The user's schema and key prefix for this round."""
        self.redis_key = f"{self.effects}:counter"

    def worker(self, long: bool) -> list[str]:
        steps, sleep = self.work(long)
        assert self.referee is not None
        idle = max(100, int(self.cfg.ttl * 500))  # half the ttl, as docs/fencing.md advises
        worker = [sys.executable, WORKER, "--port", str(self.referee.port), "--steps", str(steps),
                  "--sleep", f"{sleep:.3f}", "--postgres", POSTGRES_URL, "--schema", self.effects,
                  "--idle-timeout-ms", str(idle), "--redis", REDIS_URL, "--key", self.redis_key]  # fmt: skip
        if not self.cfg.fenced:
            worker.append("--no-fencing")
        return worker

    def phase(self, run: str) -> None:
        """After the random phase, wait until ``run`` has just read (it is in
        its work, before the write): a pause there leaves it holding a read
        the next run will overtake, in every injection."""
        super().phase(run)
        deadline = time.monotonic() + 2 * self.cfg.ttl + 1
        while time.monotonic() < deadline:
            mine = [e for e in self.refresh()[-100:] if e.get("run") == run and e["op"] != "hello"]
            if mine and mine[-1]["op"] == "read" and mine[-1]["ok"]:
                return
            if mine and mine[-1]["op"] in ("close", "error"):
                return
            time.sleep(0.005)

    def stepped(self, run: str | None, since: float) -> bool:
        """A step here writes both counters: wait for the last write (or the
        step's end) so the supervisor, resumed next, cannot stop the thawed
        run between its PostgreSQL and its Redis write."""
        for e in self.refresh()[-50:]:
            if e.get("run") != run or e["t"] <= since:
                continue
            if e["op"] in ("close", "error") or (e["op"] == "read" and not e["ok"]):
                return True
            if e["op"] == "write" and e.get("target") == TARGETS[-1]:
                return True
        return False

    def run(self) -> RoundResult:
        import psycopg

        with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=10) as conn:
            conn.execute(_queries(conn, self.effects)["create"].encode())
        try:
            return super().run()
        finally:
            drop_schema(self.effects)
            delete_prefix(f"{self.effects}:")
            forget = getattr(self.backend, "forget", None)
            if forget is not None:
                forget(self.namespace)

    def _safety(self, log: list[dict[str, Any]], head: str, tokens: dict[str, int]) -> dict[str, list[str]]:
        """(a)–(c) on the two counters, as the databases hold them now."""
        import psycopg
        import redis

        r = self.result
        assert isinstance(r, EffectsResult)
        with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=10) as conn:
            q = _queries(conn, self.effects)
            row = conn.execute(q["read"]).fetchone()
            pg_final = 0 if row is None else int(row[0])
            pg_rows = [Write(run=w[1], token=tokens.get(w[1], int(w[2])), step=int(w[3]), value=int(w[4]))
                       for w in conn.execute(q["history"]).fetchall()]  # fmt: skip
        client = redis.Redis.from_url(REDIS_URL, socket_timeout=10, decode_responses=True)
        try:
            h = client.hgetall(self.redis_key)
        finally:
            client.close()
        rd_final = int(h.pop("value", 0))
        rd_rows = []
        for k, v in h.items():
            run, token, step = v.split()
            rd_rows.append(
                Write(run=run, token=tokens.get(run, int(token)), step=int(step), value=int(k[1:]))
            )
        rd_rows.sort(key=lambda w: w.value)
        out: dict[str, list[str]] = {"a": [], "b": [], "c": []}
        for target, final, rows in (("postgres", pg_final, pg_rows), ("redis", rd_final, rd_rows)):
            acked = [(e["run"], e["step"], e["value"]) for e in log
                     if e["op"] == "write" and e["ok"] and e.get("target") == target]  # fmt: skip
            r.increments[target] = final
            r.recorded[target] = len(rows)
            r.acknowledged[target] = len(acked)
            r.fenced[target] = sum(
                1 for e in log if e["op"] == "read" and target in e.get("fenced", ())
            ) + sum(1 for e in log if e["op"] == "write" and e.get("target") == target and e.get("fenced"))
            out["a"] += check_token_order(target, rows)
            out["b"] += check_interleaving(target, rows)
            out["c"] += check_no_lost_update(target, final, rows, acked)
        r.db_errors = [f"{e['run']}: {e['error']}" for e in log if e["op"] == "error"]
        return out

    def _after_long_pause(self, inj: Any, h: Any) -> None:
        super()._after_long_pause(inj, h)
        r = self.result
        assert isinstance(r, EffectsResult)
        if inj.took_over is None:
            return
        after = self._first_op(h.log, inj.took_over)
        late = [
            e
            for e in h.log
            if e.get("run") == inj.target_run and e["t"] > after and e["op"] in ("read", "write")
        ]
        r.late_fenced += sum(
            len(e.get("fenced", ())) if e["op"] == "read" else bool(e.get("fenced")) for e in late
        )


@dataclass
class Write:
    """One increment as the database recorded it."""

    run: str
    token: int
    step: int
    value: int


def check_token_order(target: str, rows: Sequence[Write]) -> list[str]:
    """(a) In the order the increments were made, tokens never go down."""
    out = []
    best: Write | None = None
    for w in rows:
        if best is not None and w.token < best.token:
            out.append(f"(a) {target}: run {w.run} (token {w.token}) set the counter to {w.value} after run "
                       f"{best.run} had written with token {best.token}")  # fmt: skip
        if best is None or w.token > best.token:
            best = w
    return out


def check_interleaving(target: str, rows: Sequence[Write]) -> list[str]:
    """(b) Each run's increments come in one block."""
    out = []
    finished: set[str] = set()
    current: str | None = None
    for w in rows:
        if w.run == current:
            continue
        if w.run in finished:
            out.append(
                f"(b) {target}: run {w.run} set the counter to {w.value} after run {current} had written"
            )
        if current is not None:
            finished.add(current)
        current = w.run
    return out


def check_no_lost_update(
    target: str, final: int, rows: Sequence[Write], acked: Sequence[tuple[str, int, int]]
) -> list[str]:
    """(c) The counter equals the increments recorded; they set it to 1…N in
    order (each read the value the one before left); every acknowledged
    write is recorded as its worker made it."""
    out = []
    if final != len(rows):
        out.append(f"(c) {target}: the counter is {final} after {len(rows)} recorded increments")
    due, before = 1, None
    for w in rows:
        if w.value != due:
            who = "" if before is None else f" (after run {before.run}'s write of {before.value})"
            out.append(f"(c) {target}: run {w.run} set the counter to {w.value} where {due} was due{who}: "
                       "it wrote from a stale read")  # fmt: skip
        due, before = w.value + 1, w
    made = {(w.run, w.step, w.value) for w in rows}
    by_value = {w.value: w for w in rows}
    for run, step, value in acked:
        if (run, step, value) not in made:
            there = by_value.get(value)
            by = "" if there is None else f", overwritten by run {there.run}"
            out.append(f"(c) {target}: run {run}'s acknowledged write of {value} (step {step}) is gone{by}")
    return out


def effects_config(fault: Fault, *, fenced: bool, ttl: float, faults: int, seed: int | None = None,
                   min_cycles: int = 4, gap: tuple[int, int] = (1, 2),
                   timeout: float | None = None) -> RoundConfig:  # fmt: skip
    """A round's settings in effects mode (a frozen-holder fault)."""
    if fault not in PAUSES:
        raise ValueError(f"effects mode injects {', '.join(PAUSES)}, not {fault}")
    return RoundConfig(
        fault=fault, fenced=fenced, ttl=ttl, faults=faults, min_cycles=min_cycles, gap=gap,
        long_share=0.5, long_work=4.0 if fault is Fault.STALL_SUPERVISOR else 1.5,
        timeout=timeout if timeout is not None else max(60.0, faults * ttl * 20), seed=seed,
    )  # fmt: skip


def run_effects_round(backend: Backend, config: RoundConfig) -> EffectsResult:
    result = EffectsRound(backend, config).run()
    assert isinstance(result, EffectsResult)
    return result
