"""Delivery that never stalls, against real receivers on loopback and a real
SQLite store: a slow receiver drains at its own pace whatever the flush's
budget, a refused event is set aside without holding back the rest, a
request still in flight at the deadline is abandoned with its connection,
and SIGTERM ends ``flush`` and ``monitor`` at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.receivers import Receiver

from cronwarden.cli import main as cli_main
from cronwarden.clock import SYSTEM_CLOCK, FakeClock
from cronwarden.events import Event, EventKind, new_id
from cronwarden.guard import Warden
from cronwarden.outbox import SinkResult, flush_sinks
from cronwarden.sinks import load_sinks
from cronwarden.sinks.base import Call, DeliveryError, Sink, SinkBase, SinkOptions
from cronwarden.stores.base import EventQuery
from cronwarden.stores.sqlite import SqliteStore

SECRET = "s3cret-for-tests"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "cronwarden.db")
    yield s
    s.close()


def backlog(store: SqliteStore, n: int, job: str = "export") -> list[str]:
    """``n`` events of one job in the ledger (a sink registered before them
    gets them all), oldest first."""
    assert store.undelivered("hook", 1, backfill=0) == []
    ids = []
    for _ in range(n):
        event = Event(kind=EventKind.SUCCEEDED, job=job, run_id=new_id(), at=time.time())
        store.record(event)
        ids.append(event.event_id)
    return ids


def webhook_table(port: int, **kwargs: Any) -> dict[str, Any]:
    return {"type": "webhook", "url": f"http://127.0.0.1:{port}/hook", "secret": SECRET, **kwargs}


def one_sink(table: dict[str, Any], name: str = "hook") -> Sink:
    [sink] = load_sinks({"sinks": {name: table}})
    return sink


def received(r: Receiver) -> list[str]:
    return [q.headers["X-Cronwarden-Event-Id"] for q in r.requests]


def hook_table(receiver: Receiver) -> str:
    return f'[sinks.hook]\ntype = "webhook"\nurl = "{receiver.url()}"\nsecret = "x"\n'


def config(tmp_path: Path, store: SqliteStore, sinks: str) -> Path:
    path = tmp_path / "cronwarden.toml"
    path.write_text(f'store = "{store.url}"\n{sinks}')
    return path


# -- per-event progress ----------------------------------------------------------


def test_a_slow_webhook_drains_a_budget_worth_per_flush_and_every_event_arrives_once(
    store: SqliteStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The receiver takes 0.1 s per event; 150 wait; each ``cronwarden flush
    --timeout 3s`` delivers what 3 s allow (about 30), acknowledged one by
    one, until all are there. A request cut at a deadline may arrive twice:
    at most one per flush."""
    ids = backlog(store, 150)
    receiver = Receiver(delay=0.1)
    path = config(tmp_path, store, hook_table(receiver))
    per_flush: list[int] = []
    try:
        for _ in range(30):  # 5 on a quiet machine; a busy one drains slower, never not at all
            before = len(set(received(receiver)))
            cli_main(["flush", "--config", str(path), "--timeout", "3s"])
            per_flush.append(len(set(received(receiver))) - before)
            if store.undelivered("hook", 1) == []:
                break
    finally:
        receiver.stop()
    capsys.readouterr()

    counts = Counter(received(receiver))
    assert set(counts) == set(ids), f"an event never arrived: {per_flush}"
    assert sum(n - 1 for n in counts.values()) <= len(per_flush), f"more repeats than flushes: {counts}"
    assert len(per_flush) >= 5, f"150 events at 0.1 s each cannot fit in fewer 3 s flushes: {per_flush}"
    assert all(n <= 31 for n in per_flush), per_flush
    assert min(per_flush[:-1]) >= 10, f"a flush made (almost) no progress: {per_flush}"


def test_a_flush_acknowledges_each_event_as_it_is_answered(store: SqliteStore) -> None:
    """Cut by its deadline mid-backlog, a flush has acknowledged exactly the
    events whose answers came back: the next one starts right after them."""
    ids = backlog(store, 20)
    receiver = Receiver(delay=0.1)
    try:
        sink = one_sink(webhook_table(receiver.port))
        began = time.monotonic()
        [result] = flush_sinks(store, [sink], deadline=began + 0.75, clock=SYSTEM_CLOCK)
        took = time.monotonic() - began
    finally:
        receiver.stop()

    left = [e.event_id for e in store.undelivered("hook", 100)]
    assert result.out_of_time and result.error is None and 3 <= result.delivered <= 7
    assert left == ids[result.delivered :], "what was answered is not what was acknowledged"
    assert received(receiver)[: result.delivered] == ids[: result.delivered]
    assert took < 1.25


