"""cronwarden: make scheduled jobs safe.

The public API, importable from here::

    from cronwarden import Warden, Run, Policy, NotStarted

Names are loaded on first use (a module ``__getattr__``), so ``import
cronwarden`` costs almost nothing and ``cronwarden run`` pays only for the
modules it uses. Everything not listed in ``__all__`` is an implementation
detail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_PUBLIC: dict[str, str] = {
    # guarding runs
    "Warden": "cronwarden.guard",
    "Guard": "cronwarden.guard",
    "Run": "cronwarden.guard",
    "Ending": "cronwarden.guard",
    "Options": "cronwarden.guard",
    "Policy": "cronwarden.policy",
    # the ledger's records
    "Event": "cronwarden.events",
    "EventKind": "cronwarden.events",
    "JobInfo": "cronwarden.events",
    "Outcome": "cronwarden.events",
    "RunRecord": "cronwarden.events",
    # stores and time
    "Store": "cronwarden.stores.base",
    "Refused": "cronwarden.stores.base",
    "open_store": "cronwarden.stores",
    "Clock": "cronwarden.clock",
    "FakeClock": "cronwarden.clock",
    # errors
    "CronwardenError": "cronwarden.errors",
    "Fenced": "cronwarden.errors",
    "LeaseLost": "cronwarden.errors",
    "LeaseRevoked": "cronwarden.errors",
    "NotStarted": "cronwarden.errors",
    "StoreError": "cronwarden.errors",
    "StoreUnavailable": "cronwarden.errors",
    "TimedOut": "cronwarden.errors",
    "UsageError": "cronwarden.errors",
}

__all__ = [
    "Clock",
    "CronwardenError",
    "Ending",
    "Event",
    "EventKind",
    "FakeClock",
    "Fenced",
    "Guard",
    "JobInfo",
    "LeaseLost",
    "LeaseRevoked",
    "NotStarted",
    "Options",
    "Outcome",
    "Policy",
    "Refused",
    "Run",
    "RunRecord",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TimedOut",
    "UsageError",
    "Warden",
    "__version__",
    "open_store",
]
"""Kept equal to the table above (tests/test_public_api.py)."""


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'cronwarden' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain global
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, eagerly
    from cronwarden.clock import Clock, FakeClock
    from cronwarden.errors import (
        CronwardenError,
        Fenced,
        LeaseLost,
        LeaseRevoked,
        NotStarted,
        StoreError,
        StoreUnavailable,
        TimedOut,
        UsageError,
    )
    from cronwarden.events import Event, EventKind, JobInfo, Outcome, RunRecord
    from cronwarden.guard import Ending, Guard, Options, Run, Warden
    from cronwarden.policy import Policy
    from cronwarden.stores import open_store
    from cronwarden.stores.base import Refused, Store
