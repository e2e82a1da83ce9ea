"""Promise 1 of CHAOS.md, exactly-once firing, and its oracles.

- `check_fires`: at most one job per (schedule, nominal time), only nominal times; every
  misfire decision exactly what the policy says for its window (recomputed here, and the
  windows checked against the recorded downtimes); the schedules' `misfires`,
  `misfire_skipped` and `misfires_state_full` counters equal to the sums; coverage (every
  nominal time fired, skipped by a misfire or refused for space, fires within 3 s outside
  fault windows, misfires only after faults).

A time refused for space (the state at its budget, DESIGN.md §9.1) is a `misfired` event with
`"reason": "state_full"` and its `fire_time_ms`, in the tick that decided to fire it: that time
has no job, which is not a missing fire; the tick's decision is what it fired plus what it
refused. A time both fired and refused is a violation, and a duplicate is still a duplicate.

The oracles it recomputes the decisions with, written independently of scheduler/:
`nominal_times` (the times a schedule owes) and `expected_plan` (a tick's misfire decision);
with the helpers that read ticks and downtime windows out of the recorded run.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from raftcron.chaos.tier2.checkers.data import CheckResult, RunData
from raftcron.chaos.tier2.history import RecordedEvent

STATE_FULL = "state_full"  # the reason of a misfired event for a time refused for space
NODE_FAULTS = frozenset({"kill", "pause", "partition", "downtime", "clock", "force_leader",
                         "kill_main", "term_group", "damage",
                         "power_one", "power_majority", "power_all"})


# -- 1. exactly-once firing ----------------------------------------------------------------


def nominal_times(period_ms: int, after_ms: int, until_ms: int) -> list[int]:
    """Multiples of period_ms in (after_ms, until_ms]: the oracle for `*/N * * * * *` in UTC."""
    first = (after_ms // period_ms + 1) * period_ms
    return list(range(first, until_ms + 1, period_ms)) if first <= until_ms else []


def expected_plan(
    due: list[int], now_ms: int, grace_ms: int, policy: str, max_catchup: int
) -> tuple[list[int], int, int]:
    """(times to fire, late count, skipped count) for due times at a tick at now_ms, written
    from DESIGN.md section 3, independently of scheduler/."""
    cutoff = now_ms - grace_ms
    late = sum(1 for t in due if t < cutoff)
    if late == 0 or policy == "fire_all":
        fire = due[-max_catchup:]
    elif policy == "fire_once":
        fire = due[-1:]
    else:
        fire = [t for t in due if t >= cutoff][-max_catchup:]
    return fire, late, len(due) - len(fire)


def _fire_observations(run: RunData) -> dict[tuple[str, int], set[int]]:
    """(schedule, fire time) -> every job id seen for it: on any node, in the event log, in
    the sink."""
    seen: dict[tuple[str, int], set[int]] = defaultdict(set)
    periods = run.setting("schedules", {})
    for jobs in run.jobs.values():
        for job in jobs:
            if job.get("schedule") in periods and job.get("fire_time_ms") is not None:
                if str(job.get("key", "")).startswith(f"{job['schedule']}@manual"):
                    continue
                seen[(job["schedule"], int(job["fire_time_ms"]))].add(int(job["id"]))
    for event in run.cluster_events:
        if event.get("kind") == "fired" and event.get("schedule") in periods:
            seen[(event["schedule"], int(event["fire_time_ms"]))].add(int(event["job"]))
    for row in run.sink:
        name, at, time_text = str(row.get("key") or "").partition("@")
        if at and name in periods and time_text.isdigit():
            seen[(name, int(time_text))].add(int(row["job_id"]))
    return seen


def _excused(run: RunData, at_ms: int, after_s: float) -> bool:
    """Whether at_ms falls in a node fault window (extended by after_s and the clock skew)."""
    skew_ms = int(run.setting("clock_skew_s", 0) * 1000)
    for start, end, event in run.faults():
        if event.get("fault") in NODE_FAULTS and (
            start - skew_ms - 1000 <= at_ms <= end + int(after_s * 1000) + skew_ms
        ):
            return True
    return False


def check_fires(run: RunData) -> CheckResult:
    result = CheckResult("exactly-once firing", safety=True)
    periods: dict[str, list[Any]] = run.setting("schedules", {})
    grace_ms = int(run.setting("grace_ms", 8000))
    horizon_ms = int(run.setting("horizon_ms", 0))
    lateness_ms_max = int(run.setting("fire_lateness_ms_max", 3000))
    seen = _fire_observations(run)
    duplicated = 0
    for (name, fire_ms), job_ids in sorted(seen.items()):
        period_ms = int(periods[name][0]) * 1000
        if len(job_ids) > 1:
            duplicated += 1
            result.violate(f"duplicate fire: {name}@{fire_ms} has jobs {sorted(job_ids)}")
        if fire_ms % period_ms:
            result.violate(f"{name} fired {fire_ms}, which is not a nominal time")
    if run.cluster_events and int(run.cluster_events[0].get("seq", 1)) > 1:
        result.violate("the cluster's event log wrapped: misfire decisions cannot be checked")
    schedules = {s["name"]: s for s in run.schedules}
    downtimes = _downtimes(run.history)
    jobs = run.jobs_by_id()
    expected_total = seen_total = missed = late_fires = unexplained = 0
    misfire_groups = refused_total = 0
    for name, (period_s, policy) in sorted(periods.items()):
        period_ms = int(period_s) * 1000
        groups = _processing_groups(run.cluster_events, name)
        if not groups:
            result.violate(f"{name} never fired")
            continue
        owed: set[int] = set()  # nominal times the policy says must have a job
        caught_up: set[int] = set()  # fired by a misfire tick: late by the policy's design
        skipped_by_policy: set[int] = set()
        refused: set[int] = set()  # decided, then refused for space: no job, by design
        refusals = 0
        misfires = skipped = 0
        view = schedules.get(name)
        cursor_ms = _start_cursor(view, groups[0], period_ms, grace_ms, policy)
        for group in groups:
            now_ms = group["now_ms"]
            due = nominal_times(period_ms, cursor_ms, now_ms)
            fire, late, skip = expected_plan(due, now_ms, grace_ms, policy, 100)
            if group["misfire"] is not None:
                misfire_groups += 1
                event = group["misfire"]
                if int(event.get("missed", -1)) != late or int(event.get("fired", -1)) != len(fire):
                    result.violate(
                        f"{name} misfire at {now_ms} (cursor {cursor_ms}): reported missed="
                        f"{event.get('missed')} fired={event.get('fired')}, the policy says "
                        f"missed={late} fired={len(fire)} of due {due}"
                    )
                if not _excused(run, now_ms, after_s=grace_ms / 1000 + 15):
                    unexplained += 1
                    result.violate(f"{name} misfired at {now_ms} with no fault to explain it")
            elif late:
                result.violate(
                    f"{name}: a tick at {now_ms} fired late times {due} without a misfire event"
                )
            for fire_ms in sorted(set(group["fired"]) & set(group["refused"])):
                result.violate(f"{name}@{fire_ms} both fired and refused for space by the "
                               f"tick at {now_ms}")
            if sorted(group["fired"] + group["refused"]) != fire:
                result.violate(
                    f"{name} tick at {now_ms} (cursor {cursor_ms}, policy {policy}): fired "
                    f"{sorted(group['fired'])}, refused for space {sorted(group['refused'])}, "
                    f"expected {fire}"
                )
            if group["misfire"] is not None:
                caught_up.update(fire)
            refused.update(group["refused"])
            refusals += len(group["refused"])
            misfires += late
            skipped += skip
            owed.update(fire)
            skipped_by_policy.update(set(due) - set(fire))
            cursor_ms = now_ms
        _check_downtime_windows(result, name, groups, downtimes, period_ms, grace_ms)
        if view is not None:
            if int(view.get("misfires", -1)) != misfires:
                result.violate(
                    f"{name}: misfires counter {view.get('misfires')}, expected {misfires}"
                )
            if int(view.get("misfire_skipped", -1)) != skipped:
                result.violate(
                    f"{name}: misfire_skipped counter {view.get('misfire_skipped')}, expected "
                    f"{skipped}"
                )
            if int(view.get("misfires_state_full", 0)) != refusals:
                result.violate(
                    f"{name}: misfires_state_full counter {view.get('misfires_state_full')}, "
                    f"expected {refusals} (the state_full refusals in the event log)"
                )
        refused_total += refusals
        first_ms = min(owed | skipped_by_policy, default=0)
        for fire_ms in nominal_times(period_ms, first_ms - 1, horizon_ms):
            if fire_ms in skipped_by_policy:
                if (name, fire_ms) in seen:
                    result.violate(f"{name}@{fire_ms} was skipped by its policy but has a job")
                continue
            if fire_ms in refused:
                continue  # no job by design; one that has a job is reported below
            expected_total += 1
            if (name, fire_ms) not in seen:
                missed += 1
                result.violate(f"missed fire: {name}@{fire_ms} has no job and was not skipped")
        for (seen_name, fire_ms), job_ids in seen.items():
            if seen_name == name and fire_ms in refused:
                result.violate(f"{name}@{fire_ms} was refused for space but has job(s) "
                               f"{sorted(job_ids)}")
            if seen_name != name or fire_ms > horizon_ms:
                continue
            seen_total += 1
            if fire_ms not in owed:
                result.violate(f"{name}@{fire_ms} has job(s) {sorted(job_ids)}, but no decision "
                               "in the log fired it")
            for job_id in job_ids:
                job = jobs.get(job_id) if len(job_ids) == 1 else None
                created = None if job is None else job.get("created_ms")
                if (
                    created is not None
                    and fire_ms not in caught_up
                    and created - fire_ms > lateness_ms_max
                    and not _excused(run, fire_ms, after_s=10)
                ):
                    late_fires += 1
                    result.violate(
                        f"late fire: {name}@{fire_ms} created {created - fire_ms} ms late "
                        "outside any fault window"
                    )
    result.counts = {
        "expected": expected_total,
        "seen": seen_total,
        "duplicated": duplicated,
        "missed": missed,
        "late": late_fires,
        "misfire_ticks": misfire_groups,
        "refused": refused_total,
        "unexplained_misfires": unexplained,
        "downtimes": len(downtimes),
    }
    return result


START_SLACK_MS = 2_000  # a new schedule starts at the first tick after its creation


def _matches(group: dict[str, Any], cursor_ms: int, period_ms: int, grace_ms: int,
             policy: str) -> bool:
    due = nominal_times(period_ms, cursor_ms, group["now_ms"])
    fire, late, _ = expected_plan(due, group["now_ms"], grace_ms, policy, 100)
    event = group["misfire"]
    numbers = (0, len(fire)) if event is None else (int(event["missed"]), int(event["fired"]))
    return sorted(group["fired"] + group["refused"]) == fire and numbers == (late, len(fire))


def _start_cursor(view: dict[str, Any] | None, first: dict[str, Any], period_ms: int,
                  grace_ms: int, policy: str) -> int:
    """Where a schedule's cursor started: at the first tick after its creation, which the
    event log does not show. Between `created_ms` and that tick at most one tick's worth of
    nominal times may have passed (they are not owed); the candidate that explains the first
    decision is taken, created_ms when none does (and the first decision is then reported)."""
    if view is None or view.get("created_ms") is None:
        decided = sorted(first["fired"] + first["refused"])
        return decided[0] - 1 if decided else int(first["now_ms"])
    created_ms = int(view["created_ms"])
    candidates = [created_ms, *nominal_times(period_ms, created_ms, created_ms + START_SLACK_MS)]
    for cursor_ms in candidates:
        if _matches(first, cursor_ms, period_ms, grace_ms, policy):
            return cursor_ms
    return created_ms


def _processing_groups(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The ticks that processed a schedule: its fired/misfired events grouped by (time, run of
    consecutive seq), oldest first. A group's `misfire` is the policy's decision (a late tick);
    `refused` holds the times it decided to fire that were refused for space (state_full)."""
    groups: list[dict[str, Any]] = []
    for event in sorted(events, key=lambda e: int(e.get("seq", 0))):
        if event.get("schedule") != name or event.get("kind") not in ("fired", "misfired"):
            continue
        now_ms = int(event["time_ms"])
        if not groups or groups[-1]["now_ms"] != now_ms:
            groups.append({"now_ms": now_ms, "fired": [], "misfire": None, "refused": []})
        group = groups[-1]
        if event["kind"] == "fired":
            group["fired"].append(int(event["fire_time_ms"]))
        elif event.get("reason") == STATE_FULL:
            group["refused"].append(int(event["fire_time_ms"]))
        else:
            group["misfire"] = event
    return groups


