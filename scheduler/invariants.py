"""What must hold of a state after every command: `violations(state)` lists what does not.

Used by the property tests after every step and by the chaos suite on every node at the end.
An empty list is a healthy state; each entry names the job or schedule and the broken rule.
The checks read everything (O(n)): for tests and audits, not for the hot path.
"""

from __future__ import annotations

from typing import Any

from raftcron.scheduler import jobs as j
from raftcron.scheduler import queues, sizes
from raftcron.scheduler.fairness import NO_KEY, FairQueue
from raftcron.scheduler.frozen import FrozenJob, readable
from raftcron.scheduler.schedules import spec_wire_bytes
from raftcron.scheduler.state import SchedulerState


def violations(state: SchedulerState) -> list[str]:
    problems: list[str] = []
    problems += _job_rules(state)
    problems += _index_rules(state)
    problems += _flow_rules(state)
    problems += _schedule_rules(state)
    problems += _size_rules(state)
    problems += _shelter_rules(state)
    return problems


def _job_rules(state: SchedulerState) -> list[str]:
    out = []
    now_ms = state.now_ms
    tokens: dict[int, int] = {}
    for record in state.table:
        job = readable(record)
        where = f"job {job.id}"
        if job.final != isinstance(record, FrozenJob):
            out.append(f"{where}: {job.status} but {type(record).__name__} between commands")
        if isinstance(record, FrozenJob):
            header = (record.id, record.status, record.finished_ms, record.queue, record.schedule)
            fields = (job.id, job.status, job.finished_ms, job.queue, job.schedule)
            if header != fields:
                out.append(f"{where}: frozen with fields {header}, its record says {fields}")
        if job.id >= state.next_job_id:
            out.append(f"{where}: id not below next_job_id {state.next_job_id}")
        if job.status not in j.STATUSES:
            out.append(f"{where}: unknown status {job.status}")
        if job.final != (job.finished_ms is not None):
            out.append(f"{where}: {job.status} with finished_ms {job.finished_ms}")
        if job.token is not None and job.token > state.fence:
            out.append(f"{where}: token {job.token} above the fence {state.fence}")
        if job.attempts > job.attempt_limit:
            out.append(f"{where}: {job.attempts} attempts over the limit {job.attempt_limit}")
        if len(job.history) > min(job.attempts, 20):
            out.append(f"{where}: {len(job.history)} history entries for {job.attempts} attempts")
        if job.status == j.RUNNING:
            if job.token is None or job.lease_until_ms is None or job.worker is None:
                out.append(f"{where}: running without token, lease or worker")
            elif job.lease_until_ms <= now_ms:
                out.append(
                    f"{where}: running with a lease that ended at {job.lease_until_ms} <= {now_ms}"
                )
            elif job.token in tokens:
                out.append(f"{where}: token {job.token} also held by job {tokens[job.token]}")
            else:
                tokens[job.token] = job.id
            current = job.current_attempt()
            if current is None or current.token != job.token:
                out.append(f"{where}: running but its last attempt is not open with its token")
        elif job.current_attempt() is not None:
            out.append(f"{where}: {job.status} with an attempt still open")
        if job.status == j.SCHEDULED and job.run_at_ms <= now_ms:
            out.append(f"{where}: scheduled for {job.run_at_ms}, already due at {now_ms}")
        if job.status == j.BLOCKED:
            pending = 0
            for parent_id in job.depends_on:
                parent = state.table.get(parent_id)
                if parent is not None and parent.status != j.SUCCEEDED:
                    pending += 1
                    if parent.status in (j.FAILED, j.CANCELLED):
                        out.append(f"{where}: blocked on job {parent_id}, which is {parent.status}")
            if pending != job.waiting_on or pending == 0:
                out.append(
                    f"{where}: blocked, waiting_on {job.waiting_on}, unfinished parents {pending}"
                )
        if job.status in (j.QUEUED, j.RUNNING, j.SUCCEEDED):
            for parent_id in job.depends_on:
                parent = state.table.get(parent_id)
                if parent is not None and parent.status != j.SUCCEEDED:
                    out.append(f"{where}: {job.status} while parent {parent_id} is {parent.status}")
    return out


