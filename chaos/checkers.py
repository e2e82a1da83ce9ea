"""The checkers of CHAOS.md: one function per promise, over a recorded run.

Each takes a `RunData` (the harness's history, the final state of every node, the cluster's
event log, the sink's execution log, the run's settings) and returns a `CheckResult` with
counts and violations. Safety checkers gate with zero tolerance; liveness ones have bounds.
None of them may be unable to fail: tests/chaos/test_checkers.py feeds each a bad history.

- `check_fires`: at most one job per (schedule, nominal time), only nominal times; every
  misfire decision exactly what the policy says for its window (recomputed here, and the
  windows checked against the recorded downtimes); the schedules' `misfires` and
  `misfire_skipped` counters equal to the sums; coverage (every nominal time fired or
  skipped by a misfire, fires within 3 s outside fault windows, misfires only after faults).
- `check_lost`: every acknowledged submit and workflow present on every node and final.
- `check_idempotent`: one job per key across every acknowledgement and every node.
- `check_fencing`: one accepted completion per job, with its newest token; no stale write
  accepted (stale actor, sink); one applied effect per key; a completed job has its effect;
  every execution ran under a token some committed claim gave (no phantom lease).
- `check_rerun`: a job held by a worker that died or froze is claimed again within the bound.
- `check_dag`: a child is claimed only after its parents completed; a failed parent's
  descendants never run.
- `check_convergence`: every node digested the same state at the same log entry.
- `check_liveness`: a leader soon after the final heal, acked jobs final within the drain
  bound, and no node exited by itself.

It must not talk to the cluster: everything it judges was collected before.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.history import Event

FINAL = frozenset({"succeeded", "failed", "cancelled"})
NODE_FAULTS = frozenset({"kill", "pause", "partition", "downtime", "clock", "force_leader"})
VIOLATIONS_LISTED_MAX = 50
HISTORY_KEPT = 20  # attempts a job's history keeps (scheduler.limits.HISTORY_ATTEMPTS_MAX)


@dataclass
class RunData:
    history: list[Event]
    jobs: dict[str, list[dict[str, Any]]]  # node id -> every job it holds
    schedules: list[dict[str, Any]]
    cluster_events: list[dict[str, Any]]
    digests: dict[str, list[Any]]  # node id -> [log index, digest]
    sink: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    _by_id: dict[int, dict[str, Any]] | None = field(default=None, repr=False)

    def setting(self, name: str, default: Any) -> Any:
        return self.settings.get(name, default)

    def jobs_by_id(self) -> dict[int, dict[str, Any]]:
        """One view per job id (the first node that has it)."""
        if self._by_id is not None:
            return self._by_id
        found: dict[int, dict[str, Any]] = {}
        detailed = sorted(
            self.jobs, key=lambda n: (not any("history" in j for j in self.jobs[n]), n)
        )
        for node in detailed:
            for job in self.jobs[node]:
                found.setdefault(int(job["id"]), job)
        self._by_id = found
        return found

    def faults(self) -> list[tuple[int, int, Event]]:
        """(start_ms, end_ms, start event) of every fault; an unended one ends at the last
        event of the history."""
        last_ms = max((e["t"] for e in self.history), default=0)
        ends = {e["id"]: e["t"] for e in self.history if e["kind"] == "fault"
                and e.get("phase") == "end"}
        return [
            (e["t"], ends.get(e["id"], last_ms), e)
            for e in self.history
            if e["kind"] == "fault" and e.get("phase") == "start"
        ]


@dataclass
class CheckResult:
    name: str
    safety: bool  # safety: any violation fails; liveness: bounded
    violations: list[str] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def violate(self, text: str) -> None:
        if len(self.violations) < VIOLATIONS_LISTED_MAX:
            self.violations.append(text)
        elif len(self.violations) == VIOLATIONS_LISTED_MAX:
            self.violations.append("... (more not listed)")


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
    misfire_groups = 0
    for name, (period_s, policy) in sorted(periods.items()):
        period_ms = int(period_s) * 1000
        groups = _processing_groups(run.cluster_events, name)
        if not groups:
            result.violate(f"{name} never fired")
            continue
        owed: set[int] = set()  # nominal times the policy says must have a job
        caught_up: set[int] = set()  # fired by a misfire tick: late by the policy's design
        skipped_by_policy: set[int] = set()
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
            if sorted(group["fired"]) != fire:
                result.violate(
                    f"{name} tick at {now_ms} (cursor {cursor_ms}, policy {policy}): fired "
                    f"{sorted(group['fired'])}, expected {fire}"
                )
            if group["misfire"] is not None:
                caught_up.update(fire)
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
        first_ms = min(owed | skipped_by_policy, default=0)
        for fire_ms in nominal_times(period_ms, first_ms - 1, horizon_ms):
            if fire_ms in skipped_by_policy:
                if (name, fire_ms) in seen:
                    result.violate(f"{name}@{fire_ms} was skipped by its policy but has a job")
                continue
            expected_total += 1
            if (name, fire_ms) not in seen:
                missed += 1
                result.violate(f"missed fire: {name}@{fire_ms} has no job and was not skipped")
        for (seen_name, fire_ms), job_ids in seen.items():
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
    return sorted(group["fired"]) == fire and numbers == (late, len(fire))


def _start_cursor(view: dict[str, Any] | None, first: dict[str, Any], period_ms: int,
                  grace_ms: int, policy: str) -> int:
    """Where a schedule's cursor started: at the first tick after its creation, which the
    event log does not show. Between `created_ms` and that tick at most one tick's worth of
    nominal times may have passed (they are not owed); the candidate that explains the first
    decision is taken, created_ms when none does (and the first decision is then reported)."""
    if view is None or view.get("created_ms") is None:
        return first["fired"][0] - 1 if first["fired"] else int(first["now_ms"])
    created_ms = int(view["created_ms"])
    candidates = [created_ms, *nominal_times(period_ms, created_ms, created_ms + START_SLACK_MS)]
    for cursor_ms in candidates:
        if _matches(first, cursor_ms, period_ms, grace_ms, policy):
            return cursor_ms
    return created_ms


def _processing_groups(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The ticks that processed a schedule: its fired/misfired events grouped by (time, run of
    consecutive seq), oldest first."""
    groups: list[dict[str, Any]] = []
    for event in sorted(events, key=lambda e: int(e.get("seq", 0))):
        if event.get("schedule") != name or event.get("kind") not in ("fired", "misfired"):
            continue
        now_ms = int(event["time_ms"])
        if not groups or groups[-1]["now_ms"] != now_ms:
            groups.append({"now_ms": now_ms, "fired": [], "misfire": None})
        group = groups[-1]
        if event["kind"] == "fired":
            group["fired"].append(int(event["fire_time_ms"]))
        else:
            group["misfire"] = event
    return groups


