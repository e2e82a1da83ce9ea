"""A running job's progress (DESIGN.md §9.4): what a handler reports, bounded, and the one
record a job keeps of it.

A worker's heartbeat may carry `progress: {"value", "message", "data"}`: `value` a fraction
in [0, 1] or `{"done", "total"}` (0 <= done <= total, total >= 1), `message` a short text,
`data` a small JSON value. The job keeps only the newest report, with the state time it was
applied and the attempt that made it, packed (msgpack, as payloads are): a report replaces the
last one, so progress never grows a job, and it is not an event (a handler reporting every
second would flood the event log).

The rules that keep replicas alike (scheduler/state.py applies them): a report is recorded
only once the cluster is finalized (scheduler/gate.py), because the previous release reads a
heartbeat's unknown `progress` field and ignores it; a new attempt starts with none
(`Job.add_attempt`), so a retry never shows the last attempt's figures as its own; a finished
job keeps its last one, as BullMQ keeps `job.progress`, so a failed export still says how far
it got.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from raftcron.scheduler import limits, parse
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.packing import to_msgpack

_FIELDS = frozenset({"value", "message", "data"})
_COUNT_FIELDS = frozenset({"done", "total"})


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """One report: `value` is a fraction (an int 0 or 1, or a float) or `{"done", "total"}`."""

    value: float | int | dict[str, int]
    message: str | None = None
    data: Any = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"value": self.value}
        if self.message is not None:
            wire["message"] = self.message
        if self.data is not None:
            wire["data"] = self.data
        return wire

    @classmethod
    def parse(cls, data: object, field: str = "") -> ProgressReport:
        """A report from the wire (a heartbeat's `progress`); Invalid names the field under
        `field` (`progress.value.total`)."""
        try:
            return cls._parse(data)
        except Invalid as error:
            raise (error.within(field) if field else error) from None

    @classmethod
    def _parse(cls, data: object) -> ProgressReport:
        body = parse.as_mapping(data, "")
        parse.reject_unknown(body, _FIELDS)
        if "value" not in body:
            raise Invalid("value", "is required: a fraction in [0, 1] or {\"done\", \"total\"}")
        message = parse.optional_text(
            body.get("message"), "message", chars_max=limits.PROGRESS_MESSAGE_CHARS_MAX)
        data = body.get("data")
        if data is not None:
            parse.json_value(data, "data", bytes_max=limits.PROGRESS_DATA_BYTES_MAX)
        return cls(parse_value(body["value"]), message, data)

    def packed(self, at_ms: int, attempt: int) -> bytes:
        """The record a job keeps: [value, message, data, at_ms, attempt]."""
        return to_msgpack([self.value, self.message, self.data, at_ms, attempt])


def parse_value(value: object, field: str = "value") -> float | int | dict[str, int]:
    """A fraction in [0, 1], or `{"done", "total"}` rebuilt in that key order (the record's
    bytes must not depend on the order a client wrote the keys in)."""
    if isinstance(value, Mapping):
        parse.reject_unknown(value, _COUNT_FIELDS, field)
        total = parse.integer(value.get("total"), f"{field}.total", low=1)
        done = parse.integer(value.get("done"), f"{field}.done", low=0, high=total)
        return {"done": done, "total": total}
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid(field, "must be a fraction in [0, 1] or {\"done\", \"total\"}, "
                             f"not {parse.type_name(value)}")
    if math.isnan(value) or not 0 <= value <= 1:
        raise Invalid(field, f"must be between 0 and 1, not {value}")
    return value


def view(record: bytes | None) -> dict[str, Any] | None:
    """A job's kept progress as the API shows it: {"value", "message", "data", "at_ms",
    "attempt"}, or None."""
    if record is None:
        return None
    value, message, data, at_ms, attempt = msgpack.unpackb(record, raw=False)
    return {"value": value, "message": message, "data": data, "at_ms": at_ms,
            "attempt": attempt}

