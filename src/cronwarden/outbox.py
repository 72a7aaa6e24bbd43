"""The outbox: every event reaches every sink at least once, and a down sink
never fails or delays a job beyond a bound (G9).

Each sink's outbox lives in the store (``Store.undelivered`` /
``Store.mark_delivered``): the ledger minus what the sink acknowledged. A
flush, per sink: fetch a batch, deliver it, acknowledge it, repeat until the
outbox is empty or the deadline comes. A failure stops that sink for this
flush; its events stay, and the next flush (the next ``cronwarden run``, the
monitor, ``cronwarden flush``) retries after a backoff.

The backoff state is in the ledger, as ``sink_failed`` / ``sink_recovered``
events under the job ``sink:NAME``: every host and every short-lived
``cronwarden run`` process shares it without a file or a new store method,
so a fleet probes a down sink about once per backoff interval, not once per
run; and a sink's outage is itself a fact on-call can read (other sinks
deliver it, ``cronwarden flush`` prints it).

Bounds: each delivery call runs in a daemon thread joined with the time
left, and each request's socket timeout is at most that too. A receiver that
trickles bytes cannot hold the flush past its deadline; what it had not
acknowledged by then is delivered again later (at least once).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.events import Event, EventKind
from cronwarden.sinks.base import DeliveryError, Sink
from cronwarden.stores.base import EventQuery, Store

BATCH = 100
"""Events fetched, delivered and acknowledged per step."""
RETRY_FIRST = 15.0
RETRY_MAX = 600.0


def retry_delay(attempt: int) -> float:
    """Seconds to wait after the ``attempt``-th failure in a row: 15s, 30s,
    1m, 2m, 4m, 8m, then 10m."""
    return min(RETRY_FIRST * 2.0 ** max(0, attempt - 1), RETRY_MAX)


def sink_job(name: str) -> str:
    """The ledger's job name for a sink's own events (``:`` never occurs in a
    job name, so it cannot collide)."""
    return f"sink:{name}"


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """A failing sink's state, from its latest ``sink_failed`` event."""

    attempt: int
    retry_at: float
    error: str
    down_since: float


@dataclass(frozen=True, kw_only=True)
class SinkResult:
    """What one flush did for one sink."""

    sink: str
    delivered: int = 0
    """Events sent and acknowledged."""
    skipped: int = 0
    """Events acknowledged without sending (other jobs, kinds the sink does
    not map, older than ``max_age``)."""
    error: str | None = None
    """Why delivery stopped, when it failed (now or, while backing off, last time)."""
    retry_at: float | None = None
    backing_off: bool = False
    """Not attempted: the last failure's backoff has not elapsed."""
    out_of_time: bool = False
    """Stopped by the deadline with events left in the outbox."""

    @property
    def ok(self) -> bool:
        return self.error is None and not self.out_of_time


def backoff(store: Store, sink: str) -> Backoff | None:
    """The sink's backoff, or None if its last delivery did not fail."""
    latest = store.events(
        EventQuery(job=sink_job(sink), kinds=[EventKind.SINK_FAILED, EventKind.SINK_RECOVERED], limit=1)
    )
    if not latest or latest[0].kind is not EventKind.SINK_FAILED:
        return None
    d = latest[0].data
    return Backoff(
        attempt=int(d.get("attempt", 1)),
        retry_at=float(d.get("retry_at", 0.0)),
        error=str(d.get("error", "")),
        down_since=float(d.get("down_since", latest[0].at)),
    )


def flush(
    store: Store,
    sinks: Sequence[Sink],
    *,
    deadline: float,
    clock: Clock = SYSTEM_CLOCK,
    force: bool = False,
) -> int:
    """Deliver what each sink's outbox holds, until empty or until
    ``deadline`` (a ``clock.monotonic()`` time). Never raises. Returns how
    many events were sent. ``force`` ignores the backoff of failing sinks."""
    return sum(r.delivered for r in flush_sinks(store, sinks, deadline=deadline, clock=clock, force=force))


def flush_sinks(
    store: Store,
    sinks: Sequence[Sink],
    *,
    deadline: float,
    clock: Clock = SYSTEM_CLOCK,
    force: bool = False,
) -> list[SinkResult]:
    """``flush``, reporting per sink. Never raises."""
    results = []
    for sink in sinks:
        try:
            results.append(_flush_one(store, sink, deadline, clock, force))
        except Exception as e:  # the store failed: the events are still there
            results.append(SinkResult(sink=sink.name, error=f"store: {_one_line(e)}"))
    return results


