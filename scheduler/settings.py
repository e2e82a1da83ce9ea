"""The cluster's settings: retention and the state budget, replicated so every replica evicts
and refuses exactly the same (DESIGN.md §9.1); archive retention and search attributes, so
every member's archive keeps the same rows with the same indexes (§9.2).

`Settings` is a frozen value: `parse` is the only way in (from the API, the config of a new
cluster, the wire) and names the field that is wrong; `to_wire` gives the whole shape back,
defaults included, which is what `GET /v1/settings` shows. They take effect only once the
cluster is finalized (`scheduler.gate`): before, retention is the 7-day constant and nothing
is refused for space, as in the previous release.

Retention: for each outcome (succeeded, failed, cancelled) a rule `{max_age_ms, max_count}`:
a finished job goes when it is older than `max_age_ms` OR when more than `max_count` newer
jobs of its outcome are kept. A queue may override any outcome's rule (`queues`); a field it
leaves out is the cluster-wide rule's. A queue with an override for an outcome is counted
apart: its jobs neither count toward nor are evicted by the cluster-wide count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from raftcron.scheduler import limits, parse
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.search import PATH_DEPTH_MAX, payload_path

OUTCOMES = ("succeeded", "failed", "cancelled")

# Defaults (the suggestion, kept: a default cluster stays bounded by count at ~1.1 M
# finished jobs, and by the budget whatever their size).
SUCCEEDED_AGE_MS_DEFAULT = limits.DAY_MS
SUCCEEDED_COUNT_DEFAULT = 1_000_000
FAILED_AGE_MS_DEFAULT = 7 * limits.DAY_MS
FAILED_COUNT_DEFAULT = 100_000

# Bounds. History kept longer belongs in the archive, not in every replica's memory; and fire
# keys live as long as the longest age (backfill reaches that far), so an every-second
# schedule keeps 2.6 M keys at 30 days.
RETENTION_AGE_MS_MAX = 30 * limits.DAY_MS
RETENTION_COUNT_MAX = 100_000_000
QUEUE_OVERRIDES_MAX = 1_000
BUDGET_BYTES_MIN = 1 << 20
BUDGET_BYTES_MAX = 1 << 40


@dataclass(frozen=True, slots=True)
class Rule:
    max_age_ms: int
    max_count: int

    def to_wire(self) -> dict[str, int]:
        return {"max_age_ms": self.max_age_ms, "max_count": self.max_count}

    @classmethod
    def parse(cls, data: object, where: str, base: Rule) -> Rule:
        """A rule; a field left out is `base`'s."""
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, _RULE_FIELDS, where)
        return cls(
            max_age_ms=parse.integer(data.get("max_age_ms", base.max_age_ms),
                                     f"{where}.max_age_ms", low=0, high=RETENTION_AGE_MS_MAX),
            max_count=parse.integer(data.get("max_count", base.max_count),
                                    f"{where}.max_count", low=0, high=RETENTION_COUNT_MAX),
        )


_RULE_FIELDS = frozenset({"max_age_ms", "max_count"})
DEFAULT_RULES = {
    "succeeded": Rule(SUCCEEDED_AGE_MS_DEFAULT, SUCCEEDED_COUNT_DEFAULT),
    "failed": Rule(FAILED_AGE_MS_DEFAULT, FAILED_COUNT_DEFAULT),
    "cancelled": Rule(FAILED_AGE_MS_DEFAULT, FAILED_COUNT_DEFAULT),
}


