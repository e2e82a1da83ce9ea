"""What a schedule is: recurrence, zone, bounds, policies and what each fire creates.

`ScheduleSpec.parse` validates a `PUT /v1/schedules/{name}` body (or its wire form) and raises
`Invalid` naming the field. The recurrence arithmetic itself lives in `scheduler.calendar`; the
decision of what to fire at a given time lives in `scheduler.firing`. The original texts of
`cron`/`every`/`at` are kept so that what a user reads back is what they wrote.

`day_rule` (cron only) says how the day fields combine: `crontab` (crontab(5), the default of
`parse`, what the API and the CLI put) or `croniter` (raftcron 0.1's rule). The wire form names
it only for an expression the two rules read differently, and a wire form without it means
`croniter` (`from_wire`): log entries and snapshots written before the rule existed keep the
fire times every replica computed from them, while a common expression (`0 0 * * *`) is the
same command as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

from raftcron.scheduler import calendar, cronexpr, limits, parse
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.specs import JobSpec, WorkflowSpec

T = TypeVar("T")
_RECURRENCE_PREFIX = re.compile(r"^(cron|every|at|tz): ")
EVERY_MS_MIN = 1_000  # fire times are seconds: a faster "every" would only flood the store
MISFIRE_POLICIES = ("fire_once", "fire_all", "skip")
OVERLAP_POLICIES = ("allow", "forbid", "replace", "buffer_one")
_RECURRENCE_FIELDS = ("cron", "every", "at")
_FIELDS = frozenset(
    {
        *_RECURRENCE_FIELDS,
        "tz",
        "start_at",
        "end_at",
        "jitter_ms",
        "paused",
        "misfire",
        "misfire_grace_ms",
        "max_catchup",
        "overlap",
        "job",
        "workflow",
        "retain",
        "description",
        "day_rule",
    }
)
MISFIRE_GRACE_MS_MIN = (
    1_000  # fires are committed up to one tick late: a smaller grace misfires all
)


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    kind: str  # "cron" | "every" | "at"
    text: str | int  # the recurrence as the user wrote it
    recurrence: calendar.Recurrence
    tz: str = "UTC"
    start_at_ms: int | None = None
    end_at_ms: int | None = None
    jitter_ms: int = 0
    paused: bool = False
    misfire: str = "fire_once"
    misfire_grace_ms: int = limits.MISFIRE_GRACE_MS_DEFAULT
    max_catchup: int = limits.MAX_CATCHUP_DEFAULT
    overlap: str = "allow"
    job: JobSpec | None = None
    workflow: WorkflowSpec | None = None
    retain: int = limits.SCHEDULE_RETAIN_DEFAULT
    description: str | None = None

    @property
    def day_rule(self) -> str | None:
        """How a cron's day fields combine (None for every and at)."""
        return self.recurrence.day_rule if isinstance(self.recurrence, calendar.Cron) else None

    @classmethod
    def from_wire(cls, data: object) -> ScheduleSpec:
        """A spec as a command or a snapshot carries it: no `day_rule` means raftcron 0.1's."""
        return cls.parse(data, day_rule_absent=cronexpr.CRONITER)

    @property
    def zone(self) -> ZoneInfo:
        return calendar.load_zone(self.tz)

    @classmethod
    def parse(cls, data: object, *, day_rule_absent: str = cronexpr.CRONTAB) -> ScheduleSpec:
        """A schedule from a user's body (`day_rule` absent: crontab(5)'s)."""
        data = parse.as_mapping(data, "schedule")
        parse.reject_unknown(data, _FIELDS)
        given = [name for name in _RECURRENCE_FIELDS if data.get(name) is not None]
        if len(given) != 1:
            raise Invalid(
                "cron",
                "give exactly one of cron, every or at"
                + (f" (got {', '.join(given)})" if given else ""),
            )
        kind = given[0]
        tz_name = parse.text(data.get("tz", "UTC"), "tz", chars_max=64)
        zone = _call(lambda: calendar.load_zone(tz_name), "tz")
        start_at_ms = _instant(data.get("start_at"), "start_at", zone)
        end_at_ms = _instant(data.get("end_at"), "end_at", zone)
        if start_at_ms is not None and end_at_ms is not None and end_at_ms <= start_at_ms:
            raise Invalid("end_at", "must be after start_at")
        text = data[kind]
        if isinstance(text, bool) or not isinstance(text, str | int):
            raise Invalid(kind, f"must be a string, not {parse.type_name(text)}")
        if isinstance(text, str) and len(text) > 256:
            raise Invalid(kind, "must be at most 256 characters")
        day_rule = data.get("day_rule")
        if day_rule is not None and kind != "cron":
            raise Invalid("day_rule", "applies to cron schedules only")
        day_rule = parse.choice(
            day_rule_absent if day_rule is None else day_rule, "day_rule", cronexpr.DAY_RULES
        )
        recurrence = _recurrence(kind, text, zone, start_at_ms, day_rule)
        job_data, workflow_data = data.get("job"), data.get("workflow")
        if (job_data is None) == (workflow_data is None):
            raise Invalid("job", "give exactly one of job or workflow")
        return cls(
            kind=kind,
            text=text,
            recurrence=recurrence,
            tz=tz_name,
            start_at_ms=start_at_ms,
            end_at_ms=end_at_ms,
            jitter_ms=parse.integer(
                data.get("jitter_ms", 0), "jitter_ms", low=0, high=limits.JITTER_MS_MAX
            ),
            paused=parse.boolean(data.get("paused", False), "paused"),
            misfire=parse.choice(data.get("misfire", "fire_once"), "misfire", MISFIRE_POLICIES),
            misfire_grace_ms=parse.integer(
                data.get("misfire_grace_ms", limits.MISFIRE_GRACE_MS_DEFAULT),
                "misfire_grace_ms",
                low=MISFIRE_GRACE_MS_MIN,
                high=limits.RETENTION_MS_DEFAULT,
            ),
            max_catchup=parse.integer(
                data.get("max_catchup", limits.MAX_CATCHUP_DEFAULT),
                "max_catchup",
                low=1,
                high=limits.MAX_CATCHUP_MAX,
            ),
            overlap=parse.choice(data.get("overlap", "allow"), "overlap", OVERLAP_POLICIES),
            job=None if job_data is None else JobSpec.parse(job_data, "job", template=True),
            workflow=(
                None
                if workflow_data is None
                else WorkflowSpec.parse(workflow_data, "workflow", template=True)
            ),
            retain=parse.integer(
                data.get("retain", limits.SCHEDULE_RETAIN_DEFAULT),
                "retain",
                low=1,
                high=limits.SCHEDULE_RETAIN_MAX,
            ),
            description=parse.optional_text(
                data.get("description"), "description", chars_max=1_000
            ),
        )

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {self.kind: self.text}
        defaults = _DEFAULTS
        for name in (
            "tz",
            "jitter_ms",
            "paused",
            "misfire",
            "misfire_grace_ms",
            "max_catchup",
            "overlap",
            "retain",
            "description",
        ):
            if getattr(self, name) != getattr(defaults, name):
                wire[name] = getattr(self, name)
        if isinstance(self.recurrence, calendar.Cron) and cronexpr.day_rules_differ(
            self.recurrence.expr
        ):
            wire["day_rule"] = self.recurrence.day_rule
        if self.start_at_ms is not None:
            wire["start_at"] = self.start_at_ms
        if self.end_at_ms is not None:
            wire["end_at"] = self.end_at_ms
        if self.job is not None:
            wire["job"] = self.job.to_wire()
        if self.workflow is not None:
            wire["workflow"] = self.workflow.to_wire()
        return wire

    def same_timing(self, other: ScheduleSpec) -> bool:
        """True when both specs produce the same fire times (a replace keeps the fire cursor)."""
        return (self.recurrence, self.tz, self.start_at_ms, self.end_at_ms) == (
            other.recurrence,
            other.tz,
            other.start_at_ms,
            other.end_at_ms,
        )


