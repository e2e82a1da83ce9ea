"""Snapshot and restore: the whole state as msgpack bytes, and a digest of it.

The snapshot carries records only (jobs, schedules, workflows, tables in their dict order);
every index (ready queues, heaps, status sets) is rebuilt on restore. Two replicas that applied
the same commands produce identical bytes, and `restore(snapshot(s))` continues exactly as `s`
would have: the indexes are only ever consulted in total orders, so how a heap was built never
shows.
"""

from __future__ import annotations

import hashlib
import heapq
from typing import Any

import msgpack

from scheduler import jobs as j
from scheduler.events import EventLog
from scheduler.jobs import Attempt, Job
from scheduler.requests import RequestLog
from scheduler.schedules import schedule_restore, schedule_snapshot
from scheduler.specs import DEFAULT_BACKOFF, BackoffSpec
from scheduler.state import SchedulerState, Workflow

# 2: request-id answers are kept msgpack-packed (scheduler/requests.py). Version 1 snapshots
# (raftcron 0.1, which held the answers themselves) still load; a version-1 node cannot read 2.
SNAPSHOT_VERSION = 2
SNAPSHOT_VERSIONS_READ = (1, 2)


def snapshot(state: SchedulerState) -> bytes:
    data = [
        SNAPSHOT_VERSION,
        state.now_ms,
        state.fence,
        state.next_job_id,
        state.next_workflow_id,
        [_job_to_list(job) for job in state.table.jobs.values()],
        [[key, *entry] for key, entry in state.table.keys.items()],
        [[*schedule_snapshot(s), list(s.active)] for s in state.schedules.values()],
        list(state.pending_schedules),
        [_workflow_to_list(w) for w in state.workflows.values()],
        state.requests.to_list(),
        state.events.to_list(),
        state.counters,
        None if state.leader is None else list(state.leader),
    ]
    packed: bytes = msgpack.packb(data, use_bin_type=True)
    return packed


_SNAPSHOT_FIELDS = 14


def restore(blob: bytes) -> SchedulerState:
    """The state a snapshot holds; ValueError if the blob is not a whole snapshot of ours."""
    try:
        return _restore(blob)
    except msgpack.OutOfData:
        raise ValueError("the snapshot ends early (truncated)") from None
    except msgpack.UnpackException as error:
        raise ValueError(f"the snapshot does not decode: {error}") from None


def _restore(blob: bytes) -> SchedulerState:
    # Streamed: the jobs array is read one job at a time, so a million jobs never exist twice
    # over (as msgpack lists and as Jobs). Unpacking it whole doubled a restoring node's RSS.
    unpacker = msgpack.Unpacker(
        _Chunks(blob), read_size=1 << 20, raw=False, strict_map_key=False,
        max_buffer_size=max(len(blob), 1 << 20),
    )
    if unpacker.read_array_header() != _SNAPSHOT_FIELDS:
        raise ValueError("a snapshot holds 14 fields")
    version = unpacker.unpack()
    if version not in SNAPSHOT_VERSIONS_READ:
        raise ValueError(f"snapshot version {version} is not one of {SNAPSHOT_VERSIONS_READ}")
    state = SchedulerState()
    state.now_ms = unpacker.unpack()
    state.fence = unpacker.unpack()
    state.next_job_id = unpacker.unpack()
    state.next_workflow_id = unpacker.unpack()
    table = state.table
    for _ in range(unpacker.read_array_header()):
        job = _job_from_list(unpacker.unpack())
        table.jobs[job.id] = job
        table.count_by_status[job.status] += 1
    keys, schedules, pending, workflows, requests, event_log, counters, leader = (
        unpacker.unpack() for _ in range(8)
    )
    if unpacker.tell() != len(blob):
        raise ValueError("a snapshot has bytes after its last field")
    # Rebuild the indexes in canonical orders (finish order for retention, creation for keys).
    for job in sorted(table.jobs.values(), key=lambda job: (job.finished_ms or 0, job.id)):
        table._index(job)
    for key, job_id, created_ms, long in keys:
        table.keys[key] = (job_id, created_ms, long)
    for created_ms, key in sorted((entry[1], key) for key, entry in table.keys.items()):
        (table.fire_key_order if table.keys[key][2] else table.key_order).append((created_ms, key))
    for item in schedules:
        schedule = schedule_restore(item[:-1])
        schedule.active.update(dict.fromkeys(item[-1]))
        state.schedules[schedule.name] = schedule
        if schedule.next_fire_ms is not None and not schedule.paused:
            state.schedule_heap.append((schedule.next_fire_ms, schedule.name))
    heapq.heapify(state.schedule_heap)
    state.pending_schedules.update(dict.fromkeys(pending))
    for item in workflows:
        workflow = _workflow_from_list(item)
        state.workflows[workflow.id] = workflow
    state.requests = RequestLog.from_list(requests, packed=version >= 2)
    state.events = EventLog.from_list(event_log)
    state.counters = counters
    state.leader = None if leader is None else (leader[0], leader[1])
    return state


