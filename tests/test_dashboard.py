"""The dashboard (``cronwarden.web``, ``cronwarden dashboard``) on every
store: what each page and API answer shows of a scripted ledger, that it
only reads, that bad requests and an unreachable store get a clear answer,
and the real server process."""

from __future__ import annotations

import http.client
import json
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from conftest import Lapse
from cronwarden import cli
from cronwarden.clock import Clock, FakeClock
from cronwarden.errors import UsageError
from cronwarden.events import EventKind, Outcome, new_id
from cronwarden.monitor import Monitor, Thresholds
from cronwarden.monitor.views import audit_item
from cronwarden.stores import open_store
from cronwarden.stores.base import End, EventQuery, Start, Store
from cronwarden.web import Dashboard
from monitor_history import PERIOD, aligned, begin, describe, lease_of, run
from redisserver import RedisServer, free_port

CREEPING, STEADY = "creeping", "steady"


@pytest.fixture
def mclock(clock: Clock) -> FakeClock:
    from monitor_history import history_clock

    return history_clock(clock)


@pytest.fixture
def ledger(store: Store, mclock: FakeClock) -> dict[str, Any]:
    """Two jobs over the last day: ``creeping`` runs 4 minutes, then longer
    each time, up to 9 of its 10 (at risk, a slow finding holds); its last
    start was refused by an open run. ``steady`` runs a minute, and one of its
    runs is open now."""
    t0 = aligned(mclock.wall() - 86400)
    describe(store, CREEPING, at=t0, reason="the export must not run twice")
    describe(store, STEADY, at=t0)
    durations = [240.0 + 30 * i for i in range(11)]
    t = t0
    for d in durations:
        run(store, CREEPING, t, d)
        t += PERIOD
    held = lease_of(begin(store, CREEPING, t))
    refused = new_id()
    begin(store, CREEPING, t + 5, run_id=refused)
    for i in range(5):
        run(store, STEADY, t0 + i * PERIOD, 60.0)
    failed = lease_of(begin(store, STEADY, t0 + 5 * PERIOD))
    store.finish(
        failed,
        End(outcome=Outcome.FAILED, at=t0 + 5 * PERIOD + 3, exit_code=1, detail="<script>alert(1)</script>"),
    )
    open_run = lease_of(begin(store, STEADY, t + 10))
    mclock.advance(t + 20 - mclock.wall())
    return {"durations": durations, "held": held, "refused": refused, "open": open_run}


@pytest.fixture
def dashboard(store: Store, mclock: FakeClock) -> Dashboard:
    return Dashboard(Monitor(store, clock=mclock, thresholds=Thresholds(runs=20)), refresh=15)


def page(dashboard: Dashboard, target: str, status: int = 200) -> str:
    response = dashboard.handle("GET", target)
    assert response.status == status, response.body[:500]
    return response.body.decode()


def api(dashboard: Dashboard, target: str, status: int = 200) -> Any:
    response = dashboard.handle("GET", target)
    assert response.status == status, response.body[:500]
    assert response.content_type == "application/json"
    return json.loads(response.body)


def row_of(html_text: str, needle: str) -> str:
    rows = [r for r in re.findall(r"<tr>(.*?)</tr>", html_text) if needle in r]
    assert rows, f"no table row with {needle!r}"
    return rows[0]


def test_front_page_shows_verdicts_findings_open_runs_and_trouble(
    dashboard: Dashboard, ledger: dict[str, Any]
) -> None:
    text = page(dashboard, "/")
    creeping = row_of(text, f'href="/jobs/{CREEPING}"')
    assert 'class="badge at-risk">at risk<' in creeping
    # Its last ending failed: failing, not a green ok.
    assert 'class="badge failing">failing<' in row_of(text, f'href="/jobs/{STEADY}"')
    findings = text[text.index("<h2>Findings</h2>") : text.index("<h2>Open runs</h2>")]
    finding = row_of(findings, ">slow<")
    assert 'class="badge warning">warning<' in finding and "88% of the 10m period" in finding
    open_runs = text[text.index("<h2>Open runs</h2>") : text.index("<h2>Latest trouble</h2>")]
    row = row_of(open_runs, ledger["open"].run_id)
    assert f'href="/jobs/{STEADY}"' in row and "<td>running</td>" in row
    assert f"held by {ledger['held'].run_id}" in row_of(text, ledger["refused"])
    assert '<meta http-equiv="refresh" content="15">' in text


