"""Schedules in the state machine: their commands, and firing them inside `Tick`.

A fire creates one job (or one workflow) whose key is `<schedule>@<fire_time_ms>`, and moves
the schedule's cursor past the fire time in the same command, so a time fires at most once
whichever node leads. The overlap policy is applied here, at fire time: `allow` fires anyway,
`forbid` skips (counted), `replace` cancels the active run first, `buffer_one` keeps one fire
waiting until the active run finishes.

A schedule that is created, resumed or re-timed starts at the *next* Tick rather than at
`state.now_ms`: after a restart the state's clock can be minutes old, and starting from it would
fire a catch-up for times before the schedule existed.
"""

from __future__ import annotations

import heapq
from typing import Any, Protocol

from raftcron.scheduler import events, limits, parse, retention, sizes, upstream
from raftcron.scheduler.calendar import At
from raftcron.scheduler.commands import (
    BackfillSchedule,
    Command,
    DeleteSchedule,
    PauseSchedule,
    PutSchedule,
    ResumeSchedule,
    TriggerSchedule,
)
from raftcron.scheduler.errors import Invalid, Ok, Rejected, Result
from raftcron.scheduler.frozen import FrozenJob
from raftcron.scheduler.jobs import REPLACED, Job, Workflow, stable_hash
from raftcron.scheduler.requests import answer_bytes
from raftcron.scheduler.schedules import (
    Schedule,
    fire_times_between,
    plan_fires,
    spec_wire_bytes,
)
from raftcron.scheduler.settings import Settings
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.store import JobTable


class FiringState(retention.BudgetState, upstream.ShelterState, Protocol):
    """What firing needs of the state machine, written out so that this module does not import
    `scheduler.state` (which calls it): `state.SchedulerState` is the one implementation, and
    mypy checks it against this at every call."""

    now_ms: int
    next_job_id: int
    table: JobTable
    schedules: dict[str, Schedule]
    schedule_heap: list[tuple[int, str]]  # (next_fire_ms, name), cleaned lazily
    pending_schedules: dict[str, None]
    settings: Settings
    schedules_bytes: int
    keys_forgotten_ms: int

    @property
    def finalized(self) -> bool: ...

    def state_bytes(self) -> int: ...

    def count(self, name: str, label: str, by: int = 1) -> None: ...

    def emit(self, kind: str, *, at_ms: int | None = None, **fields: Any) -> None: ...

    # Only the arguments firing passes: the implementation takes more (workflow nodes...).
    def create_job(
        self, spec: JobSpec, *, key: str, schedule: str, fire_time_ms: int, run_at_ms: int
    ) -> Job: ...

    def create_workflow(
        self, spec: WorkflowSpec, *, key: str, schedule: str, fire_time_ms: int, run_at_ms: int
    ) -> Workflow: ...

    def cancel_job(self, job: Job, reason: str) -> None: ...

    def remove_job(self, job: Job | FrozenJob) -> None: ...


def apply_schedule_command(state: FiringState, command: Command) -> Result:
    match command:
        case PutSchedule():
            return _put(state, command)
        case DeleteSchedule():
            schedule = _get(state, command.name)
            del state.schedules[schedule.name]
            state.schedules_bytes -= sizes.schedule_bytes(schedule.spec_bytes)
            state.pending_schedules.pop(schedule.name, None)
            return Ok({})
        case PauseSchedule():
            _get(state, command.name).paused = True
            return Ok({})
        case ResumeSchedule():
            schedule = _get(state, command.name)
            if schedule.paused:
                schedule.paused = False
                state.pending_schedules[schedule.name] = None
            return Ok({})
        case TriggerSchedule():
            return _trigger(state, command)
        case BackfillSchedule():
            return _backfill(state, command)
    raise AssertionError(f"not a schedule command: {command!r}")


def _get(state: FiringState, name: str) -> Schedule:
    schedule = state.schedules.get(name)
    if schedule is None:
        raise Invalid("name", f"no schedule {name!r}", code="not_found")
    return schedule


