"""The checkers of CHAOS.md: one function per promise, over a recorded run.

Each takes a `RunData` (the harness's history, the final state of every node, the cluster's
event log, the sink's execution log, the run's settings) and returns a `CheckResult` with
counts and violations. Safety checkers gate with zero tolerance; liveness ones have bounds.
None of them may be unable to fail: tests/chaos/test_checkers.py feeds each a bad history.

The modules, each owning one part:

- `data`: `RunData`, `CheckResult` and `FINAL`, which every checker shares.
- `firing`: `check_fires` (exactly-once firing, misfire decisions and their counters,
  coverage) and its oracles `nominal_times` and `expected_plan`.
- `jobs`: `check_lost`, `check_idempotent`, `check_fencing` (fenced completion and effects)
  and `check_rerun` (lease expiry re-runs jobs); `final_evidence`, what the run saw of jobs
  that ended (an evicted job's alibi; the drain reads it too).
- `dag_liveness`: `check_dag` (DAG order), `check_convergence` and `check_liveness`.
- `storage`: `check_storage` (snapshot writers die with their node; damage is refused).
- `disk`: `check_disk_liveness` (leader elections while a node's fsyncs stall, within the
  plan's bound; nodes restarted after a disk fault come back).
- `statetime`: `check_state_time` (no node's state time ahead of the majority's clocks).
- `memory`: `check_memory` (OOM kills only where the nemesis squeezed, each one real).
- `slopes`: `check_slopes` (resources sampled in the endurance run level off) and
  `slopes_table`, the table printed with the report.
- `membership`: `check_membership` (never two leaders in one term; membership changes one at
  a time, a removed node never leads again, every member ends agreeing on the members).
- `network`: `check_sick_network` (leader changes during network sickness, against the
  bound a fault carries: 0 under 50 +- 25 ms of latency).

This package owns `CHECKERS` (every checker, in the order they run and are reported) and
`check_all`, and re-exports the modules' public names, so `chaos.checkers.X` keeps working.

It must not talk to the cluster: everything it judges was collected before.
"""

from __future__ import annotations

from collections.abc import Callable

from raftcron.chaos.tier2.checkers.dag_liveness import check_convergence, check_dag, check_liveness
from raftcron.chaos.tier2.checkers.data import FINAL, VIOLATIONS_LISTED_MAX, CheckResult, RunData
from raftcron.chaos.tier2.checkers.disk import check_disk_liveness
from raftcron.chaos.tier2.checkers.firing import (
    NODE_FAULTS,
    START_SLACK_MS,
    check_fires,
    expected_plan,
    nominal_times,
)
from raftcron.chaos.tier2.checkers.jobs import (
    HISTORY_KEPT,
    check_fencing,
    check_idempotent,
    check_lost,
    check_rerun,
    final_evidence,
)
from raftcron.chaos.tier2.checkers.membership import check_membership
from raftcron.chaos.tier2.checkers.memory import check_memory
from raftcron.chaos.tier2.checkers.network import check_sick_network
from raftcron.chaos.tier2.checkers.slopes import check_slopes, slopes_table
from raftcron.chaos.tier2.checkers.statetime import check_state_time
from raftcron.chaos.tier2.checkers.storage import STORAGE_FAULTS, check_storage

__all__ = [
    "CHECKERS",
    "FINAL",
    "HISTORY_KEPT",
    "NODE_FAULTS",
    "START_SLACK_MS",
    "STORAGE_FAULTS",
    "VIOLATIONS_LISTED_MAX",
    "CheckResult",
    "RunData",
    "check_all",
    "check_convergence",
    "check_dag",
    "check_disk_liveness",
    "check_fencing",
    "check_fires",
    "check_idempotent",
    "check_liveness",
    "check_lost",
    "check_membership",
    "check_memory",
    "check_rerun",
    "check_sick_network",
    "check_slopes",
    "check_state_time",
    "check_storage",
    "expected_plan",
    "final_evidence",
    "nominal_times",
    "slopes_table",
]


CHECKERS: list[Callable[[RunData], CheckResult]] = [
    check_fires,
    check_lost,
    check_idempotent,
    check_fencing,
    check_rerun,
    check_dag,
    check_convergence,
    check_liveness,
    check_storage,
    check_state_time,
    check_membership,
    check_sick_network,
    check_disk_liveness,
    check_memory,
    check_slopes,
]


def check_all(run: RunData) -> list[CheckResult]:
    return [checker(run) for checker in CHECKERS]
