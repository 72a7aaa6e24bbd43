"""The dashboard behind the standard library's HTTP server: one thread per
connection, every method answered by ``Dashboard.handle``."""

from __future__ import annotations

import hmac
import socket
import sys
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from cronwarden.errors import UsageError

if TYPE_CHECKING:
    from cronwarden.web.dashboard import Dashboard


BODY_MAX = 65536
"""A request body up to this size is read and dropped; a larger one closes
the connection (the dashboard reads no body but the login form's)."""
SECURITY_HEADERS = {
    # Inline <style> and style attributes are the pages' only resources.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
"""Sent with every answer."""
COOKIE = "cronwarden_token"
LOGIN_FORM = (
    b"<!doctype html><html><head><meta charset=utf-8><title>cronwarden: log in</title></head><body>"
    b"<form method=post action=/login><label>Dashboard token <input type=password name=token "
    b"autofocus></label> <button>Log in</button></form></body></html>"
)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to listen on) is reachable from this host only."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(
    dashboard: Dashboard,
    host: str,
    port: int,
    *,
    ready: Callable[[str], None] = lambda url: None,
    log: Callable[[str], None] | None = None,
    token: str | None = None,
) -> None:
    """Serve ``dashboard`` on ``host:port`` until interrupted (KeyboardInterrupt,
    or an exception raised by a signal handler). ``ready`` gets the URL once
    the socket listens (port 0 picks a free one). Raises ``UsageError`` when
    the address cannot be bound."""
    server = bind(dashboard, host, port, log=log, token=token)
    try:
        ready(url_of(server))
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = str(server.server_address[0]), server.server_address[1]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def bind(
    dashboard: Dashboard,
    host: str,
    port: int,
    *,
    log: Callable[[str], None] | None = None,
    token: str | None = None,
) -> ThreadingHTTPServer:
    """A server for ``dashboard``, listening on ``host:port`` (``serve_forever``
    to answer; ``shutdown`` from another thread and ``server_close`` to stop).
    With ``token``, every request must carry it (``Authorization: Bearer``, or
    the cookie the login form at ``/login`` sets), compared in constant time;
    an address beyond loopback requires one. Raises ``UsageError`` when the
    address cannot be bound or needs a token."""
    if token is not None and len(token) < 16:
        raise UsageError("the dashboard token must be at least 16 characters (e.g. openssl rand -hex 16)")
    if token is None and not is_loopback(host):
        raise UsageError(f"listening on {host} reaches beyond this host: give --token or set "
                         "$CRONWARDEN_DASHBOARD_TOKEN (or listen on 127.0.0.1 behind a proxy that asks "
                         "for a login)")  # fmt: skip
    secret = None if token is None else token.encode()

    class Handler(BaseHTTPRequestHandler):
        server_version = "cronwarden"
        protocol_version = "HTTP/1.1"
        timeout = 30  # a client that stops sending frees its thread
        # The headers and the body are two writes: with Nagle's algorithm the
        # body of a small answer waits for the client's delayed ACK, ~40 ms
        # on a kept-alive connection (bench/dashboard.py measured it).
        disable_nagle_algorithm = True

        def __getattr__(self, name: str) -> Callable[[], None]:
            # Every method reaches ``handle`` (http.server answers 501 itself for
            # a method with no ``do_`` function): GET and HEAD are served, the
            # rest get 405 with the reason.
            if name.startswith("do_"):
                return self._answer
            raise AttributeError(name)

        def _answer(self) -> None:
            started = time.monotonic()
            framing = self._framing_problem()
            if framing is not None:
                # Two lengths, or a length and chunks: a proxy in front may
                # read the body differently, and what it takes for the rest
                # of this request would be answered as a request of its own.
                self.close_connection = True
                self._send(400, "text/plain; charset=utf-8", framing.encode(), {"Connection": "close"},
                           started)  # fmt: skip
                return
            if secret is not None and self.path.split("?", 1)[0] == "/login":
                self._login(started)
                return
            self._discard_body()
            if secret is not None and not self._authorized():
                self._send(401, "text/html; charset=utf-8", LOGIN_FORM,
                           {"WWW-Authenticate": 'Bearer realm="cronwarden"'}, started)  # fmt: skip
                return
            response = dashboard.handle(self.command, self.path)
            self._send(response.status, response.content_type, response.body, response.headers, started)

        def _framing_problem(self) -> str | None:
            lengths = self.headers.get_all("Content-Length") or []
            encodings = self.headers.get_all("Transfer-Encoding") or []
            if len(lengths) > 1:
                return "more than one Content-Length header\n"
            if lengths and encodings:
                return "both Content-Length and Transfer-Encoding\n"
            if len(encodings) > 1:
                return "more than one Transfer-Encoding header\n"
            return None

        def _authorized(self) -> bool:
            assert secret is not None
            given = self.headers.get("Authorization", "")
            if given[:7].lower() == "bearer " and hmac.compare_digest(given[7:].strip().encode(), secret):
                return True
            from http.cookies import CookieError, SimpleCookie

            try:
                cookie = SimpleCookie(self.headers.get("Cookie", ""))
            except CookieError:
                return False
            morsel = cookie.get(COOKIE)
            return morsel is not None and hmac.compare_digest(morsel.value.encode(), secret)

        def _login(self, started: float) -> None:
            assert secret is not None
            if self.command != "POST":
                self._discard_body()
                self._send(200, "text/html; charset=utf-8", LOGIN_FORM, {}, started)
                return
            length = self.headers.get("Content-Length", "0").strip() or "0"
            if not length.isdigit() or int(length) > 4096:
                self.close_connection = True
                self._send(400, "text/plain; charset=utf-8", b"bad login form\n", {}, started)
                return
            from urllib.parse import parse_qs

            form = parse_qs(self.rfile.read(int(length)).decode("utf-8", "replace"))
            given = (form.get("token") or [""])[0].encode()
            if not hmac.compare_digest(given, secret):
                self._send(401, "text/html; charset=utf-8", LOGIN_FORM, {}, started)
                return
            cookie = f"{COOKIE}={given.decode()}; HttpOnly; SameSite=Strict; Path=/"
            self._send(
                303, "text/plain; charset=utf-8", b"", {"Location": "/", "Set-Cookie": cookie}, started
            )

        def _send(self, status: int, content_type: str, body: bytes, headers: Mapping[str, str],
                  started: float) -> None:  # fmt: skip
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in {**SECURITY_HEADERS, **headers}.items():
                self.send_header(name, value)
            # Logged before the body is sent: a client holding its answer can
            # count on the line (a SIGTERM right after it does not lose it).
            if log is not None:
                took = (time.monotonic() - started) * 1000
                shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in self.path)
                log(f"{self.client_address[0]} {self.command} {shown} {status} {took:.0f} ms")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _discard_body(self) -> None:
            """Read a request's body, unused: left on a kept-alive connection it
            would be read as the next request. A large or chunked one ends the
            connection instead."""
            length = self.headers.get("Content-Length", "0").strip() or "0"
            chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            if chunked or not length.isascii() or not length.isdigit() or int(length) > BODY_MAX:
                self.close_connection = True
            elif int(length):
                self.rfile.read(int(length))

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request from _answer instead, or none

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            # Not socketserver's traceback: a client that went away is no
            # news, anything else is one line.
            error = sys.exc_info()[1]
            if isinstance(error, ConnectionError | TimeoutError) or log is None:
                return
            log(f"{client_address[0]}: request failed: {type(error).__name__}: {error}")

    try:
        return Server((host, port), Handler)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
