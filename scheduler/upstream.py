"""Results along the DAG (DESIGN.md §9.4): what a workflow job's handler reads of its parents
(`ctx.upstream`), and the shelter that keeps those parents in the state until their workflow
ends.

The shelter is replicated behaviour, on once the cluster is finalized (scheduler/gate.py). A
finished job of a workflow that still has unfinished jobs is *sheltered*: retention's rules
(age, count) and a schedule's `retain` never evict it, so a child claimed later still finds
its parents' results. When eviction reaches a sheltered job at the front of its FIFO
(scheduler/finished.py), the job is set aside here, by workflow, so it holds back none of the
jobs behind it; when its workflow's last job finishes, the jobs set aside go back in their
places and retention takes them as any other (most are then past their age at once).

The budget is the one bound that wins. When the state is over it and nothing else finished is
left, sheltered jobs go too, oldest first, as the budget's last resort: they leave for the
archive, where a worker's on-demand read of a parent (GET /v1/jobs/{id}) still finds them. So
a workflow that never ends (a child in a paused queue, a far `run_at`) holds its finished jobs
past their retention, at most WORKFLOW_JOBS_MAX of them, but never the state past its budget.

The set-aside lists are an index, not state: a replica restored from a snapshot has every
sheltered job back in its FIFO and sets it aside when eviction reaches it. That changes no
decision (setting aside is not eviction work: the per-Tick bound counts evictions only, and a
sheltered front is set aside before that bound is looked at), so it evicts exactly the jobs a
replica that never stopped evicts.

The claim's view is a read (the shell builds it after the claim's apply, as the rest of a
claimed job): `attach` adds `upstream` to each claimed workflow job with parents, `{name:
{"job_id", "delivered", "result"}}`. Results are delivered in claim order, and parents in
their `after` order, while their stored sizes sum to at most UPSTREAM_CLAIM_BYTES_MAX; from the
first that would pass it on, a parent says `"delivered": false` (no `result`) and the worker
reads it on demand.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, Protocol

from raftcron.scheduler import jobs as j
from raftcron.scheduler import limits
from raftcron.scheduler.frozen import FrozenJob, readable
from raftcron.scheduler.jobs import Job, Workflow
from raftcron.scheduler.store import JobTable

AsideEntry = tuple[int, int, str, str]  # set aside: (finished_ms, id, status, queue)
HEAP_SLACK = 64  # stale entries the oldest-first heap may hold beyond twice the live ones


class Sheltered:
    """Finished jobs eviction reached while their workflow still ran, set aside by workflow."""

    def __init__(self) -> None:
        self.by_workflow: dict[int, list[AsideEntry]] = {}
        self.workflow_of: dict[int, int] = {}  # job id -> its workflow, while set aside
        self._heap: list[AsideEntry] = []  # oldest first: the budget's last resort

    def __len__(self) -> int:
        return len(self.workflow_of)

    def set_aside(self, workflow_id: int, entry: AsideEntry) -> None:
        self.by_workflow.setdefault(workflow_id, []).append(entry)
        self.workflow_of[entry[1]] = workflow_id
        heap = self._heap
        heapq.heappush(heap, entry)
        if len(heap) > 2 * len(self.workflow_of) + HEAP_SLACK:
            # Entries of released workflows leave the heap only when they surface: rebuilt
            # from the lists, it stays bounded (its order is the entries', not its shape's).
            heap[:] = [e for entries in self.by_workflow.values() for e in entries
                       if self.workflow_of.get(e[1]) is not None]
            heapq.heapify(heap)

    def release(self, workflow_id: int) -> list[AsideEntry]:
        """The workflow ended: its entries, to go back in their FIFOs (stale ones included)."""
        entries = self.by_workflow.pop(workflow_id, [])
        for entry in entries:
            if self.workflow_of.get(entry[1]) == workflow_id:
                del self.workflow_of[entry[1]]
        return entries

    def oldest(self, is_valid: Callable[[str, int, int], bool]) -> AsideEntry | None:
        """The oldest entry still set aside and valid (`JobTable.finished_entry_valid`)."""
        heap = self._heap
        while heap:
            finished_ms, job_id, status, _ = heap[0]
            if job_id in self.workflow_of and is_valid(status, finished_ms, job_id):
                return heap[0]
            heapq.heappop(heap)
        return None

    def evicted(self, job_id: int) -> None:
        """The entry `oldest` gave is gone with its job (the workflow's list drops it lazily)."""
        heapq.heappop(self._heap)
        del self.workflow_of[job_id]


class ShelterState(Protocol):
    """What the shelter reads of the state machine (`state.SchedulerState`)."""

    table: JobTable
    workflows: dict[int, Workflow]
    workflow_of: dict[int, int]
    sheltered: Sheltered


def shelter(state: ShelterState, job_id: int) -> int | None:
    """The workflow that shelters a finished job (one with unfinished jobs), or None."""
    workflow_id = state.workflow_of.get(job_id)
    if workflow_id is None:
        return None
    workflow = state.workflows.get(workflow_id)
    return workflow_id if workflow is not None and workflow.unfinished else None


def set_aside(state: ShelterState, place: tuple[int, int], status: str, queue: str) -> bool:
    """If the job at the front of the (status, queue) FIFO is sheltered, take it out of the
    FIFO and set it aside (True); eviction then looks at the next one."""
    workflow_id = shelter(state, place[1])
    if workflow_id is None:
        return False
    state.table.finished.drop_front(status, queue)
    state.sheltered.set_aside(workflow_id, (place[0], place[1], status, queue))
    return True


def job_moved(state: ShelterState, workflow_id: int, by: int) -> None:
    """A job of the workflow finished (-1) or came back (+1, a retry). When none is left
    unfinished, the workflow has ended: its jobs are sheltered no more."""
    workflow = state.workflows.get(workflow_id)
    if workflow is None:
        return
    workflow.unfinished += by
    if not workflow.unfinished and workflow_id in state.sheltered.by_workflow:
        _workflow_ended(state, workflow_id)


def _workflow_ended(state: ShelterState, workflow_id: int) -> None:
    """What was set aside goes back in line, where it was."""
    table = state.table
    for finished_ms, job_id, status, queue in state.sheltered.release(workflow_id):
        if table.finished_entry_valid(status, finished_ms, job_id):
            table.finished.put_back(status, queue, finished_ms, job_id)


# -- the claim's view (a read) ----------------------------------------------------------------


class ClaimReadState(Protocol):
    table: JobTable
    workflows: dict[int, Workflow]
    workflow_of: dict[int, int]


def attach(state: ClaimReadState, claimed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add `upstream` to the claimed jobs' views (`views.claimed_jobs`) that have parents in a
    workflow; the others are left as they are (a worker reads no `upstream` as none)."""
    room = limits.UPSTREAM_CLAIM_BYTES_MAX
    names: dict[int, dict[int, str]] = {}  # workflow id -> job id -> name, built once per claim
    table = state.table
    for view in claimed:
        workflow_id = state.workflow_of.get(view["id"])
        if workflow_id is None:
            continue  # the common claim: one dict lookup per job
        job = table.jobs.get(view["id"])
        workflow = state.workflows.get(workflow_id)
        if job is None or workflow is None:
            continue
        depends_on = readable(job).depends_on
        if not depends_on:
            continue
        named = names.get(workflow_id)
        if named is None:
            named = names[workflow_id] = {job_id: name for name, job_id in workflow.job_ids.items()}
        upstream: dict[str, dict[str, Any]] = {}
        for parent_id in depends_on:
            entry: dict[str, Any] = {"job_id": parent_id, "delivered": False}
            upstream[named.get(parent_id, str(parent_id))] = entry
            parent = table.jobs.get(parent_id) if room > 0 else None
            if parent is None or parent.status != j.SUCCEEDED:
                continue  # evicted for space (the archive has it), or the cap is spent
            result = _result(parent)
            size = 0 if result is None else len(result)
            if size > room:
                room = 0  # from here on, every result is read on demand: bounded work here
                continue
            room -= size
            entry["delivered"] = True
            entry["result"] = j.unpack(result)
        view["upstream"] = upstream
    return claimed


def _result(parent: Job | FrozenJob) -> bytes | None:
    value: bytes | None = readable(parent).result
    return value
