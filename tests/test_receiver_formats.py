"""What each receiver is sent, as its API documents it, checked on real
loopback receivers: Healthchecks slugs, exit statuses and UUID ``rid``s;
Sentry check-ins with UUID ids and the monitor upsert; webhook signatures
that refuse a replay; routing by job, tag, kind and snooze; Apprise."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.receivers import Receiver

from cronwarden.clock import FakeClock
from cronwarden.events import Event, EventKind, JobInfo, new_id
from cronwarden.outbox import SinkResult, flush_sinks
from cronwarden.sinks import SinkConfigError, load_sinks, sink_problems
from cronwarden.sinks.base import Sink
from cronwarden.sinks.webhook import verify
from cronwarden.stores.base import EventQuery
from cronwarden.stores.sqlite import SqliteStore

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "cronwarden.db")
    yield s
    s.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def sink_of(table: dict[str, Any], doc: dict[str, Any] | None = None, name: str = "s") -> Sink:
    [sink] = load_sinks({**(doc or {}), "sinks": {name: table}})
    return sink


def registered(store: SqliteStore, name: str = "s") -> None:
    assert store.undelivered(name, 1, backfill=0) == []


def record(store: SqliteStore, kind: EventKind, job: str = "nightly", run_id: str | None = None,
           **data: Any) -> Event:  # fmt: skip
    event = Event(kind=kind, job=job, run_id=run_id, at=time.time(), data=data)
    store.record(event)
    return event


def flush(store: SqliteStore, sink: Sink) -> SinkResult:
    clock = FakeClock(start=time.time())
    [result] = flush_sinks(store, [sink], deadline=clock.monotonic() + 10, clock=clock)
    return result


# -- Healthchecks ------------------------------------------------------------------


def test_healthchecks_maps_a_job_name_to_a_slug_and_says_it_once(
    store: SqliteStore, receiver: Receiver
) -> None:
    registered(store)
    rid = new_id()
    record(store, EventKind.STARTED, "Nightly.Export@eu", rid, host="h", pid=1, token=1)
    record(store, EventKind.FAILED, "Nightly.Export@eu", rid, exit_code=3, detail="exit status 3",
           duration=2.0)  # fmt: skip

    result = flush(store, sink_of({"type": "healthchecks", "url": receiver.url("/ping/KEY/{job}")}))

    assert result.ok
    assert [(q.path, q.rid) for q in receiver.requests] == [
        ("/ping/KEY/nightly-export-eu/start", rid),
        ("/ping/KEY/nightly-export-eu/3", rid),
    ]
    body = receiver.requests[1].body.decode()
    assert body.count("exit status 3") == 1, body


@pytest.mark.parametrize(
    ("kind", "data", "path"),
    [
        (EventKind.SUCCEEDED, {"exit_code": 0}, "/k/nightly/0"),
        (EventKind.SUCCEEDED, {"exit_code": None}, "/k/nightly"),
        (EventKind.FAILED, {"exit_code": 2}, "/k/nightly/2"),
        (EventKind.FAILED, {"exit_code": None, "detail": "RuntimeError: boom"}, "/k/nightly/fail"),
        (EventKind.FAILED, {"exit_code": 300}, "/k/nightly/fail"),
        (EventKind.TIMED_OUT, {"exit_code": 143}, "/k/nightly/fail"),
        (EventKind.INTERRUPTED, {"exit_code": 143, "signal": "SIGTERM"}, "/k/nightly/fail"),
        (EventKind.STOPPED, {"by": "alice", "reason": "bad data"}, "/k/nightly/fail"),
        (EventKind.SKIPPED, {"holder_run_id": "x"}, "/k/nightly/log"),
    ],
)
def test_healthchecks_pings_each_ending_at_its_documented_endpoint(
    store: SqliteStore, receiver: Receiver, kind: EventKind, data: dict[str, Any], path: str
) -> None:
    registered(store)
    record(store, kind, "nightly", new_id(), **data)

    flush(store, sink_of({"type": "healthchecks", "url": receiver.url("/k/{job}")}))

    assert [q.path for q in receiver.requests] == [path]


def test_healthchecks_rid_is_always_a_uuid_the_same_for_every_ping_of_a_run(
    store: SqliteStore, receiver: Receiver
) -> None:
    registered(store)
    record(store, EventKind.STARTED, "nightly", "celery-task-42", host="h", pid=1, token=1)
    record(store, EventKind.SUCCEEDED, "nightly", "celery-task-42", exit_code=0)
    canonical = new_id()
    record(store, EventKind.STARTED, "nightly", canonical.upper(), host="h", pid=1, token=2)

    flush(store, sink_of({"type": "healthchecks", "url": receiver.url("/k/{job}")}))

    rids = [q.rid for q in receiver.requests]
    assert rids[0] == rids[1] and rids[0] is not None
    assert str(uuid.UUID(rids[0])) == rids[0], "not a canonical UUID"
    assert rids[2] == canonical, "a UUID run id is sent as it is"


def test_healthchecks_slugs_and_create_as_configured(store: SqliteStore, receiver: Receiver) -> None:
    registered(store)
    record(store, EventKind.STARTED, "reconcile", new_id(), host="h", pid=1, token=1)
    record(store, EventKind.STARTED, "other", new_id(), host="h", pid=1, token=1)
    table = {"type": "healthchecks", "url": receiver.url("/k/{job}"), "slugs": {"reconcile": "recon-prod"},
             "create": True}  # fmt: skip

    flush(store, sink_of(table))

    assert sorted((q.path, q.query.split("&")[0]) for q in receiver.requests) == [
        ("/k/other/start", "create=1"),
        ("/k/recon-prod/start", "create=1"),
    ]


def test_healthchecks_refuses_a_job_name_with_no_slug_and_says_why(
    store: SqliteStore, receiver: Receiver
) -> None:
    registered(store)
    long_name = "n" * 101
    record(store, EventKind.STARTED, long_name, new_id(), host="h", pid=1, token=1)
    record(store, EventKind.STARTED, "short", new_id(), host="h", pid=1, token=1)

    result = flush(store, sink_of({"type": "healthchecks", "url": receiver.url("/k/{job}")}))

    assert [q.path for q in receiver.requests] == ["/k/short/start"]
    assert result.rejected == 1 and "no Healthchecks slug" in (result.rejection or "")
    [why] = store.events(EventQuery(job="sink:s", kinds=[EventKind.SINK_REJECTED]))
    assert why.data["job"] == long_name and why.data["status"] is None


def test_healthchecks_slug_config_is_checked() -> None:
    problems = sink_problems({"sinks": {"hc": {"type": "healthchecks", "url": "https://hc-ping.com/K/{job}",
                                               "slugs": {"a": "Bad Slug", "b": "x", "c": "x"}}}})  # fmt: skip

    messages = [p.message for p in problems]
    assert any("'Bad Slug' is not a Healthchecks slug" in m for m in messages)
    assert any("b and c both ping slug 'x'" in m for m in messages)


# -- Sentry ------------------------------------------------------------------------


def sentry_table(receiver: Receiver, **kwargs: Any) -> dict[str, Any]:
    return {"type": "sentry", "dsn": f"http://pk@127.0.0.1:{receiver.port}/42", **kwargs}


def check_ins(receiver: Receiver) -> list[dict[str, Any]]:
    return [json.loads(q.body.decode().splitlines()[2]) for q in receiver.requests]


def test_sentry_check_in_id_is_a_uuid_also_for_a_run_id_that_is_not(
    store: SqliteStore, receiver: Receiver
) -> None:
    registered(store)
    record(store, EventKind.STARTED, "nightly", "job-7", host="h", pid=1, token=1)
    record(store, EventKind.INTERRUPTED, "nightly", "job-7", exit_code=143, signal="SIGTERM", duration=1.5)

    flush(store, sink_of(sentry_table(receiver)))

    [opened, closed] = check_ins(receiver)
    assert opened["check_in_id"] == closed["check_in_id"]
    assert uuid.UUID(hex=opened["check_in_id"]).hex == opened["check_in_id"]
    assert (opened["status"], closed["status"], closed["duration"]) == ("in_progress", "error", 1.5)
    assert "monitor_config" not in opened, "the upsert is opt-in"


def test_sentry_upserts_the_monitor_from_the_jobs_schedule(store: SqliteStore, receiver: Receiver) -> None:
    store.save_job(JobInfo(name="nightly", schedule="CRON_TZ=Europe/Berlin 30 2 * * *", period=86400.0,
                           grace=90.0, max_runtime=3600.0, updated_at=time.time()))  # fmt: skip
    store.save_job(JobInfo(name="often", schedule="every 15m", period=900.0, updated_at=time.time()))
    store.save_job(JobInfo(name="odd", schedule="every 90s", period=90.0, updated_at=time.time()))
    registered(store)
    for job in ("nightly", "often", "odd"):
        record(store, EventKind.STARTED, job, new_id(), host="h", pid=1, token=1)
    table = sentry_table(receiver, monitor_config=True, failure_issue_threshold=2, recovery_threshold=3)

    flush(store, sink_of(table))

    configs = {c["monitor_slug"]: c.get("monitor_config") for c in check_ins(receiver)}
    assert configs["nightly"] == {
        "schedule": {"type": "crontab", "value": "30 2 * * *"},
        "timezone": "Europe/Berlin",
        "checkin_margin": 2,
        "max_runtime": 60,
        "failure_issue_threshold": 2,
        "recovery_threshold": 3,
    }
    assert configs["often"] == {
        "schedule": {"type": "interval", "value": 15, "unit": "minute"},
        "failure_issue_threshold": 2,
        "recovery_threshold": 3,
    }
    assert configs["odd"] is None, "90s is not a whole number of Sentry's units"


def test_sentry_thresholds_without_the_upsert_are_a_config_problem() -> None:
    with pytest.raises(SinkConfigError, match="give monitor_config = true too"):
        load_sinks({"sinks": {"s": {"type": "sentry", "dsn": "https://k@o0.ingest.sentry.io/1",
                                    "recovery_threshold": 2}}})  # fmt: skip


# -- webhooks: signed against replay --------------------------------------------------


def documented_receiver() -> Any:
    """The receiver's check as docs/sinks.md shows it, run from the document."""
    from tests.docs.blocks import parse_document

    path = ROOT / "docs" / "sinks.md"
    document = parse_document(str(path), path.read_text())
    [block] = [b for b in document.blocks if b.lang == "python" and "def verify_request" in b.text]
    namespace: dict[str, Any] = {}
    exec(compile(block.text.split("\n# --- a demonstration")[0], str(path), "exec"), namespace)
    return namespace["verify_request"]