def _put(state: FiringState, command: PutSchedule) -> Result:
    schedule = state.schedules.get(command.name)
    created = schedule is None
    spec = command.spec
    past = isinstance(spec.recurrence, At) and spec.recurrence.at_ms <= state.now_ms
    if past and (schedule is None or not schedule.spec.same_timing(spec)):
        # It could never fire: refuse it rather than keep a schedule that silently does nothing.
        return Rejected("invalid", f"at: {spec.text!r} is not after the cluster's clock", "at")
    if schedule is None:
        schedule = state.schedules[command.name] = Schedule(
            command.name, command.spec, state.now_ms
        )
        state.pending_schedules[command.name] = None
        state.schedules_bytes += sizes.schedule_bytes(schedule.spec_bytes)
    else:
        same_timing = schedule.spec.same_timing(command.spec)
        state.schedules_bytes -= sizes.schedule_bytes(schedule.spec_bytes)
        schedule.spec = command.spec
        schedule.spec_bytes = spec_wire_bytes(command.spec)
        state.schedules_bytes += sizes.schedule_bytes(schedule.spec_bytes)
        schedule.updated_ms = state.now_ms
        was_paused, schedule.paused = schedule.paused, command.spec.paused
        if not same_timing or (was_paused and not schedule.paused):
            state.pending_schedules[command.name] = None
    return Ok({"created": created})


def fire_due(state: FiringState) -> list[int]:
    """Inside Tick: start pending schedules, then fire every schedule whose time has come (of
    those late past CATCHUP_LATE_MS, only up to CATCHUP_WORK_PER_TICK of work: the next Ticks do
    the rest, so a catch-up after downtime is spread over log entries).

    Returns the fire times that created work (the shell measures fire lateness from them).
    """
    now_ms = state.now_ms
    for name in state.pending_schedules:
        schedule = state.schedules[name]
        schedule.cursor_ms = max(schedule.cursor_ms, now_ms)
        schedule.next_fire_ms = schedule.due_after(schedule.cursor_ms)
        _file(state, schedule)
    state.pending_schedules.clear()
    fired: list[int] = []
    heap = state.schedule_heap
    late_ms = now_ms - limits.CATCHUP_LATE_MS
    catch_up_work = 0
    while heap and heap[0][0] <= now_ms:
        next_fire_ms, name = heapq.heappop(heap)
        found = state.schedules.get(name)
        if found is None or found.paused or found.next_fire_ms != next_fire_ms:
            continue  # a stale entry: deleted, paused or re-timed since it was filed
        late = next_fire_ms < late_ms
        if late and catch_up_work >= limits.CATCHUP_WORK_PER_TICK:
            # The rest waits for the next Tick (the heap is ordered: all of it is late).
            heapq.heappush(heap, (next_fire_ms, name))
            break
        schedule = found
        created = _fire_due_times(state, schedule)
        if late:
            catch_up_work += 1 + len(created)
        fired += created
        _file(state, schedule)
    return fired


def _file(state: FiringState, schedule: Schedule) -> None:
    if schedule.next_fire_ms is not None and not schedule.paused:
        heapq.heappush(state.schedule_heap, (schedule.next_fire_ms, schedule.name))


def _fire_due_times(state: FiringState, schedule: Schedule) -> list[int]:
    now_ms = state.now_ms
    plan = plan_fires(schedule.spec, schedule.cursor_ms, now_ms)
    schedule.cursor_ms = now_ms
    schedule.next_fire_ms = schedule.due_after(now_ms)
    if plan.late:
        schedule.misfires += plan.late
        schedule.misfires_truncated |= plan.truncated
        state.emit(
            events.MISFIRED,
            schedule=schedule.name,
            missed=plan.late,
            fired=len(plan.fire),
            policy=schedule.spec.misfire,
        )
    schedule.misfire_skipped += plan.skipped
    created = []
    for fire_time_ms in plan.fire:
        outcome = fire(state, schedule, fire_time_ms)
        if outcome is not None and outcome != BUFFERED:
            created.append(fire_time_ms)
    return created


RETENTION_DAYS = limits.RETENTION_MS_DEFAULT // limits.DAY_MS
BUFFERED = -1  # fire(): the fire waits behind the active run (buffer_one)


