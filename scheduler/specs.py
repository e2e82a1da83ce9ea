"""What a client asks for: job, backoff and workflow specs, parsed from JSON-like data.

A spec is a frozen, validated value. `parse` is the only way in (from an HTTP body or from the
wire) and raises `Invalid` naming the field; `to_wire` gives back the JSON-like form with the
defaults left out, so commands stay small. Specs say nothing about state: whether a dependency
exists or a key was seen before is decided by the state machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raftcron.scheduler import limits, parse
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.flowspecs import (
    ConcurrencySpec,
    FairnessSpec,
    RateKeySpec,
    UniqueSpec,
)
from raftcron.scheduler.packing import to_msgpack
from raftcron.scheduler.value import value

_BACKOFF_FIELDS = frozenset({"initial_ms", "factor", "max_ms", "jitter"})


@dataclass(frozen=True, slots=True)
class BackoffSpec:
    """Capped exponential backoff: initial_ms * factor**(n-1), at most max_ms, plus jitter."""

    initial_ms: int = limits.BACKOFF_INITIAL_MS_DEFAULT
    factor: float = limits.BACKOFF_FACTOR_DEFAULT
    max_ms: int = limits.BACKOFF_MAX_MS_DEFAULT
    jitter: float = limits.BACKOFF_JITTER_DEFAULT  # fraction of the delay added, 0..1

    @classmethod
    def parse(cls, data: object, where: str = "backoff") -> BackoffSpec:
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, _BACKOFF_FIELDS, where)
        day = limits.DAY_MS
        spec = cls(
            initial_ms=parse.integer(
                data.get("initial_ms", limits.BACKOFF_INITIAL_MS_DEFAULT),
                f"{where}.initial_ms",
                low=0,
                high=day,
            ),
            factor=parse.number(
                data.get("factor", limits.BACKOFF_FACTOR_DEFAULT),
                f"{where}.factor",
                low=1,
                high=100,
            ),
            max_ms=parse.integer(
                data.get("max_ms", limits.BACKOFF_MAX_MS_DEFAULT),
                f"{where}.max_ms",
                low=0,
                high=day,
            ),
            jitter=parse.number(
                data.get("jitter", limits.BACKOFF_JITTER_DEFAULT), f"{where}.jitter", low=0, high=1
            ),
        )
        if spec.max_ms < spec.initial_ms:
            raise Invalid(f"{where}.max_ms", f"must be at least initial_ms ({spec.initial_ms})")
        return spec

    def to_wire(self) -> dict[str, Any]:
        return _non_default(self, BackoffSpec(), ("initial_ms", "factor", "max_ms", "jitter"))


DEFAULT_BACKOFF = BackoffSpec()

_JOB_FIELDS = (
    "task",
    "payload",
    "queue",
    "priority",
    "key",
    "run_at_ms",
    "delay_ms",
    "max_attempts",
    "backoff",
    "timeout_ms",
    "depends_on",
    "concurrency",
    "unique",
    "debounce_ms",
    "debounce_max_ms",
    "rate",
    "fairness",
    "traceparent",
)
# Fields that say something of the key: only a job with a key of its own may give them.
_KEYED_FIELDS = ("unique", "debounce_ms", "debounce_max_ms")
_KEYED_FIELDS_SET = frozenset(_KEYED_FIELDS)


@value
class JobSpec:
    task: str
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    key: str | None = None
    run_at_ms: int | None = None
    delay_ms: int | None = None
    max_attempts: int = limits.MAX_ATTEMPTS_DEFAULT
    backoff: BackoffSpec = DEFAULT_BACKOFF
    timeout_ms: int | None = None
    depends_on: tuple[int, ...] = field(default=())
    concurrency: ConcurrencySpec | None = None
    unique: UniqueSpec | None = None
    debounce_ms: int | None = None
    debounce_max_ms: int | None = None
    rate: RateKeySpec | None = None  # a keyed rate limit (scheduler/ratekeys.py)
    fairness: FairnessSpec | None = None  # its key's turns in its queue (scheduler/fairness.py)
    traceparent: str | None = None  # the submitter's trace: the worker's spans continue it
    # The payload as a job stores it (msgpack), packed once: the budget's check of a submit
    # and the job it creates both need it. Not part of the value (compare=False).
    _packed: bytes | None = field(default=None, compare=False, repr=False)

    def packed_payload(self) -> bytes | None:
        if self.payload is None:
            return None
        if self._packed is None:
            object.__setattr__(self, "_packed", to_msgpack(self.payload))
        return self._packed

    @classmethod
    def parse(cls, data: object, where: str = "", *, template: bool = False) -> JobSpec:
        """Parse a job; `template` forbids the per-job fields (a schedule's job template).

        Only the fields present are validated (the rest keep their defaults), and a field's
        path is built only when it is wrong: this runs for every job of every batch on every
        replica.
        """
        data = parse.as_mapping(data, where or "job")
        parsers = _TEMPLATE_PARSERS if template else _JOB_PARSERS
        fields: dict[str, Any] = {}
        try:
            names_met = parse.NAMES_MET
            for name, value in data.items():
                if (name == "task" or name == "queue") and type(value) is str \
                        and value in names_met and len(value) <= limits.NAME_CHARS_MAX:
                    fields[name] = value  # a name met before (parse.name's check, inline)
                    continue
                if name == "payload":  # checked by packing it: the job keeps those bytes
                    if value is not None:
                        fields["_packed"] = parse.json_packed(
                            value, name, bytes_max=limits.PAYLOAD_BYTES_MAX)
                    fields[name] = value
                    continue
                parser = parsers.get(name)
                if parser is None:
                    parse.reject_unknown({name: value}, frozenset(parsers))
                    continue
                fields[name] = parser(value, name)
            if "task" not in fields:
                raise Invalid("task", "is required")
            if fields.get("run_at_ms") is not None and fields.get("delay_ms") is not None:
                raise Invalid("delay_ms", "give run_at_ms or delay_ms, not both")
            if not _KEYED_FIELDS_SET.isdisjoint(fields):
                _check_keyed_fields(fields)
        except Invalid as error:
            raise (error.within(where) if where else error) from None
        if fields.get("backoff", DEFAULT_BACKOFF) is None:
            del fields["backoff"]
        return cls(**fields)

    def to_wire(self) -> dict[str, Any]:
        # On every replica for every job (a submit's request fingerprint): one getattr per field
        # against defaults read once.
        wire = {
            name: value
            for name, default in _JOB_DEFAULT_ITEMS
            if (value := getattr(self, name)) != default
        }
        wire["task"] = self.task
        if "backoff" in wire:
            wire["backoff"] = self.backoff.to_wire()
        if "depends_on" in wire:
            wire["depends_on"] = list(self.depends_on)
        for name in ("concurrency", "unique", "rate", "fairness"):
            if name in wire:
                wire[name] = wire[name].to_wire()
        return wire


_JOB_DEFAULTS = JobSpec(task="-")
_JOB_DEFAULT_ITEMS = tuple((name, getattr(_JOB_DEFAULTS, name)) for name in _JOB_FIELDS[1:])


def _check_keyed_fields(fields: dict[str, Any]) -> None:
    """unique and debounce act on the job holding the same key; debounce decides when it runs."""
    for name in _KEYED_FIELDS:
        if fields.get(name) is not None and fields.get("key") is None:
            raise Invalid(name, "needs a key (the job it is unique with or debounces is the "
                          "one holding the same key)")
    debounce_ms, debounce_max_ms = fields.get("debounce_ms"), fields.get("debounce_max_ms")
    if debounce_ms is not None:
        for name in ("run_at_ms", "delay_ms"):
            if fields.get(name) is not None:
                raise Invalid(name, "a debounced job runs debounce_ms after the last submit; "
                              "give no run_at_ms or delay_ms with it")
    if debounce_max_ms is not None:
        if debounce_ms is None:
            raise Invalid("debounce_max_ms", "needs debounce_ms")
        if debounce_max_ms < debounce_ms:
            raise Invalid("debounce_max_ms", f"must be at least debounce_ms ({debounce_ms})")


def _parse_optional(
    spec: Callable[[object, str], Any],
) -> Callable[[object, str], Any]:
    return lambda value, name: None if value is None else spec(value, name)


def _parse_backoff(value: object, name: str) -> BackoffSpec | None:
    return None if value is None else BackoffSpec.parse(value, name)


def _parse_depends_on(value: object, name: str) -> tuple[int, ...]:
    items = parse.array(value, name, items_max=limits.DEPENDS_ON_MAX)
    return _unique_ids(items, name) if items else ()


_FieldParser = Callable[[object, str], Any]
_JOB_PARSERS: dict[str, _FieldParser] = {
    "task": lambda v, n: parse.name(v, n, chars_max=limits.NAME_CHARS_MAX),
    "payload": lambda v, n: parse.json_value(v, n, bytes_max=limits.PAYLOAD_BYTES_MAX),
    "queue": lambda v, n: parse.name(v, n, chars_max=limits.NAME_CHARS_MAX),
    "priority": lambda v, n: parse.integer(v, n, low=limits.PRIORITY_MIN, high=limits.PRIORITY_MAX),
    "key": lambda v, n: parse.client_key(v, n, chars_max=limits.KEY_CHARS_MAX),
    "run_at_ms": lambda v, n: parse.optional_integer(v, n, low=0, high=limits.TIME_MS_MAX),
    "delay_ms": lambda v, n: parse.optional_integer(v, n, low=0, high=limits.DELAY_MS_MAX),
    "max_attempts": lambda v, n: parse.integer(v, n, low=1, high=limits.ATTEMPTS_MAX),
    "backoff": _parse_backoff,
    "timeout_ms": lambda v, n: parse.optional_integer(v, n, low=1, high=limits.TIMEOUT_MS_MAX),
    "depends_on": _parse_depends_on,
    "concurrency": _parse_optional(ConcurrencySpec.parse),
    "unique": _parse_optional(UniqueSpec.parse),
    "debounce_ms": lambda v, n: parse.optional_integer(v, n, low=1, high=limits.DELAY_MS_MAX),
    "debounce_max_ms": lambda v, n: parse.optional_integer(v, n, low=1, high=limits.DELAY_MS_MAX),
    "rate": _parse_optional(RateKeySpec.parse),
    "fairness": _parse_optional(FairnessSpec.parse),
    "traceparent": _parse_optional(parse.traceparent),
}
# A schedule's job template: no key (each fire gets `<schedule>@<fire_time_ms>`), so nothing
# that acts on a key either, no timing of its own (the schedule decides), no dependencies on
# existing jobs. A concurrency key and a rate key it may give: each fired job holds them. No
# traceparent: each fire starts a trace of its own.
_TEMPLATE_PARSERS = {
    name: parser
    for name, parser in _JOB_PARSERS.items()
    if name not in ("key", "run_at_ms", "delay_ms", "depends_on", "traceparent", *_KEYED_FIELDS)
}


def _unique_ids(values: list[Any], where: str) -> tuple[int, ...]:
    ids = tuple(parse.integer(v, f"{where}[{i}]", low=1) for i, v in enumerate(values))
    if len(set(ids)) != len(ids):
        raise Invalid(where, "lists a job more than once")
    return ids


@dataclass(frozen=True, slots=True)
class WorkflowNode:
    name: str
    job: JobSpec
    after: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    """A DAG submitted at once: jobs named within the request, `after` edges between names."""

    nodes: tuple[WorkflowNode, ...]
    key: str | None = None

    @classmethod
    def parse(cls, data: object, where: str = "", *, template: bool = False) -> WorkflowSpec:
        at = (lambda name: f"{where}.{name}") if where else (lambda name: name)
        data = parse.as_mapping(data, where or "workflow")
        parse.reject_unknown(data, frozenset({"jobs"} if template else {"jobs", "key"}), where)
        raw_nodes = parse.array(data.get("jobs"), at("jobs"), items_max=limits.WORKFLOW_JOBS_MAX)
        if not raw_nodes:
            raise Invalid(at("jobs"), "must list at least one job")
        nodes = tuple(_parse_node(raw, f"{at('jobs')}[{i}]") for i, raw in enumerate(raw_nodes))
        check_dag(nodes, at("jobs"))
        key = (
            None
            if template
            else parse.client_key(data.get("key"), at("key"), chars_max=limits.KEY_CHARS_MAX)
        )
        return cls(nodes=nodes, key=key)

    def to_wire(self) -> dict[str, Any]:
        jobs = []
        for node in self.nodes:
            item = node.job.to_wire()
            item["name"] = node.name
            if node.after:
                item["after"] = list(node.after)
            jobs.append(item)
        wire: dict[str, Any] = {"jobs": jobs}
        if self.key is not None:
            wire["key"] = self.key
        return wire


_NODE_EXTRA = frozenset({"name", "after"})


def _parse_node(raw: object, where: str) -> WorkflowNode:
    data = parse.as_mapping(raw, where)
    job_data = {k: v for k, v in data.items() if k not in _NODE_EXTRA}
    for bad in ("key", "depends_on", *_KEYED_FIELDS):
        if bad in job_data:
            raise Invalid(
                f"{where}.{bad}",
                "is not allowed in a workflow job (use the workflow's key and 'after')",
            )
    after = parse.array(data.get("after", ()), f"{where}.after", items_max=limits.DEPENDS_ON_MAX)
    return WorkflowNode(
        name=parse.name(data.get("name"), f"{where}.name", chars_max=limits.NAME_CHARS_MAX),
        job=JobSpec.parse(job_data, where),
        after=tuple(
            parse.name(v, f"{where}.after[{i}]", chars_max=limits.NAME_CHARS_MAX)
            for i, v in enumerate(after)
        ),
    )


def check_dag(nodes: tuple[WorkflowNode, ...], where: str) -> None:
    """Names unique, edges point at known names, and no cycle (the cycle is named in the error)."""
    index: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if node.name in index:
            raise Invalid(f"{where}[{i}].name", f"{node.name!r} is used by more than one job")
        index[node.name] = i
    for i, node in enumerate(nodes):
        for j, parent in enumerate(node.after):
            if parent not in index:
                raise Invalid(f"{where}[{i}].after[{j}]", f"no job is named {parent!r}")
            if parent == node.name:
                raise Invalid(
                    f"{where}[{i}].after[{j}]", f"cycle: {parent} -> {parent}", code="cycle"
                )
        if len(set(node.after)) != len(node.after):
            raise Invalid(f"{where}[{i}].after", "lists a job more than once")
    cycle = find_cycle({node.name: node.after for node in nodes})
    if cycle:
        raise Invalid(where, "cycle: " + " -> ".join(cycle), code="cycle")


def find_cycle(parents: Mapping[str, tuple[str, ...]]) -> list[str] | None:
    """A cycle in the `after` graph as a closed path of names (first == last), or None.

    Iterative depth-first search in the order the jobs were given, so the same request always
    names the same cycle. The path is reported in run order: each name runs after the previous.
    """
    on_path, done = 1, 2
    mark: dict[str, int] = {}
    for start in parents:
        if start in mark:
            continue
        path = [start]
        mark[start] = on_path
        stack = [iter(parents[start])]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                mark[path.pop()] = done
                continue
            seen = mark.get(step)
            if seen == on_path:
                # The walk follows `after` edges (child -> parent); reverse it into run order.
                return [*path[path.index(step) :], step][::-1]
            if seen is None:
                mark[step] = on_path
                path.append(step)
                stack.append(iter(parents[step]))
    return None


def _non_default(value: object, default: object, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(value, n) for n in names if getattr(value, n) != getattr(default, n)}