def _index_rules(state: SchedulerState) -> list[str]:
    out = []
    table = state.table
    counted = dict.fromkeys(j.STATUSES, 0)
    for job in table:
        counted[job.status] += 1
        index = table.by_status.get(job.status)
        if index is not None and job.id not in index:
            out.append(f"job {job.id}: missing from the {job.status} index")
        if job.status == j.QUEUED:
            ready = table.ready.get(job.queue)
            in_line = ready is not None and job.id in ready.members
            holding = table.held.get(readable(job).concurrency_key or "")
            held = holding is not None and job.id in holding.members
            rate = readable(job).rate
            rate_entry = None if rate is None else table.rates.keys.get(rate.key)
            if rate_entry is not None and rate_entry.held is not None \
                    and job.id in rate_entry.held.members:
                held = not held  # held for its rate key's window (and so for nothing else)
            if in_line == held:
                where = "both a ready queue and held" if held else "neither a ready queue nor held"
                out.append(f"job {job.id}: queued, in {where} ({job.queue!r})")
    if counted != table.count_by_status:
        out.append(f"status counts {table.count_by_status} differ from the records {counted}")
    for status, index in table.by_status.items():
        for job_id in index:
            indexed = table.get(job_id)
            if indexed is None or indexed.status != status:
                out.append(f"job {job_id}: in the {status} index but is not {status}")
    for name, ready in table.ready.items():
        for job_id in ready.members:
            member = table.get(job_id)
            if member is None or member.status != j.QUEUED or member.queue != name:
                out.append(f"job {job_id}: in ready queue {name!r} but not queued there")
    for key, (job_id, _, _) in table.keys.items():
        keyed = table.get(job_id)
        if keyed is not None and keyed.key != key:
            out.append(f"key {key!r}: points at job {job_id}, whose key is {keyed.key!r}")
    return out


def _flow_rules(state: SchedulerState) -> list[str]:
    """The counts a claim trusts match the records; a held job waits only while its key is
    full; queue controls hold only limits, and buckets stay within their size."""
    out = []
    table = state.table
    running: dict[str, int] = {}
    key_running: dict[str, int] = {}
    key_ready: dict[str, int] = {}
    key_max_running: dict[str, int] = {}
    held_by_queue: dict[str, int] = {}
    for job_id in table.by_status[j.RUNNING]:
        job = readable(table.jobs[job_id])
        running[job.queue] = running.get(job.queue, 0) + 1
        if job.concurrency_key is not None:
            key = job.concurrency_key
            key_running[key] = key_running.get(key, 0) + 1
            key_max_running[key] = max(key_max_running.get(key, 0), job.concurrency_max)
    for ready in table.ready.values():
        for job_id in ready.members:
            ready_key = readable(table.jobs[job_id]).concurrency_key
            if ready_key is not None:
                key_ready[ready_key] = key_ready.get(ready_key, 0) + 1
    for key, held in table.held.items():
        if not held.members:
            out.append(f"key {key!r}: an empty held heap is kept")
        for job_id in held.members:
            job = readable(table.jobs[job_id])
            if job.status != j.QUEUED or job.concurrency_key != key:
                out.append(f"job {job_id}: held for key {key!r} but is {job.status} with key "
                           f"{job.concurrency_key!r}")
            held_by_queue[job.queue] = held_by_queue.get(job.queue, 0) + 1
        head = held.peek()
        if head is not None:
            first = readable(table.jobs[head[2]])
            taken = key_running.get(key, 0) + key_ready.get(key, 0)
            if taken < first.concurrency_max:
                out.append(f"key {key!r}: job {first.id} held while only {taken} of its "
                           f"{first.concurrency_max} slots are taken")
    out += _rate_key_rules(state)
    out += _fair_rules(state)
    for name, counted, kept in (
        ("running by queue", running, table.running_by_queue),
        ("running by key", key_running, table.key_running),
        ("ready by key", key_ready, table.key_ready),
        ("held by queue", held_by_queue, table.held_by_queue),
    ):
        if counted != kept:
            out.append(f"{name}: kept {kept}, the records say {counted}")
    for key, count in key_running.items():
        if count > key_max_running[key]:
            out.append(f"key {key!r}: {count} running, over every running job's max")
    for name, control in state.queues.items():
        if control.spec.is_default:
            out.append(f"queue {name!r}: a control with no limit is kept")
        rate = control.spec.rate_limit
        if rate is not None and not 0 <= control.units <= (rate.burst or rate.max) * rate.per_ms:
            out.append(f"queue {name!r}: bucket at {control.units} units, outside its size")
        if control.rule == "window":
            out += _window_rules(name, control, state.now_ms)
        if control.refilled_ms > state.now_ms:
            out.append(f"queue {name!r}: refilled at {control.refilled_ms}, after now")
    return out


