"""The commands of flow control (DESIGN.md §8.5): queue limits and bulk actions on jobs.

Frozen dataclasses with a `TAG` and `to_wire`/`from_wire`, exactly as `scheduler.commands`
(which lists them in its registry: `Command`, `COMMAND_TYPES`). Their tags start at 30, away
from the commands that other work adds in the meantime. `from_wire` validates with the same
spec parsers as the HTTP routes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from raftcron.scheduler import limits, parse
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.flowspecs import BULK_ACTIONS, BulkFilter, QueueSpec


def _request_id(data: Mapping[str, Any]) -> str | None:
    return parse.optional_text(data.get("request_id"), "request_id", chars_max=limits.KEY_CHARS_MAX)


def queue_name(value: object) -> str:
    """A queue's name as every command takes it (the API's paths parse names with this)."""
    return parse.name(value, "name", chars_max=limits.NAME_CHARS_MAX)


def _with_request_id(request_id: str | None, fields: dict[str, Any]) -> dict[str, Any]:
    return fields if request_id is None else {"request_id": request_id, **fields}


@dataclass(frozen=True, slots=True)
class PutQueue:
    """Set a queue's limits; defaults everywhere forgets them."""

    TAG: ClassVar[int] = 30
    request_id: str | None
    name: str
    spec: QueueSpec

    def to_wire(self) -> dict[str, Any]:
        return _with_request_id(self.request_id, {"name": self.name, "spec": self.spec.to_wire()})

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PutQueue:
        try:
            spec = QueueSpec.parse(data.get("spec"))
        except Invalid as error:
            raise error.within("spec") from None
        return cls(_request_id(data), queue_name(data.get("name")), spec)


@dataclass(frozen=True, slots=True)
class _NamedQueueCommand:
    request_id: str | None
    name: str

    def to_wire(self) -> dict[str, Any]:
        return _with_request_id(self.request_id, {"name": self.name})


@dataclass(frozen=True, slots=True)
class PauseQueue(_NamedQueueCommand):
    """Hand out no job of this queue (its leases already out carry on)."""

    TAG: ClassVar[int] = 31

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PauseQueue:
        return cls(_request_id(data), queue_name(data.get("name")))


@dataclass(frozen=True, slots=True)
class ResumeQueue(_NamedQueueCommand):
    TAG: ClassVar[int] = 32

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ResumeQueue:
        return cls(_request_id(data), queue_name(data.get("name")))


@dataclass(frozen=True, slots=True)
class BulkJobs:
    """Cancel, retry or delete the jobs matching a filter: at most `max` of them, among the
    ids after `cursor` that one command looks at (scheduler/bulk.py). The answer's
    `next_cursor` continues where this one stopped."""

    TAG: ClassVar[int] = 33
    request_id: str | None
    action: str
    filter: BulkFilter
    max: int = limits.BULK_MAX
    cursor: int = 0

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"action": self.action, "filter": self.filter.to_wire(),
                                "max": self.max}
        if self.cursor:
            wire["cursor"] = self.cursor
        return _with_request_id(self.request_id, wire)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> BulkJobs:
        return cls(
            _request_id(data),
            parse.choice(data.get("action"), "action", BULK_ACTIONS),
            BulkFilter.parse(data.get("filter", {})),
            parse.integer(data.get("max", limits.BULK_MAX), "max", low=1, high=limits.BULK_MAX),
            parse.integer(data.get("cursor", 0), "cursor", low=0),
        )


FLOW_COMMANDS: tuple[type[Any], ...] = (PutQueue, PauseQueue, ResumeQueue, BulkJobs)
FlowCommand = PutQueue | PauseQueue | ResumeQueue | BulkJobs
