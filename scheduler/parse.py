"""Field validators shared by every spec parser: plain JSON-like data in, typed values out.

The HTTP layer and the command codec parse through the same functions, so a value that the API
accepts is exactly a value that `apply` accepts, and every error names its field. Bools are not
ints here (JSON `true` is not a priority), unknown fields are errors (a typo must not be ignored),
and nothing in this module touches state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from raftcron.scheduler import limits
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.packing import to_msgpack

INT64_MAX = 2**63 - 1
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]*")
# Valid names met so far: a job's task and queue are checked on every replica for every job,
# and a cluster has few of them. Bounded; once full, names are checked by the pattern alone.
NAMES_MET_MAX = 4096
NAMES_MET: dict[str, None] = {}
# The shape of a schedule's fire keys (below): a client key of that shape would share the key
# table with a fire and swallow it.
_FIRE_KEY_RE = re.compile(_NAME_RE.pattern + r"@(?:manual-)?-?[0-9]+")
_TRACEPARENT_RE = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def fire_key(schedule: str, fire_time_ms: int) -> str:
    """The key of a schedule's job for one nominal fire time."""
    return f"{schedule}@{fire_time_ms}"


def manual_fire_key(schedule: str, job_id: int) -> str:
    """The key of a manual trigger's job: named by that job's id, so unique forever."""
    return f"{schedule}@manual-{job_id}"


def as_mapping(data: object, field: str) -> Mapping[str, Any]:
    if type(data) is dict:  # what msgpack and JSON give: skips the ABC's isinstance check
        return data
    if not isinstance(data, Mapping):
        raise Invalid(field, f"must be an object, not {type_name(data)}")
    return data


def reject_unknown(data: Mapping[str, Any], known: frozenset[str], field: str = "") -> None:
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        where = f"{field}.{unknown[0]}" if field else unknown[0]
        raise Invalid(where, f"unknown field (known: {', '.join(sorted(known))})")


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def integer(value: object, field: str, *, low: int = -INT64_MAX, high: int = INT64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(field, f"must be an integer, not {type_name(value)}")
    if not low <= value <= high:
        raise Invalid(field, f"must be between {low} and {high}, not {value}")
    return value


def optional_integer(
    value: object, field: str, *, low: int = -INT64_MAX, high: int = INT64_MAX
) -> int | None:
    return None if value is None else integer(value, field, low=low, high=high)


def number(value: object, field: str, *, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid(field, f"must be a number, not {type_name(value)}")
    result = float(value)
    if math.isnan(result) or not low <= result <= high:
        raise Invalid(field, f"must be between {low:g} and {high:g}, not {value}")
    return result


def boolean(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise Invalid(field, f"must be true or false, not {type_name(value)}")
    return value


def text(value: object, field: str, *, chars_max: int, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise Invalid(field, f"must be a string, not {type_name(value)}")
    if not value and not allow_empty:
        raise Invalid(field, "must not be empty")
    if len(value) > chars_max:
        raise Invalid(field, f"must be at most {chars_max} characters, not {len(value)}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise Invalid(field, "is not valid Unicode (it holds a lone surrogate)") from None
    return value


def optional_text(value: object, field: str, *, chars_max: int) -> str | None:
    return None if value is None else text(value, field, chars_max=chars_max)


def traceparent(value: object, field: str) -> str:
    """A W3C trace context `traceparent` of version 00 (lower-case hex, ids not all zeros)."""
    text_ = text(value, field, chars_max=limits.TRACEPARENT_CHARS)
    if not _TRACEPARENT_RE.fullmatch(text_):
        raise Invalid(field, "must be a W3C traceparent: 00-<32 hex trace id>-<16 hex parent "
                      "id>-<2 hex flags>, lower case, ids not all zeros")
    return text_


def client_key(value: object, field: str, *, chars_max: int) -> str | None:
    """An idempotency key from a client: any text but the reserved shape of a fire key."""
    result = optional_text(value, field, chars_max=chars_max)
    if result is not None and _FIRE_KEY_RE.fullmatch(result):
        raise Invalid(
            field,
            f"{result!r} has the shape '<schedule>@<time>' that schedules' fire keys have; "
            "such keys are reserved",
        )
    return result


def name(value: object, field: str, *, chars_max: int) -> str:
    """A name that appears in URLs, keys and metrics: letters, digits and `_ . : -`."""
    if type(value) is str and value in NAMES_MET and len(value) <= chars_max:
        return value
    result = text(value, field, chars_max=chars_max)
    if not _NAME_RE.fullmatch(result):
        raise Invalid(
            field,
            f"{result!r} must start with a letter or digit and contain only "
            "letters, digits, '_', '.', ':' and '-'",
        )
    if len(NAMES_MET) < NAMES_MET_MAX:
        NAMES_MET[result] = None
    return result


def choice(value: object, field: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise Invalid(field, f"must be one of {', '.join(choices)}, not {value!r}")
    return value


def array(value: object, field: str, *, items_max: int) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise Invalid(field, f"must be an array, not {type_name(value)}")
    if len(value) > items_max:
        raise Invalid(
            field, f"must have at most {items_max} items, not {len(value)}", code="too_large"
        )
    return list(value)


def json_value(value: object, field: str, *, bytes_max: int) -> Any:
    """A JSON-compatible value (payload or result) no larger than `bytes_max` as msgpack."""
    json_packed(value, field, bytes_max=bytes_max)
    return value


def json_packed(value: object, field: str, *, bytes_max: int) -> bytes:
    """`json_value`'s check, giving the msgpack bytes it measured (a job stores them)."""
    try:
        packed: bytes = to_msgpack(value)
    except (TypeError, ValueError, OverflowError) as error:
        raise Invalid(field, f"is not a JSON value ({error})") from None
    if len(packed) > bytes_max:
        raise Invalid(
            field, f"is {len(packed)} bytes, more than the limit of {bytes_max}",
            code="too_large",
        )
    _check_json_shape(value, field, depth=0)
    return packed


_LEAF_TYPES = frozenset({str, int, bool, type(None)})  # exactly these: nothing to look into


def _check_json_shape(value: object, field: str, depth: int) -> None:
    # msgpack also carries bytes and non-string keys; JSON clients could not read them back.
    # Every payload of every job passes here on every replica: the leaves that decoded JSON
    # and msgpack give (exact types) are passed over without a call each.
    if depth > 64:
        raise Invalid(field, "is nested more than 64 levels deep")
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise Invalid(field, "must not contain NaN or Infinity")
        return
    if isinstance(value, list | tuple):
        for item in value:
            if type(item) not in _LEAF_TYPES:
                _check_json_shape(item, field, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise Invalid(field, "object keys must be strings")
            if type(item) not in _LEAF_TYPES:
                _check_json_shape(item, field, depth + 1)
        return
    raise Invalid(field, f"is not a JSON value ({type_name(value)})")
