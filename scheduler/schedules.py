"""A schedule's replicated record and the pure decision of which fire times to fire.

The fire cursor (`cursor_ms`: every nominal time at or before it has been dealt with) lives in
the replicated state, so a new leader resumes exactly where the old one stopped and a time is
never fired twice. `plan_fires` turns "the cursor is here, the time is now" into the times to
fire and the times skipped, by the misfire policy:

- a time is *late* (misfired) when it is more than `misfire_grace_ms` behind now;
- no late time: every due time fires (normally one);
- `fire_once`: one run, for the latest due time; `fire_all`: every due time, the newest
  `max_catchup` of them; `skip`: only the times still within the grace.

Creating the jobs (and the overlap policy) is the state machine's part.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import msgpack

from raftcron.scheduler import calendar, limits
from raftcron.scheduler.schedulespec import ScheduleSpec


class Schedule:
    __slots__ = (
        "active",
        "buffered",
        "created_ms",
        "cursor_ms",
        "finished",
        "fires",
        "misfire_skipped",
        "misfires",
        "misfires_state_full",
        "misfires_truncated",
        "name",
        "next_fire_ms",
        "overlap_skipped",
        "paused",
        "recent_fires",
        "spec",
        "spec_bytes",
        "updated_ms",
    )

    def __init__(self, name: str, spec: ScheduleSpec, now_ms: int,
                 spec_bytes: int | None = None) -> None:
        self.name = name
        self.spec = spec
        # The encoded size of its spec, for the memory model (scheduler/sizes.py).
        self.spec_bytes = spec_wire_bytes(spec) if spec_bytes is None else spec_bytes
        self.created_ms = now_ms
        self.updated_ms = now_ms
        self.paused = spec.paused
        self.cursor_ms = now_ms  # times at or before the cursor are never fired by the clock
        self.next_fire_ms: int | None = None
        self.fires = 0  # fire times that created work (clock, trigger and backfill)
        self.misfires = 0  # due times found more than the grace late
        self.misfire_skipped = 0  # due times not fired because of the misfire policy
        self.misfires_truncated = False  # an outage too long to count every missed time
        self.overlap_skipped = 0  # fires skipped because an earlier run was still active
        self.misfires_state_full = 0  # fires refused for want of room (state budget)
        # (fire_time_ms, job id), newest last. A list, and `finished` is made on first use: an
        # empty deque costs 624 bytes, two of them were most of a schedule's memory.
        self.recent_fires: list[tuple[int, int]] = []
        self.active: dict[int, None] = {}  # unfinished jobs this schedule created
        self.buffered: tuple[int, int] | None = None  # (fire_time_ms, 1 if manual): buffer_one
        self.finished: deque[int] | None = None  # finished job ids, oldest first, for `retain`

    def note_fire(self, fire_time_ms: int, job_id: int) -> None:
        self.recent_fires.append((fire_time_ms, job_id))
        if len(self.recent_fires) > limits.RECENT_FIRES_KEPT:
            del self.recent_fires[0]

    def note_finished(self, job_id: int) -> deque[int]:
        """Record a finished run; the finished ids, oldest first."""
        if self.finished is None:
            self.finished = deque()
        self.finished.append(job_id)
        return self.finished

    def due_after(self, after_ms: int) -> int | None:
        return next_fire_ms(self.spec, after_ms)


def next_fire_ms(spec: ScheduleSpec, after_ms: int) -> int | None:
    """The first fire time after after_ms within the schedule's start/end bounds."""
    if spec.start_at_ms is not None:
        after_ms = max(after_ms, spec.start_at_ms - 1)
    fire_ms = calendar.next_fire_ms(spec.recurrence, spec.zone, after_ms)
    end_ms = (
        limits.TIME_MS_MAX if spec.end_at_ms is None else min(spec.end_at_ms, limits.TIME_MS_MAX)
    )
    if fire_ms is None or fire_ms > end_ms:
        return None
    return fire_ms


def _bounds(spec: ScheduleSpec, after_ms: int, until_ms: int) -> tuple[int, int]:
    """(after_ms, until_ms] narrowed to the schedule's start/end bounds."""
    if spec.start_at_ms is not None:
        after_ms = max(after_ms, spec.start_at_ms - 1)
    until_ms = min(until_ms, limits.TIME_MS_MAX)
    if spec.end_at_ms is not None:
        until_ms = min(until_ms, spec.end_at_ms)
    return after_ms, until_ms


def fire_times_between(spec: ScheduleSpec, after_ms: int, until_ms: int, limit: int) -> list[int]:
    """Fire times in (after_ms, until_ms] within the schedule's bounds, oldest first."""
    after_ms, until_ms = _bounds(spec, after_ms, until_ms)
    if until_ms <= after_ms:
        return []
    return calendar.fire_times_ms(spec.recurrence, spec.zone, after_ms, until_ms, limit)


