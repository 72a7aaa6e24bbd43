"""The outbox: every event reaches every sink at least once, at the rate the
sink's receiver answers, and a down sink never fails or delays a job beyond
a bound.

Each sink's outbox lives in the store (``Store.undelivered`` /
``Store.mark_delivered``): the ledger minus what the sink acknowledged. A
flush serves every sink at once, from one thread that does all the store's
work: it fetches a sink's events, hands them to delivery threads (at most
the sink's ``concurrency`` at a time, one request per event, each job's
events in ledger order), and acknowledges each event as its answer comes
back, so a sink progresses at its receiver's pace whatever the flush's
budget, and nothing acknowledged is sent again (but across a crash, at least
once).

Answers:

- **accepted** (2xx): acknowledged.
- **refused for good** (a 4xx other than 401, 403, 407, 408, 429: the event
  itself is wrong for that receiver, and sending it again would be refused
  again): the event is set aside, with a ``sink_rejected`` event naming it
  (``Store.reject``), and the sink goes on with the rest, that job's later
  events included. Order is kept per job otherwise; a rejected event is the
  one exception, because holding a job's later events behind an event that
  will never be taken would silence the job on that sink forever.
  ``cronwarden flush --retry-rejected`` sends the set-aside events again.
- **anything else** (no answer, a 5xx, a 429, a refused connection): the
  sink stops for this flush; its unacknowledged events stay, and the next
  flush (the next ``cronwarden run``, the monitor, ``cronwarden flush``)
  retries after a backoff.

The backoff state is in the ledger, as ``sink_failed`` / ``sink_recovered``
events under the job ``sink:NAME``: every host and every short-lived
``cronwarden run`` process shares it without a file or a new store method,
so a fleet probes a down sink about once per backoff interval, not once per
run; and a sink's outage is itself a fact on-call can read (other sinks
deliver it, ``cronwarden flush`` prints it).

Bounds: every request's timeouts are at most the time left, and when the
flush's deadline comes every request still in flight is abandoned with its
connection (its socket is shut, so it neither sends nor reads on); its
event stays in the outbox. A sink that answered nothing within the whole
flush counts as failing (a black hole backs off like a closed port); one
that was delivering is only out of time. A stop (SIGTERM, SIGINT: an
exception that is not an ``Exception``) abandons what is in flight and goes
on up, recording nothing.
"""

from __future__ import annotations

import functools
import queue
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.events import Event, EventKind, JobInfo
from cronwarden.sinks.base import Call, DeliveryError, Sink
from cronwarden.stores.base import EventQuery, Store

BATCH = 100
"""Events fetched from the store per read, per sink."""
PENDING_MAX = 10 * BATCH
"""A sink's fetched-but-unfinished events at most: a long backlog of one job
is read as it drains, not all at once."""
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
    """Events sent and acknowledged (with ``replay``: set-aside events sent
    and taken out of the dead letters)."""
    skipped: int = 0
    """Events acknowledged without sending (routed elsewhere, kinds the sink
    does not map, older than ``max_age``)."""
    rejected: int = 0
    """Events the receiver refused for good, set aside this flush."""
    rejection: str | None = None
    """The last refusal's error, when there was one."""
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
    ``deadline`` (a ``clock.monotonic()`` time). Never raises an
    ``Exception``. Returns how many events were sent. ``force`` ignores the
    backoff of failing sinks."""
    return sum(r.delivered for r in flush_sinks(store, sinks, deadline=deadline, clock=clock, force=force))


def flush_sinks(
    store: Store,
    sinks: Sequence[Sink],
    *,
    deadline: float,
    clock: Clock = SYSTEM_CLOCK,
    force: bool = False,
    replay: bool = False,
) -> list[SinkResult]:
    """``flush``, reporting per sink, in the order given. With ``replay``,
    what is delivered is each sink's dead letters (``Store.rejected``)
    instead of its outbox, whatever their age: each one the receiver takes
    is forgotten, each it refuses again stays (and is recorded again). Never
    raises an ``Exception``; a stop (``KeyboardInterrupt``, a signal's
    ``BaseException``) abandons the requests in flight and propagates."""
    flows = [_Flow(store, sink, clock, replay) for sink in sinks]
    for flow in flows:
        flow.start(force)
    _Loop(flows, deadline, clock).run()
    return [flow.result() for flow in flows]


@dataclass(eq=False)
class _Task:
    """One ``deliver`` call in flight: a job's next events, on a thread."""

    lane: str
    events: list[Event]
    call: Call