def fire(
    state: FiringState,
    schedule: Schedule,
    fire_time_ms: int,
    *,
    manual: bool = False,
    force: bool = False,
) -> int | None:
    """Create the work of one fire: the job id (first job of a workflow), BUFFERED, or None.

    A nominal fire's key is `<schedule>@<fire_time_ms>`; a manual trigger's is
    `<schedule>@manual-<job id>`, unique forever (a schedule deleted and created again must not
    meet its earlier incarnation's triggers). Fire keys are remembered for the job retention
    period, whether or not the job still exists, so a time fires at most once.
    """
    if not manual and state.table.remembers_key(parse.fire_key(schedule.name, fire_time_ms)):
        return None  # this time already fired (by the clock, a backfill or an earlier incarnation)
    if schedule.active and not force:
        policy = schedule.spec.overlap
        if policy == "forbid" or (policy == "buffer_one" and schedule.buffered is not None):
            schedule.overlap_skipped += 1
            state.emit(
                events.OVERLAP_SKIPPED,
                schedule=schedule.name,
                fire_time_ms=fire_time_ms,
                policy=policy,
            )
            return None
        if policy == "buffer_one":
            schedule.buffered = (fire_time_ms, 1 if manual else 0)
            return BUFFERED
        if policy == "replace":
            # A fire buffered under an earlier buffer_one policy is superseded too: were it kept,
            # cancelling the active run below would release it and start two runs at once.
            schedule.buffered = None
            for job_id in sorted(schedule.active):
                job = state.table.get(job_id)
                if isinstance(job, Job) and not job.final:
                    state.cancel_job(job, REPLACED)
    if not manual and schedule.buffered == (fire_time_ms, 0):
        # This very time waits in the buffer and fires now (a backfill): it must not fire again
        # when the active run ends, maybe after its key has been forgotten (retention).
        schedule.buffered = None
    # A manual key is taken only now, after any cancellation, so it names the job it creates.
    key = (
        parse.manual_fire_key(schedule.name, state.next_job_id)
        if manual
        else parse.fire_key(schedule.name, fire_time_ms)
    )
    if state.finalized and retention.check_room(state, sizes.fire_bytes(schedule.spec, key)):
        # A trigger or a backfill checked before it came here: this is the clock's (or a
        # buffered) fire, which is never dropped silently (DESIGN.md §9.1).
        schedule.misfires_state_full += 1
        state.emit(events.MISFIRED, schedule=schedule.name, missed=1, fired=0,
                   policy=schedule.spec.misfire, reason="state_full",
                   fire_time_ms=fire_time_ms)
        return None
    return _create_work(state, schedule, fire_time_ms, key)


def _create_work(state: FiringState, schedule: Schedule, fire_time_ms: int, key: str) -> int:
    spec = schedule.spec
    jitter_ms = stable_hash(key) % (spec.jitter_ms + 1) if spec.jitter_ms else 0
    run_at_ms = fire_time_ms + jitter_ms
    if spec.workflow is not None:
        workflow = state.create_workflow(
            spec.workflow,
            key=key,
            schedule=schedule.name,
            fire_time_ms=fire_time_ms,
            run_at_ms=run_at_ms,
        )
        job_id = next(iter(workflow.job_ids.values()))
    else:
        assert spec.job is not None
        job_id = state.create_job(
            spec.job,
            key=key,
            schedule=schedule.name,
            fire_time_ms=fire_time_ms,
            run_at_ms=run_at_ms,
        ).id
    schedule.fires += 1
    schedule.note_fire(fire_time_ms, job_id)
    state.count("fires", schedule.name)
    state.emit(events.FIRED, schedule=schedule.name, fire_time_ms=fire_time_ms, job=job_id)
    return job_id


