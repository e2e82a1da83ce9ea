"""One job: its record, its statuses and the arithmetic of its retries.

A job moves `blocked -> scheduled -> queued -> running -> succeeded | failed | cancelled`; the
moves themselves belong to `scheduler.store` (which keeps the indexes true) and the command
handlers. Here: the record (`__slots__`, because a node keeps a million of them), the attempt
history entries, and the backoff delay, which is deterministic: the jitter is a hash of
(job id, attempt), never a random number, so every replica computes the same retry time.
"""

from __future__ import annotations

import zlib
from typing import Any

import msgpack

from raftcron.scheduler import limits
from raftcron.scheduler.flowspecs import FairnessSpec, RateKeySpec
from raftcron.scheduler.packing import to_msgpack
from raftcron.scheduler.specs import DEFAULT_BACKOFF, BackoffSpec

BLOCKED = "blocked"
SCHEDULED = "scheduled"
QUEUED = "queued"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
STATUSES = (BLOCKED, SCHEDULED, QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
ACTIVE = frozenset({BLOCKED, SCHEDULED, QUEUED, RUNNING})

# Attempt outcomes recorded in a job's history.
OUTCOME_SUCCEEDED = "succeeded"
OUTCOME_FAILED = "failed"
OUTCOME_LEASE_EXPIRED = "lease_expired"
OUTCOME_CANCELLED = "cancelled"

# Cancel reasons with a meaning of their own.
UPSTREAM_FAILED = "upstream_failed"
REPLACED = "replaced"


class Attempt:
    """One claim of a job: who ran it, with which fencing token, and how it ended."""

    __slots__ = ("end_ms", "error", "node", "number", "outcome", "start_ms", "token", "worker")

    def __init__(
        self,
        number: int,
        token: int,
        worker: str,
        node: str | None,
        start_ms: int,
        end_ms: int | None = None,
        outcome: str | None = None,
        error: str | None = None,
    ) -> None:
        self.number = number
        self.token = token
        self.worker = worker
        self.node = node
        self.start_ms = start_ms
        self.end_ms = end_ms
        self.outcome = outcome
        self.error = error

    def to_list(self) -> list[Any]:
        return [
            self.number,
            self.token,
            self.worker,
            self.node,
            self.start_ms,
            self.end_ms,
            self.outcome,
            self.error,
        ]

    @classmethod
    def from_list(cls, data: list[Any]) -> Attempt:
        return cls(*data)


class Job:
    __slots__ = (
        "attempt_limit",
        "attempts",
        "backoff",
        "cancel_reason",
        "children",
        "concurrency_key",
        "concurrency_max",
        "counted",
        "created_ms",
        "depends_on",
        "error",
        "fairness",
        "finished_ms",
        "fire_time_ms",
        "history",
        "id",
        "key",
        "lease_ms",
        "lease_until_ms",
        "max_attempts",
        "payload",
        "priority",
        "progress",
        "queue",
        "rate",
        "result",
        "run_at_ms",
        "schedule",
        "status",
        "task",
        "timeout_ms",
        "token",
        "traceparent",
        "waiting_on",
        "worker",
        "workflow_id",
        "workflow_node",
    )

    def __init__(self, job_id: int, task: str, created_ms: int) -> None:
        self.id = job_id
        self.task = task
        self.created_ms = created_ms
        self.key: str | None = None
        self.queue = "default"
        self.payload: bytes | None = None  # msgpack: a dict per job costs 5x the memory
        self.priority = 0
        self.status = QUEUED
        self.attempts = 0  # claims so far
        self.max_attempts = limits.MAX_ATTEMPTS_DEFAULT
        self.attempt_limit = self.max_attempts  # grows by max_attempts on a manual retry
        self.run_at_ms = created_ms
        self.backoff: BackoffSpec = DEFAULT_BACKOFF
        self.timeout_ms: int | None = None
        self.schedule: str | None = None
        self.fire_time_ms: int | None = None
        self.workflow_id: int | None = None
        self.workflow_node: str | None = None
        self.depends_on: tuple[int, ...] = ()
        self.waiting_on = 0  # parents not yet succeeded
        self.children: list[int] | None = None  # created on the first child: most jobs have none
        self.result: bytes | None = None  # msgpack, as the payload
        self.error: str | None = None
        self.finished_ms: int | None = None
        self.token: int | None = None
        self.lease_until_ms: int | None = None
        self.lease_ms: int | None = None
        self.worker: str | None = None
        # A tuple, not a list: most jobs have one attempt, and a one-tuple is 40 bytes smaller
        # than a one-item list (an empty tuple costs nothing): 40 MB per million jobs.
        self.history: tuple[Attempt, ...] = ()
        self.cancel_reason: str | None = None
        # At most concurrency_max running jobs hold concurrency_key at once (scheduler.keyslots).
        self.concurrency_key: str | None = None
        self.concurrency_max = 0
        # The newest progress report of the latest attempt that made one, packed
        # (scheduler/progress.py); None: none.
        self.progress: bytes | None = None
        # At most rate.max jobs of rate.key start in any window of rate.per_ms (ratekeys.py).
        self.rate: RateKeySpec | None = None
        # Its key's turns within its queue and priority (scheduler/fairness.py).
        self.fairness: FairnessSpec | None = None
        self.traceparent: str | None = None  # the submitter's W3C trace context
        self.counted = 0  # its bytes in the memory model, as the table counted them last

    def add_child(self, child_id: int) -> None:
        if self.children is None:
            self.children = []
        self.children.append(child_id)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def current_attempt(self) -> Attempt | None:
        if self.history and self.history[-1].outcome is None:
            return self.history[-1]
        return None

    def end_attempt(self, now_ms: int, outcome: str, error: str | None = None) -> None:
        attempt = self.current_attempt()
        if attempt is not None:
            attempt.end_ms = now_ms
            attempt.outcome = outcome
            attempt.error = error

    def add_attempt(self, attempt: Attempt) -> None:
        self.history = (*self.history, attempt)[-limits.HISTORY_ATTEMPTS_MAX :]
        self.progress = None  # a new attempt has reported nothing yet


def pack(value: Any) -> bytes | None:
    """A payload or result as stored: msgpack bytes (None stays None)."""
    if value is None:
        return None
    packed: bytes = to_msgpack(value)
    return packed


def unpack(blob: bytes | None) -> Any:
    return None if blob is None else msgpack.unpackb(blob, raw=False)


def backoff_delay_ms(backoff: BackoffSpec, job_id: int, attempt: int) -> int:
    """Delay before attempt `attempt + 1` after attempt `attempt` (>= 1) failed.

    initial_ms * factor**(attempt-1), capped at max_ms, then up to `jitter` of that added. The
    factor is applied in integer hundredths so no float ever decides a time.
    """
    factor_hundredths = round(backoff.factor * 100)
    delay = backoff.initial_ms
    for _ in range(min(attempt - 1, limits.ATTEMPTS_MAX)):
        delay = delay * factor_hundredths // 100
        if delay >= backoff.max_ms:
            break
    delay = min(delay, backoff.max_ms)
    spread = delay * round(backoff.jitter * 1000) // 1000
    if spread <= 0:
        return delay
    return delay + stable_hash(f"{job_id}:{attempt}") % (spread + 1)


def stable_hash(text: str) -> int:
    """A hash that is the same on every node and every run (builtin hash() is salted)."""
    return zlib.crc32(text.encode())


class Workflow:
    """A DAG of jobs submitted together (or fired by one schedule time)."""

    __slots__ = (
        "created_ms", "fire_time_ms", "id", "job_ids", "key", "remaining", "schedule", "unfinished",
    )

    def __init__(self, workflow_id: int, created_ms: int) -> None:
        self.id = workflow_id
        self.created_ms = created_ms
        self.key: str | None = None
        self.schedule: str | None = None
        self.fire_time_ms: int | None = None
        self.job_ids: dict[str, int] = {}  # node name -> job id, in submit order
        self.remaining = 0  # jobs not yet removed by retention
        # Jobs not yet final: while any is, its finished jobs are sheltered from eviction
        # (scheduler/upstream.py). Counted from the jobs, never snapshotted: a restore counts it.
        self.unfinished = 0
