"""JSON lines, one event per line, to stderr or appended to a file."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from cronwarden.events import Event
from cronwarden.sinks.base import Call, DeliveryError, SinkBase, SinkOptions, dumps, event_json


class LogSink(SinkBase):
    """``path`` None writes to stderr. A file is opened for each batch in
    append mode and the batch is written with one ``write`` and fsynced
    before the outbox acknowledges it: lines from several processes do not
    interleave, and an acknowledged event is on disk. One batch, in ledger
    order, at a time: the file reads as the ledger does."""

    batch = 100

    def __init__(self, name: str, options: SinkOptions, path: str | None = None) -> None:
        super().__init__(name, options)
        self.path = path

    def accepts(self, event: Event) -> bool:
        return True

    def deliver(self, events: Sequence[Event], *, timeout: float, call: Call) -> None:
        text = "".join(dumps(event_json(e)) + "\n" for e in events)
        if self.path is None:
            try:
                sys.stderr.write(text)
                sys.stderr.flush()
            except (OSError, ValueError) as e:
                raise DeliveryError(f"cannot write to stderr: {e}") from None
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                data = memoryview(text.encode())
                while data:
                    data = data[os.write(fd, data) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise DeliveryError(f"cannot append to {self.path}: {e.strerror or e}") from None
