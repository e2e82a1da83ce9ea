"""Finished jobs kept packed: a million retained jobs in a fraction of the memory.

A job in a final status changes only if it is retried or gains a child, so the table keeps it
as a `FrozenJob`: the few fields its indexes and filters read (id, status, finished_ms, queue,
schedule) plus the job's whole record as msgpack bytes. That is about 0.4 KB where a `Job` with
its attempt history is about 1.2 KB, and a snapshot writes those bytes as they are and a restore
keeps them as they are: neither decodes a finished job (the measured cost of both, at a million
retained jobs, was decoding them).

Reading any other field of a frozen job decodes its record (`readable` does it once for a
view); changing one needs `JobTable.live`, which puts a decoded `Job` back in the table. A frozen
job refuses writes (no slot, read-only properties), so a change that skipped `live` fails loudly
instead of being lost. The packed record is a pure function of the job's fields, so a replica
that froze a job and one that restored it from a snapshot hold the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from raftcron.scheduler import jobs as j
from raftcron.scheduler import packing
from raftcron.scheduler.flowspecs import FairnessSpec, RateKeySpec
from raftcron.scheduler.jobs import Attempt, Job
from raftcron.scheduler.specs import DEFAULT_BACKOFF, BackoffSpec

_READABLE = (frozenset(Job.__slots__) - {"counted"}) | {"current_attempt"}


class FrozenJob:
    """A finished job: its indexed fields, and the rest packed (see the module docstring)."""

    __slots__ = ("_finished_ms", "_id", "_packed", "_queue", "_schedule", "_status")

    def __init__(
        self,
        job_id: int,
        status: str,
        finished_ms: int,
        queue: str,
        schedule: str | None,
        packed: bytes,
    ) -> None:
        self._id = job_id
        self._status = status
        self._finished_ms = finished_ms
        self._queue = queue
        self._schedule = schedule
        self._packed = packed

    @property
    def id(self) -> int:
        return self._id

    @property
    def status(self) -> str:
        return self._status

    @property
    def finished_ms(self) -> int:
        return self._finished_ms

    @property
    def queue(self) -> str:
        return self._queue

    @property
    def schedule(self) -> str | None:
        return self._schedule

    @property
    def final(self) -> bool:
        return True

    def thawed(self) -> Job:
        """A decoded copy, not in any table: changing it changes nothing."""
        return job_from_list(msgpack.unpackb(self._packed, raw=False))

    def __getattr__(self, name: str) -> Any:
        # Reached only for names that are not slots or properties above.
        if name in _READABLE:
            return getattr(self.thawed(), name)
        raise AttributeError(f"job {self._id} is frozen ({self._status}); {name!r} needs it live")


def freezer(*, compact: bool) -> Callable[[Job], FrozenJob]:
    """A function that freezes finished jobs, for the jobs one command finished: one Packer
    for them all (a Packer made per record cost more than packing a small job's record)."""
    pack = packing.packer().pack
    fields = job_to_compact_list if compact else job_to_list

    def freeze_one(job: Job) -> FrozenJob:
        finished_ms = job.finished_ms
        assert job.final and finished_ms is not None, f"freezing job {job.id} in {job.status}"
        return FrozenJob(job.id, job.status, finished_ms, job.queue, job.schedule,
                         pack(fields(job)))

    return freeze_one


def row(job: Job | FrozenJob, *, compact: bool = False) -> list[Any]:
    """The job as a snapshot writes it, and a frozen job holds it: the fields indexes read,
    then the packed record (`compact`: the record format of a finalized cluster). A frozen job
    gives its bytes as they are."""
    if isinstance(job, FrozenJob):
        return [job._id, job._status, job._finished_ms, job._queue, job._schedule, job._packed]
    return [job.id, job.status, job.finished_ms, job.queue, job.schedule,
            pack(job, compact=compact)]


def readable(job: Job | FrozenJob) -> Job:
    """The job to read many fields of: a frozen one decoded once (a copy)."""
    return job.thawed() if isinstance(job, FrozenJob) else job


def pack(job: Job, *, compact: bool = False) -> bytes:
    fields = job_to_compact_list(job) if compact else job_to_list(job)
    data: bytes = packing.to_msgpack(fields)
    return data


def job_to_list(job: Job) -> list[Any]:
    fields = [
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
    # Fields added since the first record format are written only when set, so a job that
    # uses none of them packs to the same bytes as before (and older records read as unset).
    # A job's progress and rate exist only in a finalized cluster, whose records are compact:
    # they are written here too, so no format can lose them.
    fields += _since_first(job, job.concurrency_key is not None)
    return fields


def _since_first(job: Job, keyed: bool) -> list[Any]:
    """The fields added since the first record format, up to the last one set (none: [])."""
    extra = [job.concurrency_key, job.concurrency_max, job.progress,
             None if job.rate is None else _rate_wire(job.rate),
             None if job.fairness is None else job.fairness.to_wire(), job.traceparent]
    last = 5  # the last one set (a loop, not a generator: this runs for every job frozen)
    while last > 1 and extra[last] is None:
        last -= 1
    if last == 1 and not keyed:
        return []
    return extra[:last + 1]


def _rate_wire(rate: RateKeySpec) -> list[Any]:
    return [rate.key, rate.max, rate.per_ms]


def _rate(data: list[Any] | None) -> RateKeySpec | None:
    return None if data is None else RateKeySpec.parse(
        {"key": data[0], "max": data[1], "per_ms": data[2]})


BASE_FIELDS = 30  # the fields of the first record format; later ones follow when set

# The compact record format (written once the cluster is finalized, scheduler/gate.py: the
# previous release reads only the first one). It starts with COMPACT_MARK where the first
# format starts with the job's id (>= 1). The same fields, cheaper: statuses and outcomes as
# small numbers, times as differences (from created_ms; an attempt's end from its start),
# which msgpack writes in 1-5 bytes where a Unix time in ms takes 9. A finished job's record
# went from 122 to 79 bytes (a claimed and completed job of a small payload).
COMPACT_MARK = -2
COMPACT_FIELDS = 33  # a compact record's fields; progress, rate, fairness, traceparent follow
# when set
STATUS_CODE = {status: code for code, status in enumerate(j.STATUSES)}
OUTCOMES = (j.OUTCOME_SUCCEEDED, j.OUTCOME_FAILED, j.OUTCOME_LEASE_EXPIRED, j.OUTCOME_CANCELLED)
OUTCOME_CODE = {outcome: code for code, outcome in enumerate(OUTCOMES)}


def job_to_compact_list(job: Job) -> list[Any]:
    base = job.created_ms
    fields = [
        COMPACT_MARK,
        job.id,
        job.key,
        job.task,
        job.queue,
        job.payload,
        job.priority,
        STATUS_CODE[job.status],
        job.attempts,
        job.max_attempts,
        job.attempt_limit,
        base,
        job.run_at_ms - base,
        None if job.backoff == DEFAULT_BACKOFF else job.backoff.to_wire(),
        job.timeout_ms,
        job.schedule,
        None if job.fire_time_ms is None else job.fire_time_ms - base,
        job.workflow_id,
        job.workflow_node,
        list(job.depends_on),
        job.waiting_on,
        job.children,
        job.result,
        job.error,
        None if job.finished_ms is None else job.finished_ms - base,
        job.token,
        None if job.lease_until_ms is None else job.lease_until_ms - base,
        job.lease_ms,
        job.worker,
        [_compact_attempt(a, base) for a in job.history],
        job.cancel_reason,
        job.concurrency_key,
        job.concurrency_max,
    ]
    fields += _since_first(job, True)[2:]  # only when set: a record without them keeps its bytes
    return fields


def _compact_attempt(attempt: Attempt, base_ms: int) -> list[Any]:
    start = attempt.start_ms
    return [
        attempt.number,
        attempt.token,
        attempt.worker,
        attempt.node,
        start - base_ms,
        None if attempt.end_ms is None else attempt.end_ms - start,
        None if attempt.outcome is None else OUTCOME_CODE[attempt.outcome],
        attempt.error,
    ]


def job_from_list(item: list[Any]) -> Job:
    if item[0] == COMPACT_MARK:
        return _job_from_compact_list(item)
    extra = item[BASE_FIELDS:]
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
    ) = item[:BASE_FIELDS]
    job = Job.__new__(Job)  # every field is set below: __init__'s defaults would be overwritten
    job.id = job_id
    job.task = intern(task)
    job.created_ms = created_ms
    job.key = key
    job.queue = intern(queue)
    job.payload = payload
    job.priority = priority
    job.status = STATUS[status]
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
    if extra:
        job.concurrency_key, job.concurrency_max = extra[0], extra[1]
    else:
        job.concurrency_key, job.concurrency_max = None, 0
    job.progress = extra[2] if len(extra) > 2 else None
    job.rate = _rate(extra[3]) if len(extra) > 3 else None
    job.fairness = FairnessSpec.parse(extra[4]) if len(extra) > 4 and extra[4] else None
    job.traceparent = extra[5] if len(extra) > 5 else None
    job.counted = 0  # the table counts it when it takes it
    return job


STATUS = {status: status for status in j.STATUSES}  # also rejects an unknown status (KeyError)


def _job_from_compact_list(item: list[Any]) -> Job:
    """A compact record read back as the first format's fields (one decoder for both)."""
    (_, job_id, key, task, queue, payload, priority, status, attempts, max_attempts,
     attempt_limit, base, run_at_d, backoff, timeout_ms, schedule, fire_time_d, workflow_id,
     workflow_node, depends_on, waiting_on, children, result, error, finished_d, token,
     lease_until_d, lease_ms, worker, history, cancel_reason, concurrency_key,
     concurrency_max) = item[:COMPACT_FIELDS]
    return job_from_list([
        job_id, key, task, queue, payload, priority, j.STATUSES[status], attempts,
        max_attempts, attempt_limit, base + run_at_d, backoff, timeout_ms, schedule,
        _plus(base, fire_time_d), workflow_id, workflow_node, depends_on, waiting_on, children,
        result, error, base, _plus(base, finished_d), token, _plus(base, lease_until_d),
        lease_ms, worker, [_attempt_from_compact(a, base) for a in history], cancel_reason,
        concurrency_key, concurrency_max, *item[COMPACT_FIELDS:],  # progress, rate, ...
    ])


def _plus(base_ms: int, difference: int | None) -> int | None:
    return None if difference is None else base_ms + difference


def _attempt_from_compact(data: list[Any], base_ms: int) -> list[Any]:
    """A compact attempt as the first format writes it (`Attempt.to_list`)."""
    number, token, worker, node, start_d, end_d, outcome, error = data
    start_ms = base_ms + start_d
    return [number, token, worker, node, start_ms, _plus(start_ms, end_d),
            None if outcome is None else OUTCOMES[outcome], error]


def intern(text: str, _seen: dict[str, str] = {}) -> str:  # noqa: B006 - a deliberate cache
    """One object per distinct name: a million jobs share their queue and task strings."""
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
