"""Sinks and the outbox against real HTTP servers on loopback, with events
made by the real guard on a real SQLite store (G9: at least once, idempotent
by event id, a down sink never fails or delays a run beyond the bound)."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.receivers import Receiver, Request, closed_port

from cronwarden.cli import main as cli_main
from cronwarden.clock import FakeClock
from cronwarden.errors import NotStarted, UsageError
from cronwarden.events import Event, EventKind
from cronwarden.guard import Warden
from cronwarden.outbox import SinkResult, flush, flush_after_run, flush_sinks, retry_delay
from cronwarden.sinks import SinkConfigError, load_sinks, sink_problems
from cronwarden.sinks.base import Sink, utc
from cronwarden.sinks.healthchecks import HealthchecksSink
from cronwarden.sinks.sentry import SentrySink
from cronwarden.sinks.webhook import WebhookSink
from cronwarden.stores.base import EventQuery
from cronwarden.stores.sqlite import SqliteStore

SECRET = "s3cret-for-tests"
SLOT = 1_750_000_200.0
JOB = "reconcile"


# -- real servers ---------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel's backlog) and
    never answers: the worst down sink, a black hole."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield int(s.getsockname()[1])
    s.close()


# -- the real guard on a real store ---------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "cronwarden.db")
    yield s
    s.close()


@pytest.fixture
def warden(store: SqliteStore) -> Iterator[Warden]:
    with Warden(store, quiet=True, host="web-1") as w:
        yield w


def run_ok(w: Warden) -> str:
    with w.guard(JOB, ttl=30) as run:
        return run.run_id


def run_failing(w: Warden) -> str:
    rid = ""
    with pytest.raises(RuntimeError), w.guard(JOB, ttl=30) as run:
        rid = run.run_id
        raise RuntimeError("boom")
    return rid


def run_skipped(w: Warden) -> tuple[str, str]:
    """A start refused while another run holds the lease: (holder, skipped) run ids."""
    with w.guard(JOB, ttl=30) as holder:
        with pytest.raises(NotStarted), w.guard(JOB, ttl=30, slot=SLOT):
            pass
        [skip] = w.store.events(EventQuery(job=JOB, kinds=[EventKind.SKIPPED], limit=1))
        assert skip.run_id is not None
        return holder.run_id, skip.run_id


def ledger_ids(store: SqliteStore) -> list[str]:
    return [e.event_id for e in store.events(EventQuery(limit=100_000, newest_first=False))]


def webhook(port: int, **kwargs: Any) -> Sink:
    [sink] = load_sinks(
        {
            "sinks": {
                "hook": {
                    "type": "webhook",
                    "url": f"http://127.0.0.1:{port}/hook",
                    "secret": SECRET,
                    **kwargs,
                }
            }
        }
    )
    return sink


def flush_now(store: SqliteStore, sinks: list[Sink], clock: Any = None, **kwargs: Any) -> SinkResult:
    clock = clock or FakeClock(start=time.time())
    [result] = flush_sinks(store, sinks, deadline=clock.monotonic() + 5, clock=clock, **kwargs)
    return result


def event_ids_received(r: Receiver) -> list[str]:
    return [q.headers["X-Cronwarden-Event-Id"] for q in r.requests]


# -- the webhook ----------------------------------------------------------------


def test_webhook_receiver_sees_each_event_once_after_being_down_and_coming_back(
    store: SqliteStore, warden: Warden
) -> None:
    down = Receiver()
    port = down.port
    down.stop()
    sink, clock = webhook(port), FakeClock(start=time.time())
    run_ok(warden), run_failing(warden), run_skipped(warden)

    first = flush_now(store, [sink], clock)
    run_ok(warden)  # life goes on while the sink is down
    second = flush_now(store, [sink], clock)
    up = Receiver(port=port)
    try:
        clock.advance(retry_delay(1) + 1)
        third = flush_now(store, [sink], clock)
    finally:
        up.stop()

    assert first.error is not None and first.delivered == 0
    assert second.backing_off and second.delivered == 0
    assert third.ok and third.delivered == len(up.requests)
    received = Counter(event_ids_received(up))
    assert set(received) == set(ledger_ids(store)), "an event was dropped"
    assert max(received.values()) == 1, f"duplicates without a lost ack: {received}"


def test_webhook_flush_after_a_successful_one_delivers_nothing(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    sink = webhook(receiver.port)
    run_ok(warden), run_skipped(warden)
    flush_now(store, [sink])
    sent = len(receiver.requests)

    again = flush_now(store, [sink])

    assert sent > 0 and again.delivered == 0 and len(receiver.requests) == sent


def test_webhook_redelivers_only_the_event_whose_ack_was_lost(store: SqliteStore, warden: Warden) -> None:
    # The third POST arrives but its answer is an error: the receiver has the
    # event, cronwarden cannot know it, so that one event may come twice.
    receiver = Receiver(status=lambda request, n: 500 if n == 3 else 200)
    try:
        sink, clock = webhook(receiver.port), FakeClock(start=time.time())
        run_ok(warden), run_failing(warden), run_skipped(warden)

        failed = flush_now(store, [sink], clock)
        clock.advance(retry_delay(1))
        retried = flush_now(store, [sink], clock)
    finally:
        receiver.stop()

    assert failed.delivered == 2 and failed.error is not None and "HTTP 500" in failed.error
    assert retried.ok
    received = Counter(event_ids_received(receiver))
    lost_ack = event_ids_received(receiver)[2]
    assert set(received) == set(ledger_ids(store))
    assert {i for i, n in received.items() if n > 1} == {lost_ack}


def signed(secret: bytes, request: Request) -> str:
    """The signature a receiver expects: HMAC-SHA256 of ``t.event_id.body``."""
    t = request.headers["X-Cronwarden-Signature"].split(",")[0].removeprefix("t=")
    message = f"{t}.{request.headers['X-Cronwarden-Event-Id']}.".encode() + request.body
    return f"t={t},v1=" + hmac.new(secret, message, hashlib.sha256).hexdigest()


def test_webhook_signature_is_hmac_sha256_of_the_time_the_event_id_and_the_raw_body(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    run_ok(warden)
    before = int(time.time())

    flush_now(store, [webhook(receiver.port)])

    assert receiver.requests
    for request in receiver.requests:
        header = request.headers["X-Cronwarden-Signature"]
        assert hmac.compare_digest(header, signed(SECRET.encode(), request))
        t = int(header.split(",")[0].removeprefix("t="))
        assert before <= t <= time.time() + 1
        body = json.loads(request.body)
        assert body["event_id"] == request.headers["X-Cronwarden-Event-Id"]
        assert request.headers["Content-Type"] == "application/json"


def test_webhook_signature_does_not_verify_with_another_secret(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    run_ok(warden)

    flush_now(store, [webhook(receiver.port)])

    request = receiver.requests[0]
    assert not hmac.compare_digest(request.headers["X-Cronwarden-Signature"], signed(b"other", request))


def test_webhook_body_is_the_event_as_json(store: SqliteStore, warden: Warden, receiver: Receiver) -> None:
    rid = run_ok(warden)

    flush_now(store, [webhook(receiver.port)])

    bodies = [json.loads(r.body) for r in receiver.requests]
    assert [(b["kind"], b["job"], b["run_id"]) for b in bodies] == [
        ("started", JOB, rid),
        ("succeeded", JOB, rid),
    ]
    assert bodies[0]["data"]["host"] == "web-1" and isinstance(bodies[1]["data"]["duration"], float)


# -- backoff --------------------------------------------------------------------


def test_a_failing_sink_is_not_tried_again_before_its_backoff_elapses(
    store: SqliteStore, warden: Warden
) -> None:
    receiver = Receiver(status=lambda request, n: 503)
    try:
        sink, clock = webhook(receiver.port), FakeClock(start=time.time())
        run_ok(warden)
        flush_now(store, [sink], clock)
        tried = len(receiver.requests)

        clock.advance(retry_delay(1) - 1)
        early = flush_now(store, [sink], clock)
        after_early = len(receiver.requests)
        clock.advance(2)
        due = flush_now(store, [sink], clock)
    finally:
        receiver.stop()

    assert tried == 1
    assert early.backing_off and after_early == 1
    assert not due.backing_off and due.error is not None and len(receiver.requests) == 2


def test_backoff_doubles_with_each_failure_in_a_row(store: SqliteStore, warden: Warden) -> None:
    sink, clock = webhook(closed_port()), FakeClock(start=time.time())
    run_ok(warden)
    waits = []
    for _ in range(4):
        result = flush_now(store, [sink], clock)
        assert result.retry_at is not None
        waits.append(round(result.retry_at - clock.wall()))
        clock.advance(result.retry_at - clock.wall())

    assert waits == [15, 30, 60, 120]


def test_force_tries_a_sink_that_is_backing_off(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    sink, clock = webhook(receiver.port), FakeClock(start=time.time())
    failing = webhook(closed_port())
    run_ok(warden)
    flush_now(store, [failing], clock)  # puts "hook" into backoff

    forced = flush_now(store, [sink], clock, force=True)

    assert forced.ok and forced.delivered > 0


def test_a_sink_outage_and_its_recovery_are_recorded_in_the_ledger(
    store: SqliteStore, warden: Warden
) -> None:
    clock = FakeClock(start=time.time())
    run_ok(warden)
    flush_now(store, [webhook(closed_port())], clock)
    clock.advance(retry_delay(1))
    receiver = Receiver()
    try:
        flush_now(store, [webhook(receiver.port)], clock)
    finally:
        receiver.stop()

    kinds = [e.kind for e in store.events(EventQuery(job="sink:hook", limit=10, newest_first=False))]
    assert kinds == [EventKind.SINK_FAILED, EventKind.SINK_RECOVERED]
    [failed] = store.events(EventQuery(job="sink:hook", kinds=[EventKind.SINK_FAILED]))
    assert failed.data["attempt"] == 1 and "refused" in failed.data["error"]


# -- Healthchecks ---------------------------------------------------------------


def healthchecks(receiver: Receiver, **kwargs: Any) -> Sink:
    table = {"type": "healthchecks", "ping_urls": {JOB: receiver.url("/ping/abc")}, **kwargs}
    [sink] = load_sinks({"sinks": {"hc": table}})
    return sink


def test_healthchecks_pings_start_success_and_fail_with_each_run_id(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    ok, failed = run_ok(warden), run_failing(warden)

    result = flush_now(store, [healthchecks(receiver)])

    assert result.ok
    assert [(r.path, r.rid) for r in receiver.requests] == [
        ("/ping/abc/start", ok),
        ("/ping/abc", ok),
        ("/ping/abc/start", failed),
        ("/ping/abc/fail", failed),
    ]
    assert b"RuntimeError: boom" in receiver.requests[3].body


def test_healthchecks_log_body_says_what_was_skipped_and_why(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    holder, skipped = run_skipped(warden)

    flush_now(store, [healthchecks(receiver)])

    assert [(r.path, r.rid) for r in receiver.requests] == [
        ("/ping/abc/start", holder),
        ("/ping/abc/log", skipped),
        ("/ping/abc", holder),
    ]
    body = receiver.requests[1].body.decode()
    assert body.startswith(f"skipped: run {skipped} of {JOB}")
    assert f"run {holder} (host web-1" in body
    assert "has held the lease for" in body
    assert f"did no work for slot {utc(SLOT)}" in body


def test_healthchecks_acknowledges_jobs_without_a_ping_url_without_sending(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    with warden.guard("other-job", ttl=30):
        pass

    result = flush_now(store, [healthchecks(receiver)])

    assert receiver.requests == [] and result.delivered == 0 and result.skipped == 2
    assert flush_now(store, [healthchecks(receiver)]).skipped == 0


def test_healthchecks_url_template_pings_each_job_by_name(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    [sink] = load_sinks({"sinks": {"hc": {"type": "healthchecks", "url": receiver.url("/key/{job}")}}})
    rid = run_ok(warden)

    flush_now(store, [sink])

    assert [(r.path, r.rid) for r in receiver.requests] == [(f"/key/{JOB}/start", rid), (f"/key/{JOB}", rid)]


# -- Sentry ---------------------------------------------------------------------


def sentry(receiver: Receiver) -> Sink:
    dsn = f"http://publickey@127.0.0.1:{receiver.port}/42"
    [sink] = load_sinks({"sinks": {"sentry": {"type": "sentry", "dsn": dsn, "environment": "prod"}}})
    return sink


def check_ins(receiver: Receiver) -> list[dict[str, Any]]:
    out = []
    for r in receiver.requests:
        assert r.path == "/api/42/envelope/"
        assert "sentry_key=publickey" in r.headers["X-Sentry-Auth"]
        _header, item, payload = r.body.decode().splitlines()
        assert json.loads(item) == {"type": "check_in"}
        out.append(json.loads(payload))
    return out


def test_sentry_check_ins_open_and_close_by_run_id(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    ok, failed = run_ok(warden), run_failing(warden)

    flush_now(store, [sentry(receiver)])

    got = [(c["check_in_id"], c["status"], "duration" in c) for c in check_ins(receiver)]
    assert got == [
        (ok.replace("-", ""), "in_progress", False),
        (ok.replace("-", ""), "ok", True),
        (failed.replace("-", ""), "in_progress", False),
        (failed.replace("-", ""), "error", True),
    ]
    assert {c["monitor_slug"] for c in check_ins(receiver)} == {JOB}
    assert {c["environment"] for c in check_ins(receiver)} == {"prod"}


def test_sentry_sends_nothing_for_a_skipped_start(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    holder, _ = run_skipped(warden)

    result = flush_now(store, [sentry(receiver)])

    assert [c["check_in_id"] for c in check_ins(receiver)] == [holder.replace("-", "")] * 2
    assert result.skipped == 1


# -- the log sink and filters ---------------------------------------------------


def test_log_sink_appends_one_json_line_per_event(store: SqliteStore, warden: Warden, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    [sink] = load_sinks({"sinks": {"file": {"type": "log", "path": str(path)}}})
    run_ok(warden), run_skipped(warden)

    flush_now(store, [sink])
    flush_now(store, [sink])

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["event_id"] for line in lines] == ledger_ids(store)


def test_jobs_filter_acknowledges_other_jobs_without_sending(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    with warden.guard("other-job", ttl=30):
        pass
    rid = run_ok(warden)

    result = flush_now(store, [webhook(receiver.port, jobs=[JOB])])

    assert {json.loads(r.body)["run_id"] for r in receiver.requests} == {rid}
    assert (result.delivered, result.skipped) == (2, 2)


def test_max_age_acknowledges_stale_events_without_sending(
    store: SqliteStore, warden: Warden, receiver: Receiver
) -> None:
    run_ok(warden)
    clock = FakeClock(start=time.time() + 600)

    result = flush_now(store, [webhook(receiver.port, max_age="5m")], clock)

    assert receiver.requests == [] and (result.delivered, result.skipped) == (0, 2)


# -- bounds: a down sink never fails or delays a run beyond the bound ----------


def test_flush_to_a_closed_port_returns_at_once_and_keeps_the_events(
    store: SqliteStore, warden: Warden
) -> None:
    run_ok(warden)
    began = time.monotonic()

    result = flush_now(store, [webhook(closed_port())], clock=None)

    assert time.monotonic() - began < 1.0
    assert result.error is not None and "refused" in result.error and result.delivered == 0
    assert len(store.undelivered("hook", 100)) >= 2


def test_flush_to_a_silent_server_stops_at_the_deadline(
    store: SqliteStore, warden: Warden, silent_port: int
) -> None:
    run_ok(warden)
    from cronwarden.clock import SYSTEM_CLOCK

    began = time.monotonic()
    [result] = flush_sinks(
        store, [webhook(silent_port, timeout="30s")], deadline=began + 0.5, clock=SYSTEM_CLOCK
    )

    assert time.monotonic() - began < 1.5
    assert result.error is not None and result.delivered == 0


def test_flush_returns_the_count_and_never_raises_when_the_store_is_gone(
    tmp_path: Path, receiver: Receiver
) -> None:
    store = SqliteStore(tmp_path / "gone.db")
    store.close()  # every call now fails

    assert flush(store, [webhook(receiver.port)], deadline=time.monotonic() + 1) == 0


def test_flush_after_run_with_a_down_sink_stays_within_its_bound(
    store: SqliteStore, warden: Warden, silent_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    run_ok(warden)
    doc = {
        "sinks": {
            "flush_timeout": "500ms",
            "hook": {"type": "webhook", "url": f"http://127.0.0.1:{silent_port}/", "secret": "x"},
        }
    }
    began = time.monotonic()

    delivered = flush_after_run(store, doc)

    assert time.monotonic() - began < 1.5 and delivered == 0
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("cronwarden: sink hook:") and "outbox" in line


def test_flush_after_run_with_a_broken_sink_config_reports_one_line_and_returns(
    store: SqliteStore, capsys: pytest.CaptureFixture[str]
) -> None:
    assert flush_after_run(store, {"sinks": {"hook": {"type": "slack"}}}) == 0
    [line] = capsys.readouterr().err.splitlines()
    assert "sinks not flushed" in line and "slack" in line


def test_the_run_command_imports_no_sink_code() -> None:
    code = (
        "import sys, cronwarden.cli, cronwarden.cli.run\n"
        "bad = sorted(m for m in sys.modules if m == 'cronwarden.outbox' or m.startswith('cronwarden.sinks.')"
        " or m == 'urllib.request')\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# -- configuration --------------------------------------------------------------


def test_load_sinks_builds_each_type_in_file_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_SECRET", "abc")
    doc = {
        "sinks": {
            "flush_timeout": "3s",
            "stderr": {"type": "log"},
            "hook": {
                "type": "webhook",
                "url": "https://ops.example.com/cw",
                "secret_env": "HOOK_SECRET",
                "timeout": "3s",
                "jobs": ["reconcile"],
            },
            "hc": {
                "type": "healthchecks",
                "ping_urls": {"reconcile": "https://hc-ping.com/1234"},
                "max_age": "10m",
            },
            "sentry": {"type": "sentry", "dsn": "https://key@o0.ingest.sentry.io/42"},
        }
    }

    sinks = load_sinks(doc)

    assert [s.name for s in sinks] == ["stderr", "hook", "hc", "sentry"]
    assert isinstance(sinks[1], WebhookSink) and sinks[1].options.timeout == 3.0
    assert sinks[1].options.jobs == frozenset({"reconcile"})
    assert isinstance(sinks[2], HealthchecksSink) and sinks[2].options.max_age == 600.0
    assert isinstance(sinks[3], SentrySink)
    assert sinks[3].envelope_url == "https://o0.ingest.sentry.io/api/42/envelope/"


def test_an_unknown_sink_type_is_a_one_line_error() -> None:
    with pytest.raises(SinkConfigError) as info:
        load_sinks({"sinks": {"ops": {"type": "slack", "url": "https://x"}}})

    assert (
        str(info.value)
        == "[sinks.ops] type must be one of log, webhook, healthchecks, sentry, apprise, got 'slack'"
    )


def test_an_unknown_key_suggests_the_close_one() -> None:
    with pytest.raises(
        SinkConfigError,
        match=r"unknown key 'secrit' in \[sinks.ops\] \(type webhook\); "
        r"did you mean 'secret'\?",
    ):
        load_sinks(
            {"sinks": {"ops": {"type": "webhook", "url": "https://x.example", "secret": "a", "secrit": "b"}}}
        )


def test_a_webhook_secret_env_that_is_not_set_is_an_error() -> None:
    with pytest.raises(SinkConfigError, match=r"secret_env: \$NOPE_NOT_SET is not set or empty"):
        load_sinks(
            {"sinks": {"ops": {"type": "webhook", "url": "https://x.example", "secret_env": "NOPE_NOT_SET"}}},
            environ={},
        )


def test_a_webhook_without_a_secret_is_an_error() -> None:
    with pytest.raises(SinkConfigError, match=r"needs secret = .* or secret_env"):
        load_sinks({"sinks": {"ops": {"type": "webhook", "url": "https://x.example"}}})


def test_every_problem_is_reported_with_its_key() -> None:
    doc = {
        "sinks": {
            "flush_timeot": "1s",
            "a": {"type": "webhook", "url": "ftp://x", "secret": "s", "timeout": "5"},
            "b": {"type": "healthchecks", "url": "https://hc-ping.com/key"},
            "c": {"type": "sentry", "dsn": "https://o0.ingest.sentry.io/42"},
        }
    }

    problems = sink_problems(doc)

    assert [p.key for p in problems] == [
        ("sinks", "flush_timeot"),
        ("sinks", "a", "timeout"),
        ("sinks", "a", "url"),
        ("sinks", "b", "url"),
        ("sinks", "c", "dsn"),
    ]
    assert all("\n" not in p.message for p in problems)


def test_sink_config_error_is_a_usage_error() -> None:
    assert issubclass(SinkConfigError, UsageError) and SinkConfigError([]).exit_code == 2


# -- cronwarden flush -----------------------------------------------------------


def config_file(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "cronwarden.toml"
    path.write_text(f'[sinks.hook]\ntype = "webhook"\nurl = "http://127.0.0.1:{port}/hook"\nsecret = "x"\n')
    return path


def test_flush_command_delivers_and_exits_0(
    store: SqliteStore, warden: Warden, receiver: Receiver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_ok(warden)
    path = config_file(tmp_path, receiver.port)

    code = cli_main(["flush", "--config", str(path), "--store", store.url])

    assert code == 0 and len(receiver.requests) == 2
    assert capsys.readouterr().out.strip() == "hook  delivered 2"


def test_flush_command_exits_1_when_a_sink_is_down(
    store: SqliteStore, warden: Warden, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_ok(warden)
    path = config_file(tmp_path, closed_port())

    code = cli_main(["flush", "--config", str(path), "--store", store.url, "--timeout", "2s"])

    assert code == 1
    assert "failed:" in capsys.readouterr().out


def test_flush_command_with_a_bad_sink_config_exits_2_with_one_line(
    store: SqliteStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cronwarden.toml"
    path.write_text('[sinks.hook]\ntype = "webhook"\nsecret = "x"\n')

    code = cli_main(["flush", "--config", str(path), "--store", store.url])

    assert code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("cronwarden: ") and "needs url" in line


def test_events_of_the_sink_job_are_not_pinged_to_healthchecks(
    store: SqliteStore, receiver: Receiver
) -> None:
    store.record(Event(kind=EventKind.SINK_FAILED, job="sink:hook", at=time.time(), data={"sink": "hook"}))
    [sink] = load_sinks({"sinks": {"hc": {"type": "healthchecks", "url": receiver.url("/k/{job}")}}})

    result = flush_now(store, [sink])

    assert receiver.requests == [] and result.skipped == 1
