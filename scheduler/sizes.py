"""The memory model: what each record of the state counts toward the state budget.

The budget (DESIGN.md §9.1) is decided by the core, so the size of the state must be a pure
function of its content that every replica computes alike, whatever Python's allocator does:
a fixed overhead per record plus the bytes it carries (payload, result, error texts, keys,
attempts). The overheads are measured (CPython 3.11, 2-core dev machine): a queued `Job` with
its dict slot and index entries costs ~630 bytes (tracemalloc, 100,000 jobs of a tiny
payload); a finished one (`FrozenJob`, the bytes object of its packed record, the table's
slot, its retention entry, its id) ~360 bytes besides its record (a state filled with 1.39 M
finished jobs of 122-byte records held 710 MiB of RSS); a key entry (the table's slot, the
order entry, the tuple) ~220 bytes besides the key. The model is close to, not exactly, what
the process holds; docs/operations/size.md ("Sizing the state") says how the budget relates to RSS.

A live job changes size where its status changes too (a claim adds an attempt, an ack a
result or an error, a debounce a payload), and `JobTable.set_status` counts it again there,
or by a progress report, after which `JobTable.recount` does (scheduler/progress.py); a
finished job is counted from its packed record, which is a pure function of its fields, so a
replica that froze a job and one that restored it count the same.
"""

from __future__ import annotations

from raftcron.scheduler.frozen import FrozenJob
from raftcron.scheduler.jobs import Job
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.specs import WorkflowSpec

JOB_BYTES = 600  # a live job's record, its slot in the table and its index entries
ATTEMPT_BYTES = 120  # an Attempt and its slot in the history tuple
FROZEN_JOB_BYTES = 360  # a finished job besides its packed record
KEY_BYTES = 220  # an idempotency or fire key's entry besides the key's text
SCHEDULE_BYTES = 1_000  # a schedule's record besides its spec's encoded size
WORKFLOW_BYTES = 300  # a workflow's record besides its nodes' names
WORKFLOW_NODE_BYTES = 100  # a node's entry in the workflow's name table
EVENT_BYTES = 300  # an entry of the event log (its fields are a few small values)
TOMBSTONE_BYTES = 100  # a purged id kept so no fill writes it again (scheduler/archiving.py)
PROGRESS_BYTES = 40  # a live job's progress record (a bytes object: 33) besides its bytes


def live_job_bytes(job: Job) -> int:
    # Runs two or three times per job (JobTable.set_status): locals, one pass.
    payload, result, error, key, history = job.payload, job.result, job.error, job.key, job.history
    size = JOB_BYTES
    if payload is not None:
        size += len(payload)
    if result is not None:
        size += len(result)
    if error is not None:
        size += len(error)
    if key is not None:
        size += len(key)
    if history:
        size += ATTEMPT_BYTES * len(history)
        for attempt in history:
            if attempt.error is not None:
                size += len(attempt.error)
    progress = job.progress
    if progress is not None:
        size += PROGRESS_BYTES + len(progress)
    if job.traceparent is not None:
        size += len(job.traceparent)
    return size


def frozen_job_bytes(job: FrozenJob) -> int:
    return FROZEN_JOB_BYTES + len(job._packed)


def job_bytes(job: Job | FrozenJob) -> int:
    return frozen_job_bytes(job) if isinstance(job, FrozenJob) else live_job_bytes(job)


def key_bytes(key: str) -> int:
    return KEY_BYTES + len(key)


def new_job_bytes(payload: bytes | None, key: str | None, traceparent: str | None = None) -> int:
    """What a job about to be created will count (its key entry included)."""
    size = JOB_BYTES + (0 if payload is None else len(payload))
    if traceparent is not None:
        size += len(traceparent)
    if key is not None:
        size += len(key) + key_bytes(key)
    return size


def new_workflow_bytes(spec: WorkflowSpec, key: str | None) -> int:
    """What a workflow about to be created will count: its jobs (the first one takes the
    workflow's key) and its own record."""
    size = WORKFLOW_BYTES + WORKFLOW_NODE_BYTES * len(spec.nodes)
    for index, node in enumerate(spec.nodes):
        size += new_job_bytes(node.job.packed_payload(), key if index == 0 else None,
                              node.job.traceparent)
    return size


def fire_bytes(spec: ScheduleSpec, key: str) -> int:
    """What one fire of a schedule will count: its job or workflow, and the event it emits."""
    if spec.workflow is not None:
        return new_workflow_bytes(spec.workflow, key) + EVENT_BYTES
    assert spec.job is not None
    return new_job_bytes(spec.job.packed_payload(), key) + EVENT_BYTES


def schedule_bytes(spec_wire_bytes: int) -> int:
    """A schedule's record, from the encoded size of its spec."""
    return SCHEDULE_BYTES + spec_wire_bytes