def test_a_replayed_or_stale_webhook_request_fails_the_documented_verification(
    store: SqliteStore, receiver: Receiver
) -> None:
    registered(store)
    record(store, EventKind.SUCCEEDED, "nightly", new_id(), exit_code=0)
    secret = b"a-long-random-secret"

    flush(store, sink_of({"type": "webhook", "url": receiver.url(), "secret": secret.decode()}))

    [q] = receiver.requests
    header, event_id, body = q.headers["X-Cronwarden-Signature"], q.headers["X-Cronwarden-Event-Id"], q.body
    now = time.time()
    for check in (documented_receiver(), lambda *a, now: verify(*a, now=now)):
        assert check(secret, header, event_id, body, now=now), "the genuine request does not verify"
        assert not check(secret, header, new_id(), body, now=now), "a replay under a new id verified"
        assert not check(secret, header, event_id, body + b" ", now=now), "a changed body verified"
        assert not check(b"another secret", header, event_id, body, now=now)
        assert not check(secret, header, event_id, body, now=now + 301), "a stale request verified"
        t = int(header.split(",")[0].removeprefix("t="))
        fresh = f"t={t + 400}," + header.split(",")[1]
        assert not check(secret, fresh, event_id, body, now=now + 400), "a re-dated signature verified"
    expected = hmac.new(secret, f"{t}.{event_id}.".encode() + body, hashlib.sha256).hexdigest()
    assert header == f"t={t},v1={expected}"