def _downtimes(history: list[Event]) -> list[tuple[int, int]]:
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


# -- 2. no lost job, 3. idempotent submit --------------------------------------------------


def _acked_submits(history: list[Event]) -> dict[str, set[int]]:
    acked: dict[str, set[int]] = defaultdict(set)
    for event in history:
        if event["kind"] == "submit" and event.get("op") == "ok":
            acked[event["key"]].add(int(event["job_id"]))
    return acked


def _acked_workflows(history: list[Event]) -> list[Event]:
    return [e for e in history if e["kind"] == "workflow" and e.get("op") == "ok"]


def check_lost(run: RunData) -> CheckResult:
    result = CheckResult("no lost job", safety=True)
    acked = _acked_submits(run.history)
    expected: dict[int, str] = {}
    for key, job_ids in acked.items():
        for job_id in job_ids:
            expected[job_id] = f"submit {key}"
    for event in _acked_workflows(run.history):
        for name, job_id in event["jobs"].items():
            expected[int(job_id)] = f"workflow {event['key']}/{name}"
    invoked = {e["key"] for e in run.history if e["kind"] == "submit"}
    info_keys = {e["key"] for e in run.history if e["kind"] == "submit" and e.get("op") == "info"}
    lost = not_final = 0
    for node, jobs in sorted(run.jobs.items()):
        held = {int(job["id"]): job for job in jobs}
        for job_id, what in sorted(expected.items()):
            job = held.get(job_id)
            if job is None:
                lost += 1
                result.violate(f"lost: {what} (job {job_id}) acknowledged, absent on {node}")
            elif job.get("status") not in FINAL:
                not_final += 1
                result.violate(f"{what} (job {job_id}) still {job.get('status')} on {node}")
        for job in jobs:
            job_key = job.get("key")
            if (
                job.get("schedule") is None
                and job.get("workflow_id") is None
                and job_key is not None
                and job_key not in invoked
            ):
                result.violate(f"unexpected job {job['id']} with key {job_key!r} on {node}")
    final_keys = {job.get("key") for jobs in run.jobs.values() for job in jobs}
    result.counts = {
        "acknowledged": len(expected),
        "lost": lost,
        "not_final": not_final,
        "indeterminate": len(info_keys),
        "recovered": len(info_keys & final_keys),
    }
    return result


