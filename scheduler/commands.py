"""The commands of the replicated log: frozen dataclasses, one per thing that can happen.

Every client command carries an optional `request_id`; the state machine answers a repeated id
with the first result instead of applying the command twice (a proposal that timed out may still
commit, so the shell retries with the same id). Clocks never enter a client command: only `Tick`
and `BeginLeadership`, proposed by the leader, carry time.

Each command has a `TAG` (never reused) and `to_wire`/`from_wire` to its JSON-like form; the
codec wraps that in `[version, tag, fields]`. `from_wire` validates with the same parsers as the
HTTP API, so a command from the wire is exactly as trustworthy as one built here.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from raftcron.scheduler import limits, parse
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.flowcommands import FLOW_COMMANDS, FlowCommand
from raftcron.scheduler.gate import GATE_COMMANDS, GateCommand
from raftcron.scheduler.notifications import AckNotification, DeleteNotification, PutNotification
from raftcron.scheduler.packing import to_msgpack
from raftcron.scheduler.progress import ProgressReport
from raftcron.scheduler.purging import PurgeJobs
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.value import value

T = TypeVar("T")


def _request_id(data: Mapping[str, Any]) -> str | None:
    return parse.optional_text(data.get("request_id"), "request_id", chars_max=limits.KEY_CHARS_MAX)


def _job_id(data: Mapping[str, Any], field: str = "job_id") -> int:
    return parse.integer(data.get(field), field, low=1)


def _token(data: Mapping[str, Any]) -> int:
    return parse.integer(data.get("token"), "token", low=1)


def schedule_name(value: object) -> str:
    """A schedule's name as every command takes it (the API's paths parse names with this)."""
    return parse.name(value, "name", chars_max=limits.NAME_CHARS_MAX)


def _schedule_name(data: Mapping[str, Any]) -> str:
    return schedule_name(data.get("name"))


def _lease_ms(value: object, field: str = "lease_ms") -> int:
    return parse.integer(value, field, low=limits.LEASE_MS_MIN, high=limits.LEASE_MS_MAX)


def _error_text(value: object, field: str = "error") -> str:
    # A worker's failure must always land, so an over-long error is cut rather than rejected.
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Invalid(field, f"must be a string, not {parse.type_name(value)}")
    # Lone surrogates are replaced, not refused: the failure report must land all the same.
    cut = value[: limits.ERROR_CHARS_MAX]
    return cut if cut.isascii() else cut.encode("utf-8", "replace").decode("utf-8")


def _parse_items(items: list[Any], name: str, parse_one: Callable[[Any], T]) -> tuple[T, ...]:
    """Parse every item; an error names the item's index (built only on error: hot path)."""
    parsed = []
    for index, item in enumerate(items):
        try:
            parsed.append(parse_one(item))
        except Invalid as error:
            raise error.within(f"{name}[{index}]") from None
    return tuple(parsed)


def _strip_none(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


@value
class SubmitJobs:
    TAG: ClassVar[int] = 1
    request_id: str | None
    jobs: tuple[JobSpec, ...]

    def to_wire(self) -> dict[str, Any]:
        return _strip_none(
            {"request_id": self.request_id, "jobs": [j.to_wire() for j in self.jobs]}
        )

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> SubmitJobs:
        raw = parse.array(data.get("jobs"), "jobs", items_max=limits.BATCH_JOBS_MAX)
        if not raw:
            raise Invalid("jobs", "must list at least one job")
        return cls(_request_id(data), _parse_items(raw, "jobs", JobSpec.parse))


@dataclass(frozen=True, slots=True)
class SubmitWorkflow:
    TAG: ClassVar[int] = 2
    request_id: str | None
    workflow: WorkflowSpec

    def to_wire(self) -> dict[str, Any]:
        return _strip_none({"request_id": self.request_id, "workflow": self.workflow.to_wire()})

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> SubmitWorkflow:
        return cls(_request_id(data), WorkflowSpec.parse(data.get("workflow"), "workflow"))


@dataclass(frozen=True, slots=True)
class CancelJob:
    TAG: ClassVar[int] = 3
    request_id: str | None
    job_id: int
    reason: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return _strip_none(
            {"request_id": self.request_id, "job_id": self.job_id, "reason": self.reason}
        )

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CancelJob:
        reason = parse.optional_text(data.get("reason"), "reason", chars_max=limits.ERROR_CHARS_MAX)
        return cls(_request_id(data), _job_id(data), reason)


@dataclass(frozen=True, slots=True)
class RetryJob:
    TAG: ClassVar[int] = 4
    request_id: str | None
    job_id: int

    def to_wire(self) -> dict[str, Any]:
        return _strip_none({"request_id": self.request_id, "job_id": self.job_id})

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> RetryJob:
        return cls(_request_id(data), _job_id(data))


ACK_OUTCOMES = ("succeeded", "failed")


@value
class Ack:
    """A finished job reported inside a claim: one round trip acks and claims."""

    job_id: int
    token: int
    outcome: str  # "succeeded" | "failed"
    result: Any = None
    error: str = ""
    retryable: bool = True

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"id": self.job_id, "token": self.token, "outcome": self.outcome}
        if self.result is not None:
            wire["result"] = self.result
        if self.error:
            wire["error"] = self.error
        if not self.retryable:
            wire["retryable"] = False
        return wire

    @classmethod
    def parse(cls, data: object) -> Ack:
        if type(data) is dict and len(data) == 3:  # most acks: a success with no result
            job_id, token = data.get("id"), data.get("token")
            if (type(job_id) is int and type(token) is int and data.get("outcome") == "succeeded"
                    and 1 <= job_id <= parse.INT64_MAX and 1 <= token <= parse.INT64_MAX):
                return cls(job_id, token, "succeeded")
        data = parse.as_mapping(data, "ack")
        if not _ACK_FIELDS.issuperset(data):
            parse.reject_unknown(data, _ACK_FIELDS)
        result = data.get("result")
        return cls(
            job_id=parse.integer(data.get("id"), "id", low=1),
            token=parse.integer(data.get("token"), "token", low=1),
            outcome=parse.choice(data.get("outcome"), "outcome", ACK_OUTCOMES),
            result=None
            if result is None
            else parse.json_value(result, "result", bytes_max=limits.RESULT_BYTES_MAX),
            error=_error_text(data.get("error"), "error"),
            retryable=parse.boolean(data.get("retryable", True), "retryable"),
        )