def count_fire_times(spec: ScheduleSpec, after_ms: int, until_ms: int) -> int | None:
    """How many fire times lie in (after_ms, until_ms] within the bounds, without listing
    them; None where only listing can tell (see calendar.count_fire_times_ms)."""
    after_ms, until_ms = _bounds(spec, after_ms, until_ms)
    if until_ms <= after_ms:
        return 0
    return calendar.count_fire_times_ms(spec.recurrence, spec.zone, after_ms, until_ms)


@dataclass(frozen=True, slots=True)
class FirePlan:
    fire: list[int]  # times to fire, oldest first
    late: int  # due times past the grace (counted as misfires)
    skipped: int  # due times not fired
    truncated: bool  # more times were due than FIRE_SCAN_MAX: `late` and `skipped` are lower bounds


def plan_fires(spec: ScheduleSpec, cursor_ms: int, now_ms: int) -> FirePlan:
    """Which due times in (cursor_ms, now_ms] to fire, by the misfire policy."""
    grace_cutoff_ms = now_ms - spec.misfire_grace_ms
    # The usual Tick has one time due (or none): listing two tells it apart from a backlog
    # without the cost of counting, which only a backlog pays.
    due = fire_times_between(spec, cursor_ms, now_ms, 2)
    if len(due) < 2:
        return _choose(
            spec,
            due,
            sum(1 for t in due if t < grace_cutoff_ms),
            len(due),
            grace_cutoff_ms,
            truncated=False,
        )
    due_count = count_fire_times(spec, cursor_ms, now_ms)
    if due_count is not None and due_count > limits.FIRE_LIST_MAX:
        # A long outage of a frequent schedule: count the missed times, list only the newest.
        late = count_fire_times(spec, cursor_ms, grace_cutoff_ms - 1)  # the times < the cutoff
        if late is not None:
            # List only what the policy can fire: fire_once one time, skip those in the grace.
            wanted = spec.max_catchup
            if late and spec.misfire == "fire_once":
                wanted = 1
            elif late and spec.misfire == "skip":
                wanted = min(wanted, due_count - late)
            newest = newest_fire_times(spec, cursor_ms, now_ms, wanted) if wanted else []
            return _choose(spec, newest, late, due_count, grace_cutoff_ms, truncated=False)
    due = fire_times_between(spec, cursor_ms, now_ms, limits.FIRE_SCAN_MAX)
    truncated = False
    uncounted = 0
    if len(due) == limits.FIRE_SCAN_MAX:
        following = next_fire_ms(spec, due[-1])
        if following is not None and following <= now_ms:
            # Too many to count (a fixed-time cron across a DST change: listing only): the
            # oldest FIRE_SCAN_MAX times were counted; the newest are found by a window search.
            truncated = True
            uncounted = len(due)
            due = newest_fire_times(spec, due[-1], now_ms, spec.max_catchup)
    late = sum(1 for t in due if t < grace_cutoff_ms) + uncounted
    return _choose(spec, due, late, len(due) + uncounted, grace_cutoff_ms, truncated)


def _choose(
    spec: ScheduleSpec,
    due: list[int],
    late: int,
    due_count: int,
    grace_cutoff_ms: int,
    truncated: bool,
) -> FirePlan:
    """The misfire policy over the due times (`due`: all of them, or at least the newest
    `max_catchup`), `late` of the `due_count` in all being past the grace."""
    if late == 0:
        fire = due[-spec.max_catchup :]
    elif spec.misfire == "fire_once":
        fire = due[-1:]
    elif spec.misfire == "fire_all":
        fire = due[-spec.max_catchup :]
    else:  # skip
        fire = [t for t in due if t >= grace_cutoff_ms][-spec.max_catchup :]
    return FirePlan(fire=fire, late=late, skipped=due_count - len(fire), truncated=truncated)


def newest_fire_times(spec: ScheduleSpec, after_ms: int, until_ms: int, count: int) -> list[int]:
    """The newest `count` fire times in (after_ms, until_ms]: the narrowest window ending at
    until_ms that holds them is found by counting (doubling, then halving), and listed once."""
    low_ms, span_ms = 0, limits.SECOND_MS
    found = count_fire_times(spec, max(after_ms, until_ms - span_ms), until_ms)
    for _ in range(64):  # doubling from a second reaches any span in time
        if found is None:
            return _newest_by_listing(spec, after_ms, until_ms, count)
        if found >= count or until_ms - span_ms <= after_ms:
            break
        low_ms, span_ms = span_ms, span_ms * 2
        found = count_fire_times(spec, max(after_ms, until_ms - span_ms), until_ms)
    for _ in range(64):  # halving the last step: a window that holds about `count`
        if found is None or found <= limits.FIRE_LIST_MAX or span_ms - low_ms <= 1:
            break
        middle_ms = (low_ms + span_ms) // 2
        in_middle = count_fire_times(spec, max(after_ms, until_ms - middle_ms), until_ms)
        if in_middle is not None and in_middle >= count:
            span_ms, found = middle_ms, in_middle
        else:
            low_ms = middle_ms
    start_ms = max(after_ms, until_ms - span_ms)
    return fire_times_between(spec, start_ms, until_ms, limits.FIRE_SCAN_MAX)[-count:]


