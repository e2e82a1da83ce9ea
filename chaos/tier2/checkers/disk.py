"""Liveness under sick disks (chaos/tier2/disk_faults.py, DESIGN.md §9.3): how many times a
leader was elected while one node's fsyncs stalled, against the bound the plan gave the fault.

A stall's start event carries ``elections_max`` (0 while a follower's disk stalls: a slow
member must not depose a healthy leader; 1 while the leader's does: it may step down once) and
``settle_ms`` (an fsync that began before the heal sleeps out its delay, and the election it
causes comes a little after). Every time a node became leader in [start, end + settle], from
the node logs (`settings["leaders"]`, collected by chaos/tier2/scenarios.py), counts, also a
node elected again in a new term: either way the cluster was without a leader for a while.
A node restarted after a disk fault that did not come back is a violation too. How far the
terms rose meanwhile (the monitor's samples) is reported, not judged: a candidate that never
wins raises it too.
"""

from __future__ import annotations

from typing import Any

from raftcron.chaos.tier2.checkers.data import CheckResult, RunData


def check_disk_liveness(run: RunData) -> CheckResult:
    result = CheckResult("sick disk liveness", safety=False)
    leaders: list[dict[str, Any]] = list(run.setting("leaders", []) or [])
    per_fault: list[str] = []
    worst = {"leader": 0, "follower": 0}
    for start_ms, end_ms, event in run.faults():
        if event.get("elections_max") is None:
            continue
        bound = int(event["elections_max"])
        until_ms = end_ms + int(event.get("settle_ms") or 0)
        elected = [e for e in leaders if start_ms <= int(e["t"]) <= until_ms]
        terms = _highest_term(run, until_ms) - _highest_term(run, start_ms)
        role = str(event.get("role"))
        worst[role] = max(worst.get(role, 0), len(elected))
        delay = (event.get("disk") or {}).get("fsync_delay_s")
        per_fault.append(f"{event.get('id')} {role} {delay}s: {len(elected)}/{bound}, "
                         f"terms +{terms}")
        if len(elected) > bound:
            who = ", ".join(f"{e['node']}@{e['term']}" for e in elected)
            result.violate(f"{event.get('id')}: {len(elected)} leader elections while "
                           f"{'/'.join(event.get('targets') or [])} ({role}) had fsyncs of "
                           f"{delay} s (bound {bound}): {who}")
    restarts = came_back = 0
    for record in run.history:
        if record.get("kind") != "disk_restart":
            continue
        restarts += 1
        if record.get("came_back"):
            came_back += 1
        else:
            result.violate(f"{record.get('id')}: {record.get('node')} did not come back after "
                           f"a restart ({record.get('why')}): {record.get('log_tail')}")
    result.counts = {"stalls": len(per_fault), "worst_leader_stall": worst["leader"],
                     "worst_follower_stall": worst["follower"], "per_stall": per_fault,
                     "restarts": restarts, "came_back": came_back}
    return result


def _highest_term(run: RunData, until_ms: int) -> int:
    return max((int(e.get("term") or 0) for e in run.history
                if e.get("kind") == "sample" and e["t"] <= until_ms), default=0)