_ACK_FIELDS = frozenset({"id", "token", "outcome", "result", "error", "retryable"})


@value
class ClaimJobs:
    TAG: ClassVar[int] = 5
    request_id: str | None
    worker: str
    queues: tuple[str, ...]
    max: int = 1
    lease_ms: int = limits.LEASE_MS_DEFAULT
    acks: tuple[Ack, ...] = ()
    node: str | None = None  # the node that took the request, for the attempt history

    def to_wire(self) -> dict[str, Any]:
        return _strip_none(
            {
                "request_id": self.request_id,
                "worker": self.worker,
                "queues": list(self.queues),
                "max": self.max,
                "lease_ms": self.lease_ms,
                "acks": [a.to_wire() for a in self.acks] or None,
                "node": self.node,
            }
        )

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ClaimJobs:
        queues = parse.array(data.get("queues", ["default"]), "queues", items_max=64)
        if not queues:
            raise Invalid("queues", "must list at least one queue")
        names = _parse_items(
            queues, "queues", lambda q: parse.name(q, "", chars_max=limits.NAME_CHARS_MAX))
        if len(set(names)) != len(names):
            raise Invalid("queues", "lists a queue more than once")
        acks = parse.array(data.get("acks", ()), "acks", items_max=limits.ACKS_MAX)
        return cls(
            request_id=_request_id(data),
            worker=parse.name(data.get("worker"), "worker", chars_max=limits.NAME_CHARS_MAX),
            queues=names,
            max=parse.integer(data.get("max", 1), "max", low=0, high=limits.CLAIM_MAX),
            lease_ms=_lease_ms(data.get("lease_ms", limits.LEASE_MS_DEFAULT)),
            acks=_parse_items(acks, "acks", Ack.parse),
            node=parse.optional_text(data.get("node"), "node", chars_max=limits.NAME_CHARS_MAX),
        )


@dataclass(frozen=True, slots=True)
class Heartbeat:
    TAG: ClassVar[int] = 6
    request_id: str | None
    job_id: int
    token: int
    lease_ms: int | None = None  # None: the lease the job was claimed with
    # The handler's newest report (scheduler/progress.py). The previous release ignores this
    # field (its from_wire reads only the fields it knows), so it is applied only once the
    # cluster is finalized.
    progress: ProgressReport | None = None

    def to_wire(self) -> dict[str, Any]:
        return _strip_none(
            {
                "request_id": self.request_id,
                "job_id": self.job_id,
                "token": self.token,
                "lease_ms": self.lease_ms,
                "progress": None if self.progress is None else self.progress.to_wire(),
            }
        )

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Heartbeat:
        lease = data.get("lease_ms")
        progress = data.get("progress")
        return cls(
            _request_id(data),
            _job_id(data),
            _token(data),
            None if lease is None else _lease_ms(lease),
            None if progress is None else ProgressReport.parse(progress, "progress"),
        )