def test_pages_only_read_no_finding_recorded_no_run_abandoned(
    dashboard: Dashboard, ledger: dict[str, Any], store: Store, mclock: FakeClock, lapse: Lapse
) -> None:
    dying = lease_of(begin(store, "dying", mclock.wall(), ttl=lapse.ttl))
    lapse.expire(store, dying)
    watched = [EventKind.SLOW, EventKind.STUCK, EventKind.ABANDONED]
    before = store.events(EventQuery(kinds=watched, limit=1000))
    for target in ("/", f"/jobs/{CREEPING}", "/jobs/dying", "/api/jobs", f"/api/jobs/{CREEPING}", "/metrics"):
        dashboard.handle("GET", target)
    assert store.events(EventQuery(kinds=watched, limit=1000)) == before
    assert store.run(dying.run_id).outcome is None  # type: ignore[union-attr]
    # The positive control: the monitor's own pass, recording, does both.
    dashboard.monitor.evaluate(record=True)
    assert {e.kind for e in store.events(EventQuery(kinds=watched, limit=1000))} >= {
        EventKind.SLOW,
        EventKind.ABANDONED,
    }
    assert store.run(dying.run_id).outcome is Outcome.ABANDONED  # type: ignore[union-attr]


def test_api_jobs_is_the_audit_of_the_same_monitor(dashboard: Dashboard, ledger: dict[str, Any]) -> None:
    got = api(dashboard, "/api/jobs")
    t = dashboard.monitor.thresholds
    expected = [audit_item(s, t) for s in dashboard.monitor.audit()]
    assert got["jobs"] == expected
    assert {(f["rule"], f["job"]) for f in got["findings"]} >= {("slow", CREEPING)}


def test_job_page_charts_each_runs_duration_against_the_period(
    dashboard: Dashboard, ledger: dict[str, Any]
) -> None:
    text = page(dashboard, f"/jobs/{CREEPING}")
    svg = text[text.index("<svg") : text.index("</svg>")]
    bars = [float(h) for h in re.findall(r'<rect [^>]*height="([\d.]+)"', svg)]
    # The 11 finished runs oldest first, then the open one (its age so far: 20 s).
    assert len(bars) == len(ledger["durations"]) + 1
    finished = bars[:-1]
    assert finished == sorted(finished) and finished[0] < finished[-1]
    ratios = [b / d for b, d in zip(finished, ledger["durations"], strict=True)]
    assert max(ratios) == pytest.approx(min(ratios), rel=0.01)  # heights proportional to durations
    period_y = float(re.search(r'<line [^>]*y1="([\d.]+)"[^>]*stroke="#333"', svg).group(1))  # type: ignore[union-attr]
    tallest_top = min(float(y) for y in re.findall(r'<rect [^>]*y="([\d.]+)"', svg))
    assert tallest_top > period_y  # 9 minutes stays under the 10-minute line
    assert 'class="badge at-risk">at risk<' in text
    assert "the export must not run twice" in text
    assert ledger["refused"] in text  # the refused start, between the runs