def _downtimes(history: list[RecordedEvent]) -> list[tuple[int, int]]:
    down: dict[str, int] = {}
    windows = []
    for event in history:
        if event["kind"] != "downtime":
            continue
        if event.get("phase") == "down":
            down[event["id"]] = event["t"]
        elif event.get("phase") == "up" and event["id"] in down:
            windows.append((down.pop(event["id"]), event["t"]))
    return windows


def _check_downtime_windows(
    result: CheckResult,
    name: str,
    groups: list[dict[str, Any]],
    downtimes: list[tuple[int, int]],
    period_ms: int,
    grace_ms: int,
) -> None:
    """The recorded outage bounds the decisive tick: its cursor is before the cluster went
    down, its time after it came up; every nominal time inside the outage is then in its due
    set, and an outage longer than the grace must show as a misfire with at least the times
    that were already past the grace when the cluster came back."""
    for down_ms, up_ms in downtimes:
        previous = [g for g in groups if g["now_ms"] <= down_ms]
        after = [g for g in groups if g["now_ms"] > down_ms]
        if not previous or not after:
            continue
        first = after[0]
        if first["now_ms"] < up_ms:
            result.violate(f"{name}: a tick at {first['now_ms']} while every node was down "
                           f"({down_ms}..{up_ms})")
        inside = nominal_times(period_ms, down_ms, up_ms - 1)
        surely_late = [t for t in inside if t < up_ms - grace_ms]
        if surely_late:
            event = first["misfire"]
            if event is None or int(event.get("missed", 0)) < len(surely_late):
                result.violate(
                    f"{name}: outage {down_ms}..{up_ms} left {len(surely_late)} times past the "
                    f"grace, but the first tick after it reported "
                    f"{None if event is None else event.get('missed')} missed"
                )
