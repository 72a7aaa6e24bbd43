"""``Options``: how one job is guarded, validated whenever one is made."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

from cronwarden import Options, Policy, UsageError


def test_durations_may_be_seconds_or_text() -> None:
    assert Options(ttl="2m", max_runtime="1h30m").ttl == 120.0
    assert Options(ttl=90).ttl == 90.0 and Options(ttl="2m").max_runtime is None


def test_a_copy_is_validated_like_a_new_one() -> None:
    base = Options(ttl=10)
    assert base.replace(ttl=20).ttl == 20.0 and base.ttl == 10.0
    with pytest.raises(UsageError, match="ttl must be greater than zero"):
        base.replace(ttl=-5)


def test_options_are_immutable() -> None:
    with pytest.raises(AttributeError, match="replace"):
        Options().ttl = 5  # type: ignore[misc]


def test_options_copy_deepcopy_and_pickle_to_equal_options() -> None:
    o = Options(ttl="2m", policy="queue", max_pending=3, slot=1_700_000_000.0)
    assert copy.copy(o) == o and copy.deepcopy(o) == o and pickle.loads(pickle.dumps(o)) == o
    assert hash(pickle.loads(pickle.dumps(o))) == hash(o) and o.policy is Policy.QUEUE


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"policy": 3}, "policy must be one of"),
        ({"policy": "sometimes"}, "policy must be one of"),
        ({"shard": 5}, "shard must be a name"),
        ({"shard": "no spaces"}, "shard must be 1-128 characters"),
        ({"ttl": float("inf")}, "ttl must be seconds or a duration"),
        ({"ttl": True}, "ttl must be seconds or a duration"),
        ({"ttl": 1e12}, "at most 100 years"),
        ({"ttl": "ten"}, "ttl must be a duration like 90s"),
        ({"slot": "now"}, "slot must be a time in epoch seconds"),
        ({"max_pending": 0}, "max_pending must be a whole number from 1 to 10000"),
        ({"max_pending": 1.5}, "max_pending must be a whole number from 1 to 10000"),
    ],
)
def test_bad_values_are_one_line_usage_errors(bad: dict[str, Any], says: str) -> None:
    with pytest.raises(UsageError) as caught:
        Options(**bad)
    assert says in str(caught.value) and "\n" not in str(caught.value)