class _Flow:
    """One sink's side of a flush. Every store call is made here, on the
    flushing thread: delivery threads only talk to the receiver."""

    def __init__(self, store: Store, sink: Sink, clock: Clock, replay: bool) -> None:
        self.store, self.sink, self.clock, self.replay = store, sink, clock, replay
        self.state: Backoff | None = None
        self.lanes: dict[str, deque[Event]] = {}
        self.inflight: dict[str, _Task] = {}
        self.known: set[str] = set()
        """Ids fetched and not yet finished (queued or in flight)."""
        self.refused_again: set[str] = set()
        """In a replay: dead letters refused again, which stay dead letters
        and must not be read again in this flush."""
        self.exhausted = False
        self.done = False
        self.broken = False
        """The store failed: nothing more is read or written for this sink."""
        self.jobs: dict[str, JobInfo | None] = {}
        self.delivered = self.skipped = self.rejected = 0
        self.rejection: str | None = None
        self.error: str | None = None
        self.retry_at: float | None = None
        self.backing_off = self.out_of_time = False

    # -- the flushing thread's steps -----------------------------------------

    def start(self, force: bool) -> None:
        try:
            self.state = backoff(self.store, self.sink.name)
        except Exception as e:
            self.fail_store(e)
            return
        if self.state is not None and not force and self.clock.wall() < self.state.retry_at:
            self.backing_off, self.done = True, True
            self.error, self.retry_at = self.state.error, self.state.retry_at

    def result(self) -> SinkResult:
        return SinkResult(sink=self.sink.name, delivered=self.delivered, skipped=self.skipped,
                          rejected=self.rejected, rejection=self.rejection, error=self.error,
                          retry_at=self.retry_at, backing_off=self.backing_off,
                          out_of_time=self.out_of_time)  # fmt: skip

    def fail_store(self, e: BaseException) -> None:
        """The store failed: the events are still there; stop this sink."""
        self.error = f"store: {_one_line(e)}"
        self.broken = True
        self.stop()

    def stop(self) -> None:
        self.done = True
        self.lanes.clear()

    def fetch(self) -> None:
        """Read the next events into their lanes; acknowledge at once those
        the sink is not to be sent."""
        sink = self.sink
        limit = len(self.known) + len(self.refused_again) + BATCH
        if self.replay:
            events = self.store.rejected(sink.name, limit)
        else:
            events = self.store.undelivered(sink.name, limit, backfill=sink.options.backfill)
        self.exhausted = len(events) < limit
        now = self.clock.wall()
        unsent = []
        for e in events:
            if e.event_id in self.known or e.event_id in self.refused_again:
                continue
            # A replay is asked for: the age of what was set aside does not count.
            if not (sink.accepts(e) and sink.options.wants(e, None if self.replay else now)):
                unsent.append(e.event_id)
                continue
            self.known.add(e.event_id)
            lane = e.job if sink.options.concurrency > 1 else ""
            self.lanes.setdefault(lane, deque()).append(e)
        if unsent:
            self.settle(unsent)
            self.skipped += len(unsent)

    def settle(self, ids: list[str]) -> None:
        """Done with these events: acknowledged, or out of the dead letters."""
        if self.replay:
            self.store.forget_rejected(self.sink.name, ids)
        else:
            self.store.mark_delivered(self.sink.name, ids)

    def next_task(self) -> _Task | None:
        """The next events to send, from a lane with nothing in flight, or None."""
        for lane, events in self.lanes.items():
            if events and lane not in self.inflight:
                batch = [events.popleft() for _ in range(min(self.sink.batch, len(events)))]
                jobs: dict[str, JobInfo | None] = {}
                if self.sink.uses_jobs:
                    for e in batch:
                        if e.job not in self.jobs:
                            self.jobs[e.job] = self.store.job(e.job)
                        jobs[e.job] = self.jobs[e.job]
                task = _Task(lane, batch, Call(at=self.clock.wall(), jobs=jobs))
                self.inflight[lane] = task
                return task
        return None

    @property
    def concurrency(self) -> int:
        """Deliveries in flight at most: one, a probe, while the sink is
        failing (a down sink costs one request per backoff interval), else
        the sink's ``concurrency``."""
        return 1 if self.state is not None else self.sink.options.concurrency

    def wants_more(self) -> bool:
        """Whether to read more events: fewer are queued than could be in
        flight at once, and the store may have more. (Not whenever a request
        slot is free: one job's long backlog would be read again and again
        while its lane drains one event at a time.)"""
        if self.done or self.exhausted or len(self.known) >= PENDING_MAX:
            return False
        return sum(len(events) for events in self.lanes.values()) < self.concurrency

    def finished(self) -> bool:
        return not self.inflight and (self.done or (self.exhausted and not any(self.lanes.values())))

    def answered(self, task: _Task, outcome: BaseException | None) -> None:
        """A delivery call came back: acknowledge, set aside, or stop."""
        del self.inflight[task.lane]
        if self.broken:
            return  # nothing more is written; unacknowledged, the events come again
        events = task.events
        if outcome is None:
            done = len(events)
        else:
            done = outcome.delivered if isinstance(outcome, DeliveryError) else 0
        if done:
            ids = [e.event_id for e in events[:done]]
            self.settle(ids)
            self.known.difference_update(ids)
            self.delivered += done
            if self.state is not None:
                self.recovered()
        if outcome is None:
            return
        if isinstance(outcome, DeliveryError) and outcome.permanent and done < len(events):
            self.refused(events[done], outcome)
            rest = events[done + 1 :]
            if rest:  # a batch sink: the rest go first next time
                self.lanes.setdefault(task.lane, deque()).extendleft(reversed(rest))
            return
        self.known.difference_update(e.event_id for e in events[done:])
        if not self.done:
            self.failed(_one_line(outcome))

    def refused(self, event: Event, e: DeliveryError) -> None:
        self.known.discard(event.event_id)
        if self.replay:
            self.refused_again.add(event.event_id)
        error = _one_line(e)
        data = {"sink": self.sink.name, "event_id": event.event_id, "kind": event.kind.value,
                "job": event.job, "status": e.status, "error": error}  # fmt: skip
        # A refusal of a refusal is set aside without a record of its own:
        # two sinks refusing everything would otherwise echo forever.
        rejection = None
        if event.kind is not EventKind.SINK_REJECTED:
            job = sink_job(self.sink.name)
            rejection = Event(kind=EventKind.SINK_REJECTED, job=job, at=self.clock.wall(), data=data)
        self.store.reject(self.sink.name, event.event_id, rejection)
        self.rejected += 1
        self.rejection = error
        self.exhausted = False  # the rejection is a new event, for the other sinks and this one

    def recovered(self) -> None:
        assert self.state is not None
        # Recorded now, so that this flush also delivers it: a later flush
        # then finds nothing new.
        data = {"sink": self.sink.name, "attempts": self.state.attempt, "down_since": self.state.down_since}
        _record(self.store, self.sink.name, EventKind.SINK_RECOVERED, self.clock, data)
        self.state = None
        self.exhausted = False

    def failed(self, error: str) -> None:
        """Stop delivering for this flush and back off; what is in flight may
        still land and be acknowledged."""
        now = self.clock.wall()
        attempt = 1 if self.state is None else self.state.attempt + 1
        self.retry_at = now + retry_delay(attempt)
        data = {"sink": self.sink.name, "attempt": attempt, "error": error, "retry_at": self.retry_at,
                "down_since": now if self.state is None else self.state.down_since}  # fmt: skip
        _record(self.store, self.sink.name, EventKind.SINK_FAILED, self.clock, data)
        self.error = error
        self.stop()

    def out_of_time_now(self, budget: float) -> None:
        """The deadline came: abandon what is in flight. A sink that answered
        nothing at all in the whole flush is failing, not slow."""
        for task in self.inflight.values():
            task.call.abandon()
        stuck = bool(self.inflight) and not (self.delivered or self.rejected) and self.error is None
        self.inflight.clear()
        if self.error is not None:
            return
        if stuck:
            self.failed(f"no answer within the flush's {budget:.2g}s")
        elif not self.finished() or self.lanes:
            self.out_of_time = True
        self.stop()