def _schedule_rules(state: SchedulerState) -> list[str]:
    out = []
    for name, schedule in state.schedules.items():
        where = f"schedule {name!r}"
        if schedule.cursor_ms > state.now_ms:
            out.append(f"{where}: cursor {schedule.cursor_ms} ahead of now {state.now_ms}")
        pending = name in state.pending_schedules
        if (
            not pending
            and schedule.next_fire_ms is not None
            and schedule.next_fire_ms <= schedule.cursor_ms
        ):
            out.append(
                f"{where}: next fire {schedule.next_fire_ms} not after cursor {schedule.cursor_ms}"
            )
        next_ms = schedule.next_fire_ms
        if not pending and not schedule.paused and next_ms is not None and next_ms <= state.now_ms:
            out.append(f"{where}: next fire {next_ms} overdue at {state.now_ms}")
        for job_id in schedule.active:
            job = state.table.get(job_id)
            if job is None or job.final or job.schedule != name:
                out.append(f"{where}: active job {job_id} is not an unfinished job of it")
        if schedule.buffered is not None and not schedule.active:
            out.append(f"{where}: a buffered fire with no active run to wait for")
    for name in state.pending_schedules:
        if name not in state.schedules:
            out.append(f"pending schedule {name!r} does not exist")
    return out


def _fair_rules(state: SchedulerState) -> list[str]:
    """Fair lines (scheduler/fairness.py): each level's counts are its jobs in line by key,
    every key with jobs has a place in the turns, and no empty level is kept."""
    out = []
    for name, line in state.table.ready.items():
        if not isinstance(line, FairQueue):
            continue
        counted: dict[int, dict[str, int]] = {}
        for job_id, entry in line.members.items():
            fair = readable(state.table.jobs[job_id]).fairness
            key = NO_KEY if fair is None else fair.key
            by_key = counted.setdefault(entry[0], {})
            by_key[key] = by_key.get(key, 0) + 1
        kept = {p: dict(lv.counts) for p, lv in line.levels.items()}
        if kept != counted:
            out.append(f"queue {name!r}: fair counts {kept}, the jobs in line {counted}")
        for p, level in line.levels.items():
            if set(level.ring) != level.ringed or len(level.ring) != len(level.ringed):
                out.append(f"queue {name!r}: priority {-p}: turns {list(level.ring)} repeat or "
                           "differ from the keys they name")
            missing = sorted(set(level.counts) - level.ringed)
            if missing:
                out.append(f"queue {name!r}: priority {-p}: keys {missing} have no turn")
    return out


def _rate_key_rules(state: SchedulerState) -> list[str]:
    """Rate keys (scheduler/ratekeys.py): each key's jobs in line and held match the records,
    a held key has a wake time or jobs in line to wait for, and no key is kept for nothing."""
    out = []
    table, rates = state.table, state.table.rates
    in_line: dict[str, int] = {}
    held_by_queue: dict[str, int] = {}
    for ready in table.ready.values():
        for job_id in ready.members:
            rate = readable(table.jobs[job_id]).rate
            if rate is not None:
                in_line[rate.key] = in_line.get(rate.key, 0) + 1
    for key, entry in rates.keys.items():
        if entry.in_line != in_line.get(key, 0):
            out.append(f"rate key {key!r}: counts {entry.in_line} in line, the lines hold "
                       f"{in_line.get(key, 0)}")
        if entry.held is not None:
            if not entry.held.members:
                out.append(f"rate key {key!r}: an empty held line is kept")
            for job_id in entry.held.members:
                job = readable(table.jobs[job_id])
                if job.status != j.QUEUED or job.rate is None or job.rate.key != key:
                    out.append(f"job {job_id}: held for rate key {key!r} but is {job.status}")
                held_by_queue[job.queue] = held_by_queue.get(job.queue, 0) + 1
            if entry.wake_ms is None and entry.in_line == 0:
                out.append(f"rate key {key!r}: jobs held with nothing to wake them")
        if not entry.log and entry.held is None and entry.in_line == 0:
            out.append(f"rate key {key!r}: kept with no start, no job held and none in line")
    missing = sorted(set(in_line) - set(rates.keys))
    if missing:
        out.append(f"rate keys {missing}: jobs in line but no entry")
    if held_by_queue != rates.held_by_queue:
        out.append(f"rate-held by queue {rates.held_by_queue}, the lines hold {held_by_queue}")
    return out


