"""An in-memory driver of the state machine, for tests and models (procrastinate's habit).

`Driver` applies commands the way a replica does: every command goes through the codec
(encode, decode, apply), so a test exercises exactly what a node would run. Its helpers read as
the API does: `submit`, `claim`, `complete`, `tick` return plain data or raise `Refused` with
the rejection's code.
"""

from __future__ import annotations

import itertools
from typing import Any

from raftcron.scheduler import codec
from raftcron.scheduler.commands import (
    Ack,
    ClaimJobs,
    Command,
    CompleteJob,
    FailJob,
    Heartbeat,
    PutSchedule,
    SubmitJobs,
    Tick,
)
from raftcron.scheduler.errors import Ok, Rejected, Result
from raftcron.scheduler.frozen import readable
from raftcron.scheduler.gate import Finalize, PutSettings
from raftcron.scheduler.jobs import Job
from raftcron.scheduler.progress import ProgressReport
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.settings import Settings, parse_section
from raftcron.scheduler.specs import JobSpec
from raftcron.scheduler.state import SchedulerState


class Refused(Exception):
    def __init__(self, rejected: Rejected) -> None:
        super().__init__(f"{rejected.code}: {rejected.message}")
        self.code = rejected.code
        self.rejected = rejected


class Driver:
    def __init__(
        self, state: SchedulerState | None = None, *, now_ms: int = 1_700_000_000_000
    ) -> None:
        self.state = state if state is not None else SchedulerState()
        self.log: list[bytes] = []  # every command applied, encoded: replayable
        self._ids = itertools.count(1)
        if self.state.now_ms < now_ms:
            self.apply(Tick(now_ms))

    @property
    def now_ms(self) -> int:
        return self.state.now_ms

    def request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def apply(self, command: Command) -> Result:
        data = codec.encode(command)
        self.log.append(data)
        return self.state.apply(codec.decode(data))

    def ok(self, command: Command) -> dict[str, Any]:
        result = self.apply(command)
        if isinstance(result, Rejected):
            raise Refused(result)
        assert isinstance(result, Ok)
        return result.value

    def job(self, job_id: int) -> Job:
        """The job's fields now (a decoded copy if it is finished and frozen)."""
        job = self.state.table.get(job_id)
        assert job is not None, f"no job {job_id}"
        return readable(job)

    # -- conveniences ---------------------------------------------------------------------------

    def submit(self, **fields: Any) -> int:
        fields.setdefault("task", "noop")
        spec = JobSpec.parse(fields)
        return int(self.ok(SubmitJobs(self.request_id(), (spec,)))["jobs"][0][0])

    def submit_many(self, count: int, **fields: Any) -> list[int]:
        fields.setdefault("task", "noop")
        spec = JobSpec.parse(fields)
        value = self.ok(SubmitJobs(self.request_id(), (spec,) * count))
        return [int(item[0]) for item in value["jobs"]]

    def claim(
        self,
        worker: str = "w1",
        *,
        queues: tuple[str, ...] = ("default",),
        max: int = 1,
        lease_ms: int = 30_000,
        acks: tuple[Ack, ...] = (),
    ) -> list[tuple[int, int]]:
        value = self.ok(ClaimJobs(self.request_id(), worker, queues, max, lease_ms, acks))
        return [(int(job_id), int(token)) for job_id, token in value["jobs"]]

    def complete(self, job_id: int, token: int, result: Any = None) -> dict[str, Any]:
        return self.ok(CompleteJob(self.request_id(), job_id, token, result))

    def fail(
        self, job_id: int, token: int, error: str = "boom", *, retryable: bool = True
    ) -> dict[str, Any]:
        return self.ok(FailJob(self.request_id(), job_id, token, error, retryable))

    def heartbeat(
        self, job_id: int, token: int, lease_ms: int | None = None, *, progress: Any = None
    ) -> dict[str, Any]:
        """`progress`: a report as the API takes it ({"value", "message", "data"})."""
        report = None if progress is None else ProgressReport.parse(progress, "progress")
        return self.ok(Heartbeat(self.request_id(), job_id, token, lease_ms, report))

    def tick(self, now_ms: int | None = None, *, advance_ms: int | None = None) -> dict[str, Any]:
        if now_ms is None:
            now_ms = self.now_ms + (advance_ms or 0)
        return self.ok(Tick(now_ms))

    def put_schedule(self, name: str, **fields: Any) -> dict[str, Any]:
        fields.setdefault("job", {"task": "noop"})
        return self.ok(PutSchedule(self.request_id(), name, ScheduleSpec.parse(fields)))

    def finalize(self, **settings: Any) -> dict[str, Any]:
        """Open the upgrade gate (scheduler/gate.py) with these settings (API shapes)."""
        return self.ok(Finalize(self.request_id(), settings=Settings.parse(settings)))

    def put_settings(self, section: str, value: dict[str, Any]) -> dict[str, Any]:
        return self.ok(PutSettings(self.request_id(), section, parse_section(section, value)))