def test_api_job_history_matches_cronwarden_history_json(
    dashboard: Dashboard, ledger: dict[str, Any], store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    got = api(dashboard, f"/api/jobs/{CREEPING}?limit=5")
    assert cli.main(["history", CREEPING, "--limit", "5", "--json", "--store", store_url]) == 0
    assert got["history"] == json.loads(capsys.readouterr().out)
    assert got["job"]["verdict"] == "at risk"


def test_api_runs_lists_the_open_runs(dashboard: Dashboard, ledger: dict[str, Any]) -> None:
    got = api(dashboard, "/api/runs")
    assert {r["run_id"] for r in got} == {ledger["held"].run_id, ledger["open"].run_id}
    assert [r["run_id"] for r in api(dashboard, f"/api/runs?job={STEADY}")] == [ledger["open"].run_id]


def test_api_events_filters_by_kind_job_and_limit(dashboard: Dashboard, ledger: dict[str, Any]) -> None:
    skipped = api(dashboard, "/api/events?kind=skipped")
    assert [e["run_id"] for e in skipped] == [ledger["refused"]]
    assert skipped[0]["data"]["holder_run_id"] == ledger["held"].run_id
    two = api(dashboard, f"/api/events?job={STEADY}&kind=started,failed&limit=2")
    assert len(two) == 2 and {e["job"] for e in two} == {STEADY}
    assert {e["kind"] for e in two} <= {"started", "failed"}


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("/api/events?kind=nope", "kind='nope' is no event kind"),
        ("/api/events?limit=0", "limit='0': expected a whole number from 1 to 1000"),
        ("/api/events?limit=ten", "expected a whole number"),
        ("/api/events?since=yesterday", "since='yesterday' is not a time"),
        ("/api/events?since=nan", "is not a time"),
        ("/api/events?job=a&job=b", "job given 2 times"),
        ("/api/jobs/creeping?limit=100000", "from 1 to 1000"),
    ],
)
def test_bad_api_parameters_are_400_with_what_was_expected(
    dashboard: Dashboard, ledger: dict[str, Any], target: str, says: str
) -> None:
    assert says in api(dashboard, target, 400)["error"]


def test_unknown_pages_and_jobs_are_404_and_writes_405(dashboard: Dashboard, ledger: dict[str, Any]) -> None:
    assert "no job named 'nobody'" in api(dashboard, "/api/jobs/nobody", 404)["error"]
    assert "no job named" in page(dashboard, "/jobs/nobody", 404)
    assert "no page at /admin" in page(dashboard, "/admin", 404)
    response = dashboard.handle("POST", "/api/jobs")
    assert response.status == 405 and response.headers["Allow"] == "GET, HEAD"


def test_everything_read_from_the_ledger_is_escaped(
    dashboard: Dashboard, ledger: dict[str, Any], store: Store, mclock: FakeClock
) -> None:
    describe(store, "hostile", at=mclock.wall(), reason="<i>why</i>")
    start = Start(job="hostile", key="hostile", run_id="<u>run</u>", host="<b>host</b>", pid=1, ttl=3600,
                  at=mclock.wall())  # fmt: skip
    broke = End(outcome=Outcome.FAILED, at=mclock.wall() + 1, exit_code=3, detail="<s>broke</s>")
    store.finish(lease_of(store.acquire(start)), broke)
    for target in ("/", f"/jobs/{STEADY}", "/jobs/hostile"):
        text = page(dashboard, target)
        for tag in ("script", "i", "u", "b", "s"):
            assert f"<{tag}>" not in text, (target, tag)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page(dashboard, f"/jobs/{STEADY}")
    hostile = page(dashboard, "/jobs/hostile")
    for shown in (
        "&lt;i&gt;why&lt;/i&gt;",
        "&lt;u&gt;run&lt;/u&gt;",
        "&lt;b&gt;host&lt;/b&gt;",
        "&lt;s&gt;broke",
    ):
        assert shown in hostile


def test_metrics_is_the_prometheus_exposition(dashboard: Dashboard, ledger: dict[str, Any]) -> None:
    pytest.importorskip("prometheus_client")
    response = dashboard.handle("GET", "/metrics")
    assert response.status == 200 and response.content_type.startswith("text/plain; version=0.0.4")
    assert f'cronwarden_job_skips{{job="{CREEPING}"}} 1.0' in response.body.decode()


