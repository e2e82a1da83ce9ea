"""scheduler/parse.py's checks of client values, which run for every job on every replica and
take shortcuts (leaves of the exact types decoding gives are passed over; names met before are
not matched again): they accept and refuse exactly what the plain checks do."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftcron.scheduler import limits, parse
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.specs import JobSpec


def plain_shape_problem(value: Any, depth: int = 0) -> str | None:
    """The rule as it was written before the short paths: JSON's values only, string keys, no
    NaN or Infinity, each item judged in order (its key, then its value)."""
    if depth > 64:
        return "is nested more than 64 levels deep"
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return "must not contain NaN or Infinity" if not math.isfinite(value) else None
    if isinstance(value, list | tuple):
        for item in value:
            problem = plain_shape_problem(item, depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return "object keys must be strings"
            problem = plain_shape_problem(item, depth + 1)
            if problem:
                return problem
        return None
    return "is not a JSON value"


LEAVES = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5)
          | st.floats() | st.binary(max_size=3))
KEYS = st.text(max_size=3) | st.integers(0, 3) | st.binary(max_size=2)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=25,
)


def refusal(value: Any) -> str | None:
    try:
        parse.json_value(value, "payload", bytes_max=limits.PAYLOAD_BYTES_MAX)
    except Invalid as error:
        return error.message
    return None


@settings(max_examples=500)
@given(VALUES)
def test_a_value_is_refused_exactly_when_the_plain_rule_refuses_it(value: Any) -> None:
    expected = plain_shape_problem(value)
    got = refusal(value)
    if expected is None:
        assert got is None
    else:
        # The same problem; the size check (msgpack) comes first and names what it cannot pack.
        assert got is not None and (expected in got or "is not a JSON value" in got)


def test_nesting_past_64_levels_is_refused_also_through_leaves() -> None:
    deep: Any = 1
    for _ in range(70):
        deep = [deep]
    assert refusal(deep) is not None and "64 levels" in (refusal(deep) or "")
    assert refusal({"a": [1, "x", None, True, {"b": float("nan")}]}) is not None


@pytest.mark.parametrize("name", ["ok-name", "bad name", "", "x" * (limits.NAME_CHARS_MAX + 1)])
def test_a_name_is_judged_the_same_the_first_time_and_after(name: str) -> None:
    outcomes = []
    for _ in range(2):
        for field in ("task", "queue"):
            try:
                JobSpec.parse({"task": "t", field: name})
                outcomes.append("ok")
            except Invalid as error:
                outcomes.append(error.message)
    assert len(set(outcomes)) == 1, outcomes


def test_a_name_met_before_is_still_held_to_the_length_of_its_field() -> None:
    long_name = "n" * (limits.NAME_CHARS_MAX + 10)
    parse.name(long_name, "other", chars_max=limits.NAME_CHARS_MAX + 20)  # now met
    with pytest.raises(Invalid):
        JobSpec.parse({"task": long_name})


ACK_KEYS = st.sampled_from(["id", "token", "outcome", "result", "error", "retryable", "idd"])
ACK_VALUES = (st.integers(-2, 2**64) | st.booleans() | st.none()
              | st.sampled_from(["succeeded", "failed", "nope"]) | st.floats(0, 3))


def parsed_or_refused(data: Any) -> Any:
    from raftcron.scheduler.commands import Ack

    try:
        return Ack.parse(data)
    except Invalid as error:
        return ("refused", error.field, error.message)


@settings(max_examples=500)
@given(st.dictionaries(ACK_KEYS, ACK_VALUES, min_size=2, max_size=4)
       | st.fixed_dictionaries({"id": ACK_VALUES, "token": ACK_VALUES, "outcome": ACK_VALUES}))
def test_an_ack_s_short_path_parses_as_the_general_one(data: dict[str, Any]) -> None:
    from types import MappingProxyType

    # A mapping that is not a dict takes the general path.
    assert parsed_or_refused(data) == parsed_or_refused(MappingProxyType(data))
