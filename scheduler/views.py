"""Read-only views of the state as the API shows them (DESIGN.md section 4 field names).

Command results are compact (ids, tokens, flags) so the request-dedupe table stays small; the
shell renders them with these functions against the state. They are the queries of the shell's
one read seam, `StateMachine.read(query)`, which runs them under the lock the apply thread
takes: each returns plain data (dicts, lists, ints) that stays valid after the lock is let go,
never a live record. Nothing here changes the state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raftcron.scheduler import calendar, progress, retention, sizes
from raftcron.scheduler import jobs as j
from raftcron.scheduler.frozen import FrozenJob, readable
from raftcron.scheduler.jobs import RUNNING, Attempt, Job
from raftcron.scheduler.queues import claim_budgets
from raftcron.scheduler.recordview import attempt_fields_view, frozen_view
from raftcron.scheduler.schedules import Schedule, next_fire_ms
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.search import JobFilter
from raftcron.scheduler.settings import SECTIONS
from raftcron.scheduler.state import SchedulerState


def job_view(record: Job | FrozenJob, *, history: bool = True) -> dict[str, Any]:
    if isinstance(record, FrozenJob):
        return frozen_view(record, history=history)  # read off its record, not thawed
    job = record
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
        "concurrency": None
        if job.concurrency_key is None
        else {"key": job.concurrency_key, "max": job.concurrency_max},
        "progress": progress.view(job.progress),
        "rate": None if job.rate is None else job.rate.to_wire(),
        "fairness": None if job.fairness is None else job.fairness.to_wire(),
        "traceparent": job.traceparent,
    }
    if history:
        view["history"] = [attempt_view(a) for a in job.history]
    return view


def attempt_view(attempt: Attempt) -> dict[str, Any]:
    return attempt_fields_view(attempt.number, attempt.token, attempt.worker, attempt.node,
                               attempt.start_ms, attempt.end_ms, attempt.outcome, attempt.error)


def claimed_job_view(record: Job | FrozenJob, token: int) -> dict[str, Any]:
    """What a worker needs to run a job it just claimed."""
    job = readable(record)  # finished (and frozen) already, if it was cancelled meanwhile
    view = {
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
    if job.traceparent is not None:  # the worker's run span continues the submitter's trace
        view["traceparent"] = job.traceparent
    return view


def traceparents(state: SchedulerState, job_ids: list[int]) -> dict[int, str]:
    """The traceparent of each of these jobs that has one (a node's spans of their acks)."""
    found = {}
    for job_id in job_ids:
        record = state.table.jobs.get(job_id)
        traceparent = None if record is None else readable(record).traceparent
        if traceparent is not None:
            found[job_id] = traceparent
    return found


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
        "misfires_state_full": schedule.misfires_state_full,
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


def queues_with_work(state: SchedulerState, queues: tuple[str, ...]) -> list[str]:
    """The queues among `queues` that a claim would hand a job out of now (a job in line, and
    the queue's limits leave room), in the order given: a long-polling claim waits while a
    paused, full or rate-limited queue has jobs, rather than propose claims that get none."""
    ready = state.table.ready
    budgets = claim_budgets(state.queues, state.table, queues, state.now_ms)
    return [q for q in queues if len(ready.get(q) or ()) and budgets.get(q) != 0]


def queue_stats(state: SchedulerState) -> dict[str, dict[str, int]]:
    """Per queue: queued (in line or held for a concurrency key) and running."""
    table = state.table
    names = set(table.running_by_queue) | set(table.held_by_queue)
    names.update(table.rates.held_by_queue)
    names.update(name for name, ready in table.ready.items() if len(ready))
    return {
        name: {
            "queued": len(table.ready.get(name) or ()) + table.held_by_queue.get(name, 0)
            + table.rates.held_by_queue.get(name, 0),
            "running": table.running_by_queue.get(name, 0),
        }
        for name in sorted(names)
    }


# --- Queries for the read seam: each takes the state first and returns plain data. ---


def summary(state: SchedulerState) -> dict[str, Any]:
    """The few numbers `/v1/cluster` shows about the replicated state."""
    return {
        "now_ms": state.now_ms,
        "jobs": len(state.table),
        "schedules": len(state.schedules),
        "fence": state.fence,
        "leader": None if state.leader is None else list(state.leader),
        "level": state.level,
        "finalized": state.finalized,
        "state_bytes": state.state_bytes(),
        "budget_bytes": state.settings.budget.bytes if state.finalized else None,
    }


def usage(state: SchedulerState) -> dict[str, Any]:
    """The state against its budget (DESIGN.md §9.1): what fills it, finished jobs kept by
    outcome, evictions by reason, fires refused for space."""
    table = state.table
    return {
        "state_bytes": state.state_bytes(),
        "budget_bytes": state.settings.budget.bytes if state.finalized else None,
        "parts": retention.parts(state),
        "bytes_by_queue": dict(sorted(table.bytes_by_queue.items())),
        "kept": {status: table.count_by_status[status] for status in sorted(j.FINAL)},
        "evicted": {reason: state.counters.get("evicted", {}).get(reason, 0)
                    for reason in ("age", "count", "budget")},
        "fires_refused": sum(s.misfires_state_full for s in state.schedules.values()),
        "retention_pending": state.retention_pending,
        # Archive retention's accounting (scheduler/archiving.py): what every member's archive
        # keeps, in the memory model's bytes, and the first sequence number kept.
        "archive": {"bytes": state.archive_ledger.bytes, "floor": state.archive_ledger.floor,
                    "next_seq": state.archive_ledger.next_seq},
    }


def settings_view(state: SchedulerState) -> dict[str, Any]:
    """`GET /v1/settings`: every setting, and whether they are in effect (the upgrade gate)."""
    view: dict[str, Any] = {"finalized": state.finalized, "level": state.level}
    if state.finalized:
        view.update(state.settings.to_wire())
    else:
        view.update(dict.fromkeys(SECTIONS))
    view["usage"] = usage(state)
    return view


def find_job(state: SchedulerState, job_id: int, *, history: bool = True) -> dict[str, Any] | None:
    """One job (with its attempt history unless told otherwise), or None."""
    job = state.table.get(job_id)
    return None if job is None else job_view(job, history=history)


def created_jobs(
    state: SchedulerState, items: list[list[Any]], notes: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """[id, created] pairs from a submit result -> job views (an id gone since: just the id),
    with what `unique` and `debounce` did (scheduler/uniqueness.py): `replaced_job_id` on a job
    that replaced another, `debounced` on one a debounce moved."""
    notes = notes or {}
    replaced = {index: old_id for index, old_id in notes.get("replaced", ())}
    debounced = set(notes.get("debounced", ()))
    out = []
    for index, (job_id, created) in enumerate(items):
        job = state.table.get(job_id)
        view = job_view(job, history=False) if job is not None else {"id": job_id}
        view["created"] = created
        if index in replaced:
            view["replaced_job_id"] = replaced[index]
        if index in debounced:
            view["debounced"] = True
        out.append(view)
    return out


def fired_jobs(state: SchedulerState, fires: list[list[Any]]) -> list[dict[str, Any]]:
    """[fire_time_ms, job id or None, created] triples from a backfill -> job views."""
    out = []
    for fire_time_ms, job_id, created in fires:
        found = None if job_id is None else state.table.get(job_id)
        view = {"id": job_id} if found is None else job_view(found, history=False)
        out.append({**view, "fire_time_ms": fire_time_ms, "created": created})
    return out


SEARCH_SCAN_MAX = 5_000  # jobs one search read examines in the state (under the apply lock)


def search_jobs(
    state: SchedulerState,
    query: JobFilter,
    *,
    before_id: int | None,
    limit: int,
    extra: Iterable[Job | FrozenJob] = (),
    in_state: bool = True,
    scan_max: int = SEARCH_SCAN_MAX,
    bytes_max: int | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """The state's jobs (and `extra`'s: the archive's hand-over) that `query` matches, newest
    first, below `before_id`, as views (their history only when the worker is asked for); and
    the floor: every job with an id from the floor up to `before_id` was examined (0: all
    were). At most `limit` found, and past `bytes_max` of them (their size in the memory
    model, `sizes.job_bytes`: payloads and results are most of it) no more: a page of large
    jobs ends early, never empty; at most `scan_max` examined: a search never holds the apply
    lock long; the next read goes on below the floor. `extra`'s jobs have left the state:
    their views say `"archived": true`. `in_state` False: only `extra`'s."""
    table = state.table
    if not in_state:
        candidates: Iterable[int] = ()
    elif query.status is not None and query.status in table.by_status:
        candidates = sorted(table.by_status[query.status], reverse=True)
    else:
        candidates = reversed(table.jobs)
    bytes_cap = 2**63 if bytes_max is None else bytes_max
    found: list[tuple[dict[str, Any], int]] = []
    floor = 0
    scanned = 0
    weight = 0
    for job_id in candidates:
        if before_id is not None and job_id >= before_id:
            continue
        if scanned == scan_max or len(found) == limit or weight >= bytes_cap:
            floor = job_id + 1
            break
        scanned += 1
        job = table.jobs[job_id]
        view = _searched(job, query)
        if view is not None:
            found.append((view, size := sizes.job_bytes(job)))
            weight += size
    for job in extra:
        if floor <= job.id and (before_id is None or job.id < before_id):
            view = _searched(job, query)
            if view is not None:
                found.append((view | {"archived": True}, sizes.job_bytes(job)))
    found.sort(key=lambda item: -int(item[0]["id"]))
    # The hand-over's jobs may take the page past its bounds: cut it there, and the floor
    # rises to the last job kept (every one from it up to `before_id` is on the page).
    kept: list[dict[str, Any]] = []
    weight = 0
    for view, size in found:
        if len(kept) == limit or weight >= bytes_cap:
            floor = max(floor, int(kept[-1]["id"]))
            break
        kept.append(view)
        weight += size
    return kept, floor


def _searched(job: Job | FrozenJob, query: JobFilter) -> dict[str, Any] | None:
    """The job's view if it matches; the fields a frozen job keeps outside its record are
    tested first, so most jobs a search passes over are never decoded."""
    if query.status is not None and job.status != query.status:
        return None
    if query.queue is not None and job.queue != query.queue:
        return None
    if query.schedule is not None and job.schedule != query.schedule:
        return None
    # The attempts only when the worker is asked for (its last attempt's): a list leaves them out.
    view = job_view(job, history=query.worker is not None)
    return view if query.matches(view) else None


def claimed_jobs(state: SchedulerState, claimed: list[list[int]]) -> list[dict[str, Any]]:
    """[id, token] pairs a claim leased -> what the worker runs; a job whose lease has passed
    to another token since (a replayed claim) is left out, so no two workers hold it."""
    table = state.table
    return [
        claimed_job_view(table.jobs[job_id], token)
        for job_id, token in claimed
        if _still_leased(table.jobs.get(job_id), token)
    ]


def _still_leased(job: Job | FrozenJob | None, token: int) -> bool:
    # A finished (frozen) job holds no lease: checked first, so its record is not decoded.
    return isinstance(job, Job) and job.status == RUNNING and job.token == token


def answered(state: SchedulerState, request_id: str) -> bool:
    """Whether a command under request_id has been applied (its result is remembered)."""
    return request_id in state.requests.results


def find_schedule(state: SchedulerState, name: str) -> dict[str, Any] | None:
    schedule = state.schedules.get(name)
    return None if schedule is None else schedule_view(state, schedule)


def all_schedules(state: SchedulerState) -> list[dict[str, Any]]:
    """Every schedule's view, by name."""
    return [schedule_view(state, state.schedules[name]) for name in sorted(state.schedules)]


def schedule_spec(state: SchedulerState, name: str) -> ScheduleSpec | None:
    """A schedule's spec (immutable: safe to use after the lock is let go), or None."""
    schedule = state.schedules.get(name)
    return None if schedule is None else schedule.spec


def events_page(
    state: SchedulerState, *, cursor: int, limit: int, tail: int | None
) -> dict[str, Any]:
    """Events after `cursor` (or the newest `tail` of them), with the cursor to go on from."""
    last = state.events.last_seq
    if tail is not None:  # the newest `tail` events, for a page that just opened
        cursor, limit = max(0, last - tail), tail
    events = [
        {"seq": seq, "time_ms": at_ms, "kind": kind, **fields}
        for seq, at_ms, kind, fields in state.events.since(cursor, limit)
    ]
    next_cursor = events[-1]["seq"] if events else min(cursor, last)
    return {"events": events, "next_cursor": next_cursor}


def now_ms(state: SchedulerState) -> int:
    return state.now_ms


def next_due_ms(state: SchedulerState) -> int | None:
    return state.next_due_ms()
