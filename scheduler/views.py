"""Read-only views of the state as the API shows them (DESIGN.md section 4 field names).

Command results are compact (ids, tokens, flags) so the request-dedupe table stays small; the
shell renders them with these functions against the state, under the same lock the apply
thread takes. Nothing here changes the state.
"""

from __future__ import annotations

from typing import Any

from raftcron.scheduler import calendar
from raftcron.scheduler import jobs as j
from raftcron.scheduler.frozen import FrozenJob, readable
from raftcron.scheduler.jobs import Attempt, Job
from raftcron.scheduler.schedules import Schedule, next_fire_ms
from raftcron.scheduler.state import SchedulerState


def job_view(record: Job | FrozenJob, *, history: bool = True) -> dict[str, Any]:
    job = readable(record)
    view: dict[str, Any] = {
        "id": job.id,
        "key": job.key,
        "task": job.task,
        "queue": job.queue,
        "payload": j.unpack(job.payload),
        "priority": job.priority,
        "status": job.status,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "attempt_limit": job.attempt_limit,  # max_attempts, plus max_attempts per manual retry
        "run_at_ms": job.run_at_ms,
        "timeout_ms": job.timeout_ms,
        "schedule": job.schedule,
        "fire_time_ms": job.fire_time_ms,
        "workflow_id": job.workflow_id,
        "workflow_node": job.workflow_node,
        "depends_on": list(job.depends_on),
        "result": j.unpack(job.result),
        "error": job.error,
        "cancel_reason": job.cancel_reason,
        "created_ms": job.created_ms,
        "finished_ms": job.finished_ms,
        "token": job.token,
        "worker": job.worker if job.status == j.RUNNING else None,
        "lease_until_ms": job.lease_until_ms if job.status == j.RUNNING else None,
    }
    if history:
        view["history"] = [attempt_view(a) for a in job.history]
    return view


def attempt_view(attempt: Attempt) -> dict[str, Any]:
    return {
        "attempt": attempt.number,
        "token": attempt.token,
        "worker": attempt.worker,
        "node": attempt.node,
        "start_ms": attempt.start_ms,
        "end_ms": attempt.end_ms,
        "outcome": attempt.outcome or "running",
        "error": attempt.error,
    }


def claimed_job_view(record: Job | FrozenJob, token: int) -> dict[str, Any]:
    """What a worker needs to run a job it just claimed."""
    job = readable(record)  # finished (and frozen) already, if it was cancelled meanwhile
    return {
        "id": job.id,
        "key": job.key,
        "task": job.task,
        "queue": job.queue,
        "payload": j.unpack(job.payload),
        "attempt": job.attempts,
        "token": token,
        "lease_until_ms": job.lease_until_ms,
        "lease_ms": job.lease_ms,
        "timeout_ms": job.timeout_ms,
        "schedule": job.schedule,
        "fire_time_ms": job.fire_time_ms,
    }


def schedule_view(state: SchedulerState, schedule: Schedule) -> dict[str, Any]:
    spec = schedule.spec
    upcoming = schedule.next_fire_ms
    if schedule.name in state.pending_schedules:
        # Starts at the next Tick; show what it will be from the state's clock.
        upcoming = next_fire_ms(spec, max(schedule.cursor_ms, state.now_ms))
    if schedule.paused:
        upcoming = None
    return {
        "name": schedule.name,
        "spec": spec.to_wire(),
        "paused": schedule.paused,
        "next_fire_ms": upcoming,
        "next_fire_local": None
        if upcoming is None
        else calendar.describe_fire(spec.recurrence, spec.zone, upcoming)[0],
        "cursor_ms": schedule.cursor_ms,
        "fires": schedule.fires,
        "misfires": schedule.misfires,
        "misfire_skipped": schedule.misfire_skipped,
        "misfires_truncated": schedule.misfires_truncated,
        "overlap_skipped": schedule.overlap_skipped,
        "recent_fires": [
            {"fire_time_ms": t, "job_id": job_id} for t, job_id in reversed(schedule.recent_fires)
        ],
        "active_jobs": sorted(schedule.active),
        "buffered_fire_ms": None if schedule.buffered is None else schedule.buffered[0],
        "created_ms": schedule.created_ms,
        "updated_ms": schedule.updated_ms,
    }


def preview(schedule_spec: Any, *, from_ms: int, count: int) -> list[dict[str, Any]]:
    """The next `count` nominal fire times after from_ms, with local time and DST notes."""
    fires = []
    after_ms = from_ms
    for _ in range(count):
        fire_ms = next_fire_ms(schedule_spec, after_ms)
        if fire_ms is None:
            break
        local, note = calendar.describe_fire(schedule_spec.recurrence, schedule_spec.zone, fire_ms)
        fires.append({"fire_time_ms": fire_ms, "local": local, "note": note})
        after_ms = fire_ms
    return fires


def list_jobs(
    state: SchedulerState,
    *,
    status: str | None = None,
    queue: str | None = None,
    schedule: str | None = None,
    limit: int = 100,
    before_id: int | None = None,
    scan_max: int = 200_000,
) -> tuple[list[Job | FrozenJob], int | None]:
    """Jobs newest first, filtered; returns (jobs, cursor for the next page or None)."""
    table = state.table
    if status is not None and status in table.by_status:
        candidates: Any = sorted(table.by_status[status], reverse=True)
    else:
        candidates = reversed(table.jobs)
    found: list[Job | FrozenJob] = []
    scanned = 0
    for job_id in candidates:
        if before_id is not None and job_id >= before_id:
            continue
        scanned += 1
        if scanned > scan_max:
            return found, job_id + 1
        job = table.jobs[job_id]
        if status is not None and job.status != status:
            continue
        if queue is not None and job.queue != queue:
            continue
        if schedule is not None and job.schedule != schedule:
            continue
        found.append(job)
        if len(found) == limit:
            return found, job.id
    return found, None


def queues_with_work(state: SchedulerState, queues: tuple[str, ...]) -> list[str]:
    """The queues among `queues` holding a job ready to claim, in the order given."""
    ready = state.table.ready
    return [queue for queue in queues if len(ready.get(queue) or ())]


def queue_stats(state: SchedulerState) -> dict[str, dict[str, int]]:
    """Per queue: depth (queued now) and running."""
    stats: dict[str, dict[str, int]] = {}
    for name, ready in sorted(state.table.ready.items()):
        stats[name] = {"queued": len(ready), "running": 0}
    for job_id in state.table.by_status[j.RUNNING]:
        queue = state.table.jobs[job_id].queue
        stats.setdefault(queue, {"queued": 0, "running": 0})["running"] += 1
    return stats