@dataclass(frozen=True, slots=True)
class Retention:
    succeeded: Rule = DEFAULT_RULES["succeeded"]
    failed: Rule = DEFAULT_RULES["failed"]
    cancelled: Rule = DEFAULT_RULES["cancelled"]
    # queue -> outcome -> its rule (only the outcomes the queue overrides), by queue name
    queues: Mapping[str, Mapping[str, Rule]] = field(default_factory=dict)

    def rule(self, outcome: str) -> Rule:
        rule: Rule = getattr(self, outcome)
        return rule

    def overrides(self, outcome: str) -> dict[str, Rule]:
        """The queues counted apart for `outcome`, with their rules, in name order."""
        return {queue: rules[outcome] for queue, rules in self.queues.items() if outcome in rules}

    def rule_of(self, outcome: str, queue: str) -> Rule:
        rules = self.queues.get(queue)
        if rules is not None and outcome in rules:
            return rules[outcome]
        return self.rule(outcome)

    def longest_age_ms(self) -> int:
        """The longest any finished job is kept by age: how long fire keys are remembered,
        so how far back a backfill reaches (never less than the dedupe window of keys)."""
        ages = [self.rule(outcome).max_age_ms for outcome in OUTCOMES]
        ages += [rule.max_age_ms for rules in self.queues.values() for rule in rules.values()]
        return max([limits.KEY_WINDOW_MS_DEFAULT, *ages])

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {outcome: self.rule(outcome).to_wire() for outcome in OUTCOMES}
        wire["queues"] = {
            queue: {outcome: rule.to_wire() for outcome, rule in rules.items()}
            for queue, rules in self.queues.items()
        }
        return wire

    @classmethod
    def parse(cls, data: object, where: str = "retention") -> Retention:
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, _RETENTION_FIELDS, where)
        rules = {
            outcome: Rule.parse(data.get(outcome, {}), f"{where}.{outcome}",
                                DEFAULT_RULES[outcome])
            for outcome in OUTCOMES
        }
        raw_queues = parse.as_mapping(data.get("queues", {}), f"{where}.queues")
        if len(raw_queues) > QUEUE_OVERRIDES_MAX:
            raise Invalid(f"{where}.queues",
                          f"overrides at most {QUEUE_OVERRIDES_MAX} queues, not {len(raw_queues)}")
        queues: dict[str, dict[str, Rule]] = {}
        for name in sorted(raw_queues):  # name order: the same whatever order the client sent
            queue = parse.name(name, f"{where}.queues", chars_max=limits.NAME_CHARS_MAX)
            given = parse.as_mapping(raw_queues[name], f"{where}.queues.{queue}")
            parse.reject_unknown(given, _OUTCOME_FIELDS, f"{where}.queues.{queue}")
            if not given:
                raise Invalid(f"{where}.queues.{queue}",
                              f"must override at least one of {', '.join(OUTCOMES)}")
            queues[queue] = {
                outcome: Rule.parse(given[outcome], f"{where}.queues.{queue}.{outcome}",
                                    rules[outcome])
                for outcome in OUTCOMES
                if outcome in given
            }
        return cls(rules["succeeded"], rules["failed"], rules["cancelled"], queues)


_OUTCOME_FIELDS = frozenset(OUTCOMES)
_RETENTION_FIELDS = frozenset({*OUTCOMES, "queues"})

# The state budget's default, in bytes of the memory model (scheduler/sizes.py). Chosen by
# measurement (docs/operations/size.md, "Sizing the state"): at this budget a default node
# stays under 1.5 GiB of RSS and its snapshot and restart under 5 s.
BUDGET_BYTES_DEFAULT = 512 << 20


@dataclass(frozen=True, slots=True)
class Budget:
    bytes: int = BUDGET_BYTES_DEFAULT

    def to_wire(self) -> dict[str, int]:
        return {"bytes": self.bytes}

    @classmethod
    def parse(cls, data: object, where: str = "budget") -> Budget:
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, _BUDGET_FIELDS, where)
        return cls(parse.integer(data.get("bytes", BUDGET_BYTES_DEFAULT), f"{where}.bytes",
                                 low=BUDGET_BYTES_MIN, high=BUDGET_BYTES_MAX))


_BUDGET_FIELDS = frozenset({"bytes"})

# Archive retention (DESIGN.md §9.2): how long and how much of what left the state each
# member's archive keeps, in the archive's own accounting (scheduler/archiving.py).
ARCHIVE_AGE_MS_DEFAULT = 30 * limits.DAY_MS
ARCHIVE_BYTES_DEFAULT = 10 << 30
ARCHIVE_AGE_MS_MIN = limits.HOUR_MS
ARCHIVE_AGE_MS_MAX = 3_650 * limits.DAY_MS
ARCHIVE_BYTES_MIN = 1 << 20
ARCHIVE_BYTES_MAX = 1 << 46  # 64 TiB


