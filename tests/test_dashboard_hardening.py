"""The dashboard's HTTP server on a real loopback socket: a request framed
two ways is refused and its connection closed (no desync behind a lenient
proxy), every answer carries the security headers, and with a token every
request must bring it (bearer header or the login form's cookie); beyond
loopback a token is required."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cronwarden.errors import UsageError
from cronwarden.monitor import Monitor
from cronwarden.stores import open_store
from cronwarden.web import bind
from cronwarden.web.dashboard import Dashboard

TOKEN = "0123456789abcdef0123"


def _serve(tmp_path: Path, token: str | None) -> Iterator[int]:
    store = open_store(f"sqlite:///{tmp_path / 'l.db'}")
    server = bind(Dashboard(Monitor(store)), "127.0.0.1", 0, token=token)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        store.close()


@pytest.fixture
def port(tmp_path: Path) -> Iterator[int]:
    yield from _serve(tmp_path, None)


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[int]:
    yield from _serve(tmp_path, TOKEN)


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                return b"".join(chunks)  # the server closed the connection
            chunks.append(data)


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 0\r\nContent-Length: 44\r\n",
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
    ],
)
def test_a_request_framed_two_ways_is_refused_and_its_connection_closed(port: int, framing: bytes) -> None:
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = _raw(port, b"POST / HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n" + smuggled)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1  # the rest was not served as a second request


def test_every_answer_carries_the_security_headers(port: int) -> None:
    for path in ("/", "/api/jobs", "/nowhere"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        assert "frame-ancestors 'none'" in (r.getheader("Content-Security-Policy") or "")
        assert r.getheader("X-Frame-Options") == "DENY"
        assert r.getheader("X-Content-Type-Options") == "nosniff"
        conn.close()


def _get(port: int, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), body


def test_with_a_token_every_request_must_bring_it(guarded: int) -> None:
    status, headers, body = _get(guarded, "/api/jobs", {})
    assert status == 401 and b"<form" in body and headers["WWW-Authenticate"].startswith("Bearer")
    assert _get(guarded, "/api/jobs", {"Authorization": "Bearer wrong-token-wrong-token"})[0] == 401
    assert _get(guarded, "/api/jobs", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert _get(guarded, "/metrics", {"Cookie": "cronwarden_token=nope"})[0] == 401


def test_the_login_form_sets_a_cookie_that_lets_the_browser_in(guarded: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", guarded, timeout=10)
    conn.request(
        "POST", "/login", body="token=wrong", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    r = conn.getresponse()
    r.read()
    assert r.status == 401 and r.getheader("Set-Cookie") is None
    conn.request("POST", "/login", body=f"token={TOKEN}",
                 headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    r = conn.getresponse()
    r.read()
    assert r.status == 303 and r.getheader("Location") == "/"
    cookie = r.getheader("Set-Cookie") or ""
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    conn.close()
    assert _get(guarded, "/", {"Cookie": cookie.split(";", 1)[0]})[0] == 200


def test_beyond_loopback_a_token_is_required(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'l.db'}") as store:
        dashboard = Dashboard(Monitor(store))
        with pytest.raises(UsageError, match="CRONWARDEN_DASHBOARD_TOKEN"):
            bind(dashboard, "0.0.0.0", 0)
        with pytest.raises(UsageError, match="at least 16 characters"):
            bind(dashboard, "0.0.0.0", 0, token="short")
        server = bind(dashboard, "0.0.0.0", 0, token=TOKEN)
        server.server_close()
