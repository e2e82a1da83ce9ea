"""What leaves the state, and what is refused for want of room (DESIGN.md §9.1), once finalized.

Inside every Tick (`collect`), at most `RETENTION_WORK_PER_TICK` finished jobs go, in this order:
1. by the retention rules: for each outcome, a queue with a rule of its own keeps its newest
   `max_count` jobs no older than `max_age_ms`; the other queues together keep the newest
   `max_count` of the cluster-wide rule, none older than its `max_age_ms`;
2. by the budget: while the state counts more bytes than the budget, the oldest finished job
   goes, succeeded and cancelled ones before failed ones (the dead letters users inspect).
Whatever a Tick could not do is left for the next one, which the ticker proposes at once
(`pending`): a lowered setting over a million kept jobs is spread over entries, never one long
apply on every replica.

A command that creates jobs asks `check_room(need)` first: when even evicting every finished
job would not make room for what it creates, it is refused whole with `state_full` and nothing
changes. Otherwise it creates its work and `settle` (after every command that adds to the
state, acks included) evicts finished jobs, same order as above, until the state is back under
the budget. Unfinished jobs are never evicted; claims, heartbeats, acks, cancels, deletes and
settings are never refused.

A finished job of a workflow that still runs is sheltered (scheduler/upstream.py): the rules
never take it (it is set aside, and eviction goes on behind it), and the budget takes it only
when nothing else finished is left.
"""

from __future__ import annotations

from typing import Any, Protocol

from raftcron.scheduler import jobs as j
from raftcron.scheduler import limits, sizes, upstream
from raftcron.scheduler.archiving import ArchiveLedger
from raftcron.scheduler.commands import SubmitJobs
from raftcron.scheduler.errors import Rejected
from raftcron.scheduler.events import EventLog
from raftcron.scheduler.finished import FinishedJobs
from raftcron.scheduler.frozen import FrozenJob
from raftcron.scheduler.jobs import Job
from raftcron.scheduler.notifications import Notifications
from raftcron.scheduler.requests import RequestLog, answer_bytes
from raftcron.scheduler.settings import OUTCOMES, Settings
from raftcron.scheduler.sizes import job_bytes, new_job_bytes
from raftcron.scheduler.store import JobTable

# Finished jobs one Tick evicts at most. Measured: an eviction costs ~4 us of apply (2-core
# dev machine), so 5,000 are ~20 ms of a Tick on every replica; a steady 7,000 jobs/s at 4
# Ticks a second needs ~1,800 per Tick.
RETENTION_WORK_PER_TICK = 5_000
# Evicted first for space: what users do not come back for. Dead letters go last.
BUDGET_ORDER = ((j.SUCCEEDED, j.CANCELLED), (j.FAILED,))
QUEUES_NAMED_MAX = 5  # the queues a state_full answer names, by bytes


class BudgetState(Protocol):
    """What the budget's check needs of the state machine (`state.SchedulerState`)."""

    table: JobTable
    settings: Settings
    requests: RequestLog
    notifications: Notifications
    events: EventLog
    schedules_bytes: int
    workflows_bytes: int
    archive_ledger: ArchiveLedger

    def state_bytes(self) -> int: ...


class RetentionState(BudgetState, upstream.ShelterState, Protocol):
    """What eviction needs of the state machine (`state.SchedulerState`, checked by mypy)."""

    now_ms: int
    keys_forgotten_ms: int
    retention_pending: bool

    @property
    def finalized(self) -> bool: ...

    counters: dict[str, dict[str, int]]

    def remove_job(self, job: Job | FrozenJob) -> None: ...


def collect_garbage(state: RetentionState) -> int:
    """Inside every Tick: what leaves the state by time, count and size; keys and request ids
    past their windows. Before the gate opens, exactly what the previous release does:
    finished jobs at 7 days, fire keys with them."""
    now_ms = state.now_ms
    if state.finalized:
        removed, state.retention_pending = collect(state)
        if state.archive_ledger.trim(now_ms, state.settings.archive):
            state.retention_pending = True
        long_cutoff_ms = now_ms - state.settings.retention.longest_age_ms()
        state.keys_forgotten_ms = max(state.keys_forgotten_ms, long_cutoff_ms)
        state.table.expire_keys(now_ms - limits.KEY_WINDOW_MS_DEFAULT, state.keys_forgotten_ms)
        state.requests.expire(now_ms)
        return removed
    removed = 0
    cutoff_ms = now_ms - limits.RETENTION_MS_DEFAULT
    while (job := state.table.oldest_finished(cutoff_ms)) is not None:
        state.remove_job(job)
        removed += 1
    state.table.expire_keys(now_ms - limits.KEY_WINDOW_MS_DEFAULT, cutoff_ms)
    state.requests.expire(now_ms)
    return removed


