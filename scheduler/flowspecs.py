"""What a client asks of flow control: queue limits, a job's concurrency key, uniqueness that
knows job states, and the filter of a bulk action (DESIGN.md §8.5).

Each spec is a frozen, validated value with `parse` (raises `Invalid` naming the field) and
`to_wire` (the JSON-like form, defaults left out). Like `scheduler.specs`, nothing here reads
the state: whether a queue has room, a key is taken or a job matches is the state machine's
decision (`scheduler.queues`, `scheduler.uniqueness`, `scheduler.bulk`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raftcron.scheduler import limits, parse
from raftcron.scheduler.errors import Invalid

STATUSES = ("blocked", "scheduled", "queued", "running", "succeeded", "failed", "cancelled")
# "Unique while it is waiting or running": a job that ended (succeeded, failed, cancelled) lets
# a new one in. Oban counts a completed job too; say "succeeded" in `states` for that.
UNIQUE_STATES_DEFAULT = ("blocked", "scheduled", "queued", "running")
ON_CONFLICT = ("ignore", "replace")
BULK_ACTIONS = ("cancel", "retry", "delete")


def _within(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


_CONCURRENCY_FIELDS = frozenset({"key", "max"})
_CONCURRENCY_SEEN: dict[tuple[str, int], ConcurrencySpec] = {}


@dataclass(frozen=True, slots=True)
class ConcurrencySpec:
    """At most `max` running jobs with this `key` at once, whatever their queue."""

    key: str
    max: int = 1

    @classmethod
    def parse(cls, data: object, where: str = "concurrency") -> ConcurrencySpec:
        # Every replica parses this for every keyed job: the common shape is checked without
        # building a field path; anything else goes the long way, which names what is wrong.
        if isinstance(data, dict) and _CONCURRENCY_FIELDS.issuperset(data):
            key, count = data.get("key"), data.get("max", 1)
            # `type(...) is`: True == 1 and 1.0 == 1, and neither is a valid max.
            if type(key) is str and type(count) is int:
                known = _CONCURRENCY_SEEN.get((key, count))
                if known is not None:
                    return known
                if 0 < len(key) <= limits.KEY_CHARS_MAX and key.isascii() and (
                    1 <= count <= limits.CONCURRENCY_MAX
                ):
                    # Specs are values: a key's jobs share one (a bounded memo, cleared whole).
                    if len(_CONCURRENCY_SEEN) >= 4_096:
                        _CONCURRENCY_SEEN.clear()
                    spec = _CONCURRENCY_SEEN[(key, count)] = cls(key, count)
                    return spec
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, _CONCURRENCY_FIELDS, where)
        return cls(
            key=parse.text(data.get("key"), _within(where, "key"), chars_max=limits.KEY_CHARS_MAX),
            max=parse.integer(
                data.get("max", 1), _within(where, "max"), low=1, high=limits.CONCURRENCY_MAX
            ),
        )

    def to_wire(self) -> dict[str, Any]:
        return {"key": self.key, "max": self.max}


_RATE_KEY_FIELDS = frozenset({"key", "max", "per_ms"})
_RATE_KEY_SEEN: dict[tuple[str, int, int], RateKeySpec] = {}


@dataclass(frozen=True, slots=True)
class RateKeySpec:
    """At most `max` jobs with this `key` start in any window of `per_ms` ms, whatever their
    queue (DESIGN.md §9.4; scheduler/ratekeys.py)."""

    key: str
    max: int
    per_ms: int

    @classmethod
    def parse(cls, data: object, where: str = "rate") -> RateKeySpec:
        if type(data) is dict and _RATE_KEY_FIELDS.issuperset(data):  # a spec met before
            key, limit, per_ms = data.get("key"), data.get("max"), data.get("per_ms")
            if type(key) is str and type(limit) is int and type(per_ms) is int:
                known = _RATE_KEY_SEEN.get((key, limit, per_ms))
                if known is not None:
                    return known
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, _RATE_KEY_FIELDS, where)
        spec = cls(
            key=parse.text(data.get("key"), _within(where, "key"), chars_max=limits.KEY_CHARS_MAX),
            max=parse.integer(data.get("max"), _within(where, "max"), low=1,
                              high=limits.RATE_MAX),
            per_ms=parse.integer(data.get("per_ms"), _within(where, "per_ms"), low=1,
                                 high=limits.DAY_MS),
        )
        # Specs are values: a key's jobs share one (a bounded memo, cleared whole).
        known = _RATE_KEY_SEEN.get((spec.key, spec.max, spec.per_ms))
        if known is not None:
            return known
        if len(_RATE_KEY_SEEN) >= 4_096:
            _RATE_KEY_SEEN.clear()
        _RATE_KEY_SEEN[(spec.key, spec.max, spec.per_ms)] = spec
        return spec

    def to_wire(self) -> dict[str, Any]:
        return {"key": self.key, "max": self.max, "per_ms": self.per_ms}


_FAIRNESS_FIELDS = frozenset({"key", "weight"})
_FAIRNESS_SEEN: dict[tuple[str, int], FairnessSpec] = {}
FAIRNESS_WEIGHT_MAX = 1_000


@dataclass(frozen=True, slots=True)
class FairnessSpec:
    """Within its queue and priority, a job takes turns with other keys' jobs: `weight` jobs
    of this `key` per turn (DESIGN.md §9.4; scheduler/fairness.py)."""

    key: str
    weight: int = 1

    @classmethod
    def parse(cls, data: object, where: str = "fairness") -> FairnessSpec:
        # Every replica parses this for every job that has one: a spec met before is taken
        # from the memo (`type(...) is`: True == 1, and a bool is no weight); anything else
        # goes the long way, which names what is wrong.
        if type(data) is dict and _FAIRNESS_FIELDS.issuperset(data):
            key, weight = data.get("key"), data.get("weight", 1)
            if type(key) is str and type(weight) is int:
                known = _FAIRNESS_SEEN.get((key, weight))
                if known is not None:
                    return known
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, _FAIRNESS_FIELDS, where)
        key = parse.text(data.get("key"), _within(where, "key"), chars_max=limits.KEY_CHARS_MAX)
        weight = parse.integer(data.get("weight", 1), _within(where, "weight"), low=1,
                               high=FAIRNESS_WEIGHT_MAX)
        known = _FAIRNESS_SEEN.get((key, weight))  # specs are values: a key's jobs share one
        if known is None:
            if len(_FAIRNESS_SEEN) >= 4_096:
                _FAIRNESS_SEEN.clear()
            known = _FAIRNESS_SEEN[(key, weight)] = cls(key, weight)
        return known

    def to_wire(self) -> dict[str, Any]:
        return {"key": self.key, "weight": self.weight}


@dataclass(frozen=True, slots=True)
class UniqueSpec:
    """A submit with the job's `key` conflicts with the job holding that key if that job is in
    one of `states` and was created less than `period_ms` ago; `on_conflict` says what then."""

    states: tuple[str, ...] = UNIQUE_STATES_DEFAULT
    period_ms: int = limits.KEY_WINDOW_MS_DEFAULT
    on_conflict: str = "ignore"

    @classmethod
    def parse(cls, data: object, where: str = "unique") -> UniqueSpec:
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, frozenset({"states", "period_ms", "on_conflict"}), where)
        states: tuple[str, ...] = UNIQUE_STATES_DEFAULT
        if "states" in data:
            raw = parse.array(data["states"], _within(where, "states"), items_max=len(STATUSES))
            if not raw:
                raise Invalid(_within(where, "states"), "must list at least one status")
            chosen = {
                parse.choice(v, f"{_within(where, 'states')}[{i}]", STATUSES)
                for i, v in enumerate(raw)
            }
            if len(chosen) != len(raw):
                raise Invalid(_within(where, "states"), "lists a status more than once")
            states = tuple(s for s in STATUSES if s in chosen)  # one order: one wire form
        return cls(
            states=states,
            period_ms=parse.integer(
                data.get("period_ms", limits.KEY_WINDOW_MS_DEFAULT),
                _within(where, "period_ms"),
                low=1,
                high=limits.UNIQUE_PERIOD_PARSE_MS_MAX,
            ),
            on_conflict=parse.choice(
                data.get("on_conflict", "ignore"), _within(where, "on_conflict"), ON_CONFLICT
            ),
        )

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {}
        if self.states != UNIQUE_STATES_DEFAULT:
            wire["states"] = list(self.states)
        if self.period_ms != limits.KEY_WINDOW_MS_DEFAULT:
            wire["period_ms"] = self.period_ms
        if self.on_conflict != "ignore":
            wire["on_conflict"] = self.on_conflict
        return wire


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most `max` claims per `per_ms` (scheduler/queues.py says how that is counted: in a
    sliding window, or as a token bucket of `burst` tokens when `burst` is given)."""

    max: int
    per_ms: int
    burst: int | None = None  # None: the exact window (a bucket of `max` before finalize)

    @classmethod
    def parse(cls, data: object, where: str = "rate_limit") -> RateLimit:
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, frozenset({"max", "per_ms", "burst"}), where)
        return cls(
            max=parse.integer(
                data.get("max"), _within(where, "max"), low=1, high=limits.RATE_MAX
            ),
            per_ms=parse.integer(
                data.get("per_ms"), _within(where, "per_ms"), low=1, high=limits.DAY_MS
            ),
            burst=parse.optional_integer(
                data.get("burst"), _within(where, "burst"), low=1, high=limits.RATE_MAX
            ),
        )

    def to_wire(self) -> dict[str, Any]:
        # Without a burst, the wire form of the previous release: its replay reads it.
        wire: dict[str, Any] = {"max": self.max, "per_ms": self.per_ms}
        if self.burst is not None:
            wire["burst"] = self.burst
        return wire


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue's limits (`PUT /v1/queues/{name}`); a field left out takes its default."""

    paused: bool = False
    concurrency_max: int | None = None  # None: no cap
    rate_limit: RateLimit | None = None  # None: no limit

    @classmethod
    def parse(cls, data: object, where: str = "") -> QueueSpec:
        data = parse.as_mapping(data, where or "queue")
        parse.reject_unknown(data, frozenset({"paused", "concurrency_max", "rate_limit"}), where)
        cap = data.get("concurrency_max")
        rate = data.get("rate_limit")
        return cls(
            paused=parse.boolean(data.get("paused", False), _within(where, "paused")),
            concurrency_max=parse.optional_integer(
                cap, _within(where, "concurrency_max"), low=1, high=limits.CONCURRENCY_MAX
            ),
            rate_limit=None
            if rate is None
            else RateLimit.parse(rate, _within(where, "rate_limit")),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "paused": self.paused,
            "concurrency_max": self.concurrency_max,
            "rate_limit": None if self.rate_limit is None else self.rate_limit.to_wire(),
        }

    @property
    def is_default(self) -> bool:
        return self == QueueSpec()


