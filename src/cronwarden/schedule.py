"""When a job should fire: a cron expression (with a time zone) or a plain
period. Gives the slot a start belongs to, the next fire, and the period the
monitor compares durations with. cronsim is imported only for cron
expressions, so ``--every`` costs nothing on the wrapper's hot path."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from itertools import pairwise
from typing import Any

from cronwarden.durations import format_duration, parse_positive_duration
from cronwarden.errors import UsageError

MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
"""cron's shorthands, as Vixie cron and cronie read them."""


@dataclass(frozen=True)
class Schedule:
    text: str
    """``every 10m`` or the cron expression as given."""
    every: float | None = None
    cron: str | None = None
    tz: str | None = None

    @classmethod
    def every_(cls, text: str) -> Schedule:
        seconds = parse_positive_duration(text, what="--every")
        return cls(text=f"every {format_duration(seconds)}", every=seconds)

    @classmethod
    def cron_(cls, expr: str, tz: str | None = None) -> Schedule:
        text = expr.strip()
        cron = MACROS.get(text.lower(), text)
        if text.lower() == "@reboot":
            raise UsageError("schedule @reboot has no fire times to guard; start the job from the "
                             "boot itself (a systemd unit, cron's own @reboot line) with cronwarden "
                             "run")  # fmt: skip
        if cron.startswith("@"):
            raise UsageError(f"schedule {text!r} is not a cron macro; expected one of {', '.join(MACROS)} "
                             "or five fields like '*/10 * * * *'")  # fmt: skip
        if len(cron.split()) == 6:
            raise UsageError(f"schedule {text!r} has six fields; cron has five (minute hour day month "
                             "weekday), without seconds: for a period under a minute use --every "
                             "(every = \"30s\" in a config file)")  # fmt: skip
        sched = cls(text=text, cron=cron, tz=tz)
        sched._zone()  # validate the time zone now
        sched._iter(datetime(2026, 1, 1, tzinfo=sched._zone()))  # and the expression
        return sched

    @classmethod
    def parse(cls, text: str, tz: str | None = None) -> Schedule:
        """``every 10m`` / ``@every 10m`` / a cron expression, optionally
        preceded by ``CRON_TZ=Zone`` (cronie's spelling; how the store keeps a
        cron schedule's time zone)."""
        t = text.strip()
        if t.startswith("CRON_TZ="):
            zone, _, t = t.removeprefix("CRON_TZ=").partition(" ")
            return cls.cron_(t, zone)
        for prefix in ("@every ", "every "):
            if t.lower().startswith(prefix):
                return cls.every_(t[len(prefix) :])
        return cls.cron_(t, tz)

    def _zone(self) -> tzinfo:
        from datetime import UTC

        if not self.tz:
            import os

            return UTC if self.cron is None else _local_zone(os.environ.get("TZ", ""))
        try:
            from zoneinfo import ZoneInfo

            return ZoneInfo(self.tz)
        except Exception:
            raise UsageError(f"time zone must be an IANA name like Europe/Berlin, got {self.tz!r}") from None

    def _iter(self, start: datetime, reverse: bool = False) -> Any:
        from cronsim import CronSim, CronSimError

        try:
            return CronSim(self.cron or "", start, reverse=reverse)
        except CronSimError as e:
            raise UsageError(
                f"schedule must be a cron expression like '*/10 * * * *': {e} in {self.cron!r}"
            ) from None

    def slot(self, now: float) -> float:
        """The latest fire time at or before ``now`` (epoch seconds)."""
        if self.every is not None:
            return self._index(now) * self.every
        start = datetime.fromtimestamp(now, self._zone()) + timedelta(seconds=1)
        t = float(next(self._iter(start.replace(microsecond=0), reverse=True)).timestamp())
        # Looking back, a repeated hour (daylight saving ends) reads as its
        # first pass: 01:10 of the second pass gives the first pass's 01:00,
        # an hour too early. Fire times are made forward; walk forward to
        # the latest (one step, and no more, on every other day).
        while (nxt := self.next_fire(t)) <= now:
            t = nxt
        return t

    def _index(self, t: float) -> int:
        """The largest n with ``n * every <= t``. Fire times are ``n * every``,
        the same float on every host; the float division that finds n can be
        one off either way (``every = 1.1``), so it is checked against them."""
        assert self.every is not None
        n = math.floor(t / self.every)
        while (n + 1) * self.every <= t:
            n += 1
        while n * self.every > t:
            n -= 1
        return n

    def next_fire(self, after: float) -> float:
        """The first fire time strictly after ``after``."""
        if self.every is not None:
            return (self._index(after) + 1) * self.every
        start = datetime.fromtimestamp(after, self._zone())
        return float(next(self._iter(start)).timestamp())

    def fires(self, after: float) -> Iterator[float]:
        """The fire times strictly after ``after``, in order: ``next_fire``
        again and again, in one cron walk rather than one per fire."""
        if self.every is not None:
            n = self._index(after) + 1
            while True:
                yield n * self.every
                n += 1
        for fire in self._iter(datetime.fromtimestamp(after, self._zone())):
            yield float(fire.timestamp())

    def period(self, around: float | None = None) -> float:
        """Seconds between fires. For cron, the shortest gap among the next
        fires: the tightest slot is the one that overlaps first."""
        if self.every is not None:
            return self.every
        import time

        t = time.time() if around is None else around
        fires = [self.next_fire(t)]
        for _ in range(24):
            fires.append(self.next_fire(fires[-1]))
        return min(b - a for a, b in pairwise(fires))


@functools.cache
def _local_zone(tz: str) -> tzinfo:
    """This host's time zone with its daylight-saving rules (``$TZ``, given
    as ``tz``, else /etc/localtime), for a cron expression given without
    one: a fixed UTC offset taken now would put every fire after the next
    change an hour off, and two instances started on either side of it at
    different times. Read once per ``$TZ``: the scheduler asks for every
    fire time it walks over."""
    from datetime import UTC
    from zoneinfo import ZoneInfo

    name = tz.removeprefix(":")
    try:
        if name and not name.startswith("/"):
            return ZoneInfo(name)
        with open(name or "/etc/localtime", "rb") as f:
            return ZoneInfo.from_file(f, key="localtime")
    except Exception:  # ZoneInfoNotFoundError is a KeyError; a bad file, a ValueError
        # No zone database, a $TZ that is a POSIX rule (UTC0, CET-1CEST,…)
        # or a typo, which libc reads in its own way: the offset in force
        # now is the best there is, as before zone rules were looked up.
        return datetime.now().astimezone().tzinfo or UTC