def _window_rules(name: str, control: Any, now_ms: int) -> list[str]:
    """A window queue's start log: (time, count) runs in time order, none empty, and no more
    runs than its slices. (Its starts in the window may exceed the limit: a lowered limit
    keeps the starts made under the old one, and waits them out.)"""
    log = list(control.log)
    out = []
    times, counts = log[0::2], log[1::2]
    if len(log) % 2 or times != sorted(set(times)) or any(count <= 0 for count in counts):
        out.append(f"queue {name!r}: start log {log} is not runs in time order")
    # One run per slice of the window, and one more whose slice ends after a changed window's
    # (scheduler/queues.py `_carry_rate`).
    if len(times) > queues.LOG_RUNS_MAX + 2:
        out.append(f"queue {name!r}: {len(times)} runs in its start log")
    return out


def _size_rules(state: SchedulerState) -> list[str]:
    """The memory model's running counts equal a count from scratch; the retention index
    holds a valid entry for every finished job and counts them right; once finalized, the
    state is within its budget unless nothing finished is left to evict."""
    out = []
    table = state.table
    total = finished_bytes = 0
    by_queue: dict[str, int] = {}
    finished_counts: dict[tuple[str, str], int] = {}
    entries = {(where, entry) for where, fifo in table.finished.fifos.items() for entry in fifo}
    for record in table:
        size = sizes.job_bytes(record)
        if isinstance(record, j.Job) and record.counted != size:
            out.append(f"job {record.id}: counted {record.counted} bytes, its record is {size}")
        total += size
        by_queue[record.queue] = by_queue.get(record.queue, 0) + size
        if record.final:
            finished_bytes += size
            where = (record.status, record.queue)
            finished_counts[where] = finished_counts.get(where, 0) + 1
            if (where, (record.finished_ms, record.id)) not in entries \
                    and record.id not in state.sheltered.workflow_of:
                out.append(f"job {record.id}: finished but neither in the retention index "
                           "nor set aside")
    workflow_of = {record.id: wid for record in table
                   if (wid := readable(record).workflow_id) is not None}
    if workflow_of != state.workflow_of:
        out.append(f"workflow of jobs: kept {state.workflow_of}, the records say {workflow_of}")
    for name, counted, kept in (
        ("job bytes", total, table.bytes),
        ("finished bytes", finished_bytes, table.finished_bytes),
        ("bytes by queue", by_queue, table.bytes_by_queue),
        ("finished counts", finished_counts, table.finished.counts),
        ("key bytes", sum(sizes.key_bytes(key) for key in table.keys), table.key_bytes),
        ("schedule bytes",
         sum(sizes.schedule_bytes(spec_wire_bytes(s.spec)) for s in state.schedules.values()),
         state.schedules_bytes),
        ("workflow bytes",
         sum(sizes.WORKFLOW_BYTES + sizes.WORKFLOW_NODE_BYTES * len(w.job_ids)
             for w in state.workflows.values()),
         state.workflows_bytes),
    ):
        if counted != kept:
            out.append(f"{name}: kept {kept}, the records say {counted}")
    if state.finalized and state.state_bytes() > state.settings.budget.bytes \
            and table.finished_bytes and not state.retention_pending:
        out.append(f"state of {state.state_bytes()} bytes over its budget "
                   f"{state.settings.budget.bytes} with {table.finished_bytes} bytes of "
                   "finished jobs left to evict")
    return out


def _shelter_rules(state: SchedulerState) -> list[str]:
    """Each workflow counts its unfinished jobs right, and a job set aside from eviction
    (scheduler/upstream.py) is a finished job of a workflow that still runs."""
    out = []
    unfinished = dict.fromkeys(state.workflows, 0)
    for job_id, workflow_id in state.workflow_of.items():
        if not state.table.jobs[job_id].final and workflow_id in unfinished:
            unfinished[workflow_id] += 1
    for workflow_id, workflow in state.workflows.items():
        if workflow.unfinished != unfinished[workflow_id]:
            out.append(f"workflow {workflow_id}: counts {workflow.unfinished} unfinished jobs, "
                       f"the records say {unfinished[workflow_id]}")
    for job_id, workflow_id in state.sheltered.workflow_of.items():
        job = state.table.get(job_id)
        if job is None or not job.final:
            continue  # its entry is stale (evicted by a delete, or retried): dropped lazily
        if unfinished.get(workflow_id, 0) == 0:
            out.append(f"job {job_id}: set aside from eviction, but workflow {workflow_id} "
                       "has ended")
    return out