def _newest_by_listing(spec: ScheduleSpec, after_ms: int, until_ms: int, count: int) -> list[int]:
    """newest_fire_times where counting cannot tell: listing a widening window."""
    span_ms = max(spec.misfire_grace_ms, limits.SECOND_MS)
    for _ in range(64):
        start_ms = max(after_ms, until_ms - span_ms)
        times = fire_times_between(spec, start_ms, until_ms, limits.FIRE_SCAN_MAX)
        if len(times) >= count or start_ms == after_ms:
            return times[-count:]
        if len(times) == limits.FIRE_SCAN_MAX:
            # Too dense to widen further; the newest of what fits is the best answer.
            return times[-count:]
        span_ms *= 2
    return []


def schedule_snapshot(schedule: Schedule, wires: dict[int, Any] | None = None) -> list[Any]:
    """A schedule's snapshot row. `wires`: the spec wires built so far in this snapshot, by
    the spec's identity: schedules put from one template share one spec (`schedule_restore`),
    and building its wire once, not once per schedule, took a snapshot of 100,000 schedules
    of 1,440 specs from 1.09 s to 0.02 s (the bytes are the same)."""
    spec_wire = None if wires is None else wires.get(id(schedule.spec))
    if spec_wire is None:
        spec_wire = schedule.spec.to_wire()
        if wires is not None:
            wires[id(schedule.spec)] = spec_wire
    return [
        schedule.name,
        spec_wire,
        schedule.created_ms,
        schedule.updated_ms,
        schedule.paused,
        schedule.cursor_ms,
        schedule.next_fire_ms,
        schedule.fires,
        schedule.misfires,
        schedule.misfire_skipped,
        schedule.misfires_truncated,
        schedule.overlap_skipped,
        [list(f) for f in schedule.recent_fires],
        None if schedule.buffered is None else list(schedule.buffered),
        list(schedule.finished or ()),
        # Since finalizing (scheduler/gate.py) only; written only when set, so a state that
        # never refused a fire writes the rows the previous release reads.
        *([schedule.misfires_state_full] if schedule.misfires_state_full else []),
    ]


def schedule_restore(
    data: list[Any], specs: dict[bytes, ScheduleSpec] | None = None
) -> Schedule:
    """A schedule from its snapshot row. `specs`: the specs parsed so far in this restore, by
    their wire bytes: a spec is a frozen value, so schedules put from one template share one
    (parsing and checking a spec is 90% of a schedule's restore; 100,000 schedules of 1,440
    specs took 2.25 s)."""
    extra = data[_ROW_FIELDS:]
    (
        name,
        spec_wire,
        created_ms,
        updated_ms,
        paused,
        cursor_ms,
        next_fire,
        fires,
        misfires,
        misfire_skipped,
        truncated,
        overlap_skipped,
        recent,
        buffered,
        finished,
    ) = data[:_ROW_FIELDS]
    packed = msgpack.packb(spec_wire, use_bin_type=True)
    if specs is None:
        spec = ScheduleSpec.from_wire(spec_wire)
    else:
        found = specs.get(packed)
        spec = specs[packed] = ScheduleSpec.from_wire(spec_wire) if found is None else found
    schedule = Schedule(name, spec, created_ms, len(packed))
    schedule.updated_ms = updated_ms
    schedule.paused = paused
    schedule.cursor_ms = cursor_ms
    schedule.next_fire_ms = next_fire
    schedule.fires = fires
    schedule.misfires = misfires
    schedule.misfire_skipped = misfire_skipped
    schedule.misfires_truncated = truncated
    schedule.overlap_skipped = overlap_skipped
    schedule.recent_fires.extend((f[0], f[1]) for f in recent[-limits.RECENT_FIRES_KEPT :])
    schedule.buffered = None if buffered is None else (buffered[0], buffered[1])
    schedule.finished = deque(finished) if finished else None
    if extra:
        schedule.misfires_state_full = extra[0]
    return schedule


_ROW_FIELDS = 15  # a schedule's row as the previous release writes it; later fields follow


def spec_wire_bytes(spec: ScheduleSpec) -> int:
    """The encoded size of a schedule's spec: what its record counts beyond a fixed overhead."""
    return len(msgpack.packb(spec.to_wire(), use_bin_type=True))
