"""What a job search asks (DESIGN.md §9.2): filters over the fields of a job as the API shows
it, the same whether the job is in the state or in a node's archive.

`JobFilter.parse` reads them from a query string's pairs and names the parameter it refuses;
`matches` tests one job view. The archive turns the same filter into SQL
(cluster/archive/query.py), and a test holds both to the same answers.

Payload fields: `payload.<path>=<value>`, `.gte` / `.lte` for ranges. A value that reads as a
JSON number is a number and matches numbers only; `"..."` (JSON string) or any other text is a
string and matches strings only; `true`, `false` and `null` match themselves.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from raftcron.scheduler import jobs as j
from raftcron.scheduler.errors import Invalid

PAYLOAD_PREFIX = "payload."
PAYLOAD_FILTERS_MAX = 8
PATH_DEPTH_MAX = 8
VALUE_CHARS_MAX = 256
_SEGMENT = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")
TEXT_FIELDS = ("task", "queue", "schedule", "key", "worker")
RANGE_FIELDS = ("created_from_ms", "created_to_ms", "finished_from_ms", "finished_to_ms")
OPERATORS = {"": "eq", "gte": "gte", "lte": "lte"}
TIME_MAX_MS = 2**53
INTEGER_MIN, INTEGER_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class PayloadFilter:
    path: tuple[str, ...]
    op: str  # eq, gte, lte
    value: Any  # int, float, str, bool or None

    @property
    def name(self) -> str:
        suffix = "" if self.op == "eq" else f".{self.op}"
        return PAYLOAD_PREFIX + ".".join(self.path) + suffix


@dataclass(frozen=True, slots=True)
class JobFilter:
    status: str | None = None
    task: str | None = None
    queue: str | None = None
    schedule: str | None = None
    key: str | None = None
    worker: str | None = None
    created_from_ms: int | None = None
    created_to_ms: int | None = None
    finished_from_ms: int | None = None
    finished_to_ms: int | None = None
    error: str | None = None  # a substring of the job's error, ASCII letters in either case
    payload: tuple[PayloadFilter, ...] = ()

    @property
    def has_time_range(self) -> bool:
        return any(getattr(self, name) is not None for name in RANGE_FIELDS)

    @classmethod
    def parse(cls, pairs: Iterable[tuple[str, str]], *,
              ignore: Iterable[str] = ()) -> JobFilter:
        """The filter a query string asks for; Invalid naming the parameter it cannot read.
        `ignore`: parameters that are not filters (limit, cursor, ...)."""
        skipped = set(ignore)
        fields: dict[str, Any] = {}
        payload: list[PayloadFilter] = []
        for name, raw in pairs:
            if name in skipped or raw == "":
                continue
            if name.startswith(PAYLOAD_PREFIX):
                payload.append(_payload_filter(name, raw))
                if len(payload) > PAYLOAD_FILTERS_MAX:
                    raise Invalid(name, f"at most {PAYLOAD_FILTERS_MAX} payload filters")
                continue
            if name in fields:
                raise Invalid(name, "is given twice")
            if name == "status":
                if raw not in j.STATUSES:
                    raise Invalid(name, f"must be one of {', '.join(j.STATUSES)}")
                fields[name] = raw
            elif name in TEXT_FIELDS or name == "error":
                if len(raw) > VALUE_CHARS_MAX:
                    raise Invalid(name, f"must be at most {VALUE_CHARS_MAX} characters")
                fields[name] = raw
            elif name in RANGE_FIELDS:
                fields[name] = _time(name, raw)
            else:
                raise Invalid(name, "is not a filter of jobs (status, task, queue, schedule, "
                              "key, worker, error, created_from_ms, created_to_ms, "
                              "finished_from_ms, finished_to_ms, payload.<path>)")
        return cls(**fields, payload=tuple(payload))

    @classmethod
    def from_object(cls, data: object, where: str = "filter") -> JobFilter:
        """The filter a JSON object asks for, with the query string's names and the payload
        fields under `payload` (`{"task": "a", "created_from_ms": 0, "payload": {"customer.id":
        42, "total.gte": 10}}`): a payload value is the JSON value itself (42 a number, "42" a
        string). Invalid naming `where.<name>`."""
        if not isinstance(data, Mapping):
            raise Invalid(where, "must be an object of filters")
        pairs: list[tuple[str, str]] = []
        for name, value in data.items():
            at = f"{where}.{name}"
            if name == "payload":
                if not isinstance(value, Mapping):
                    raise Invalid(at, "must be an object of payload paths and values")
                pairs += [(PAYLOAD_PREFIX + str(path), json.dumps(wanted))
                          for path, wanted in value.items()]
            elif name in RANGE_FIELDS:
                if type(value) is not int:
                    raise Invalid(at, "must be an integer (Unix ms)")
                pairs.append((name, str(value)))
            elif name in (*TEXT_FIELDS, "status", "error"):
                if not isinstance(value, str):
                    raise Invalid(at, "must be a string")
                pairs.append((name, value))
            else:
                raise Invalid(at, "is not a filter of jobs (status, task, queue, schedule, key, "
                              "worker, error, created_from_ms, created_to_ms, finished_from_ms, "
                              "finished_to_ms, payload)")
        try:
            return cls.parse(pairs)
        except Invalid as error:
            raise error.within(where) from None

    def matches(self, view: Mapping[str, Any]) -> bool:
        """Whether the job `view` (`views.job_view`, with its history) passes."""
        if self.status is not None and view["status"] != self.status:
            return False
        for name in ("task", "queue", "schedule", "key"):
            wanted = getattr(self, name)
            if wanted is not None and view[name] != wanted:
                return False
        if self.worker is not None and last_worker(view) != self.worker:
            return False
        if not _within(view["created_ms"], self.created_from_ms, self.created_to_ms):
            return False
        if (self.finished_from_ms is not None or self.finished_to_ms is not None) and (
                view["finished_ms"] is None or not _within(
                    view["finished_ms"], self.finished_from_ms, self.finished_to_ms)):
            return False
        if self.error is not None and (
                view["error"] is None or ascii_lower(self.error) not in ascii_lower(view["error"])):
            return False
        return all(_payload_matches(view["payload"], each) for each in self.payload)


_ASCII_LOWER = {code: code + 32 for code in range(ord("A"), ord("Z") + 1)}


def ascii_lower(text: str) -> str:
    """Lower case as SQLite's `lower` makes it (ASCII letters only), so that the archive's
    search and the state's agree on every text."""
    return text.translate(_ASCII_LOWER)