def check_idempotent(run: RunData) -> CheckResult:
    result = CheckResult("idempotent submit", safety=True)
    acked = _acked_submits(run.history)
    retries = 0
    for key, job_ids in sorted(acked.items()):
        if len(job_ids) > 1:
            result.violate(f"key {key!r} acknowledged with different jobs {sorted(job_ids)}")
    first_ok: dict[str, int] = {}
    for event in run.history:
        if event["kind"] != "submit" or event.get("op") != "ok":
            continue
        if event.get("retry"):
            retries += 1
            if event["key"] in first_ok and event.get("created"):
                result.violate(f"key {event['key']!r} retried and answered as a new job")
        first_ok.setdefault(event["key"], int(event["job_id"]))
    for node, jobs in sorted(run.jobs.items()):
        by_key: dict[str, list[int]] = defaultdict(list)
        for job in jobs:
            if job.get("key") is not None:
                by_key[job["key"]].append(int(job["id"]))
        for key, held in sorted(by_key.items()):
            if len(held) > 1:
                result.violate(f"{node} holds {len(held)} jobs with key {key!r}: {held}")
            if key in acked and set(held) != acked[key]:
                result.violate(f"{node}: key {key!r} is job {held}, acknowledged as "
                               f"{sorted(acked[key])}")
    result.counts = {"keys": len(acked), "retried": retries}
    return result


# -- 4. fenced completion and effects ------------------------------------------------------


