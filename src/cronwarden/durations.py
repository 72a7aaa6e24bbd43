"""Durations as people write them ("90s", "10m", "1h30m", "1.5s", "250ms")
to seconds and back. Strict: anything else is a UsageError naming the input."""

from __future__ import annotations

import re

from cronwarden.errors import UsageError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_DURATION = 100 * 365 * 86400.0
"""A hundred years. Longer durations are mistakes, and break things: a ttl
whose renew interval exceeds ``threading.TIMEOUT_MAX`` (292 years) killed
the heartbeat thread, and the stores cannot represent such expiries."""
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")


def parse_duration(text: str, *, what: str = "duration") -> float:
    """Seconds in ``text``. Units are required (a bare number is ambiguous)
    and may repeat in any order only as a sum: ``1h30m`` is 5400."""
    value = text.strip().lower()
    if not _WHOLE.fullmatch(value):
        raise UsageError(f"{what} must be a duration like 90s, 10m or 1h30m, got {text!r}")
    seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(value))
    if seconds > MAX_DURATION:
        raise UsageError(f"{what} must be at most 100 years (36500d), got {text!r}")
    return seconds


def parse_positive_duration(text: str, *, what: str) -> float:
    seconds = parse_duration(text, what=what)
    if seconds <= 0:
        raise UsageError(f"{what} must be greater than zero, got {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Short human form: 0.25s, 42s, 10m, 1h30m, 2d3h."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 60:
        return f"{seconds:.2f}".rstrip("0").rstrip(".") + "s"
    whole = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, whole = divmod(whole, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts[:2])