class _Chunks:
    """The blob as a file-like object for msgpack's Unpacker, which then holds one chunk of it
    at a time rather than a copy of all of it."""

    def __init__(self, blob: bytes) -> None:
        self._view = memoryview(blob)
        self._at = 0

    def read(self, size: int) -> bytes:
        chunk = self._view[self._at : self._at + size]
        self._at += len(chunk)
        return bytes(chunk)


def digest(state: SchedulerState) -> str:
    """A short fingerprint of the whole state: equal on replicas that agree."""
    return hashlib.sha256(snapshot(state)).hexdigest()[:32]


def _job_to_list(job: Job) -> list[Any]:
    return [
        job.id,
        job.key,
        job.task,
        job.queue,
        job.payload,
        job.priority,
        job.status,
        job.attempts,
        job.max_attempts,
        job.attempt_limit,
        job.run_at_ms,
        None if job.backoff == DEFAULT_BACKOFF else job.backoff.to_wire(),
        job.timeout_ms,
        job.schedule,
        job.fire_time_ms,
        job.workflow_id,
        job.workflow_node,
        list(job.depends_on),
        job.waiting_on,
        job.children,
        job.result,
        job.error,
        job.created_ms,
        job.finished_ms,
        job.token,
        job.lease_until_ms,
        job.lease_ms,
        job.worker,
        [a.to_list() for a in job.history],
        job.cancel_reason,
    ]


def _job_from_list(item: list[Any]) -> Job:
    (
        job_id,
        key,
        task,
        queue,
        payload,
        priority,
        status,
        attempts,
        max_attempts,
        attempt_limit,
        run_at_ms,
        backoff,
        timeout_ms,
        schedule,
        fire_time_ms,
        workflow_id,
        workflow_node,
        depends_on,
        waiting_on,
        children,
        result,
        error,
        created_ms,
        finished_ms,
        token,
        lease_until_ms,
        lease_ms,
        worker,
        history,
        cancel_reason,
    ) = item
    job = Job(job_id, intern(task), created_ms)
    job.key = key
    job.queue = intern(queue)
    job.payload = payload
    job.priority = priority
    job.status = _STATUS[status]
    job.attempts = attempts
    job.max_attempts = max_attempts
    job.attempt_limit = attempt_limit
    job.run_at_ms = run_at_ms
    job.backoff = DEFAULT_BACKOFF if backoff is None else BackoffSpec.parse(backoff)
    job.timeout_ms = timeout_ms
    job.schedule = None if schedule is None else intern(schedule)
    job.fire_time_ms = fire_time_ms
    job.workflow_id = workflow_id
    job.workflow_node = workflow_node
    job.depends_on = tuple(depends_on)
    job.waiting_on = waiting_on
    job.children = children
    job.result = result
    job.error = error
    job.finished_ms = finished_ms
    job.token = token
    job.lease_until_ms = lease_until_ms
    job.lease_ms = lease_ms
    job.worker = None if worker is None else intern(worker)
    job.history = tuple(_attempt(a) for a in history)
    job.cancel_reason = cancel_reason
    return job


_STATUS = {status: status for status in j.STATUSES}  # also rejects an unknown status (KeyError)


def intern(text: str, _seen: dict[str, str] = {}) -> str:  # noqa: B006 - a deliberate cache
    """One object per distinct name: a million restored jobs share their queue and task strings."""
    if len(_seen) > 100_000:
        _seen.clear()
    return _seen.setdefault(text, text)


def _attempt(data: list[Any]) -> Attempt:
    number, token, worker, node, start_ms, end_ms, outcome, error = data
    return Attempt(
        number,
        token,
        intern(worker),
        None if node is None else intern(node),
        start_ms,
        end_ms,
        None if outcome is None else intern(outcome),
        error,
    )


def _workflow_to_list(workflow: Workflow) -> list[Any]:
    return [
        workflow.id,
        workflow.created_ms,
        workflow.key,
        workflow.schedule,
        workflow.fire_time_ms,
        list(workflow.job_ids.items()),
        workflow.remaining,
    ]


def _workflow_from_list(item: list[Any]) -> Workflow:
    workflow_id, created_ms, key, schedule, fire_time_ms, job_ids, remaining = item
    workflow = Workflow(workflow_id, created_ms)
    workflow.key = key
    workflow.schedule = schedule
    workflow.fire_time_ms = fire_time_ms
    workflow.job_ids = {name: job_id for name, job_id in job_ids}
    workflow.remaining = remaining
    return workflow
