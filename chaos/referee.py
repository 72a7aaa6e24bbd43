"""The fencing referee: a tiny shared resource that the chaos workers read and
write, and that judges every operation by its fencing token.

It runs in its own process (``python -m chaos.referee`` or ``Referee.spawn``)
so that killing or pausing workers and their supervisors never touches it.
It serves line-oriented requests on 127.0.0.1 from one thread, so its log is
a total order of everything that happened to the resource, each entry
stamped with the referee's own ``time.monotonic()`` (CLOCK_MONOTONIC, which
every process on the host shares, so the harness can compare its own fault
times with it).

The resource is a document built by read–modify–write: each write names the
write it read (``prev``) and becomes the new head, so the document at any
moment is the chain ``head → prev → …``. A write whose read was stale
overwrites the writes made since that read: they are no longer in the chain.
That is the lost update a broken lock causes, and checker (c) looks for it.

Fencing: the referee keeps ``floor``, the largest token it has seen in an
accepted operation. A fenced operation (``fence=1``) with a token below the
floor is rejected. Reads are fenced too: a new holder's first read raises the
floor, so the old holder cannot slip a write in between that read and the new
holder's first write (fencing only protects read–modify–write if the read is
fenced as well). With ``fence=0`` (the positive control) the referee accepts
everything but still logs the token the worker actually held.

Requests (one line each, space separated) and replies:

``HELLO run_id token pid``  → ``OK``  (the connection is that run's child;
    its close is logged, which is how the harness learns when a child died)
``READ token fence``        → ``OK head`` | ``REJECT floor``
``WRITE token fence write_id prev`` → ``OK`` | ``REJECT floor``
``EFFECT op ok json``        → ``OK``: log what a worker did to a resource
    elsewhere (effects mode: the user's own database judges the token, the
    referee only records), as ``{op, run, token, ok, **json}``
``WHO``                     → ``OK <json>``: the open worker connections
``SINCE n``                 → ``OK <json>``: log entries from index n on
``LOG``                     → ``OK <json>``: the whole log and the head
``SHUTDOWN``                → ``OK`` and exit
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

ROOT = "-"
"""``prev`` of the first write: the empty document."""


@dataclass
class _Conn:
    sock: socket.socket
    buf: bytes = b""
    run: str | None = None
    pid: int | None = None
    token: int | None = None
    opened: float = 0.0


@dataclass
class RefereeState:
    """The resource and its log; no I/O, so it can be tested on its own."""

    floor: int = -1
    head: str = ROOT
    log: list[dict[str, Any]] = field(default_factory=list)

    def _entry(self, **kw: Any) -> dict[str, Any]:
        kw["t"] = time.monotonic()
        kw["i"] = len(self.log)
        self.log.append(kw)
        return kw

    def hello(self, run: str, token: int, pid: int) -> None:
        self._entry(op="hello", run=run, token=token, pid=pid)

    def close(self, run: str | None, pid: int | None) -> None:
        self._entry(op="close", run=run, pid=pid)

    def read(self, run: str | None, token: int, fence: bool) -> tuple[bool, str]:
        ok = not fence or token >= self.floor
        if ok:
            self.floor = max(self.floor, token)
        self._entry(op="read", run=run, token=token, fence=fence, ok=ok, head=self.head, floor=self.floor)
        return ok, self.head if ok else str(self.floor)

    def effect(self, run: str | None, token: int | None, op: str, ok: bool, fields: dict[str, Any]) -> None:
        self._entry(**fields, op=op, run=run, token=token, ok=ok)

    def write(self, run: str | None, token: int, fence: bool, write_id: str, prev: str) -> tuple[bool, str]:
        ok = not fence or token >= self.floor
        if ok:
            self.floor = max(self.floor, token)
            self.head = write_id
        self._entry(op="write", run=run, token=token, fence=fence, ok=ok, id=write_id, prev=prev,
                    floor=self.floor)  # fmt: skip
        return ok, "" if ok else str(self.floor)


def _parse_token(text: str) -> int:
    return int(text)


class Server:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.listener = socket.create_server((host, port))
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)
        self.state = RefereeState()
        self.conns: dict[socket.socket, _Conn] = {}
        self.running = True

    def serve(self, parent: int | None = None) -> None:
        while self.running:
            if parent is not None and os.getppid() != parent:
                return  # the harness is gone (killed): do not outlive it
            for key, _ in self.sel.select(timeout=1.0):
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    self._readable(self.conns[key.fileobj])  # type: ignore[index]

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conns[sock] = _Conn(sock=sock, opened=time.monotonic())
        self.sel.register(sock, selectors.EVENT_READ)

    def _drop(self, c: _Conn) -> None:
        self.sel.unregister(c.sock)
        c.sock.close()
        del self.conns[c.sock]
        if c.run is not None:
            self.state.close(c.run, c.pid)

    def _readable(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(65536)
        except (ConnectionResetError, BlockingIOError):
            data = b""
        if not data:
            self._drop(c)
            return
        c.buf += data
        while b"\n" in c.buf:
            line, c.buf = c.buf.split(b"\n", 1)
            reply = self._handle(c, line.decode().split())
            try:
                c.sock.setblocking(True)
                c.sock.sendall(reply.encode() + b"\n")
                c.sock.setblocking(False)
            except OSError:
                self._drop(c)
                return

    def _handle(self, c: _Conn, words: list[str]) -> str:
        if not words:
            return "ERR empty"
        op, args = words[0], words[1:]
        s = self.state
        try:
            if op == "HELLO":
                c.run, c.token, c.pid = args[0], _parse_token(args[1]), int(args[2])
                s.hello(c.run, c.token, c.pid)
                return "OK"
            if op == "READ":
                ok, value = s.read(c.run, _parse_token(args[0]), args[1] == "1")
                return f"OK {value}" if ok else f"REJECT {value}"
            if op == "WRITE":
                ok, value = s.write(c.run, _parse_token(args[0]), args[1] == "1", args[2], args[3])
                return "OK" if ok else f"REJECT {value}"
            if op == "EFFECT":
                fields = json.loads(" ".join(args[2:])) if len(args) > 2 else {}
                s.effect(c.run, c.token, args[0], args[1] == "1", fields)
                return "OK"
            if op == "WHO":
                live = [{"run": x.run, "pid": x.pid, "token": x.token, "opened": x.opened}
                        for x in self.conns.values() if x.run is not None]  # fmt: skip
                return "OK " + json.dumps(live)
            if op == "SINCE":
                return "OK " + json.dumps(s.log[int(args[0]) :])
            if op == "LOG":
                return "OK " + json.dumps({"head": s.head, "floor": s.floor, "log": s.log})
            if op == "SHUTDOWN":
                self.running = False
                return "OK"
        except (IndexError, ValueError) as e:
            return f"ERR {type(e).__name__}: {e}"
        return f"ERR unknown request {op!r}"


class Client:
    """A blocking connection to a referee (the harness's and the worker's)."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def ask(self, line: str) -> tuple[str, str]:
        self.sock.sendall(line.encode() + b"\n")
        reply = self.file.readline().decode().rstrip("\n")
        if not reply:
            raise ConnectionError("referee closed the connection")
        status, _, rest = reply.partition(" ")
        return status, rest

    def json(self, line: str) -> Any:
        status, rest = self.ask(line)
        if status != "OK":
            raise RuntimeError(f"referee: {line!r} -> {status} {rest}")
        return json.loads(rest)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class Referee:
    """A referee process owned by the harness."""

    def __init__(self) -> None:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        # Its own session: a signal sent to a worker's group can never reach it.
        self.process = subprocess.Popen(
            [sys.executable, "-S", "-m", "chaos.referee", str(os.getpid())], cwd=here, stdout=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode().strip()
        if not line.isdigit():
            self.process.kill()
            raise RuntimeError(f"referee did not start: {line!r}")
        self.port = int(line)
        self.client = Client(self.port)

    def who(self) -> list[dict[str, Any]]:
        return list(self.client.json("WHO"))

    def since(self, index: int) -> list[dict[str, Any]]:
        return list(self.client.json(f"SINCE {index}"))

    def dump(self) -> dict[str, Any]:
        return dict(self.client.json("LOG"))

    def stop(self) -> None:
        try:
            self.client.ask("SHUTDOWN")
            self.client.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Referee:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the harness's terminal stops the harness only
    server = Server()
    print(server.port, flush=True)
    server.serve(parent=int(sys.argv[1]) if len(sys.argv) > 1 else None)


if __name__ == "__main__":
    main()
