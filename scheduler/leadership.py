"""A new leader's first entry (`BeginLeadership`): it records who leads in which term and
gives every running job at least a whole lease from then, so a worker whose heartbeats could
not commit while no leader was known does not lose its job for it."""

from __future__ import annotations

from typing import Any, Protocol

from raftcron.scheduler import events
from raftcron.scheduler import jobs as j
from raftcron.scheduler.commands import BeginLeadership
from raftcron.scheduler.errors import Ok, Result
from raftcron.scheduler.jobs import Job
from raftcron.scheduler.store import JobTable


class LeaderState(Protocol):
    now_ms: int
    table: JobTable
    leader: tuple[str, int] | None

    def emit(self, kind: str, *, at_ms: int | None = None, **fields: Any) -> None: ...


def begin(state: LeaderState, command: BeginLeadership) -> Result:
    if state.leader is not None and command.term <= state.leader[1]:
        # A deposed leader's late proposal, forwarded after a newer leader took over.
        return Ok({"ignored": f"term {command.term} is not after term {state.leader[1]}"})
    base_ms = max(state.now_ms, command.now_ms)
    extended = 0
    for job_id in state.table.by_status[j.RUNNING]:
        job = state.table.jobs[job_id]
        assert isinstance(job, Job)  # running: never frozen
        assert job.lease_ms is not None and job.lease_until_ms is not None
        if job.lease_until_ms < base_ms + job.lease_ms:
            job.lease_until_ms = base_ms + job.lease_ms
            extended += 1
    state.leader = (command.node, command.term)
    state.emit(
        events.LEADER_CHANGED,
        at_ms=base_ms,  # the state's clock may not have moved yet (a cluster's first leader)
        node=command.node,
        term=command.term,
        leases_extended=extended,
    )
    return Ok({"extended": extended})