def collect(state: RetentionState) -> tuple[int, bool]:
    """One Tick's eviction: (jobs removed, whether work was left for the next Tick)."""
    work = RETENTION_WORK_PER_TICK
    removed = 0
    for outcome in OUTCOMES:
        done, left = _by_rules(state, outcome, work - removed)
        removed += done
        if left:
            return removed, True
    done, left = _by_budget(state, work - removed)
    return removed + done, left


def _by_rules(state: RetentionState, outcome: str, work: int) -> tuple[int, bool]:
    retention = state.settings.retention
    finished = state.table.finished
    now_ms = state.now_ms
    removed = 0
    in_workflows = state.workflow_of  # only their jobs may be sheltered: one lookup for the rest
    overrides = retention.overrides(outcome)
    for queue, rule in overrides.items():
        cutoff_ms = now_ms - rule.max_age_ms
        while True:
            front = finished.front(outcome, queue)
            if front is None:
                break
            if front[0] > cutoff_ms and finished.count(outcome, queue) <= rule.max_count:
                break
            if front[1] in in_workflows and upstream.set_aside(state, front, outcome, queue):
                continue  # before the work bound: a replica that set it aside earlier agrees
            if removed == work:
                return removed, True
            _evict(state, front[1], "age" if front[0] <= cutoff_ms else "count", outcome, queue)
            removed += 1
    rule = retention.rule(outcome)
    cutoff_ms = now_ms - rule.max_age_ms
    kept = finished.total(outcome) - sum(finished.count(outcome, q) for q in overrides)
    only = finished.only_fifo((outcome,), skip=overrides)
    while True:
        if only is not None:  # one FIFO: its front is the oldest (the merge, skipped)
            front = finished.front(*only)
            oldest = None if front is None else (front[0], front[1], only[0], only[1])
        else:
            oldest = finished.oldest((outcome,), skip=overrides)
        if oldest is None or (oldest[0] > cutoff_ms and kept <= rule.max_count):
            break
        if oldest[1] in in_workflows and upstream.set_aside(state, oldest[:2], oldest[2],
                                                            oldest[3]):
            continue
        if removed == work:
            return removed, True
        _evict(state, oldest[1], "age" if oldest[0] <= cutoff_ms else "count", oldest[2],
               oldest[3])
        removed += 1
        kept -= 1
    return removed, False


def _by_budget(state: RetentionState, work: int) -> tuple[int, bool]:
    budget = state.settings.budget.bytes
    removed = 0
    while state.state_bytes() > budget:
        oldest = _oldest_for_space(state)
        if oldest is None:
            # The last resort: a sheltered job (every finished job left is one, set aside).
            last = state.sheltered.oldest(state.table.finished_entry_valid)
            if last is None:
                return removed, False  # nothing finished is left: new work is refused instead
            if removed == work:
                return removed, True
            state.remove_job(state.table.jobs[last[1]])
            state.sheltered.evicted(last[1])
            _count_eviction(state, "budget")
            removed += 1
            continue
        if removed == work:
            return removed, True
        _evict(state, oldest[1], "budget", oldest[2], oldest[3])
        removed += 1
    return removed, False


def _oldest_for_space(state: RetentionState) -> tuple[int, int, str, str] | None:
    """The oldest finished job that is not sheltered, by BUDGET_ORDER (sheltered ones met
    on the way are set aside)."""
    finished = state.table.finished
    for statuses in BUDGET_ORDER:
        while True:
            oldest = _oldest_of(finished, statuses)
            if oldest is None:
                break
            if oldest[1] not in state.workflow_of or not upstream.set_aside(
                    state, oldest[:2], oldest[2], oldest[3]):
                return oldest
    return None