_DEFAULTS = ScheduleSpec(
    kind="every", text=1000, recurrence=calendar.Every(interval_ms=1000, anchor_ms=0)
)


def _recurrence(
    kind: str, text: str | int, zone: ZoneInfo, start_at_ms: int | None, day_rule: str
) -> calendar.Recurrence:
    if kind == "cron":
        if not isinstance(text, str):
            raise Invalid("cron", "must be a string such as '0 0 * * *'")
        return _call(lambda: calendar.parse_cron(text, day_rule), "cron")
    if kind == "every":
        anchor = start_at_ms if start_at_ms is not None else 0
        every = _call(lambda: calendar.parse_every(text, anchor_ms=anchor), "every")
        if every.interval_ms < EVERY_MS_MIN:
            raise Invalid("every", f"{text!r} is shorter than the minimum interval of 1s")
        return every
    at = _call(lambda: calendar.parse_at(text, zone), "at")
    if at.at_ms > limits.TIME_MS_MAX:
        raise Invalid("at", "must be before 2200-01-01")
    return at


def _instant(value: object, field: str, zone: ZoneInfo) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise Invalid(
            field,
            f"must be an ISO-8601 date-time or Unix milliseconds, not {parse.type_name(value)}",
        )
    at = _call(lambda: calendar.parse_at(value, zone), field)
    if at.at_ms > limits.TIME_MS_MAX:
        raise Invalid(field, "must be before 2200-01-01")
    return at.at_ms


def _call(action: Callable[[], T], field: str) -> T:
    try:
        result = action()
    except calendar.RecurrenceError as error:
        # The calendar names its own field ("cron: ..."); Invalid names ours, once.
        raise Invalid(field, _RECURRENCE_PREFIX.sub("", str(error), count=1)) from None
    return result