def _flush_one(store: Store, sink: Sink, deadline: float, clock: Clock, force: bool) -> SinkResult:
    state = backoff(store, sink.name)
    if state is not None and not force and clock.wall() < state.retry_at:
        return SinkResult(sink=sink.name, backing_off=True, error=state.error, retry_at=state.retry_at)
    delivered = skipped = 0
    while True:
        left = deadline - clock.monotonic()
        if left <= 0:
            return SinkResult(sink=sink.name, delivered=delivered, skipped=skipped, out_of_time=True)
        events = store.undelivered(sink.name, BATCH, backfill=sink.options.backfill)
        if not events:
            break
        now = clock.wall()
        wanted = [e for e in events if sink.options.wants(e, now) and sink.accepts(e)]
        chosen = {e.event_id for e in wanted}
        unsent = [e.event_id for e in events if e.event_id not in chosen]
        try:
            if wanted:
                _within(
                    functools.partial(sink.deliver, wanted, timeout=min(left, sink.options.timeout)), left
                )
        except Exception as e:
            done = e.delivered if isinstance(e, DeliveryError) else 0
            store.mark_delivered(sink.name, unsent + [x.event_id for x in wanted[:done]])
            error = _one_line(e)
            retry_at = _record_failure(store, sink.name, state, error, clock)
            return SinkResult(sink=sink.name, delivered=delivered + done, skipped=skipped + len(unsent),
                              error=error, retry_at=retry_at)  # fmt: skip
        store.mark_delivered(sink.name, [e.event_id for e in events])
        delivered += len(wanted)
        skipped += len(unsent)
        if wanted and state is not None:
            # Recorded now, so that this flush also delivers it: a later flush
            # then finds nothing new.
            data = {"sink": sink.name, "attempts": state.attempt, "down_since": state.down_since}
            _record(store, sink.name, EventKind.SINK_RECOVERED, clock, data)
            state = None
            continue
        if len(events) < BATCH:
            break
    return SinkResult(sink=sink.name, delivered=delivered, skipped=skipped)


def _record_failure(store: Store, sink: str, state: Backoff | None, error: str, clock: Clock) -> float:
    now = clock.wall()
    attempt = 1 if state is None else state.attempt + 1
    retry_at = now + retry_delay(attempt)
    data = {"sink": sink, "attempt": attempt, "error": error, "retry_at": retry_at,
            "down_since": now if state is None else state.down_since}  # fmt: skip
    _record(store, sink, EventKind.SINK_FAILED, clock, data)
    return retry_at


def _record(store: Store, sink: str, kind: EventKind, clock: Clock, data: Mapping[str, Any]) -> None:
    try:
        store.record(Event(kind=kind, job=sink_job(sink), at=clock.wall(), data=data))
    except Exception:  # losing a backoff record costs an early retry, nothing more
        pass


def _within(fn: Callable[[], None], seconds: float) -> None:
    """Run ``fn`` in a daemon thread and wait at most ``seconds`` for it. A
    call still running is abandoned (a daemon thread never keeps the process
    alive); whatever it had not acknowledged is delivered again later."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as e:
            failure.append(e)

    thread = threading.Thread(target=target, name="cronwarden-sink", daemon=True)
    thread.start()
    thread.join(max(0.0, seconds))
    if thread.is_alive():
        raise DeliveryError(f"no answer within the flush's remaining {seconds:.2g}s")
    if failure:
        raise failure[0]


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else type(e).__name__


def flush_after_run(
    store: Store, doc: Mapping[str, Any], *, clock: Clock = SYSTEM_CLOCK, timeout: float | None = None
) -> int:
    """The end of ``cronwarden run``: deliver within ``[sinks] flush_timeout``
    (default 2s). Call it only when ``cronwarden.sinks.has_sinks(doc)``, so a
    run without sinks imports none of this. Never raises and never changes
    the run's exit status; a sink that fails is reported on stderr in one
    line (once per backoff interval at most, since a backing-off sink is not
    tried)."""
    from cronwarden.errors import UsageError
    from cronwarden.sinks import flush_timeout, load_sinks

    try:
        sinks = load_sinks(doc)
    except UsageError as e:
        print(f"cronwarden: sinks not flushed: {str(e).splitlines()[0]}", file=sys.stderr)
        return 0
    bound = flush_timeout(doc) if timeout is None else timeout
    results = flush_sinks(store, sinks, deadline=clock.monotonic() + bound, clock=clock)
    for r in results:
        if r.error is not None and not r.backing_off:
            print(f"cronwarden: sink {r.sink}: {r.error}; its events stay in the outbox", file=sys.stderr)
    return sum(r.delivered for r in results)