# -- routing -----------------------------------------------------------------------


def test_routes_send_each_sink_its_kinds_for_its_jobs_and_tags(
    store: SqliteStore, receiver: Receiver
) -> None:
    doc = {"jobs": {"billing-run": {"tags": ["payments"]}, "ledger-close": {"tags": ["payments"]}}}
    table = {"type": "webhook", "url": receiver.url(), "secret": "x",
             "routes": [{"jobs": ["billing-*"], "kinds": ["refusals"]},
                        {"tags": ["payments"], "kinds": ["failures", "findings"]}]}  # fmt: skip
    sink = sink_of(table, doc)
    registered(store)
    sent = [
        record(store, EventKind.SKIPPED, "billing-run", new_id()),  # route 1
        record(store, EventKind.FAILED, "ledger-close", new_id()),  # route 2 (tag)
        record(store, EventKind.SLOW, "billing-run", None, state="raised"),  # route 2
    ]
    unsent = [
        record(store, EventKind.SUCCEEDED, "billing-run", new_id()),  # no route takes successes
        record(store, EventKind.SKIPPED, "reports", new_id()),  # neither job nor tag
        record(store, EventKind.FAILED, "reports", new_id()),
    ]

    result = flush(store, sink)

    got = sorted(json.loads(q.body)["event_id"] for q in receiver.requests)
    assert got == sorted(e.event_id for e in sent)
    assert (result.delivered, result.skipped) == (3, 3) and len(unsent) == 3


