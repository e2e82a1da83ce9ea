"""The API view of a finished job read straight from its packed record.

Every member builds the view of each job that leaves the state, for its archive's row
(cluster/archive/writer.py), and a listing of finished jobs builds one per job shown. Thawing
the record into a `Job` and reading the view off it took 8-10 us of CPU a job, more than half
of it the thaw (a `Job` and its `Attempt`s built, names interned, specs parsed, all read once
and dropped): 11% of a follower's samples with the state at its budget (py-spy). Read straight
off the decoded record it takes about 5 us.

`frozen_view` gives exactly what `views.job_view` gives for the thawed job, keys in the same
order (an archive row's document is the view's JSON, and retention counts its bytes, the same on
every member): tests/test_core_recordview.py holds the two to it for both record formats.
"""

from __future__ import annotations

from typing import Any

import msgpack

from raftcron.scheduler import jobs as j
from raftcron.scheduler import progress
from raftcron.scheduler.flowspecs import FairnessSpec, RateKeySpec
from raftcron.scheduler.frozen import (
    BASE_FIELDS,
    COMPACT_FIELDS,
    COMPACT_MARK,
    OUTCOMES,
    STATUS,
    FrozenJob,
)


def frozen_view(record: FrozenJob, *, history: bool = True) -> dict[str, Any]:
    """`views.job_view(record, history=history)`, without thawing the record."""
    item = msgpack.unpackb(record._packed, raw=False)
    if item[0] == COMPACT_MARK:
        return _compact_view(item, history)
    return _first_view(item, history)


def _first_view(item: list[Any], history: bool) -> dict[str, Any]:
    (job_id, key, task, queue, payload, priority, status, attempts, max_attempts,
     attempt_limit, run_at_ms, _backoff, timeout_ms, schedule, fire_time_ms, workflow_id,
     workflow_node, depends_on, _waiting_on, _children, result, error, created_ms, finished_ms,
     token, lease_until_ms, _lease_ms, worker, attempts_kept, cancel_reason) = item[:BASE_FIELDS]
    status = STATUS[status]
    attempt_views = [attempt_fields_view(*a) for a in attempts_kept] if history else None
    return _view(job_id, key, task, queue, payload, priority, status, attempts, max_attempts,
                 attempt_limit, run_at_ms, timeout_ms, schedule, fire_time_ms, workflow_id,
                 workflow_node, depends_on, result, error, cancel_reason, created_ms,
                 finished_ms, token, worker, lease_until_ms, item[BASE_FIELDS:],
                 attempt_views)


def _compact_view(item: list[Any], history: bool) -> dict[str, Any]:
    (_, job_id, key, task, queue, payload, priority, status, attempts, max_attempts,
     attempt_limit, base, run_at_d, _backoff, timeout_ms, schedule, fire_time_d, workflow_id,
     workflow_node, depends_on, _waiting_on, _children, result, error, finished_d, token,
     lease_until_d, _lease_ms, worker, attempts_kept, cancel_reason, concurrency_key,
     concurrency_max) = item[:COMPACT_FIELDS]
    attempt_views = [_compact_attempt_view(a, base) for a in attempts_kept] if history else None
    return _view(job_id, key, task, queue, payload, priority, j.STATUSES[status], attempts,
                 max_attempts, attempt_limit, base + run_at_d, timeout_ms, schedule,
                 None if fire_time_d is None else base + fire_time_d, workflow_id,
                 workflow_node, depends_on, result, error, cancel_reason, base,
                 None if finished_d is None else base + finished_d, token, worker,
                 None if lease_until_d is None else base + lease_until_d,
                 [concurrency_key, concurrency_max, *item[COMPACT_FIELDS:]], attempt_views)


def _view(job_id: int, key: str | None, task: str, queue: str, payload: bytes | None,
          priority: int, status: str, attempts: int, max_attempts: int, attempt_limit: int,
          run_at_ms: int, timeout_ms: int | None, schedule: str | None,
          fire_time_ms: int | None, workflow_id: str | None, workflow_node: str | None,
          depends_on: list[Any], result: bytes | None, error: str | None,
          cancel_reason: str | None, created_ms: int, finished_ms: int | None, token: int,
          worker: str | None, lease_until_ms: int | None, extra: list[Any],
          history: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The view's fields in `job_view`'s order; `extra` the fields added since the first
    record format (concurrency key and max, progress, rate, fairness, traceparent), as many as
    the record has; `history` the attempts' views (None: a view without them)."""
    running = status == j.RUNNING
    concurrency_key = extra[0] if extra else None
    rate = extra[3] if len(extra) > 3 else None
    fairness = extra[4] if len(extra) > 4 else None
    view = {
        "id": job_id,
        "key": key,
        "task": task,
        "queue": queue,
        "payload": None if payload is None else msgpack.unpackb(payload, raw=False),
        "priority": priority,
        "status": status,
        "attempts": attempts,
        "max_attempts": max_attempts,
        "attempt_limit": attempt_limit,
        "run_at_ms": run_at_ms,
        "timeout_ms": timeout_ms,
        "schedule": schedule,
        "fire_time_ms": fire_time_ms,
        "workflow_id": workflow_id,
        "workflow_node": workflow_node,
        "depends_on": list(depends_on),
        "result": None if result is None else msgpack.unpackb(result, raw=False),
        "error": error,
        "cancel_reason": cancel_reason,
        "created_ms": created_ms,
        "finished_ms": finished_ms,
        "token": token,
        "worker": worker if running else None,
        "lease_until_ms": lease_until_ms if running else None,
        "concurrency": None if concurrency_key is None
        else {"key": concurrency_key, "max": extra[1]},
        "progress": progress.view(extra[2] if len(extra) > 2 else None),
        # Parsed as a thaw parses them, so a view shows what the spec makes of its record.
        "rate": None if rate is None else RateKeySpec.parse(
            {"key": rate[0], "max": rate[1], "per_ms": rate[2]}).to_wire(),
        "fairness": FairnessSpec.parse(fairness).to_wire() if fairness else None,
        "traceparent": extra[5] if len(extra) > 5 else None,
    }
    if history is not None:
        view["history"] = history
    return view


def _compact_attempt_view(data: list[Any], base_ms: int) -> dict[str, Any]:
    number, token, worker, node, start_d, end_d, outcome, error = data
    start_ms = base_ms + start_d
    return attempt_fields_view(number, token, worker, node, start_ms,
                               None if end_d is None else start_ms + end_d,
                               None if outcome is None else OUTCOMES[outcome], error)


def attempt_fields_view(number: int, token: int, worker: str, node: str | None, start_ms: int,
                  end_ms: int | None, outcome: str | None, error: str | None) -> dict[str, Any]:
    return {
        "attempt": number,
        "token": token,
        "worker": worker,
        "node": node,
        "start_ms": start_ms,
        "end_ms": end_ms,
        "outcome": outcome or "running",
        "error": error,
    }
