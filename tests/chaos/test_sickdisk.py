"""The sickdisk scenario (chaos/tier2/disk_faults.py) and its liveness checker.

The checker tests are unit tests on recorded runs: elections while a node's fsyncs stall are
counted against the bound the plan put in the fault (0 for a follower, 1 for the leader), and a
node that did not come back after a disk fault's restart fails it.

The smoke (processes tier) runs `raftcron chaos run --scenario sickdisk --minutes 0`: one pass
of every disk fault on powerfs mounts, about a minute. It asserts that every safety checker
passes and that each fault was injected and bit (powerfs counted stalled fsyncs and errors).
The leader-election bound is the product's contract (DESIGN.md §9.3), asserted too: before
PreVote and the sync thread (cluster/consensus/prevote.py, cluster/storage/syncworker.py) a
follower's stall cost one election or more, a leader's two.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from raftcron.chaos.powerfs.harness import fuse_unavailable_reason
from raftcron.chaos.tier2 import history
from raftcron.chaos.tier2.checkers import RunData, check_disk_liveness
from raftcron.chaos.tier2.netns import leftover_namespaces

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 240
T0 = 1_800_000_000_000


def _stall(
    fault_id: str, role: str, start_ms: int, end_ms: int, bound: int,
) -> list[dict[str, Any]]:
    start = {"t": start_ms, "kind": "fault", "phase": "start", "id": fault_id,
             "fault": "fsync_stall", "targets": ["n2"], "role": role, "elections_max": bound,
             "settle_ms": 3_000, "disk": {"fsync_delay_s": 2.0}}
    end = {"t": end_ms, "kind": "fault", "phase": "end", "id": fault_id, "fault": "fsync_stall"}
    return [start, end]


def _run(events: list[dict[str, Any]], leaders: list[dict[str, Any]]) -> RunData:
    return RunData(history=events, jobs={}, schedules=[], cluster_events=[], digests={},
                   sink=[], settings={"leaders": leaders})


def test_elections_during_a_follower_stall_fail_the_bound_of_zero() -> None:
    events = _stall("f1", "follower", T0, T0 + 5_000, 0)
    events += [{"t": T0 - 10, "kind": "sample", "node": "n2", "term": 2},  # the monitor's
               {"t": T0 + 6_000, "kind": "sample", "node": "n2", "term": 4}]
    elected = [{"node": "n3", "term": 4, "t": T0 + 7_000}]  # within the settle time
    result = check_disk_liveness(_run(events, elected))
    assert not result.ok
    assert "1 leader elections while n2 (follower)" in result.violations[0]
    assert result.counts["per_stall"] == ["f1 follower 2.0s: 1/0, terms +2"]


def test_one_election_during_a_leader_stall_is_within_its_bound_and_two_are_not() -> None:
    events = _stall("f1", "leader", T0, T0 + 5_000, 1)
    once = [{"node": "n1", "term": 3, "t": T0 + 1_000}]
    assert check_disk_liveness(_run(events, once)).ok
    twice = [*once, {"node": "n3", "term": 4, "t": T0 + 4_000}]
    result = check_disk_liveness(_run(events, twice))
    assert not result.ok and result.counts["worst_leader_stall"] == 2


def test_elections_outside_a_stall_and_its_settle_time_are_not_counted() -> None:
    events = _stall("f1", "follower", T0, T0 + 5_000, 0)
    elected = [{"node": "n1", "term": 2, "t": T0 - 1}, {"node": "n3", "term": 3,
                                                       "t": T0 + 8_001}]
    result = check_disk_liveness(_run(events, elected))
    assert result.ok and result.counts["worst_follower_stall"] == 0


def test_a_node_that_did_not_come_back_after_a_disk_restart_fails() -> None:
    events = [{"t": T0, "kind": "disk_restart", "id": "f4", "node": "n2", "why": "fsync failed",
               "came_back": False, "log_tail": "cannot start"}]
    result = check_disk_liveness(_run(events, []))
    assert not result.ok and "did not come back" in result.violations[0]


@pytest.mark.processes
@pytest.mark.timeout(SMOKE_TIMEOUT_S + 30)
def test_the_sickdisk_smoke_injects_every_disk_fault_and_stays_safe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    reason = fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(f"FUSE cannot be mounted here: {reason}")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "raftcron.chaos", "run", "--scenario", "sickdisk",
         "--minutes", "0", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False,
    )
    elapsed = time.monotonic() - started
    print(done.stdout)
    print(done.stderr[-4000:], file=sys.stderr)
    # 0: every checker passed; 2: only a liveness bound was missed; 1: safety or the harness
    assert done.returncode == 0, f"sickdisk failed (exit {done.returncode}):\n{done.stdout}"
    [folder] = list(tmp_path.glob("*/sickdisk"))
    results = json.loads((folder / "results.json").read_text())
    assert results["error"] is None
    unsafe = [r for r in results["results"] if r["safety"] and not r["ok"]]
    assert unsafe == []
    assert results["faults"] == {"fsync_stall": 2, "write_eio": 1, "fsync_eio": 1,
                                 "read_eio": 1, "read_only": 1}
    events = history.load(folder / "history.jsonl")
    healed = {e["id"]: e.get("injected", {}) for e in events
              if e["kind"] == "disk_fault" and e.get("op") == "healed"}
    starts = [e for e in events if e["kind"] == "fault" and e.get("phase") == "start"]
    bit = {"fsync_stall": "fsync_delays", "write_eio": "write_errors",
           "fsync_eio": "fsync_errors", "read_eio": "read_errors",
           "read_only": "read_only_refusals"}
    for start in starts:
        assert healed[start["id"]].get(bit[start["fault"]], 0) > 0, (start, healed)
    assert {s["role"] for s in starts if s["fault"] == "fsync_stall"} == {"leader", "follower"}
    restarts = [e for e in events if e["kind"] == "disk_restart"]
    assert {r["why"].split(":")[0] for r in restarts} >= {"fsync failed", "after failing reads"}
    assert all(r["came_back"] for r in restarts)
    disk = next(r for r in results["results"] if r["name"] == "sick disk liveness")
    with capsys.disabled():
        print(f"\nsickdisk in {elapsed:.0f} s: leader elections per stall (seen/bound): "
              f"{disk['counts']['per_stall']}")
    assert disk["ok"], disk
    if os.geteuid() == 0 and shutil.which("ip"):
        assert leftover_namespaces() == []
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", "processes of the sickdisk run are still alive"
    with open("/proc/self/mountinfo") as mounts:
        assert str(tmp_path) not in mounts.read(), "a powerfs mount of the run is left"