def test_snoozed_findings_reach_only_a_sink_whose_route_says_so(store: SqliteStore, tmp_path: Path) -> None:
    """Findings the monitor raised while the job was snoozed carry
    ``snoozed = true``: an alerting sink is not sent them, the log sink
    (which keeps everything) is, and so is a route with ``snoozed = true``."""
    pager, chat = Receiver(), Receiver()
    log = tmp_path / "events.jsonl"
    try:
        sinks = load_sinks({"sinks": {
            "pager": {"type": "webhook", "url": pager.url(), "secret": "x", "kinds": ["findings"]},
            "chat": {"type": "webhook", "url": chat.url(), "secret": "x", "kinds": ["findings"],
                     "snoozed": True},
            "file": {"type": "log", "path": str(log)},
        }})  # fmt: skip
        for sink in sinks:
            registered(store, sink.name)
        quiet = record(store, EventKind.SLOW, "nightly", None, state="raised", summary="p95 9m", snoozed=True)
        loud = record(store, EventKind.STUCK, "nightly", None, state="raised", summary="open 2h")
        clock = FakeClock(start=time.time())
        flush_sinks(store, sinks, deadline=clock.monotonic() + 10, clock=clock)
        to_pager = [json.loads(q.body)["event_id"] for q in pager.requests]
        to_chat = [json.loads(q.body)["event_id"] for q in chat.requests]
    finally:
        pager.stop()
        chat.stop()

    assert to_pager == [loud.event_id]
    assert sorted(to_chat) == sorted([quiet.event_id, loud.event_id])
    logged = [json.loads(line)["event_id"] for line in log.read_text().splitlines()]
    assert quiet.event_id in logged and loud.event_id in logged


def test_route_config_is_strict() -> None:
    doc = {"sinks": {
        "a": {"type": "webhook", "url": "https://x.example", "secret": "s", "kinds": ["failure"]},
        "b": {"type": "webhook", "url": "https://x.example", "secret": "s", "jobs": ["x"], "routes": [{}]},
        "c": {"type": "log", "concurrency": 4},
        "d": {"type": "webhook", "url": "https://x.example", "secret": "s", "routes": [{"kind": ["failed"]}]},
    }}  # fmt: skip

    messages = [p.message for p in sink_problems(doc)]

    assert "[sinks.a] kinds: unknown kind 'failure'; did you mean 'failures'?" in messages
    assert any("has routes, so jobs belongs in each [[sinks.b.routes]] table" in m for m in messages)
    assert any("a log sink writes one batch at a time" in m for m in messages)
    assert any("unknown key 'kind' in [sinks.d] route 1" in m for m in messages)


def test_job_tags_are_checked_with_the_job() -> None:
    from cronwarden.config import load
    from cronwarden.errors import UsageError

    with pytest.raises(UsageError, match="tags must be a non-empty list"):
        load_text('[jobs.nightly]\ntags = "payments"\n', load)


def load_text(text: str, load: Any) -> Any:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cronwarden.toml"
        path.write_text(text)
        return load(str(path))


# -- Apprise -----------------------------------------------------------------------


def test_apprise_json_url_notifies_a_real_receiver_with_title_body_and_type(
    store: SqliteStore, receiver: Receiver
) -> None:
    pytest.importorskip("apprise")
    registered(store)
    failed = record(store, EventKind.FAILED, "nightly", new_id(), exit_code=3, duration=4.0)
    record(store, EventKind.SUCCEEDED, "nightly", new_id(), exit_code=0)  # not an alert: not sent
    sink = sink_of({"type": "apprise", "url": f"json://127.0.0.1:{receiver.port}/notify"})

    result = flush(store, sink)

    assert result.ok and (result.delivered, result.skipped) == (1, 1)
    [q] = receiver.requests
    payload = json.loads(q.body)
    assert q.path == "/notify"
    assert payload["title"] == "nightly: failed" and payload["type"] == "failure"
    assert f"run {failed.run_id} of nightly" in payload["message"] and "exit status 3" in payload["message"]


def test_apprise_service_down_backs_off_and_keeps_the_event(store: SqliteStore) -> None:
    pytest.importorskip("apprise")
    registered(store)
    failed = record(store, EventKind.FAILED, "nightly", new_id(), exit_code=3)
    down = Receiver(status=lambda q, n: 500)
    try:
        result = flush(store, sink_of({"type": "apprise", "url": f"json://127.0.0.1:{down.port}/notify"}))
    finally:
        down.stop()

    assert result.error is not None and "did not take the notification" in result.error
    assert result.rejected == 0
    assert store.undelivered("s", 10)[0].event_id == failed.event_id


def test_an_apprise_url_apprise_cannot_use_is_a_config_problem() -> None:
    pytest.importorskip("apprise")
    with pytest.raises(SinkConfigError, match="is not a URL Apprise can use"):
        load_sinks({"sinks": {"chat": {"type": "apprise", "url": "nosuchservice://x"}}})


def test_reading_the_config_at_a_runs_start_does_not_import_apprise() -> None:
    """A run's config read checks an Apprise URL's shape only; Apprise
    (a tenth of a second to import) is loaded to deliver, after the run."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from cronwarden.sinks import sink_problems\n"
        "problems = sink_problems({'sinks': {'chat': {'type': 'apprise', 'url': 'json://localhost/x'},"
        " 'bad': {'type': 'apprise', 'url': 'no url'}}})\n"
        "print([p.key for p in problems], 'apprise' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[('sinks', 'bad', 'url')] False"