def _oldest_of(
    finished: FinishedJobs, statuses: tuple[str, ...]
) -> tuple[int, int, str, str] | None:
    only = finished.only_fifo(statuses)
    if only is not None:  # one FIFO: its front is the oldest (the merge, skipped)
        front = finished.front(*only)
        return None if front is None else (front[0], front[1], only[0], only[1])
    return finished.oldest(statuses)


def _evict(state: RetentionState, job_id: int, reason: str, status: str, queue: str) -> None:
    """Remove the job at the front of its (status, queue) FIFO."""
    table = state.table
    state.remove_job(table.jobs[job_id])
    table.finished.drop_front(status, queue)
    _count_eviction(state, reason)


def _count_eviction(state: RetentionState, reason: str) -> None:
    evicted = state.counters.get("evicted")
    if evicted is None:
        evicted = state.counters["evicted"] = {}
    evicted[reason] = evicted.get(reason, 0) + 1


def check_submit(state: BudgetState, command: SubmitJobs) -> Rejected | None:
    """Room for the jobs a submit creates (not those its keys answer with an existing job),
    and for its answer in the request table."""
    need_bytes = 0
    table = state.table
    for spec in command.jobs:
        if (spec.key is None or spec.unique is not None or spec.debounce_ms is not None
                or not table.remembers_key(spec.key)):
            need_bytes += new_job_bytes(spec.packed_payload(), spec.key, spec.traceparent)
    if not need_bytes:
        return None
    return check_room(state, need_bytes + answer_bytes(command.request_id, len(command.jobs)))


def check_room(
    state: BudgetState, need_bytes: int, *, keep: int | None = None
) -> Rejected | None:
    """None if `need_bytes` more fit under the budget once every finished job that may go is
    gone (not `keep`, a finished job a retry brings back); else the refusal. Changes nothing:
    the command creates its work, then `settle` evicts what it takes."""
    over = state.state_bytes() + need_bytes - state.settings.budget.bytes
    if over <= 0:
        return None
    table = state.table
    evictable = table.finished_bytes
    if keep is not None:
        evictable -= job_bytes(table.jobs[keep])
    return state_full(state, need_bytes) if evictable < over else None


def settle(state: RetentionState) -> bool:
    """After a command that added to the state: evict finished jobs, oldest first, while it
    is over its budget, as much as a Tick would (what one command adds is far less; a lowered
    budget can take more). Whether work was left for the Ticks."""
    return _by_budget(state, RETENTION_WORK_PER_TICK)[1]


def state_full(state: BudgetState, need_bytes: int) -> Rejected:
    budget = state.settings.budget.bytes
    used = state.state_bytes()
    by_queue = state.table.bytes_by_queue
    top = sorted(by_queue.items(), key=lambda item: (-item[1], item[0]))[:QUEUES_NAMED_MAX]
    queues: list[dict[str, Any]] = [{"queue": name, "bytes": size} for name, size in top]
    named = ", ".join(f"{q['queue']} {q['bytes']}" for q in queues) or "no jobs"
    return Rejected(
        "state_full",
        f"the cluster's state is full: {used} of {budget} bytes of its budget are used by "
        f"unfinished jobs and the tables, and {need_bytes} more were asked; nothing finished "
        f"is left to evict (bytes by queue: {named}). Finish or cancel work, or raise the "
        "budget (PUT /v1/settings/budget)",
        details={"budget_bytes": budget, "state_bytes": used, "needed_bytes": need_bytes,
                 "queues": queues, "parts": parts(state)},
    )


def parts(state: BudgetState) -> dict[str, int]:
    """`SchedulerState.state_bytes` by what fills it (they sum to it): for the 507 answer,
    /metrics and the settings view."""
    table = state.table
    return {
        "unfinished_jobs": table.bytes - table.finished_bytes,
        "finished_jobs": table.finished_bytes,
        "keys": table.key_bytes,
        "requests": state.requests.bytes_counted,
        "schedules": state.schedules_bytes,
        "workflows": state.workflows_bytes,
        "events": sizes.EVENT_BYTES * (len(state.events) + len(state.notifications.outbox)),
        "tombstones": state.archive_ledger.tombstone_bytes,
    }