def check_fencing(run: RunData) -> CheckResult:
    result = CheckResult("fenced completion and effects", safety=True)
    jobs = run.jobs_by_id()
    for job_id, job in sorted(jobs.items()):
        attempts = job.get("history") or []
        won = [a for a in attempts if a.get("outcome") == "succeeded"]
        if len(won) > 1:
            result.violate(f"job {job_id} completed {len(won)} times: {[a['token'] for a in won]}")
        if job.get("status") == "succeeded" and won:
            newest = max(int(a["token"]) for a in attempts)
            if int(won[0]["token"]) != newest:
                result.violate(
                    f"job {job_id} completed with token {won[0]['token']}, its newest is {newest}"
                )
    rejected = accepted = indeterminate = 0
    for event in run.history:
        if event["kind"] != "stale" or event.get("op") == "invoke":
            continue
        stale = int(event["token"]) < int(event["newest_token"])
        if event["op"] == "ok" and stale:
            accepted += 1
            result.violate(
                f"stale {event['action']} accepted: job {event['job_id']} token {event['token']} "
                f"(newest {event['newest_token']})"
            )
        elif event["op"] == "fail":
            rejected += 1
        elif event["op"] == "info":
            indeterminate += 1
        target = jobs.get(int(event["job_id"]))
        if target is not None and stale and event.get("action") == "complete":
            won = [a for a in target.get("history") or [] if a.get("outcome") == "succeeded"]
            if any(int(a["token"]) == int(event["token"]) for a in won) and event["op"] != "fail":
                result.violate(f"job {event['job_id']} completed by the stale token "
                               f"{event['token']}")
    applied: dict[str, list[int]] = defaultdict(list)
    newest_seen: dict[int, int] = {}
    sink_rejected = 0
    executions: dict[int, int] = defaultdict(int)
    for row in run.sink:
        job_id, token, phase = int(row["job_id"]), int(row["token"]), row["phase"]
        if phase == "start":
            executions[job_id] += 1
        if phase == "stale":
            sink_rejected += 1
        if phase in ("applied", "duplicate"):
            if token < newest_seen.get(job_id, 0):
                result.violate(f"the sink accepted token {token} for job {job_id} after "
                               f"seeing {newest_seen[job_id]}")
            newest_seen[job_id] = max(token, newest_seen.get(job_id, 0))
        if phase == "applied":
            applied[str(row["key"])].append(job_id)
    phantom = 0
    for row in run.sink:  # every execution must come from a claim the log kept (no phantom)
        claimed = jobs.get(int(row["job_id"]))
        if row["phase"] != "start" or claimed is None or "history" not in claimed:
            continue
        tokens = {int(a["token"]) for a in claimed["history"]}
        if int(row["token"]) not in tokens and len(claimed["history"]) < HISTORY_KEPT:
            phantom += 1
            result.violate(f"job {row['job_id']} ran under token {row['token']}, which no "
                           f"committed claim gave (attempts: {sorted(tokens)})")
    for key, job_ids in sorted(applied.items()):
        if len(job_ids) > 1:
            result.violate(f"effect applied {len(job_ids)} times for key {key!r}")
    task = run.setting("task", "chaos.effect")
    for job_id, job in sorted(jobs.items()):
        if job.get("status") == "succeeded" and job.get("task") == task:
            key = job.get("key") or f"job-{job_id}"
            if not applied.get(str(key)):
                result.violate(f"job {job_id} ({key}) succeeded without an applied effect")
    result.counts = {
        "stale_rejected": rejected + sink_rejected,
        "stale_accepted": accepted,
        "stale_indeterminate": indeterminate,
        "effects": sum(len(v) for v in applied.values()),
        "executions": sum(executions.values()),
        "re_executions": sum(max(0, n - 1) for n in executions.values()),
        "phantom_claims": phantom,
    }
    return result


# -- 5. lease expiry re-runs jobs ----------------------------------------------------------


def check_rerun(run: RunData) -> CheckResult:
    """A job whose worker died, froze or was cut off is claimed again within the bound of the
    later of the fault and the last leader change before the re-run: a new leader gives every
    existing lease one more lease period (DESIGN.md section 3), so the clock restarts there.
    The raw delay from the fault is reported too."""
    result = CheckResult("lease re-run bound", safety=False)
    bound_ms = int(run.setting("rerun_bound_s", 10) * 1000)
    jobs = run.jobs_by_id()
    leader_changes = sorted(
        int(e["time_ms"]) for e in run.cluster_events if e.get("kind") == "leader_changed"
    )
    worst_ms = worst_anchored_ms = cases = 0
    for start, _end, event in run.faults():
        if event.get("fault") not in ("worker_kill", "worker_pause", "worker_cut"):
            continue
        worker = event["targets"][0]
        for job_id, token in _held(run, worker, start):
            job = jobs.get(job_id)
            attempts = [] if job is None else job.get("history") or []
            mine = [a for a in attempts if int(a["token"]) == token]
            if mine and mine[0].get("outcome") in ("succeeded", "failed"):
                continue  # its ack made it before the fault: nothing to re-run
            later = [
                r["t_ms"] for r in run.sink
                if int(r["job_id"]) == job_id and int(r["token"]) > token and r["phase"] == "start"
            ]
            cases += 1
            if not later:
                if job is None or job.get("status") not in FINAL:
                    result.violate(f"job {job_id} held by {worker} (token {token}) at "
                                   f"{event['fault']} was never claimed again")
                continue
            rerun_ms = min(later)
            anchor_ms = max([start, *(t for t in leader_changes if t < rerun_ms)])
            worst_ms = max(worst_ms, rerun_ms - start)
            worst_anchored_ms = max(worst_anchored_ms, rerun_ms - anchor_ms)
            if rerun_ms - anchor_ms > bound_ms:
                result.violate(
                    f"job {job_id} held by {worker} re-run {rerun_ms - start} ms after "
                    f"{event['fault']}, {rerun_ms - anchor_ms} ms after the fault or the last "
                    f"leader change (bound {bound_ms} ms)"
                )
    result.counts = {"cases": cases, "worst_rerun_ms": worst_ms,
                     "worst_after_last_leader_change_ms": worst_anchored_ms}
    return result