def test_metrics_without_prometheus_client_is_501_saying_what_to_install(
    dashboard: Dashboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cronwarden.monitor.metrics

    def missing() -> None:
        raise UsageError("metrics need the 'prometheus_client' package: pip install 'cronwarden[metrics]'")

    monkeypatch.setattr(cronwarden.monitor.metrics, "require_prometheus_client", missing)
    response = dashboard.handle("GET", "/metrics")
    assert response.status == 501
    assert "pip install 'cronwarden[metrics]'" in json.loads(response.body)["error"]


def test_an_unreachable_store_is_a_503_and_pages_come_back_with_it(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    server = RedisServer(tmp_path)  # not started yet: the store is unreachable
    store = open_store(server.url(connect_timeout="0.5s", socket_timeout="0.5s"))
    try:
        dashboard = Dashboard(Monitor(store))
        assert dashboard.handle("GET", "/healthz").status == 503
        response = dashboard.handle("GET", "/api/jobs")
        assert response.status == 503
        assert json.loads(response.body)["error"].startswith("the store cannot be read now:")
        assert "the store cannot be read now" in dashboard.handle("GET", "/").body.decode()
        server.start()
        assert dashboard.handle("GET", "/healthz").status == 200
        assert api(dashboard, "/api/jobs")["jobs"] == []
    finally:
        store.close()
        server.stop()


# -- the command ----------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    db = tmp_path / "cw.db"
    store = f"sqlite:///{db}"
    cmd = [sys.executable, "-m", "cronwarden"]
    subprocess.run(
        [*cmd, "run", "--store", store, "--job", "nightly", "--every", "1d", "--", "true"], check=True
    )
    proc = subprocess.Popen(
        [*cmd, "dashboard", "--store", store, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        assert sel.select(timeout=20), "the dashboard printed no address within 20 s"
        line = proc.stdout.readline()  # type: ignore[union-attr]
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found, line
        yield proc, found.group(0), store
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


def exchange(url: str, request: bytes) -> list[tuple[int, bytes]]:
    """Send raw bytes on one connection; the (status, body) of each answer."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    answers = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
        answers.append((status, raw[:length]))
        raw = raw[length:]
    return answers


def test_the_server_speaks_http_1_1_carefully(served: tuple[subprocess.Popen[str], str, str]) -> None:
    proc, url, _ = served
    # HEAD: the headers of GET, no body.
    conn = http.client.HTTPConnection(urlsplit(url).hostname, urlsplit(url).port, timeout=10)
    conn.request("HEAD", "/api/jobs")
    head = conn.getresponse()
    assert head.status == 200 and int(head.headers["Content-Length"]) > 0 and head.read() == b""
    # Every other method is 405 with Allow, whatever http.server knows of it.
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "BREW"):
        conn.request(method, "/api/jobs", body=b"{}")
        answer = conn.getresponse()
        assert (answer.status, answer.headers["Allow"]) == (405, "GET, HEAD"), method
        answer.read()
    conn.close()
    # A POST's body is read and dropped, not taken for the next request on the connection.
    smuggled = b"GET /api/runs HTTP/1.1\r\nHost: x\r\n\r\n"
    answers = exchange(url, b"POST /api/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                       b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                       % (len(smuggled), smuggled))  # fmt: skip
    assert [(status, body) for status, body in answers][1] == (200, b"ok\n")
    assert [status for status, _ in answers] == [405, 200]
    # A target that is no URL is a 400, and a path with control characters is logged escaped.
    assert exchange(url, b"GET http://[/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")[0][0] == 400
    assert exchange(url, b"GET /\x1b[2J HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")[0][0] == 404
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    log = proc.stderr.read()  # type: ignore[union-attr]
    assert "GET /\\x1b[2J 404" in log and "\x1b" not in log
    assert "Traceback" not in log and "Exception" not in log


def test_the_server_answers_over_http_and_stops_on_sigterm(
    served: tuple[subprocess.Popen[str], str, str],
) -> None:
    proc, url, _ = served
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200 and "nightly" in r.read().decode()
    with urllib.request.urlopen(url + "api/jobs", timeout=10) as r:
        assert [j["job"] for j in json.load(r)["jobs"]] == ["nightly"]
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(url + "api/events?limit=0", timeout=10)
    assert caught.value.code == 400
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    log = proc.stderr.read()  # type: ignore[union-attr]
    assert "GET / 200" in log and "GET /api/events?limit=0 400" in log
    assert "Traceback" not in log


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--listen", "8370"], "expected HOST:PORT such as 127.0.0.1:8370, got '8370'"),
        (["--listen", "127.0.0.1:99999"], "expected HOST:PORT"),
        (["--refresh", "soon"], "--refresh must be a duration"),
        (["--runs", "0"], "--runs"),
        (["--refresh", "500ms"], "--refresh must be 0 (never) or at least 1s, got '500ms'"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["dashboard", "--store", f"sqlite:///{tmp_path / 'cw.db'}", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_an_address_in_use_is_exit_2_and_sigterm_is_given_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli.main(["run", "--store", f"sqlite:///{tmp_path / 'cw.db'}", "--job", "j", "--", "true"])
    before = signal.getsignal(signal.SIGTERM)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(
            ["dashboard", "--store", f"sqlite:///{tmp_path / 'cw.db'}", "--listen", f"127.0.0.1:{port}"]
        )
    assert code == 2
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_sqlite_path_with_no_ledger_is_refused_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = tmp_path / "no-such-dir" / "cw.db"
    assert cli.main(["dashboard", "--store", f"sqlite:///{typo}"]) == 2
    assert f"no ledger at {typo}" in capsys.readouterr().err
    assert not typo.parent.exists()


def test_an_unreachable_store_at_start_is_exit_75(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("redis")
    url = f"redis://127.0.0.1:{free_port()}/0?connect_timeout=0.5s"
    assert cli.main(["dashboard", "--store", url, "--listen", "127.0.0.1:0"]) == 75
    err = capsys.readouterr().err
    assert err.startswith("cronwarden: ") and len(err.strip().splitlines()) == 1


def test_help_names_every_page(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["dashboard", "--help"])
    out = capsys.readouterr().out
    for path in ("/jobs/NAME", "/api/jobs", "/api/events", "/metrics", "/healthz"):
        assert path in out


def test_monitor_listen_serves_the_findings_its_own_loop_records(tmp_path: Path) -> None:
    """``cronwarden monitor --listen``: one process records findings in its
    loop and serves them; the dashboard shows what the loop wrote."""
    store = f"sqlite:///{tmp_path / 'cw.db'}"
    with open_store(store) as ledger:
        t = aligned(time.time() - 86400)
        describe(ledger, CREEPING, at=t)
        for i in range(5):  # 9 minutes of a 10-minute period: slow
            run(ledger, CREEPING, t + i * PERIOD, 540.0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cronwarden", "monitor", "--store", store, "--listen", "127.0.0.1:0",
         "--interval", "1s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stderr, selectors.EVENT_READ)  # type: ignore[arg-type]
        assert sel.select(timeout=20), "monitor printed no dashboard address within 20 s"
        found = re.search(r"dashboard on (http://127\.0\.0\.1:\d+/)", proc.stderr.readline())  # type: ignore[union-attr]
        assert found
        url = found.group(1)
        deadline = time.monotonic() + 20
        raised: list[Any] = []
        while not raised and time.monotonic() < deadline:
            with urllib.request.urlopen(url + "api/events?kind=slow", timeout=10) as r:
                raised = [e for e in json.load(r) if e["data"].get("state") == "raised"]
            if not raised:
                threading.Event().wait(0.2)  # the loop's first pass is under way
        assert raised and raised[0]["job"] == CREEPING
        with urllib.request.urlopen(url, timeout=10) as r:
            assert 'class="badge at-risk">at risk<' in r.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)  # as a service manager stops it: a clean exit
        assert proc.wait(timeout=10) == 0
        assert "Traceback" not in proc.stderr.read()  # type: ignore[union-attr]
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


def test_monitor_listen_refuses_once_and_a_bad_address(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'cw.db'}"
    assert cli.main(["monitor", "--store", store, "--listen", "127.0.0.1:0", "--once"]) == 2
    assert "--listen serves while the monitor loops: drop --once" in capsys.readouterr().err
    assert cli.main(["monitor", "--store", store, "--listen", "nowhere"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err
    assert cli.main(["monitor", "--store", store, "--refresh", "10s"]) == 2
    assert "--refresh is how often the dashboard's pages reload: give --listen too" in capsys.readouterr().err
