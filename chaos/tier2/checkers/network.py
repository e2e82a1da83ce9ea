"""Checker 12: a sick network does not change the leader where it should not (CHAOS.md
"Wave 3": latency of 50 +- 25 ms between nodes is a regression guard of 0 leader changes).

A fault whose start event carries `leader_changes_max` (chaos/tier2/net_faults.py) is held to
it: the times a node became leader (`settings["leaders"]`, read from the node logs as
scenarios.py `_leaders` does) between the fault's start and end are counted. Every other
network sickness (stall, loss, reset) is only counted, per kind, for the report.
"""

from __future__ import annotations

from collections import Counter

from raftcron.chaos.tier2.checkers.data import CheckResult, RunData

SICK_FAULTS = frozenset({"latency", "stall", "loss", "reset"})


def check_sick_network(run: RunData) -> CheckResult:
    """Leader changes during each network sickness; a bounded one over its bound fails."""
    result = CheckResult("sick network", safety=False)
    elected = sorted(int(leader["t"]) for leader in run.setting("leaders", []))
    changes: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    for start_ms, end_ms, event in run.faults():
        kind = str(event.get("fault"))
        if kind not in SICK_FAULTS:
            continue
        faults[kind] += 1
        during = sum(1 for t in elected if start_ms <= t <= end_ms)
        changes[kind] += during
        bound = event.get("leader_changes_max")
        if bound is not None and during > int(bound):
            result.violate(f"{event.get('id')} {kind} {event.get('delay_ms')} +- "
                           f"{event.get('jitter_ms')} ms: {during} leader changes in "
                           f"{(end_ms - start_ms) / 1000:.1f} s (bound {bound})")
    result.counts = {"faults": dict(faults), "leader_changes": dict(changes)}
    return result
