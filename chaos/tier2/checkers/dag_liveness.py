"""Promises 6-8 of CHAOS.md: workflow order, the replicas' final state, and progress.

- `check_dag`: a child is claimed only after its parents completed; a failed parent's
  descendants never run.
- `check_convergence`: every node digested the same state at the same log entry.
- `check_liveness`: a leader soon after the final heal, acked jobs final within the drain
  bound, and no node exited by itself.

With the helpers that measure leadership from the recorded samples (a leader through the
heal, the worst failover).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from raftcron.chaos.tier2.checkers.data import CheckResult, RunData
from raftcron.chaos.tier2.checkers.jobs import _acked_workflows
from raftcron.chaos.tier2.history import RecordedEvent

# Faults during which no node runs: a failover is measured from their end (the restart).
WHOLE_CLUSTER = frozenset({"downtime", "power_all"})

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
    alarms = run.setting("raft_alarms", [])
    for line in alarms:
        result.violate(f"a node logged a Raft alarm: {line}")
    result.counts = {"nodes": len(run.digests), "distinct_states": len(pairs),
                     "raft_alarms": len(alarms)}
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


def _leader_through(history: list[RecordedEvent], at_ms: int) -> int | None:
    """0 if the last sample of some node before at_ms says it leads with quorum and nothing
    after says otherwise."""
    state: dict[str, RecordedEvent] = {}
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
        if event.get("failover_expected") is False:
            continue  # slows the leader's links but must not move it (chaos/tier2/net_faults.py)
        if leader is None or (leader not in event.get("targets", []) and
                              event.get("fault") not in WHOLE_CLUSTER):
            continue
        if event.get("fault") in WHOLE_CLUSTER:
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
