"""Promises 2-5 of CHAOS.md: what happens to a job once it exists.

- `check_lost`: every acknowledged submit and workflow present on every node, live or
  archived, in the final status the run saw (without an archive: or evicted once final, with
  evidence, within the evictions the cluster counted); a submit or workflow refused with a
  definite error (4xx, 507 `state_full`) created nothing.
- `check_idempotent`: one job per key across every acknowledgement and every node.
- `check_fencing`: one accepted completion per job, with its newest token; no stale write
  accepted (stale actor, sink); one applied effect per key; a completed job has its effect;
  every execution ran under a token some committed claim gave (no phantom lease).
- `check_rerun`: a job held by a worker that died or froze is claimed again within the bound.

With the helpers that read acknowledged submits and workflows, the evidence that a job was
final (`final_evidence`), and the jobs a worker held, out of the recorded run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from raftcron.chaos.tier2.checkers.data import FINAL, CheckResult, RunData
from raftcron.chaos.tier2.history import RecordedEvent

HISTORY_KEPT = 20  # attempts a job's history keeps (scheduler.limits.HISTORY_ATTEMPTS_MAX)
STATE_FULL_STATUS = 507  # a submit refused for space: definite, nothing created
# The sink phases a worker writes when the cluster answered "ok" to an ack that ended its job
# (chaos/tier2/workload.py): a success, or a failure it must not retry.
ACKED_PHASES = {"acked_succeeded": "succeeded", "acked_failed": "failed"}


# -- 2. no lost job, 3. idempotent submit --------------------------------------------------


# The faults that take a worker away from the jobs it holds (a lease then has to run out).
WORKER_FAULTS = ("worker_kill", "worker_pause", "worker_cut")


def _acked_submits(history: list[RecordedEvent]) -> dict[str, set[int]]:
    acked: dict[str, set[int]] = defaultdict(set)
    for event in history:
        if event["kind"] == "submit" and event.get("op") == "ok":
            acked[event["key"]].add(int(event["job_id"]))
    return acked


def _acked_workflows(history: Sequence[RecordedEvent]) -> list[RecordedEvent]:
    return [e for e in history if e["kind"] == "workflow" and e.get("op") == "ok"]


def evictions(run: RunData) -> int:
    """Finished jobs the cluster evicted during the run, whatever the reason (`usage.evicted`
    of GET /v1/settings at the end; 0 when the run did not collect it)."""
    usage = run.setting("usage", None) or {}
    return sum(int(count) for count in (usage.get("evicted") or {}).values())


def definite_failure(event: RecordedEvent) -> bool:
    """A submit or workflow the cluster answered with an error that says nothing was created:
    a 4xx, or 507 `state_full` (a 5xx the client does not retry may be indeterminate)."""
    status = event.get("status")
    return (event.get("op") == "fail" and isinstance(status, int)
            and (400 <= status < 500 or status == STATE_FULL_STATUS))


def final_evidence(
    history: Sequence[RecordedEvent], sink: Sequence[dict[str, Any]],
    cluster_events: Sequence[dict[str, Any]] = (),
) -> dict[int, str]:
    """Job id -> the final status the run saw it reach (or "final" when it does not say which),
    from what was recorded while it ran:
    - `final` events of the history: the observer's reads, the flood consumer's accepted acks,
      the harness's accepted cancels, reads that settled an ack whose answer was lost;
    - the sink's `acked_*` rows: a worker's ack the cluster answered "ok" that ended the job;
    - `dead_lettered` events of the cluster's log (the job failed for good);
    - a job of an acknowledged workflow whose ancestor is known to have ended failed or
      cancelled (its descendants were cancelled by the same command).
    """
    seen: dict[int, str] = {}
    for event in history:
        if event["kind"] == "final":
            seen.setdefault(int(event["job_id"]), str(event.get("status") or "final"))
    for row in sink:
        status = ACKED_PHASES.get(str(row.get("phase")))
        if status is not None:
            seen.setdefault(int(row["job_id"]), status)
    for event in cluster_events:
        if event.get("kind") == "dead_lettered" and event.get("job") is not None:
            seen.setdefault(int(event["job"]), "failed")
    for event in _acked_workflows(history):
        ids = {name: int(job_id) for name, job_id in event["jobs"].items()}
        edges: dict[str, list[str]] = event.get("edges") or {}
        changed = True
        while changed:
            changed = False
            for child, parents in edges.items():
                if ids.get(child) in seen or child not in ids:
                    continue
                if any(seen.get(ids.get(p, -1)) in ("failed", "cancelled") for p in parents):
                    seen[ids[child]] = "cancelled"
                    changed = True
    return seen


def check_lost(run: RunData) -> CheckResult:
    """Every acknowledged submit and workflow job is on every node at the end, final: live, or
    archived once it left the state (`"archived": true`, DESIGN.md §9.2), and in the final
    status the run saw it reach, when it saw one (`final_evidence`).

    With the archive on (the run's `archive` setting: every member keeps what leaves its
    state), an acknowledged job a node holds neither live nor archived is lost, whatever the
    evidence: eviction is no excuse, and neither is a leader's snapshot the node installed
    (it fills from a peer what the entries it skipped removed; the final read waits for that,
    then reads each node's own archive). In a scenario that evicts (`evicting`: a low
    retention or a small budget) at least one acknowledged job must be found archived on
    every node, or this check proved nothing about the archive.

    Without the archive (`[storage] archive = false`), the rule of budgets: an acknowledged job
    absent at the end is excused only when the cluster counted evictions (`usage.evicted` at
    the end) AND the run has evidence that the job was final before it left; and on each node
    the excused jobs are no more than the evictions counted. An absent job never seen final is
    lost; with no eviction counted, an absent job is lost whatever the evidence.

    Refused submits: a submit or workflow answered with a definite error (`definite_failure`:
    4xx, 507 `state_full`) created nothing, so no job may hold its key, unless the key was
    acknowledged by another submit (then `check_idempotent` judges which job holds it).
    """
    result = CheckResult("no lost job", safety=True)
    expected = _expected_jobs(run.history)
    invoked = {e["key"] for e in run.history if e["kind"] == "submit"}
    info_keys = {e["key"] for e in run.history if e["kind"] == "submit" and e.get("op") == "info"}
    archive = bool(run.setting("archive", False))
    evicted_total = evictions(run)
    evidence = final_evidence(run.history, run.sink, run.cluster_events)
    held_by = {node: {int(job["id"]): job for job in jobs} for node, jobs in run.jobs.items()}
    lost = not_final = altered = excused_max = 0
    archived_min: int | None = None
    for node, held in sorted(held_by.items()):
        excused = archived = 0
        for job_id, what in sorted(expected.items()):
            job = held.get(job_id)
            if job is None and not archive and evicted_total and job_id in evidence:
                excused += 1  # evicted once final (counted against the evictions below)
            elif job is None:
                lost += 1
                why = (", live and archived" if archive
                       else ", never seen final" if evicted_total else "")
                result.violate(f"lost: {what} (job {job_id}) acknowledged, absent on {node}{why}")
            elif job.get("status") not in FINAL:
                not_final += 1
                result.violate(f"{what} (job {job_id}) still {job.get('status')} on {node}")
            else:
                archived += job.get("archived") is True
                seen = evidence.get(job_id)
                if seen in FINAL and seen != job["status"]:
                    altered += 1
                    result.violate(f"{what} (job {job_id}) ended {seen} as the run saw it, "
                                   f"{job['status']} on {node}"
                                   + (" (archived)" if job.get("archived") else ""))
        _check_keys(run.jobs[node], node, invoked, result)
        if excused > evicted_total:
            result.violate(f"{node}: {excused} acknowledged jobs absent once final, but the "
                           f"cluster counted only {evicted_total} evictions")
        excused_max = max(excused_max, excused)
        archived_min = archived if archived_min is None else min(archived_min, archived)
    if archive and run.setting("evicting", False) and expected and not archived_min:
        result.violate("the scenario evicts, yet some node holds no acknowledged job archived: "
                       "nothing was read back from its archive")
    refused, refused_created = _check_refused(run, result)
    final_keys = {job.get("key") for jobs in run.jobs.values() for job in jobs}
    result.counts = {
        "acknowledged": len(expected),
        "lost": lost,
        "not_final": not_final,
        "altered": altered,
        "indeterminate": len(info_keys),
        "recovered": len(info_keys & final_keys),
        "refused": refused,
        "refused_created": refused_created,
        "evictions": evicted_total,
        "evicted_acknowledged": excused_max,
        "archived_acknowledged": archived_min or 0,
    }
    return result


def _expected_jobs(history: list[RecordedEvent]) -> dict[int, str]:
    """Every acknowledged submit's and workflow's job: id -> what acknowledged it."""
    expected: dict[int, str] = {}
    for key, job_ids in _acked_submits(history).items():
        for job_id in job_ids:
            expected[job_id] = f"submit {key}"
    for event in _acked_workflows(history):
        for name, job_id in event["jobs"].items():
            expected[int(job_id)] = f"workflow {event['key']}/{name}"
    return expected


def _check_keys(jobs: list[dict[str, Any]], node: str, invoked: set[str],
                result: CheckResult) -> None:
    """No job holds a client key no submit was made with (a schedule's and a workflow's jobs
    carry keys of their own)."""
    for job in jobs:
        job_key = job.get("key")
        if (
            job.get("schedule") is None
            and job.get("workflow_id") is None
            and job_key is not None
            and job_key not in invoked
        ):
            result.violate(f"unexpected job {job['id']} with key {job_key!r} on {node}")


def _check_refused(run: RunData, result: CheckResult) -> tuple[int, int]:
    """(submits and workflows refused for space, refused ones that created a job anyway)."""
    failed: dict[str, int] = {}
    acked_keys: set[str] = set()
    refused = 0
    for event in run.history:
        if event["kind"] not in ("submit", "workflow"):
            continue
        if event.get("op") == "ok":
            acked_keys.add(event["key"])
        elif definite_failure(event):
            failed.setdefault(event["key"], int(event["status"]))
            refused += event["status"] == STATE_FULL_STATUS
    created = 0
    for node, jobs in sorted(run.jobs.items()):
        for job in jobs:
            key = job.get("key")
            if key in failed and key not in acked_keys:
                created += 1
                result.violate(f"refused submit created a job: {key!r} was answered "
                               f"{failed[key]}, job {job['id']} holds it on {node}")
    return refused, created


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
    existing lease one more lease period (DESIGN.md section 3), so the clock restarts there;
    so does a fault on a worker the job went to meanwhile, while it held it (`_refaulted`).
    The raw delay from the fault is reported too. A job gone at the end (evicted for space)
    that the run saw final is not judged: its attempts left with it."""
    result = CheckResult("lease re-run bound", safety=False)
    bound_ms = int(run.setting("rerun_bound_s", 10) * 1000)
    jobs = run.jobs_by_id()
    evidence = final_evidence(run.history, run.sink, run.cluster_events) if evictions(run) else {}
    leader_changes = sorted(
        int(e["time_ms"]) for e in run.cluster_events if e.get("kind") == "leader_changed"
    )
    worker_faults = [(start, end, event) for start, end, event in run.faults()
                     if event.get("fault") in WORKER_FAULTS]
    worst_ms = worst_anchored_ms = cases = 0
    for start, _end, event in worker_faults:
        worker = event["targets"][0]
        for job_id, token in _held(run, worker, start):
            job = jobs.get(job_id)
            if job is None and job_id in evidence:
                continue
            attempts = [] if job is None else job.get("history") or []
            mine = [a for a in attempts if int(a["token"]) == token]
            if mine and mine[0].get("outcome") in ("succeeded", "failed"):
                continue  # its ack made it before the fault: nothing to re-run
            later = [  # (started at, token) of the attempts after the held one
                (r["t_ms"], int(r["token"])) for r in run.sink
                if int(r["job_id"]) == job_id and int(r["token"]) > token and r["phase"] == "start"
            ]
            cases += 1
            if not later:
                if job is None or job.get("status") not in FINAL:
                    result.violate(f"job {job_id} held by {worker} (token {token}) at "
                                   f"{event['fault']} was never claimed again")
                continue
            rerun_ms, rerun_token = min(later)
            anchor_ms = max([start, *(t for t in leader_changes if t < rerun_ms),
                             *_refaulted(worker_faults, token, rerun_token, rerun_ms, attempts)])
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


def _refaulted(worker_faults: list[tuple[int, int, RecordedEvent]], token: int, rerun_token: int,
               rerun_ms: int, attempts: list[dict[str, Any]]) -> list[int]:
    """Starts of faults on the workers the job went to between the held attempt and the one
    that re-ran it: a worker paused, cut off or killed while holding the new lease (found
    in the 120-minute run: w1, restarted after its kill, claimed the job again 5.0 s after
    it and was paused 7 ms before that claim applied) makes it wait out one more lease, so
    the re-run is judged from that fault, as from the first one. `rerun_token`: the attempt
    that re-ran it."""
    starts = []
    for attempt in attempts:
        if not token < int(attempt["token"]) < rerun_token:
            continue
        claimed_ms, ended_ms = int(attempt["start_ms"]), attempt.get("end_ms") or rerun_ms
        for fault_start, fault_end, event in worker_faults:
            if (attempt.get("worker") in event["targets"]
                    and fault_start <= int(ended_ms) and fault_end >= claimed_ms):
                starts.append(fault_start)
    return starts


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
