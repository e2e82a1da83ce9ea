"""Workflows (DAGs of jobs submitted together, or fired by one schedule time): creating them.

A workflow's jobs are created in one command, in the order the spec lists them (checked
acyclic by the spec's parser); each knows its parents (`depends_on`), each parent its children,
and roots are runnable at once. The workflow's key goes on its first job, so the key table
finds the workflow (a second submit with the key answers the first workflow). A workflow
record lives until the last of its jobs is removed (`SchedulerState.remove_job`).

Called by the state machine (`SchedulerState.apply`, `firing`), on the state through the
`WorkflowState` protocol, so the one arrow stays state -> here.
"""

from __future__ import annotations

from typing import Any, Protocol

from raftcron.scheduler import retention, sizes
from raftcron.scheduler.errors import Ok, Rejected, Result
from raftcron.scheduler.jobs import Job, Workflow
from raftcron.scheduler.requests import answer_bytes
from raftcron.scheduler.settings import Settings
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.store import JobTable


class WorkflowState(retention.BudgetState, Protocol):
    now_ms: int
    next_workflow_id: int
    next_job_id: int
    table: JobTable
    workflows: dict[int, Workflow]
    workflows_bytes: int
    settings: Settings

    @property
    def finalized(self) -> bool: ...

    def state_bytes(self) -> int: ...

    def count(self, name: str, label: str, by: int = 1) -> None: ...

    def remove_job(self, job: Any) -> None: ...

    # Only the arguments passed here: the implementation takes more.
    def create_job(
        self,
        spec: JobSpec,
        *,
        key: str | None,
        schedule: str | None,
        fire_time_ms: int | None,
        run_at_ms: int | None,
        workflow: Workflow | None,
        node_name: str | None,
        blocked_on: int,
    ) -> Job: ...


def submit(state: WorkflowState, spec: WorkflowSpec, request_id: str | None) -> Result:
    if spec.key is not None:
        existing = state.table.job_for_key(spec.key)
        if existing is not None and existing.workflow_id is not None:
            return Ok(_answer(state.workflows[existing.workflow_id], created=False))
        if existing is None and state.finalized and state.table.remembers_key(spec.key):
            # Its first job was evicted (finished) while the key is still remembered: first
            # wins, so the workflow still holding it answers, and none is created again.
            for workflow in state.workflows.values():
                if workflow.key == spec.key:
                    return Ok(_answer(workflow, created=False))
            return Rejected(
                "conflict",
                f"key {spec.key!r} was taken by a workflow that finished and left the state "
                "(retention); the key stays taken for its dedupe window",
                "key",
            )
    if state.finalized:
        names = sum(len(node.name) for node in spec.nodes)
        need_bytes = sizes.new_workflow_bytes(spec, spec.key)
        refused = retention.check_room(
            state, need_bytes + answer_bytes(request_id, len(spec.nodes), names))
        if refused is not None:
            return refused
    workflow = create(state, spec, key=spec.key)
    return Ok(_answer(workflow, created=True))


def _answer(workflow: Workflow, *, created: bool) -> dict[str, Any]:
    jobs = [[name, job_id] for name, job_id in workflow.job_ids.items()]
    return {"workflow_id": workflow.id, "jobs": jobs, "created": created}


def create(
    state: WorkflowState,
    spec: WorkflowSpec,
    *,
    key: str | None,
    schedule: str | None = None,
    fire_time_ms: int | None = None,
    run_at_ms: int | None = None,
) -> Workflow:
    """Create every job of a DAG (already checked acyclic); roots are runnable at once."""
    workflow = Workflow(state.next_workflow_id, state.now_ms)
    state.next_workflow_id += 1
    workflow.key = key
    workflow.schedule = schedule
    workflow.fire_time_ms = fire_time_ms
    state.workflows[workflow.id] = workflow
    state.workflows_bytes += record_bytes(len(spec.nodes))
    first_id = state.next_job_id
    ids = {node.name: first_id + index for index, node in enumerate(spec.nodes)}
    for index, node in enumerate(spec.nodes):
        # The workflow's key goes on its first job, so the key table finds the workflow.
        job = state.create_job(
            node.job,
            key=key if index == 0 else None,
            schedule=schedule,
            fire_time_ms=fire_time_ms,
            run_at_ms=run_at_ms
            if node.job.run_at_ms is None and node.job.delay_ms is None
            else None,
            workflow=workflow,
            node_name=node.name,
            blocked_on=len(node.after),
        )
        job.depends_on = tuple(ids[parent] for parent in node.after)
        workflow.job_ids[node.name] = job.id
    for node in spec.nodes:
        for parent in node.after:
            parent_job = state.table.live(ids[parent])
            assert parent_job is not None  # created above, in this command
            parent_job.add_child(ids[node.name])
    return workflow


def record_bytes(nodes: int) -> int:
    """A workflow's record in the memory model (scheduler/sizes.py)."""
    return sizes.WORKFLOW_BYTES + sizes.WORKFLOW_NODE_BYTES * nodes
