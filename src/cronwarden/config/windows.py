"""Maintenance windows: recurring spans of the week, in a time zone, in
which a job's findings are recorded but not delivered to alerting sinks
(``maintenance = ["Sun 02:00-04:00 Europe/Berlin"]`` in ``[jobs.NAME]``).

Parsed when the config file is read (so a bad window is reported with its
line), judged by the monitor. No time zone is loaded until a window is
judged: the config file is read on every ``cronwarden run``."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, tzinfo
from typing import NamedTuple

from cronwarden.errors import UsageError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_FORM = re.compile(
    r"\s*(?P<days>[A-Za-z*][A-Za-z,*-]*)\s+(?P<start>\d{1,2}:\d{2})\s*-\s*(?P<end>\d{1,2}:\d{2})"
    r"(?:\s+(?P<tz>\S+))?\s*"
)
EXAMPLE = '"Sun 02:00-04:00 Europe/Berlin"'


class Window(NamedTuple):
    """One recurring window: on each of ``days`` (0 = Monday), from
    ``start`` for ``length`` seconds (past midnight when the end is earlier
    than the start), in ``tz`` (None: this host's local time)."""

    text: str
    days: frozenset[int]
    start: int
    """Seconds after midnight."""
    length: int
    tz: str | None

    @classmethod
    def parse(cls, text: str) -> Window:
        """``DAYS HH:MM-HH:MM [ZONE]``; DAYS is ``daily``, ``*``, a day
        (``Sun``), a range (``Mon-Fri``) or a list (``Sat,Sun``)."""
        m = _FORM.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise UsageError(f"maintenance windows look like {EXAMPLE} (days, HH:MM-HH:MM, time zone), "
                             f"got {text!r}")  # fmt: skip
        days = _days(m["days"], text)
        start, end = _minute(m["start"], text), _minute(m["end"], text)
        length = (end - start) % 1440 or 1440  # 02:00-02:00 is a whole day
        tz = m["tz"]
        if tz is not None:
            _check_zone(tz)
        return cls(text=text.strip(), days=days, start=start * 60, length=length * 60, tz=tz)

    def end_of(self, t: float) -> float | None:
        """The end (epoch seconds) of the occurrence of this window that
        holds ``t``, or None when ``t`` is outside every occurrence."""
        # Wall-clock arithmetic in the window's zone: "02:00" is 02:00 there, whatever the offset.
        local = (datetime.fromtimestamp(t) if self.tz is None else datetime.fromtimestamp(t, _zone(self.tz))
                 ).replace(tzinfo=None)  # fmt: skip
        midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
        for back in (0, 1):  # an occurrence that began yesterday may still hold
            day = midnight - timedelta(days=back)
            if day.weekday() not in self.days:
                continue
            begin = day + timedelta(seconds=self.start)
            end = begin + timedelta(seconds=self.length)
            if begin <= local < end:
                return t + (end - local).total_seconds()
        return None


def _days(text: str, whole: str) -> frozenset[int]:
    t = text.lower()
    if t in ("daily", "*"):
        return frozenset(range(7))
    out: set[int] = set()
    for part in t.split(","):
        first, _, last = part.partition("-")
        if first[:3] not in DAYS or (last and last[:3] not in DAYS) or len(first) < 3:
            raise UsageError(f"maintenance window days must be like Sun, Mon-Fri, Sat,Sun or daily, "
                             f"got {text!r} in {whole!r}")  # fmt: skip
        a = DAYS.index(first[:3])
        b = DAYS.index(last[:3]) if last else a
        out.update((a + i) % 7 for i in range((b - a) % 7 + 1))
    return frozenset(out)


def _minute(hhmm: str, whole: str) -> int:
    h, m = (int(x) for x in hhmm.split(":"))
    if h > 24 or m > 59 or (h == 24 and m):
        raise UsageError(
            f"maintenance window times must be HH:MM from 00:00 to 24:00, got {hhmm!r} in {whole!r}"
        )
    return h * 60 + m


def _zone(tz: str) -> tzinfo:
    from zoneinfo import ZoneInfo

    return ZoneInfo(tz)


def _check_zone(name: str) -> None:
    try:
        _zone(name)
    except Exception:
        raise UsageError(f"a maintenance window's time zone must be an IANA name like Europe/Berlin, "
                         f"got {name!r}") from None  # fmt: skip