@dataclass(frozen=True, slots=True)
class ArchiveRetention:
    max_age_ms: int = ARCHIVE_AGE_MS_DEFAULT
    max_bytes: int = ARCHIVE_BYTES_DEFAULT

    def to_wire(self) -> dict[str, int]:
        return {"max_age_ms": self.max_age_ms, "max_bytes": self.max_bytes}

    @classmethod
    def parse(cls, data: object, where: str = "archive") -> ArchiveRetention:
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, _ARCHIVE_FIELDS, where)
        return cls(
            max_age_ms=parse.integer(data.get("max_age_ms", ARCHIVE_AGE_MS_DEFAULT),
                                     f"{where}.max_age_ms", low=ARCHIVE_AGE_MS_MIN,
                                     high=ARCHIVE_AGE_MS_MAX),
            max_bytes=parse.integer(data.get("max_bytes", ARCHIVE_BYTES_DEFAULT),
                                    f"{where}.max_bytes", low=ARCHIVE_BYTES_MIN,
                                    high=ARCHIVE_BYTES_MAX),
        )


_ARCHIVE_FIELDS = frozenset({"max_age_ms", "max_bytes"})

# Search attributes (DESIGN.md §9.2): payload paths every member's archive keeps an index on,
# so a search on one needs no time range. Each index is written with every archived row and
# built over the whole archive when declared: a few paths, not many.
SEARCH_ATTRIBUTES_MAX = 16
SEARCH_ATTRIBUTE_CHARS_MAX = 256


@dataclass(frozen=True, slots=True)
class SearchAttributes:
    paths: tuple[str, ...] = ()  # dotted payload paths ("customer.id"), in name order

    def to_wire(self) -> dict[str, list[str]]:
        return {"paths": list(self.paths)}

    @classmethod
    def parse(cls, data: object, where: str = "search_attributes") -> SearchAttributes:
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, _ATTRIBUTE_FIELDS, where)
        given = parse.array(data.get("paths", []), f"{where}.paths",
                            items_max=SEARCH_ATTRIBUTES_MAX)
        paths: set[str] = set()
        for number, raw in enumerate(given):
            field_name = f"{where}.paths[{number}]"
            text = parse.text(raw, field_name, chars_max=SEARCH_ATTRIBUTE_CHARS_MAX)
            if payload_path(text) is None:
                raise Invalid(field_name, f"{text!r} must be a payload path: 1 to "
                              f"{PATH_DEPTH_MAX} names of letters, digits, _ or -, joined by "
                              "dots (e.g. customer.id)")
            if text in paths:
                raise Invalid(field_name, f"{text!r} is given twice")
            paths.add(text)
        return cls(tuple(sorted(paths)))  # name order: the same whatever order was sent


_ATTRIBUTE_FIELDS = frozenset({"paths"})
Section = Retention | Budget | ArchiveRetention | SearchAttributes


@dataclass(frozen=True, slots=True)
class Settings:
    retention: Retention = Retention()
    budget: Budget = Budget()
    archive: ArchiveRetention = ArchiveRetention()
    search_attributes: SearchAttributes = SearchAttributes()

    def to_wire(self) -> dict[str, Any]:
        return {name: getattr(self, name).to_wire() for name in SECTIONS}

    def with_section(self, name: str, value: Section) -> Settings:
        if isinstance(value, Retention):
            return replace(self, retention=value)
        if isinstance(value, Budget):
            return replace(self, budget=value)
        if isinstance(value, ArchiveRetention):
            return replace(self, archive=value)
        return replace(self, search_attributes=value)

    @classmethod
    def parse(cls, data: object, where: str = "settings") -> Settings:
        """Every section, each one optional (its defaults)."""
        data = parse.as_mapping(data, where)
        parse.reject_unknown(data, _SECTION_NAMES, where)
        settings = cls()
        for name in SECTIONS:
            if name in data:
                settings = settings.with_section(name, parse_section(name, data[name],
                                                                     f"{where}.{name}"))
        return settings


SECTIONS = ("retention", "budget", "archive", "search_attributes")
_SECTION_NAMES = frozenset(SECTIONS)


def parse_section(name: str, data: object, where: str | None = None) -> Section:
    if name == "retention":
        return Retention.parse(data, where or name)
    if name == "budget":
        return Budget.parse(data, where or name)
    if name == "archive":
        return ArchiveRetention.parse(data, where or name)
    if name == "search_attributes":
        return SearchAttributes.parse(data, where or name)
    raise Invalid("section", f"must be one of {', '.join(SECTIONS)}, not {name!r}",
                  code="not_found")