@dataclass(frozen=True, slots=True)
class CompleteJob:
    TAG: ClassVar[int] = 7
    request_id: str | None
    job_id: int
    token: int
    result: Any = None

    def to_wire(self) -> dict[str, Any]:
        return _strip_none(
            {
                "request_id": self.request_id,
                "job_id": self.job_id,
                "token": self.token,
                "result": self.result,
            }
        )

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CompleteJob:
        result = parse.json_value(data.get("result"), "result", bytes_max=limits.RESULT_BYTES_MAX)
        return cls(_request_id(data), _job_id(data), _token(data), result)


@dataclass(frozen=True, slots=True)
class FailJob:
    TAG: ClassVar[int] = 8
    request_id: str | None
    job_id: int
    token: int
    error: str = ""
    retryable: bool = True

    def to_wire(self) -> dict[str, Any]:
        wire = _strip_none(
            {"request_id": self.request_id, "job_id": self.job_id, "token": self.token}
        )
        wire["error"] = self.error
        wire["retryable"] = self.retryable
        return wire

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> FailJob:
        return cls(
            _request_id(data),
            _job_id(data),
            _token(data),
            _error_text(data.get("error")),
            parse.boolean(data.get("retryable", True), "retryable"),
        )


@dataclass(frozen=True, slots=True)
class PutSchedule:
    TAG: ClassVar[int] = 9
    request_id: str | None
    name: str
    spec: ScheduleSpec

    def to_wire(self) -> dict[str, Any]:
        return _strip_none(
            {"request_id": self.request_id, "name": self.name, "spec": self.spec.to_wire()}
        )

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PutSchedule:
        try:
            spec = ScheduleSpec.from_wire(data.get("spec"))
        except Invalid as error:
            raise error.within("spec") from None
        return cls(_request_id(data), _schedule_name(data), spec)


@dataclass(frozen=True, slots=True)
class _NamedScheduleCommand:
    request_id: str | None
    name: str

    def to_wire(self) -> dict[str, Any]:
        return _strip_none({"request_id": self.request_id, "name": self.name})


@dataclass(frozen=True, slots=True)
class DeleteSchedule(_NamedScheduleCommand):
    TAG: ClassVar[int] = 10

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> DeleteSchedule:
        return cls(_request_id(data), _schedule_name(data))


@dataclass(frozen=True, slots=True)
class PauseSchedule(_NamedScheduleCommand):
    TAG: ClassVar[int] = 11

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PauseSchedule:
        return cls(_request_id(data), _schedule_name(data))


@dataclass(frozen=True, slots=True)
class ResumeSchedule(_NamedScheduleCommand):
    TAG: ClassVar[int] = 12

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ResumeSchedule:
        return cls(_request_id(data), _schedule_name(data))


@dataclass(frozen=True, slots=True)
class TriggerSchedule:
    TAG: ClassVar[int] = 13
    request_id: str | None
    name: str
    force: bool = False  # ignore the overlap policy

    def to_wire(self) -> dict[str, Any]:
        return _strip_none(
            {"request_id": self.request_id, "name": self.name, "force": self.force or None}
        )

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> TriggerSchedule:
        return cls(
            _request_id(data),
            _schedule_name(data),
            parse.boolean(data.get("force", False), "force"),
        )


@dataclass(frozen=True, slots=True)
class BackfillSchedule:
    TAG: ClassVar[int] = 14
    request_id: str | None
    name: str
    from_ms: int
    to_ms: int

    def to_wire(self) -> dict[str, Any]:
        return _strip_none(
            {
                "request_id": self.request_id,
                "name": self.name,
                "from_ms": self.from_ms,
                "to_ms": self.to_ms,
            }
        )

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> BackfillSchedule:
        from_ms = parse.integer(data.get("from_ms"), "from_ms", low=0, high=limits.TIME_MS_MAX)
        to_ms = parse.integer(data.get("to_ms"), "to_ms", low=0, high=limits.TIME_MS_MAX)
        if to_ms <= from_ms:
            raise Invalid("to_ms", "must be after from_ms")
        return cls(_request_id(data), _schedule_name(data), from_ms, to_ms)


@dataclass(frozen=True, slots=True)
class Tick:
    """The only command that moves time: `state.now_ms = max(state.now_ms, now_ms)`.

    `leader` names the node whose clock this is. A Tick from a node other than the leader of
    the last committed BeginLeadership is ignored: a deposed leader's ticker (or one forwarded
    by a follower) must not move the state's time. A follower may propose the leader's own
    Tick, which it asked the leader for (a claim's stamp, cluster/http/stamps.py): it names the
    leader, so it applies while that node leads. None (tests, tools) always applies.
    """

    TAG: ClassVar[int] = 15
    now_ms: int
    leader: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return _strip_none({"now_ms": self.now_ms, "leader": self.leader})

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Tick:
        leader = parse.optional_text(data.get("leader"), "leader", chars_max=limits.NAME_CHARS_MAX)
        now_ms = parse.integer(data.get("now_ms"), "now_ms", low=0, high=limits.TIME_MS_MAX)
        return cls(now_ms, leader)