class _Loop:
    """Runs every flow's deliveries until all are finished or the deadline."""

    def __init__(self, flows: list[_Flow], deadline: float, clock: Clock) -> None:
        self.flows, self.deadline, self.clock = flows, deadline, clock
        self.answers: queue.SimpleQueue[tuple[_Flow, _Task, BaseException | None]] = queue.SimpleQueue()
        self.budget = max(0.0, deadline - clock.monotonic())

    def run(self) -> None:
        try:
            while True:
                for flow in self.flows:
                    self.dispatch(flow)
                if all(flow.finished() for flow in self.flows):
                    return
                left = self.deadline - self.clock.monotonic()
                if left <= 0:
                    self.time_up()
                    return
                try:
                    flow, task, outcome = self.answers.get(timeout=left)
                except queue.Empty:
                    continue  # the deadline, seen at the top
                if outcome is not None and self.clock.monotonic() >= self.deadline:
                    continue  # cut by the deadline: left in flight, for time_up to abandon
                self.step(flow, functools.partial(flow.answered, task, outcome))
        finally:
            # A stop, or anything else on the way out: nothing keeps posting.
            for flow in self.flows:
                for task in flow.inflight.values():
                    task.call.abandon()

    def dispatch(self, flow: _Flow) -> None:
        """Fill the flow's free request slots, reading more events as needed.
        Each turn sends a task or reads (which acknowledges what the sink is
        not sent, or queues events, or finds the outbox exhausted), so the
        loop ends."""
        while not flow.done:
            left = self.deadline - self.clock.monotonic()
            if left <= 0:
                return
            if len(flow.inflight) < flow.concurrency:
                task = self.step(flow, flow.next_task)
                if task is not None:
                    self.start(flow, task, min(flow.sink.options.timeout, left))
                    continue
            if not flow.wants_more():
                return
            self.step(flow, flow.fetch)

    def step(self, flow: _Flow, fn: Any) -> Any:
        """A flushing-thread step of ``flow``; a store failure stops it."""
        try:
            return fn()
        except Exception as e:
            flow.fail_store(e)
            return None

    def start(self, flow: _Flow, task: _Task, timeout: float) -> None:
        answers, sink = self.answers, flow.sink

        def deliver() -> None:
            outcome: BaseException | None = None
            try:
                sink.deliver(task.events, timeout=timeout, call=task.call)
            except BaseException as e:  # handed to the flushing thread, which decides
                outcome = e
            answers.put((flow, task, outcome))

        # A daemon thread: an abandoned call never keeps the process alive.
        threading.Thread(target=deliver, name=f"cronwarden-sink-{sink.name}", daemon=True).start()

    def time_up(self) -> None:
        # Answers that came in with the deadline still count, but not a
        # failure: a call's timeout is at most the time the flush had left,
        # so a slow receiver's last call times out at the deadline itself,
        # which says nothing against the sink. It is abandoned with the rest.
        while True:
            try:
                flow, task, outcome = self.answers.get_nowait()
            except queue.Empty:
                break
            if outcome is None and flow.inflight.get(task.lane) is task:
                self.step(flow, functools.partial(flow.answered, task, outcome))
        for flow in self.flows:
            if not flow.finished():
                self.step(flow, functools.partial(flow.out_of_time_now, self.budget))


def _record(store: Store, sink: str, kind: EventKind, clock: Clock, data: Mapping[str, Any]) -> None:
    try:
        store.record(Event(kind=kind, job=sink_job(sink), at=clock.wall(), data=data))
    except Exception:  # losing a backoff record costs an early retry, nothing more
        pass


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
        if r.rejected:
            print(f"cronwarden: sink {r.sink} refused {r.rejected} event(s) for good ({r.rejection}); set "
                  "aside: cronwarden flush --retry-rejected", file=sys.stderr)  # fmt: skip
    return sum(r.delivered for r in results)
