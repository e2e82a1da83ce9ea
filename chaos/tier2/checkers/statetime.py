"""The state's time follows the majority's clocks (DESIGN.md §8.2): no node's applied state
time is ever ahead of the harness's clock by more than `max_skew_ms`.

The harness runs on the nodes' machine with an honest clock, and the clock nemesis skews at
most a minority at once, so the harness's clock is the majority's. The monitor records every
reading of a node's state time that was ahead of it (`state_time` events,
chaos/tier2/clientload.py); a reading is taken before its event's `t`, so lateness of the
monitor only makes it look further behind. Behind is not judged here: during downtime the
state's time stands still (coverage and misfires are the firing checker's).
"""

from __future__ import annotations

from raftcron.chaos.tier2.checkers.data import CheckResult, RunData
from raftcron.cluster.config import ClockSettings

MAX_SKEW_MS_DEFAULT = ClockSettings.max_skew_ms  # what the chaos nodes run with


def check_state_time(run: RunData) -> CheckResult:
    result = CheckResult("state time", safety=True)
    bound_ms = int(run.setting("max_skew_ms", MAX_SKEW_MS_DEFAULT))
    readings = worst_ms = 0
    worst_node = None
    for event in run.history:
        if event["kind"] != "state_time":
            continue
        readings += 1
        ahead_ms = int(event["now_ms"]) - int(event["t"])
        if ahead_ms > worst_ms:
            worst_ms, worst_node = ahead_ms, event.get("node")
        if ahead_ms > bound_ms:
            result.violate(f"{event.get('node')}'s state time {event['now_ms']} was {ahead_ms} ms "
                           f"ahead of the majority's clocks at {event['t']} (bound {bound_ms} ms)")
    result.counts = {"readings": readings, "worst_ahead_ms": worst_ms, "worst_node": worst_node}
    return result