def _held(run: RunData, worker: str, at_ms: int) -> list[tuple[int, int]]:
    """(job, token) pairs the worker's current process had started and not finished at at_ms
    (per the sink); executions of an earlier, killed process of the same name do not count."""
    started = [e["t"] for e in run.history if e["kind"] == "worker" and e.get("op") == "start"
               and e.get("name") == worker and e["t"] <= at_ms]
    since_ms = max(started, default=0)
    held: dict[tuple[int, int], int] = {}
    for row in run.sink:
        if row["t_ms"] > at_ms:
            break
        if row["worker"] != worker or row["t_ms"] < since_ms:
            continue
        ident = (int(row["job_id"]), int(row["token"]))
        if row["phase"] == "start":
            held[ident] = row["t_ms"]
        else:
            held.pop(ident, None)
    return sorted(held)


# -- 6. DAG order --------------------------------------------------------------------------


def check_dag(run: RunData) -> CheckResult:
    result = CheckResult("DAG order", safety=True)
    jobs = run.jobs_by_id()
    starts: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in run.sink:
        if row["phase"] == "start":
            starts[int(row["job_id"])].append(row)
    edges_checked = workflows = 0
    for event in _acked_workflows(run.history):
        workflows += 1
        ids = {name: int(job_id) for name, job_id in event["jobs"].items()}
        for child, parents in sorted(event.get("edges", {}).items()):
            for parent in parents:
                edges_checked += 1
                p_id, c_id = ids[parent], ids[child]
                p_job, c_job = jobs.get(p_id), jobs.get(c_id)
                if p_job is None or c_job is None:
                    continue  # check_lost reports it
                c_attempts = c_job.get("history") or []
                c_ran = bool(c_attempts) or bool(starts.get(c_id))
                where = f"{event['key']}: {parent}({p_id}) -> {child}({c_id})"
                if p_job.get("status") in ("failed", "cancelled"):
                    if c_ran:
                        result.violate(f"{where}: child ran though its parent ended "
                                       f"{p_job.get('status')}")
                    if c_job.get("status") != "cancelled":
                        result.violate(f"{where}: child is {c_job.get('status')}, not cancelled")
                    continue
                if not c_ran:
                    continue
                if p_job.get("status") != "succeeded":
                    result.violate(f"{where}: child ran, parent is {p_job.get('status')}")
                    continue
                finished = p_job.get("finished_ms")
                if c_attempts and finished is not None and c_attempts[0]["start_ms"] < finished:
                    result.violate(f"{where}: child claimed at {c_attempts[0]['start_ms']}, "
                                   f"before its parent completed at {finished}")
                won = [a for a in p_job.get("history") or [] if a.get("outcome") == "succeeded"]
                p_runs = [r for r in starts.get(p_id, []) if won and r["token"] == won[0]["token"]]
                c_first = min((r["t_ms"] for r in starts.get(c_id, [])), default=None)
                if p_runs and c_first is not None and c_first < p_runs[0]["t_ms"]:
                    result.violate(f"{where}: child started at {c_first}, before the parent's "
                                   f"completing run started at {p_runs[0]['t_ms']}")
    result.counts = {"workflows": workflows, "edges": edges_checked}
    return result