def job_finished(state: FiringState, job: Job) -> None:
    """A job this schedule created ended: overlap bookkeeping, retention cap, buffered fire."""
    assert job.schedule is not None
    schedule = state.schedules.get(job.schedule)
    if schedule is None or job.id not in schedule.active:
        return  # created by an earlier schedule of the same name, or already accounted
    del schedule.active[job.id]
    finished = schedule.note_finished(job.id)
    while len(finished) > schedule.spec.retain:
        old = state.table.get(finished.popleft())
        if old is not None and old.final and old.id != job.id:
            if state.finalized and upstream.shelter(state, old.id) is not None:
                continue  # a parent its workflow may still read: left to retention
            state.remove_job(old)
    if not schedule.active and schedule.buffered is not None:
        fire_time_ms, manual = schedule.buffered
        schedule.buffered = None
        fire(state, schedule, fire_time_ms, manual=bool(manual), force=True)


def _trigger(state: FiringState, command: TriggerSchedule) -> Result:
    schedule = _get(state, command.name)
    if state.finalized:
        key = parse.manual_fire_key(schedule.name, state.next_job_id)
        need_bytes = sizes.fire_bytes(schedule.spec, key) + answer_bytes(command.request_id, 1)
        refused = retention.check_room(state, need_bytes)
        if refused is not None:
            return refused
    policy = schedule.spec.overlap
    if (
        schedule.active
        and not command.force
        and (policy == "forbid" or (policy == "buffer_one" and schedule.buffered is not None))
    ):
        return Rejected(
            "overlap",
            f"schedule {schedule.name!r} has a run in progress and its overlap policy is "
            f"{policy!r}; "
            "trigger with force to run anyway",
            "name",
        )
    outcome = fire(state, schedule, state.now_ms, manual=True, force=command.force)
    buffered = outcome == BUFFERED
    return Ok({"job_id": None if buffered else outcome, "buffered": buffered})


def _backfill(state: FiringState, command: BackfillSchedule) -> Result:
    schedule = _get(state, command.name)
    # Fire keys created at or before this may be forgotten: a backfill must start after it
    # (a time fires at or before its key is created, so one after it has its key).
    oldest_ms = (state.keys_forgotten_ms if state.finalized
                 else state.now_ms - limits.RETENTION_MS_DEFAULT)
    if command.from_ms <= oldest_ms:
        # Whether an older time fired is no longer known: a fire key is forgotten once it was
        # created at or before now - retention, and a time fires at or before its key's creation.
        reach = (
            f"{(state.now_ms - oldest_ms) // limits.HOUR_MS} hours"
            if state.finalized
            else f"{RETENTION_DAYS} days"
        )
        return Rejected(
            "invalid",
            f"from_ms: a backfill reaches back less than {reach} (from_ms > "
            f"{oldest_ms}), as long as the cluster remembers which times fired",
            "from_ms",
        )
    # Times still to come are the clock's: fired now, a time's key would be created before the
    # time itself, and expire while a backfill may still reach the time (which then fired twice).
    to_ms = min(command.to_ms, state.now_ms + 1)
    times = fire_times_between(
        schedule.spec, command.from_ms - 1, to_ms - 1, limits.BACKFILL_FIRES_MAX + 1
    )
    if len(times) > limits.BACKFILL_FIRES_MAX:
        return Rejected(
            "too_large",
            f"[from_ms, to_ms) holds more than {limits.BACKFILL_FIRES_MAX} fire times; "
            "backfill a shorter range",
            "to_ms",
        )
    if state.finalized:  # all or nothing: room for every time that has not fired
        need = sum(
            sizes.fire_bytes(schedule.spec, parse.fire_key(schedule.name, fire_time_ms))
            for fire_time_ms in times
            if not state.table.remembers_key(parse.fire_key(schedule.name, fire_time_ms))
        )
        need += answer_bytes(command.request_id, len(times))
        refused = retention.check_room(state, need) if need else None
        if refused is not None:
            return refused
    out: list[list[int | bool | None]] = []
    for fire_time_ms in times:
        key = parse.fire_key(schedule.name, fire_time_ms)
        if state.table.remembers_key(key):
            existing = state.table.job_for_key(key)
            out.append([fire_time_ms, None if existing is None else existing.id, False])
        else:
            out.append([fire_time_ms, fire(state, schedule, fire_time_ms, force=True), True])
    return Ok({"fires": out})