class TimesOutAtTheDeadline(SinkBase):
    """A receiver that answers the first call and is too slow for the
    second, as a real one is when a flush's last request is cut: the call's
    timeout is the time the flush has left, so the timeout comes *at* the
    deadline. The clock is moved there before the answer is handed back,
    which is the order a busy machine can produce for real."""

    def __init__(self, options: SinkOptions, clock: FakeClock, deadline: float) -> None:
        super().__init__("hook", options)
        self.clock, self.deadline, self.calls = clock, deadline, 0

    def accepts(self, event: Event) -> bool:
        return True

    def deliver(self, events: Sequence[Event], *, timeout: float, call: Call) -> None:
        self.calls += 1
        if self.calls > 1:
            self.clock.advance(self.deadline - self.clock.monotonic())
            raise DeliveryError(f"timed out after {timeout:g}s")


def test_a_request_cut_by_the_flush_deadline_is_not_a_sink_failure(store: SqliteStore) -> None:
    """A timeout that comes with the flush's deadline is the deadline's, not
    the sink's: no ``sink_failed`` record, no backoff; the flush is out of
    time and the cut event comes again in the next one."""
    ids = backlog(store, 5)
    clock = FakeClock(start=time.time())
    deadline = clock.monotonic() + 3.0
    sink = TimesOutAtTheDeadline(one_sink(webhook_table(1)).options, clock, deadline)

    [result] = flush_sinks(store, [sink], deadline=deadline, clock=clock)

    failures = store.events(EventQuery(kinds=[EventKind.SINK_FAILED]))
    assert failures == [], f"the deadline was taken for the sink's failure: {[e.data for e in failures]}"
    assert (result.delivered, result.error, result.out_of_time) == (1, None, True)
    assert [e.event_id for e in store.undelivered("hook", 10)] == ids[1:]


def test_a_request_in_flight_at_the_deadline_is_abandoned_with_its_connection(store: SqliteStore) -> None:
    """The receiver trickles its answer a byte every 0.1 s (no read waits
    long enough to time out; the answer takes 10 s); the flush has 0.5 s.
    When it returns, the request's connection is shut (the receiver soon
    finds nobody to write to) and nothing more is posted."""
    backlog(store, 5)
    receiver = Receiver(trickle=0.1)
    try:
        sink = one_sink(webhook_table(receiver.port, timeout="30s"))
        began = time.monotonic()
        [result] = flush_sinks(store, [sink], deadline=began + 0.5, clock=SYSTEM_CLOCK)
        returned = time.monotonic() - began
        wait_for(lambda: receiver.gone > 0, timeout=3.0)
        time.sleep(0.5)
        requests = len(receiver.requests)
    finally:
        receiver.stop()

    assert returned < 1.0
    assert requests == 1, "the abandoned delivery went on posting"
    assert result.error is not None and "no answer within" in result.error  # answered nothing at all
    assert result.retry_at is not None
    assert len(store.undelivered("hook", 100)) >= 5
    assert len(store.undelivered("hook", 100)) >= 5


def test_concurrency_is_bounded_and_each_jobs_events_keep_their_order(store: SqliteStore) -> None:
    assert store.undelivered("hook", 1, backfill=0) == []
    jobs = [f"job{i}" for i in range(6)]
    for n in range(4):
        for job in jobs:
            store.record(Event(kind=EventKind.SUCCEEDED, job=job, at=time.time(), data={"n": n}))
    receiver = Receiver(delay=0.05)
    try:
        result = flush_one(store, one_sink(webhook_table(receiver.port, concurrency=2)))
        bodies = [json.loads(q.body) for q in receiver.requests]
    finally:
        receiver.stop()

    assert result.ok and result.delivered == 24
    assert receiver.in_flight_max == 2, f"in flight at once: {receiver.in_flight_max} (bound 2)"
    for job in jobs:
        assert [b["data"]["n"] for b in bodies if b["job"] == job] == [0, 1, 2, 3]


def flush_one(store: SqliteStore, sink: Sink, clock: Any = None, **kwargs: Any) -> SinkResult:
    clock = clock or FakeClock(start=time.time())
    [result] = flush_sinks(store, [sink], deadline=clock.monotonic() + 20, clock=clock, **kwargs)
    return result


# -- poison isolation ------------------------------------------------------------


def run(warden: Warden, job: str) -> str:
    with warden.guard(job, ttl=30) as r:
        return r.run_id