@dataclass(frozen=True, slots=True)
class BulkFilter:
    """Which jobs a bulk action looks at: every field given must match (None: any)."""

    status: str | None = None
    queue: str | None = None
    task: str | None = None
    schedule: str | None = None
    created_from_ms: int | None = None  # inclusive
    created_to_ms: int | None = None  # exclusive

    @classmethod
    def parse(cls, data: object, where: str = "filter") -> BulkFilter:
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, _FILTER_FIELDS, where)

        def name(field: str) -> str | None:
            value = data.get(field)
            at = _within(where, field)
            return None if value is None else parse.name(value, at, chars_max=limits.NAME_CHARS_MAX)

        def instant(field: str) -> int | None:
            at = _within(where, field)
            return parse.optional_integer(data.get(field), at, low=0, high=limits.TIME_MS_MAX)

        status = data.get("status")
        found = cls(
            status=None if status is None else parse.choice(status, _within(where, "status"),
                                                            STATUSES),
            queue=name("queue"),
            task=name("task"),
            schedule=name("schedule"),
            created_from_ms=instant("created_from_ms"),
            created_to_ms=instant("created_to_ms"),
        )
        if (
            found.created_from_ms is not None
            and found.created_to_ms is not None
            and found.created_to_ms <= found.created_from_ms
        ):
            raise Invalid(_within(where, "created_to_ms"), "must be after created_from_ms")
        return found

    def to_wire(self) -> dict[str, Any]:
        wire = {name: getattr(self, name) for name in _FILTER_ORDER}
        return {name: value for name, value in wire.items() if value is not None}


_FILTER_ORDER = ("status", "queue", "task", "schedule", "created_from_ms", "created_to_ms")
_FILTER_FIELDS = frozenset(_FILTER_ORDER)

