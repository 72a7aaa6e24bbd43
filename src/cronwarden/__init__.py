"""cronwarden: make scheduled jobs safe.

Public API: ``Warden`` (guard runs), ``Run``, ``Policy``, the events and the
errors. Everything else is an implementation detail.
"""

from __future__ import annotations

from cronwarden.errors import (
    CronwardenError,
    LeaseLost,
    LeaseRevoked,
    NotStarted,
    StoreError,
    StoreUnavailable,
    TimedOut,
    UsageError,
)
from cronwarden.events import Event, EventKind, JobInfo, Outcome, RunRecord
from cronwarden.policy import Policy

__version__ = "0.1.0"

__all__ = [
    "CronwardenError",
    "Event",
    "EventKind",
    "JobInfo",
    "LeaseLost",
    "LeaseRevoked",
    "NotStarted",
    "Outcome",
    "Policy",
    "RunRecord",
    "StoreError",
    "StoreUnavailable",
    "TimedOut",
    "UsageError",
    "__version__",
]
