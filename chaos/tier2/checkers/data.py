"""What every checker shares: the recorded run (`RunData`), a checker's verdict
(`CheckResult`, which lists at most `VIOLATIONS_LISTED_MAX` violations) and `FINAL`, the job
statuses that end a job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raftcron.chaos.tier2.history import RecordedEvent

FINAL = frozenset({"succeeded", "failed", "cancelled"})
VIOLATIONS_LISTED_MAX = 50


@dataclass
class RunData:
    history: list[RecordedEvent]
    jobs: dict[str, list[dict[str, Any]]]  # node id -> every job it holds
    schedules: list[dict[str, Any]]
    cluster_events: list[dict[str, Any]]
    digests: dict[str, list[Any]]  # node id -> [log index, digest]
    sink: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    _by_id: dict[int, dict[str, Any]] | None = field(default=None, repr=False)

    def setting(self, name: str, default: Any) -> Any:
        return self.settings.get(name, default)

    def jobs_by_id(self) -> dict[int, dict[str, Any]]:
        """One view per job id (the first node that has it)."""
        if self._by_id is not None:
            return self._by_id
        found: dict[int, dict[str, Any]] = {}
        detailed = sorted(
            self.jobs, key=lambda n: (not any("history" in j for j in self.jobs[n]), n)
        )
        for node in detailed:
            for job in self.jobs[node]:
                found.setdefault(int(job["id"]), job)
        self._by_id = found
        return found

    def faults(self) -> list[tuple[int, int, RecordedEvent]]:
        """(start_ms, end_ms, start event) of every fault; an unended one ends at the last
        event of the history."""
        last_ms = max((e["t"] for e in self.history), default=0)
        ends = {e["id"]: e["t"] for e in self.history if e["kind"] == "fault"
                and e.get("phase") == "end"}
        return [
            (e["t"], ends.get(e["id"], last_ms), e)
            for e in self.history
            if e["kind"] == "fault" and e.get("phase") == "start"
        ]


@dataclass
class CheckResult:
    name: str
    safety: bool  # safety: any violation fails; liveness: bounded
    violations: list[str] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def violate(self, text: str) -> None:
        if len(self.violations) < VIOLATIONS_LISTED_MAX:
            self.violations.append(text)
        elif len(self.violations) == VIOLATIONS_LISTED_MAX:
            self.violations.append("... (more not listed)")
