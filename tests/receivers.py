"""Real HTTP receivers on loopback for the sink tests: a server in a thread
that records every request and answers as the test says (at once, slowly,
with an error), and ports that refuse or never answer."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    rid: str | None
    headers: dict[str, str]
    body: bytes
    query: str = ""


class Receiver:
    """An HTTP server on 127.0.0.1 in a thread that records every request.
    ``status(request, n)`` (n: requests so far) picks each answer; ``delay``
    seconds pass between reading a request (it is recorded then: the
    receiver has the event) and answering it. ``in_flight_max`` is the most
    requests it was answering at once; ``gone`` counts answers the client
    was no longer there to read (it shut the connection). With ``trickle``
    an answer's body comes a byte every that many seconds, 100 bytes: no
    single read waits long, the whole answer takes 100 times that."""

    def __init__(
        self,
        port: int = 0,
        status: Callable[[Request, int], int] | None = None,
        delay: float = 0.0,
        trickle: float = 0.0,
    ) -> None:
        self.requests: list[Request] = []
        self._status = status or (lambda request, n: 200)
        self.delay = delay
        self.trickle = trickle
        self._lock = threading.Lock()
        self._in_flight = 0
        self.in_flight_max = 0
        self.gone = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                rid = parse_qs(parts.query).get("rid", [None])[0]
                headers = dict(self.headers.items())
                request = Request(self.command, parts.path, rid, headers, body, parts.query)
                with receiver._lock:
                    receiver.requests.append(request)
                    code = receiver._status(request, len(receiver.requests))
                    receiver._in_flight += 1
                    receiver.in_flight_max = max(receiver.in_flight_max, receiver._in_flight)
                try:
                    if receiver.delay:
                        time.sleep(receiver.delay)
                        if self._peer_closed():
                            with receiver._lock:
                                receiver.gone += 1
                            return
                    self.send_response(code)
                    self.send_header("Content-Length", "100" if receiver.trickle else "2")
                    self.end_headers()
                    if not receiver.trickle:
                        self.wfile.write(b"OK")
                    for _ in range(100 if receiver.trickle else 0):
                        self.wfile.flush()
                        time.sleep(receiver.trickle)
                        self.wfile.write(b".")
                    self.wfile.flush()
                except OSError:
                    with receiver._lock:
                        receiver.gone += 1
                finally:
                    with receiver._lock:
                        receiver._in_flight -= 1

            def _peer_closed(self) -> bool:
                """The client shut the connection while the answer was pending."""
                readable, _, _ = select.select([self.connection], [], [], 0)
                try:
                    return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    return True

            do_POST = do_GET = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True
        self._thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


def closed_port() -> int:
    """A loopback port nothing listens on: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
