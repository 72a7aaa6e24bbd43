"""The dashboard behind the standard library's HTTP server: one thread per
connection, every method answered by ``Dashboard.handle``."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from cronwarden.errors import UsageError

if TYPE_CHECKING:
    from cronwarden.web.dashboard import Dashboard


BODY_MAX = 65536
"""A request body up to this size is read and dropped; a larger one closes
the connection (the dashboard reads no body)."""


def serve(
    dashboard: Dashboard,
    host: str,
    port: int,
    *,
    ready: Callable[[str], None] = lambda url: None,
    log: Callable[[str], None] | None = None,
) -> None:
    """Serve ``dashboard`` on ``host:port`` until interrupted (KeyboardInterrupt,
    or an exception raised by a signal handler). ``ready`` gets the URL once
    the socket listens (port 0 picks a free one). Raises ``UsageError`` when
    the address cannot be bound."""
    server = bind(dashboard, host, port, log=log)
    try:
        ready(url_of(server))
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = str(server.server_address[0]), server.server_address[1]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def bind(
    dashboard: Dashboard, host: str, port: int, *, log: Callable[[str], None] | None = None
) -> ThreadingHTTPServer:
    """A server for ``dashboard``, listening on ``host:port`` (``serve_forever``
    to answer; ``shutdown`` from another thread and ``server_close`` to stop).
    Raises ``UsageError`` when the address cannot be bound."""

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
            self._discard_body()
            response = dashboard.handle(self.command, self.path)
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in response.headers.items():
                self.send_header(name, value)
            # Logged before the body is sent: a client holding its answer can
            # count on the line (a SIGTERM right after it does not lose it).
            if log is not None:
                took = (time.monotonic() - started) * 1000
                shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in self.path)
                log(f"{self.client_address[0]} {self.command} {shown} {response.status} {took:.0f} ms")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)

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