@dataclass(frozen=True, slots=True)
class BeginLeadership:
    """A new leader's first command: existing leases get one lease period of grace.

    Workers may have lost their node with the old leader; expiring their leases at once would
    re-run work that is still going. Safety does not depend on this (fencing does), only waste.
    """

    TAG: ClassVar[int] = 16
    now_ms: int
    node: str
    term: int

    def to_wire(self) -> dict[str, Any]:
        return {"now_ms": self.now_ms, "node": self.node, "term": self.term}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> BeginLeadership:
        return cls(
            parse.integer(data.get("now_ms"), "now_ms", low=0, high=limits.TIME_MS_MAX),
            parse.text(data.get("node"), "node", chars_max=limits.NAME_CHARS_MAX),
            parse.integer(data.get("term"), "term", low=0),
        )


@dataclass(frozen=True, slots=True)
class Barrier:
    """A no-op through the log: once it is applied, every earlier write is visible here."""

    TAG: ClassVar[int] = 17
    request_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return _strip_none({"request_id": self.request_id})

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Barrier:
        return cls(_request_id(data))


Command = (
    SubmitJobs
    | SubmitWorkflow
    | CancelJob
    | RetryJob
    | ClaimJobs
    | Heartbeat
    | CompleteJob
    | FailJob
    | PutSchedule
    | DeleteSchedule
    | PauseSchedule
    | ResumeSchedule
    | TriggerSchedule
    | BackfillSchedule
    | Tick
    | BeginLeadership
    | Barrier
    | PutNotification
    | DeleteNotification
    | AckNotification
    | FlowCommand
    | GateCommand
    | PurgeJobs
)

COMMAND_TYPES: tuple[type[Any], ...] = (
    SubmitJobs,
    SubmitWorkflow,
    CancelJob,
    RetryJob,
    ClaimJobs,
    Heartbeat,
    CompleteJob,
    FailJob,
    PutSchedule,
    DeleteSchedule,
    PauseSchedule,
    ResumeSchedule,
    TriggerSchedule,
    BackfillSchedule,
    Tick,
    BeginLeadership,
    Barrier,
    PutNotification,  # tags 40-42: scheduler/notifications.py
    DeleteNotification,
    AckNotification,
    *FLOW_COMMANDS,
    *GATE_COMMANDS,  # tags 50-51: scheduler/gate.py
    PurgeJobs,  # tag 52: scheduler/purging.py
)
BY_TAG: dict[int, type[Any]] = {cls.TAG: cls for cls in COMMAND_TYPES}
assert len(BY_TAG) == len(COMMAND_TYPES), "a command tag is used twice"


def command_fingerprint(command: Command) -> int:
    """A checksum of what a client asked for, to catch a request_id reused for another request.

    It leaves out the request_id itself and the `node` that took the request: a worker that
    retries a claim through another node is repeating the same request.
    """
    return wire_fingerprint(command.TAG, command.to_wire())


def wire_fingerprint(tag: int, wire: Mapping[str, Any]) -> int:
    """`command_fingerprint` from a command's wire fields as they were decoded, without
    building them again: a replica applying a batch of 1,000 jobs skips a to_wire of each
    (the same bytes, since encoding a decoded command gives back its fields; a model test
    holds the two equal for every command it makes)."""
    kept = {k: v for k, v in wire.items() if k not in ("request_id", "node")}
    if tag == SubmitJobs.TAG or tag == SubmitWorkflow.TAG:
        kept = _without_traceparents(kept)
    return zlib.crc32(to_msgpack([tag, kept]))


def _without_traceparents(kept: dict[str, Any]) -> dict[str, Any]:
    """A submit's fields without its jobs' traceparents: the trace a request was sent from is
    not what it asks for, so a retry under the same request_id from another span (a client's
    own retry of a lost answer) is the same request. A submit without any fingerprints as it
    always did, so a mixed cluster agrees (none has one before finalize: scheduler/gate.py)."""
    holder = kept.get("workflow", kept)
    jobs = holder.get("jobs") if isinstance(holder, dict) else None
    if not isinstance(jobs, list) or not any(
            isinstance(job, dict) and "traceparent" in job for job in jobs):
        return kept
    stripped = [{k: v for k, v in job.items() if k != "traceparent"}
                if isinstance(job, dict) else job for job in jobs]
    if holder is kept:
        return {**kept, "jobs": stripped}
    return {**kept, "workflow": {**holder, "jobs": stripped}}
