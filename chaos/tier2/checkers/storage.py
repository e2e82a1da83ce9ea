"""Checker 9: the storage faults of CHAOS.md "Wave 2" (chaos/tier2/storage_faults.py and
chaos/tier2/power_faults.py).

A snapshot writer never outlives its node (it would rename a stale snapshot over a newer one
after the node restarted), a node whose data dir was damaged never starts: it exits non-zero
and its log names the damaged file; and a node always comes back after a power cut (a torn last
write is cut at start, never a reason to refuse). Power cuts are counted with what they dropped.
Lost writes and divergence after these faults are judged by the jobs and convergence checkers
like after any other fault.
"""

from __future__ import annotations

from raftcron.chaos.tier2.checkers.data import CheckResult, RunData

STORAGE_FAULTS = frozenset({"kill_main", "term_group", "damage"})


def check_storage(run: RunData) -> CheckResult:
    """A snapshot writer never outlives its node; a damaged data dir is always refused."""
    result = CheckResult("storage faults", safety=True)
    counts = {"kill_main": 0, "term_group": 0, "damage": 0, "writer_seen": 0, "refused": 0}
    for record in run.history:
        if record.get("kind") != "storage_fault":
            continue
        fault = str(record.get("fault"))
        counts[fault] = counts.get(fault, 0) + 1
        if record.get("writer_seen"):
            counts["writer_seen"] += 1
        if record.get("writer_outlived"):
            result.violate(f"{record.get('id')} {fault}: the snapshot writer outlived its node")
        if fault == "damage" and not record.get("skipped"):
            code, named = record.get("exit_code"), record.get("named")
            if code in (None, 0) or not named:
                result.violate(f"{record.get('id')} damage {record.get('how')} of "
                               f"{record.get('file')}: exit {code}, file named in its log: "
                               f"{named}")
            else:
                counts["refused"] += 1
    counts.update(_power(run, result))
    result.counts = counts
    return result


def _power(run: RunData, result: CheckResult) -> dict[str, int]:
    """Counts of the power cuts (`power_cut`, one per node cut) and their restarts."""
    counts = {"power_cuts": 0, "dropped_bytes": 0, "dropped_files": 0, "torn_writes": 0,
              "came_back": 0}
    for record in run.history:
        if record.get("kind") == "power_cut":
            counts["power_cuts"] += 1
            counts["dropped_bytes"] += int(record.get("dirty_bytes") or 0)
            counts["dropped_files"] += int(record.get("dirty_files") or 0)
            counts["torn_writes"] += len(record.get("torn_writes") or [])
        elif record.get("kind") == "power_restart":
            if record.get("came_back"):
                counts["came_back"] += 1
            else:
                result.violate(f"{record.get('id')}: {record.get('node')} did not come back "
                               f"after a power cut (exit {record.get('exit_code')}): "
                               f"{record.get('log_tail')}")
    return counts
