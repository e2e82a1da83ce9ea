"""The upgrade gate (DESIGN.md §9.0): behaviour that changes what commands do is off until the
cluster is finalized, so a node of this release beside one of the previous release reaches the
same state, and an old log entry keeps its old meaning on replay.

`state.level` starts at `LEVEL_BEFORE` (what the previous release does) and only a committed
`Finalize` raises it, for good. The shell proposes `Finalize` only when every member reports
this release (`POST /v1/cluster/finalize`; a new cluster's first leader before its first
Tick), because a node that does not know the command answers "unknown tag" and changes
nothing. From then on the snapshot is of version 4 (compact job records, a `settings`
section), which older releases refuse to load, naming the version: they can no longer join.
`Finalize` also seeds the settings (retention, budget) from the config of the node that
proposed it, once: a second one changes nothing.

`PutSettings` changes one section of the settings; it is refused (`not_finalized`) before the
gate opens, by this release as the previous one would (it does not know the tag).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from raftcron.scheduler import limits, parse
from raftcron.scheduler.errors import Ok, Rejected, Result
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.settings import SECTIONS, Section, Settings, parse_section
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.store import JobTable

LEVEL_BEFORE = 2  # the previous release (wave 2): retention is 7 days, nothing is refused
LEVEL_BOUNDED = 3  # wave 3: retention and budget settings, eviction, refusals for space
RELEASE_LEVEL = LEVEL_BOUNDED  # the highest level this release implements
DEFAULT_SETTINGS = Settings()


def _request_id(data: Mapping[str, Any]) -> str | None:
    return parse.optional_text(data.get("request_id"), "request_id", chars_max=limits.KEY_CHARS_MAX)


def refused_before_finalize(command: object) -> Rejected | None:
    """A job's keyed `rate`, `fairness` or `traceparent` (in a submit, a workflow or a
    schedule's template) is a field the previous release does not know: its parse refuses the
    command, and before the gate opens this release refuses it too (DESIGN.md §9.4): both leave
    the state as it was."""
    specs: list[tuple[str, JobSpec]] = []
    jobs, workflow = getattr(command, "jobs", None), getattr(command, "workflow", None)
    spec = getattr(command, "spec", None)
    if isinstance(jobs, tuple):  # SubmitJobs
        specs = [(f"jobs[{i}]", job) for i, job in enumerate(jobs) if isinstance(job, JobSpec)]
    elif isinstance(workflow, WorkflowSpec):  # SubmitWorkflow
        specs = [(f"workflow.jobs[{i}]", node.job) for i, node in enumerate(workflow.nodes)]
    elif isinstance(spec, ScheduleSpec):  # PutSchedule
        if spec.job is not None:
            specs = [("spec.job", spec.job)]
        elif spec.workflow is not None:
            specs = [(f"spec.workflow.jobs[{i}]", node.job)
                     for i, node in enumerate(spec.workflow.nodes)]
    for where, job in specs:
        for name in ("rate", "fairness", "traceparent"):
            if getattr(job, name) is not None:
                return Rejected("not_finalized", f"a job's {name} takes effect once the cluster "
                                "is finalized (raftcron cluster finalize)", f"{where}.{name}")
    return None


@dataclass(frozen=True, slots=True)
class Finalize:
    """Raise the cluster's level to `level` (this release's behaviour, for good); `settings`:
    the proposer's configured settings, taken only by the Finalize that opens the gate."""

    TAG: ClassVar[int] = 50
    request_id: str | None
    level: int = RELEASE_LEVEL
    settings: Settings = DEFAULT_SETTINGS

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"level": self.level, "settings": self.settings.to_wire()}
        return wire if self.request_id is None else {"request_id": self.request_id, **wire}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Finalize:
        level = parse.integer(data.get("level"), "level", low=LEVEL_BOUNDED, high=RELEASE_LEVEL)
        return cls(_request_id(data), level, Settings.parse(data.get("settings", {})))


@dataclass(frozen=True, slots=True)
class PutSettings:
    """Replace one section of the settings (`retention`, `budget`, `archive`,
    `search_attributes`) whole."""

    TAG: ClassVar[int] = 51
    request_id: str | None
    section: str
    value: Section

    def to_wire(self) -> dict[str, Any]:
        wire = {"section": self.section, "value": self.value.to_wire()}
        return wire if self.request_id is None else {"request_id": self.request_id, **wire}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PutSettings:
        section = parse.choice(data.get("section"), "section", SECTIONS)
        return cls(_request_id(data), section, parse_section(section, data.get("value"), "value"))


GATE_COMMANDS: tuple[type[Any], ...] = (Finalize, PutSettings)
GateCommand = Finalize | PutSettings


class GateState(Protocol):
    """What the gate's commands change of the state machine (`state.SchedulerState`)."""

    now_ms: int
    level: int
    settings: Settings
    table: JobTable
    keys_forgotten_ms: int
    retention_pending: bool


def apply(state: GateState, command: GateCommand) -> Result:
    if isinstance(command, Finalize):
        if state.level >= LEVEL_BOUNDED:
            return Ok({"level": state.level, "finalized_now": False})
        state.level = command.level
        state.settings = command.settings
        state.table.compact_records = True
        # What the previous behaviour forgot already: its last cutoff of fire keys.
        state.keys_forgotten_ms = max(0, state.now_ms - limits.RETENTION_MS_DEFAULT)
        state.retention_pending = True  # the new retention applies from the next Tick
        return Ok({"level": state.level, "finalized_now": True})
    if state.level < LEVEL_BOUNDED:
        return Rejected(
            "not_finalized",
            "settings take effect once the cluster is finalized "
            "(raftcron cluster finalize, when every member runs this release)",
        )
    state.settings = state.settings.with_section(command.section, command.value)
    state.retention_pending = True  # applied to what is kept, over the next Ticks
    return Ok({"settings": state.settings.to_wire()})