# -- 7. convergence, 8. liveness -----------------------------------------------------------


def check_convergence(run: RunData) -> CheckResult:
    result = CheckResult("convergence", safety=True)
    nodes = run.setting("nodes", 3)
    if len(run.digests) < nodes:
        result.violate(f"only {sorted(run.digests)} of {nodes} nodes digested the final audit")
    pairs = {(int(index), str(digest)) for index, digest in run.digests.values()}
    if len(pairs) > 1:
        result.violate(f"replicas differ at the final audit: {run.digests}")
    result.counts = {"nodes": len(run.digests), "distinct_states": len(pairs)}
    return result


def check_liveness(run: RunData) -> CheckResult:
    result = CheckResult("liveness", safety=False)
    leader_bound_ms = int(run.setting("leader_bound_s", 5) * 1000)
    drain_bound_ms = int(run.setting("drain_bound_s", 60) * 1000)
    healed = [e["t"] for e in run.history if e["kind"] == "phase" and e.get("name") == "healed"]
    leader_ms = None
    if healed:
        for event in run.history:
            if (
                event["kind"] == "sample"
                and event["t"] >= healed[-1]
                and event.get("role") == "leader"
                and event.get("has_quorum")
            ):
                leader_ms = event["t"] - healed[-1]
                break
        # a leader that led through the heal is reported once: find the latest one before
        if leader_ms is None:
            leader_ms = _leader_through(run.history, healed[-1])
        if leader_ms is None or leader_ms > leader_bound_ms:
            result.violate(f"no leader within {leader_bound_ms} ms of the final heal "
                           f"(got {leader_ms})")
    drained = [e for e in run.history if e["kind"] == "phase" and e.get("name") == "drained"]
    if drained and (
        drained[-1].get("remaining", 0) or drained[-1].get("elapsed_ms", 0) > drain_bound_ms
    ):
        result.violate(f"acknowledged jobs not final {drained[-1].get('elapsed_ms')} ms "
                       f"after the heal: {drained[-1].get('remaining')} left")
    for event in run.history:
        if event["kind"] == "note" and event.get("crash"):
            result.violate(f"a node exited by itself: {event.get('text')}")
    worst = _worst_failover(run)
    result.counts = {"leader_after_heal_ms": leader_ms, "worst_failover_ms": worst}
    return result


def _leader_through(history: list[Event], at_ms: int) -> int | None:
    """0 if the last sample of some node before at_ms says it leads with quorum and nothing
    after says otherwise."""
    state: dict[str, Event] = {}
    for event in history:
        if event["kind"] == "sample":
            state[event["node"]] = event
    if any(e.get("role") == "leader" and e.get("has_quorum") for e in state.values()):
        return 0
    return None


def _worst_failover(run: RunData) -> int | None:
    """Per fault that hit the leader: fault start to the first sample of a leader with quorum
    in a newer term. The largest, in ms (None if none applied)."""
    worst: int | None = None
    samples = [e for e in run.history if e["kind"] == "sample"]
    for start, _end, event in run.faults():
        leader = event.get("leader")
        if leader is None or (leader not in event.get("targets", []) and
                              event.get("fault") != "downtime"):
            continue
        if event.get("fault") == "downtime":
            start = _end  # measured from the restart: nothing can lead while all are down
        terms = [s.get("term") or 0 for s in samples if s["t"] <= start and s.get("term")]
        term = max(terms, default=0)
        for sample in samples:
            if (
                sample["t"] > start
                and sample.get("role") == "leader"
                and sample.get("has_quorum")
                and (sample.get("term") or 0) > term
            ):
                delay = sample["t"] - start
                worst = delay if worst is None else max(worst, delay)
                break
    return worst


CHECKERS: list[Callable[[RunData], CheckResult]] = [
    check_fires,
    check_lost,
    check_idempotent,
    check_fencing,
    check_rerun,
    check_dag,
    check_convergence,
    check_liveness,
]


def check_all(run: RunData) -> list[CheckResult]:
    return [checker(run) for checker in CHECKERS]