def test_a_receiver_refusing_one_jobs_pings_holds_back_no_other_job(
    store: SqliteStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Healthchecks answers 400 to one job's pings (a check it cannot take):
    every other job's pings arrive; the refused ones are set aside as
    ``sink_rejected``, shown by ``flush`` and ``status``, and sent again by
    ``flush --retry-rejected`` once the receiver takes them."""
    refusing = {"on": True}
    receiver = Receiver(status=lambda q, n: 400 if refusing["on"] and "/bad-job" in q.path else 200)
    table = f'[sinks.hc]\ntype = "healthchecks"\nurl = "{receiver.url("/key/{job}")}"\n'
    path = config(tmp_path, store, table)
    with Warden(store, quiet=True) as warden:
        for job in ("alpha", "bad-job", "beta", "bad-job", "gamma"):
            run(warden, job)
    try:
        code = cli_main(["flush", "--config", str(path)])
        flushed = capsys.readouterr().out
        cli_main(["status", "--store", store.url])
        status = capsys.readouterr().out
        first = list(receiver.requests)
        refusing["on"] = False
        replay = cli_main(["flush", "--config", str(path), "--retry-rejected"])
        replayed = capsys.readouterr().out
        again = cli_main(["flush", "--config", str(path), "--retry-rejected"])
        capsys.readouterr()
    finally:
        receiver.stop()

    delivered = {q.path.split("/")[2] for q in first if "/bad-job" not in q.path}
    assert delivered == {"alpha", "beta", "gamma"}
    assert [q.path for q in first if "/alpha" in q.path] == ["/key/alpha/start", "/key/alpha"]
    assert [q.path for q in first if "/gamma" in q.path] == ["/key/gamma/start", "/key/gamma"]
    rejections = store.events(EventQuery(job="sink:hc", kinds=[EventKind.SINK_REJECTED], limit=10,
                                         newest_first=False))  # fmt: skip
    assert len(rejections) == 4
    assert {r.data["job"] for r in rejections} == {"bad-job"}
    assert {r.data["status"] for r in rejections} == {400}
    assert set(rejections[0].data) == {"sink", "event_id", "kind", "job", "status", "error"}
    assert code == 1 and "rejected 4" in flushed and "4 events set aside" in flushed
    assert "sink hc: 4 events set aside" in status and "--retry-rejected --sink hc" in status
    resent = receiver.requests[len(first) :]
    refused = [q for q in first if "/bad-job" in q.path]
    assert replay == 0 and "sent again 4" in replayed
    assert [(q.path, q.rid) for q in resent] == [(q.path, q.rid) for q in refused]
    assert store.rejected_counts() == {} and again == 0
    assert store.undelivered("hc", 100) == []


def test_a_refused_event_is_set_aside_and_the_same_jobs_later_events_go_on(store: SqliteStore) -> None:
    ids = backlog(store, 5)
    poison = ids[1]
    receiver = Receiver(status=lambda q, n: 422 if q.headers["X-Cronwarden-Event-Id"] == poison else 200)
    try:
        result = flush_one(store, one_sink(webhook_table(receiver.port)))
    finally:
        receiver.stop()

    [rejection] = store.events(EventQuery(job="sink:hook", kinds=[EventKind.SINK_REJECTED]))
    assert rejection.data["event_id"] == poison and rejection.data["status"] == 422
    # The four others and the rejection's own record, which the sink is sent too.
    assert result.ok and (result.delivered, result.rejected) == (5, 1)
    assert [i for i in received(receiver) if i in ids] == ids, "the job's order changed"
    assert sorted(received(receiver)) == sorted([*ids, rejection.event_id])
    assert [e.event_id for e in store.rejected("hook", 10)] == [poison]


@pytest.mark.parametrize("status", [401, 403, 408, 429, 500, 503])
def test_an_answer_about_the_sink_not_the_event_backs_off_and_keeps_it(
    store: SqliteStore, status: int
) -> None:
    ids = backlog(store, 3)
    receiver = Receiver(status=lambda q, n: status)
    try:
        result = flush_one(store, one_sink(webhook_table(receiver.port)))
    finally:
        receiver.stop()

    assert result.rejected == 0 and result.error is not None and f"HTTP {status}" in result.error
    assert [e.event_id for e in store.undelivered("hook", 100)][:3] == ids
    assert store.rejected("hook", 10) == []


def test_two_sinks_refusing_everything_do_not_echo_each_others_refusals(store: SqliteStore) -> None:
    """A refusal of a ``sink_rejected`` event is set aside without a record
    of its own: otherwise each sink's refusals would feed the other's."""
    assert store.undelivered("other", 1, backfill=0) == []
    backlog(store, 1)
    receiver = Receiver(status=lambda q, n: 400)
    try:
        table = webhook_table(receiver.port)
        sinks = load_sinks({"sinks": {"hook": table, "other": table}})
        clock = FakeClock(start=time.time())
        for _ in range(3):
            flush_sinks(store, sinks, deadline=clock.monotonic() + 10, clock=clock)
    finally:
        receiver.stop()

    rejections = store.events(EventQuery(kinds=[EventKind.SINK_REJECTED], limit=100))
    # Each sink refuses the backlog event (2 records), then the other's record (no record).
    assert len(rejections) == 2
    assert store.undelivered("hook", 10) == [] and store.undelivered("other", 10) == []


# -- signals ---------------------------------------------------------------------


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}


@pytest.mark.parametrize("command", ["monitor", "flush"])
def test_sigterm_mid_flush_ends_the_command_within_a_second_with_no_sink_failed(
    store: SqliteStore, tmp_path: Path, command: str
) -> None:
    ids = backlog(store, 50)
    receiver = Receiver(delay=1.0)
    path = config(tmp_path, store, hook_table(receiver))
    extra = ["--interval", "5s", "--quiet"] if command == "monitor" else ["--timeout", "60s"]
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cronwarden", command, "--config", str(path), "--store", store.url,
             *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
        )  # fmt: skip
        try:
            wait_for(lambda: len(receiver.requests) >= 2)  # mid-flush: a request is in flight
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=10)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        receiver.stop()

    assert took < 1.0, f"{command} took {took:.2f}s to stop"
    assert proc.returncode == (0 if command == "monitor" else 143), err
    assert "Traceback" not in err
    kinds = {e.kind for e in store.events(EventQuery(job="sink:hook", limit=100))}
    assert EventKind.SINK_FAILED not in kinds
    left = [e.event_id for e in store.undelivered("hook", 100)]
    assert left and left == ids[len(ids) - len(left) :], "the undelivered events did not stay in the outbox"


def test_under_monitor_a_slow_webhook_drains_at_the_receivers_pace(
    store: SqliteStore, tmp_path: Path
) -> None:
    """``cronwarden monitor`` delivers a backlog at the pace the receiver
    answers (0.1 s an event), each event once, and stops on SIGTERM."""
    ids = backlog(store, 30)
    receiver = Receiver(delay=0.1)
    path = config(tmp_path, store, hook_table(receiver))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cronwarden", "monitor", "--config", str(path), "--store", store.url,
             "--interval", "1s", "--quiet"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
        )  # fmt: skip
        try:
            wait_for(lambda: len(receiver.requests) >= 1)
            first = time.monotonic()
            wait_for(lambda: set(ids) <= set(received(receiver)))
            took = time.monotonic() - first
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        receiver.stop()

    assert proc.returncode == 0, err
    counts = Counter(i for i in received(receiver) if i in ids)
    assert max(counts.values()) == 1, "an acknowledged event was sent again"
    assert took < 2 * 30 * 0.1, f"30 events at 0.1 s took {took:.1f}s"


def test_a_long_run_of_events_a_sink_is_not_sent_is_passed_over_at_once(store: SqliteStore) -> None:
    backlog(store, 250, job="other")
    wanted = backlog_more(store, 1, job="mine")
    receiver = Receiver()
    try:
        sink = one_sink(webhook_table(receiver.port, jobs=["mine"]))
        began = time.monotonic()
        [result] = flush_sinks(store, [sink], deadline=began + 10, clock=SYSTEM_CLOCK)
        took = time.monotonic() - began
    finally:
        receiver.stop()

    assert result.ok and (result.delivered, result.skipped) == (1, 250)
    assert received(receiver) == wanted
    assert took < 5, f"the flush waited for its deadline ({took:.1f}s)"


def test_a_replay_the_receiver_still_refuses_sends_each_once_and_keeps_them(store: SqliteStore) -> None:
    ids = backlog(store, 3)
    receiver = Receiver(status=lambda q, n: 400)
    try:
        sink = one_sink(webhook_table(receiver.port, concurrency=1))
        first = flush_one(store, sink)
        sent = len(receiver.requests)
        began = time.monotonic()
        again = flush_one(store, sink, replay=True)
        took = time.monotonic() - began
        resent = [q.headers["X-Cronwarden-Event-Id"] for q in receiver.requests[sent:]]
    finally:
        receiver.stop()

    # The three events, and the three sink_rejected records the sink is sent
    # too (refused as well: set aside with no record of their own).
    dead = [e.event_id for e in store.rejected("hook", 10)]
    assert first.rejected == 6 and dead[:3] == ids and len(dead) == 6
    assert again.rejected == 6 and again.delivered == 0
    assert sorted(resent) == sorted(dead), "a dead letter was sent more than once in one replay"
    assert len(store.events(EventQuery(kinds=[EventKind.SINK_REJECTED], limit=100))) == 3 + 3
    assert took < 5


def backlog_more(store: SqliteStore, n: int, job: str) -> list[str]:
    ids = []
    for _ in range(n):
        event = Event(kind=EventKind.SUCCEEDED, job=job, run_id=new_id(), at=time.time())
        store.record(event)
        ids.append(event.event_id)
    return ids
