"""Time, injected. Decisions read the clock once; tests advance a FakeClock
instead of sleeping.

Three readings, for three purposes:
- ``monotonic()``: this process's deadlines (how long a holder believes its lease is still its own).
- ``store_time()``: lease expiry on the embedded SQLite store. It is
  CLOCK_BOOTTIME, which every process on the host shares and which NTP steps
  never move; ``boot_id()`` tells a reboot apart, after which every
  lease of the previous boot is void.
- ``wall()``: what people read (started at, ended at) and schedules.
"""

from __future__ import annotations

import threading
import time
from functools import cache


class Clock:
    def monotonic(self) -> float:
        # CLOCK_BOOTTIME, not CLOCK_MONOTONIC: it keeps counting while the
        # host is suspended, as the store's clock does. A holder whose count
        # stopped during a suspend would believe in a lease already expired.
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    def store_time(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    def wall(self) -> float:
        return time.time()

    def boot_id(self) -> str:
        return _boot_id()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


@cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        # A made-up id would void every other process's live lease (unsafe);
        # a constant one would keep a previous boot's leases alive for as long
        # as that boot had run. Refuse instead.
        from cronwarden.errors import StoreError

        raise StoreError(
            "cannot read /proc/sys/kernel/random/boot_id: the SQLite store needs Linux's boot id "
            "to judge lease expiry; use postgresql:// or redis:// on this system"
        ) from None


SYSTEM_CLOCK = Clock()


class FakeClock(Clock):
    """A clock that moves only when told. ``sleep`` advances it."""

    def __init__(self, start: float = 1_700_000_000.0, boot: str = "fake-boot") -> None:
        self._now = start
        self._boot = boot
        self._lock = threading.Lock()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def monotonic(self) -> float:
        return self._now

    def store_time(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now

    def boot_id(self) -> str:
        return self._boot

    def reboot(self, boot: str) -> None:
        self._boot = boot

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
