"""What a start does while another run holds the job's lease."""

from __future__ import annotations

import enum

from cronwarden.errors import UsageError


class Policy(enum.StrEnum):
    SKIP = "skip"
    """The new start does no work: it records ``skipped`` (with the holder's
    run id, host, pid, start time and age) and exits. Kubernetes' Forbid,
    ``flock -n``, but never silent. The default."""

    ALLOW = "allow"
    """Concurrent runs proceed, each on its own partition (``--shard``): the
    lease key is ``job:shard`` so no partition is worked twice. Unpartitioned
    overlap needs ``allow_unpartitioned`` and is still recorded as
    ``overlap``."""

    REPLACE = "replace"
    """The new start revokes the holder (on any host, through the store), waits
    for its release or expiry, and takes over with a larger fencing token. The
    old run ends ``replaced``. For output that should reflect the latest
    inputs and whose partial results can be discarded."""

    QUEUE = "queue"
    """The new start adds one to the job's pending count (bounded by
    ``max_pending``), records ``queued`` and exits; the holder runs again
    while pending > 0. For pending-work drains."""

    @classmethod
    def parse(cls, text: str) -> Policy:
        try:
            return cls(text.strip().lower())
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise UsageError(f"policy must be one of {names}, got {text!r}") from None
