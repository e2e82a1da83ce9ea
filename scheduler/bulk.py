"""Bulk actions: cancel, retry or delete the jobs matching a filter, bounded per command.

A job matches when every field of the filter matches and the action applies to its status:
`cancel` to unfinished jobs (blocked, scheduled, queued, running), `retry` to failed and
cancelled ones, `delete` to every job that is not running (an unfinished one is cancelled
first; then it leaves the store as retention would remove it; its key stays remembered for its
window). A job that did not succeed is not deleted while a job that depends on it remains:
were the parent gone, a retry of that dependent would run it as if the parent had succeeded.
A delete acts on its matches newest first, so dependents that match go before their parents
in the same command.

One command looks at the job ids after `cursor`, in id order (ids follow creation), at most
`BULK_SCAN_MAX` of them, and acts on at most `max` matches. `next_cursor` is the last id it
looked at and `more` says whether ids remain after it: a client continues with
`cursor = next_cursor` until `more` is false. Each part runs against the state of its moment:
jobs created meanwhile are seen if their ids come after the cursor. When a status is given
and few jobs have it, the status index is walked instead of every id. A dry run is the same
selection read without a command (`select` is pure).

`state_full` (only when some were) counts the retries refused for want of room (the state
budget); they stay as they are. `changed` counts the matched jobs whose status the command
changed, by the action or as the
cascade of an earlier match (a child cancelled as `upstream_failed` with its parent, or revived
with it): a retry refused (a parent of the job is still failed or cancelled) matched but did not
change. Cascades to jobs that did not match are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raftcron.scheduler import jobs as j
from raftcron.scheduler import limits
from raftcron.scheduler.errors import Ok, Rejected, Result
from raftcron.scheduler.flowcommands import BulkJobs
from raftcron.scheduler.flowspecs import BulkFilter
from raftcron.scheduler.flowstate import FlowState
from raftcron.scheduler.frozen import FrozenJob, readable
from raftcron.scheduler.jobs import Job

APPLIES_TO = {
    "cancel": frozenset({j.BLOCKED, j.SCHEDULED, j.QUEUED, j.RUNNING}),
    "retry": frozenset({j.FAILED, j.CANCELLED}),
    "delete": frozenset(s for s in j.STATUSES if s != j.RUNNING),
}
CANCEL_REASON = {"cancel": "cancelled in bulk", "delete": "deleted in bulk"}


@dataclass(frozen=True, slots=True)
class Selection:
    ids: list[int]  # the matching jobs, in id order
    next_cursor: int  # the last id looked at (the cursor given when none was)
    more: bool  # ids remain after next_cursor


def select(
    state: FlowState,
    action: str,
    where: BulkFilter,
    *,
    cursor: int,
    max_jobs: int,
    scan_max: int = limits.BULK_SCAN_MAX,
) -> Selection:
    statuses = APPLIES_TO[action]
    if where.status is not None:
        statuses = statuses & {where.status}
    table = state.table
    last_id = state.next_job_id - 1
    if not statuses or cursor >= last_id or not table.jobs:
        return Selection([], cursor, False)
    index = table.by_status.get(where.status) if where.status is not None else None
    if index is not None and len(index) <= scan_max:
        # Few jobs have the status: walk them (sorting at most scan_max ids).
        candidates = sorted(job_id for job_id in index if job_id > cursor)
        exhausted_at = last_id
    else:
        first_id = max(cursor + 1, next(iter(table.jobs)))
        stop_id = min(last_id, first_id + scan_max - 1)
        candidates = list(range(first_id, stop_id + 1))
        exhausted_at = stop_id
    found: list[int] = []
    looked_at = cursor
    for job_id in candidates:
        looked_at = job_id
        job = table.jobs.get(job_id)
        if job is not None and job.status in statuses and _matches(job, where):
            found.append(job_id)
            if len(found) == max_jobs:
                break
    else:
        looked_at = max(looked_at, exhausted_at)
    return Selection(found, looked_at, looked_at < last_id)


def _matches(job: Job | FrozenJob, where: BulkFilter) -> bool:
    # The fields a frozen job keeps unpacked first: its record is decoded only if they match.
    if where.queue is not None and job.queue != where.queue:
        return False
    if where.schedule is not None and job.schedule != where.schedule:
        return False
    if where.task is None and where.created_from_ms is None and where.created_to_ms is None:
        return True
    record = readable(job)
    if where.task is not None and record.task != where.task:
        return False
    if where.created_from_ms is not None and record.created_ms < where.created_from_ms:
        return False
    return where.created_to_ms is None or record.created_ms < where.created_to_ms


def apply(state: FlowState, command: BulkJobs) -> Result:
    chosen = select(state, command.action, command.filter, cursor=command.cursor,
                    max_jobs=command.max)
    table = state.table
    before = [table.jobs[job_id].status for job_id in chosen.ids]
    refused = 0
    for job_id in reversed(chosen.ids) if command.action == "delete" else chosen.ids:
        refused += _act(state, command.action, job_id)
    changed = 0
    for job_id, status in zip(chosen.ids, before, strict=True):
        job = table.get(job_id)
        changed += job is None or job.status != status
    value = answer(chosen, changed)
    if refused:  # retries refused for want of room (the state budget: DESIGN.md §9.1)
        value["state_full"] = refused
    return Ok(value)


def answer(chosen: Selection, changed: int) -> dict[str, Any]:
    return {"matched": len(chosen.ids), "changed": changed, "more": chosen.more,
            "next_cursor": chosen.next_cursor}


def _act(state: FlowState, action: str, job_id: int) -> bool:
    """Act on one matched job; whether a retry was refused for want of room. An earlier job
    of the same command may have moved it already (a cascade), so its status is read again."""
    job = state.table.get(job_id)
    if job is None or job.status not in APPLIES_TO[action]:
        return False
    if action == "retry":
        # Refused (a parent still failed, or no room): it stays as it is.
        outcome = state.retry_job(job_id)
        return isinstance(outcome, Rejected) and outcome.code == "state_full"
    if action == "delete" and job.status != j.SUCCEEDED and state.table.has_dependents(job):
        return False  # matched, not changed: see the module docstring
    if not job.final:
        live = state.table.live(job_id)
        assert live is not None
        state.cancel_job(live, CANCEL_REASON[action])
        job = live
    if action == "delete":
        state.remove_job(job)
    return False