def last_worker(view: Mapping[str, Any]) -> str | None:
    """The worker a search names for a job: its last attempt's."""
    history = view.get("history") or ()
    return history[-1]["worker"] if history else None


def _within(value: int, low: int | None, high: int | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _time(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise Invalid(name, f"must be an integer (Unix ms), not {raw!r}") from None
    if not 0 <= value <= TIME_MAX_MS:
        raise Invalid(name, f"must be between 0 and {TIME_MAX_MS}")
    return value


def payload_path(text: str) -> tuple[str, ...] | None:
    """The names of a dotted payload path ("customer.id"), or None when it is not one: 1 to
    `PATH_DEPTH_MAX` names of letters, digits, `_` or `-`. Nothing else may be in a path: the
    archive writes it into its SQL as a literal (cluster/archive/query.py)."""
    parts = tuple(text.split("."))
    if len(parts) > PATH_DEPTH_MAX or not all(_SEGMENT.fullmatch(part) for part in parts):
        return None
    return parts


def _payload_filter(name: str, raw: str) -> PayloadFilter:
    parts = name[len(PAYLOAD_PREFIX):].split(".")
    op = "eq"
    if len(parts) > 1 and parts[-1] in ("gte", "lte"):
        op = parts.pop()
    path = payload_path(".".join(parts))
    if path is None:
        raise Invalid(name, f"must be payload.<path> with 1 to {PATH_DEPTH_MAX} names of "
                      "letters, digits, _ or - (and .gte or .lte for a range)")
    if len(raw) > VALUE_CHARS_MAX:
        raise Invalid(name, f"must be at most {VALUE_CHARS_MAX} characters")
    value = _value(raw)
    if isinstance(value, int) and not isinstance(value, bool) and not (
            INTEGER_MIN <= value <= INTEGER_MAX):
        # The archive compares in SQLite, whose integers are of 64 bits.
        raise Invalid(name, f"an integer must be between {INTEGER_MIN} and {INTEGER_MAX}")
    if op != "eq" and (isinstance(value, bool) or value is None):
        raise Invalid(name, "a range compares numbers or strings")
    return PayloadFilter(path, op, value)


def _value(raw: str) -> Any:
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return raw  # an object or a list: taken as the text it is


def _payload_matches(payload: Any, wanted: PayloadFilter) -> bool:
    found = payload
    for segment in wanted.path:
        if not isinstance(found, dict) or segment not in found:
            return False
        found = found[segment]
    value = wanted.value
    if not _same_kind(found, value):
        return False
    if isinstance(found, str):
        # SQLite's JSON functions end a string at its first NUL ("\u0000"): read as the
        # archive reads it, so that the archive's search and the state's agree on every text.
        found = found.partition("\x00")[0]
    if wanted.op == "eq":
        return bool(found == value)
    if wanted.op == "gte":
        return bool(found >= value)
    return bool(found <= value)


def _same_kind(found: Any, value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return found is value
    if isinstance(value, (int, float)):
        return isinstance(found, (int, float)) and not isinstance(found, bool)
    return isinstance(found, str)
