"""What the flow-control modules need of the state machine, written out as a Protocol.

`scheduler.claiming`, `scheduler.uniqueness` and `scheduler.bulk` act on the state but are
called by it (`SchedulerState.apply`), so they import this Protocol rather than
`scheduler.state` (as `scheduler.firing` does with its own): the one arrow stays state ->
them. `state.SchedulerState` is the one implementation, and mypy checks it against this at
every call.
"""

from __future__ import annotations

from typing import Protocol

from raftcron.scheduler.commands import Ack
from raftcron.scheduler.errors import Result
from raftcron.scheduler.frozen import FrozenJob
from raftcron.scheduler.jobs import Job
from raftcron.scheduler.queues import QueueControl
from raftcron.scheduler.settings import Settings
from raftcron.scheduler.specs import JobSpec
from raftcron.scheduler.store import JobTable


class FlowState(Protocol):
    now_ms: int
    fence: int
    next_job_id: int
    table: JobTable
    queues: dict[str, QueueControl]
    settings: Settings

    @property
    def finalized(self) -> bool: ...

    def count(self, name: str, label: str, by: int = 1) -> None: ...

    # Only the arguments these modules pass: the implementation takes more.
    def create_job(self, spec: JobSpec, *, key: str | None) -> Job: ...

    def cancel_job(self, job: Job, reason: str) -> None: ...

    def remove_job(self, job: Job | FrozenJob) -> None: ...

    def retry_job(self, job_id: int) -> Result: ...

    def ack(self, ack: Ack) -> Result: ...
