"""The memory nemesis (chaos/tier2/memory_faults.py) and its checker (checkers/memory.py).

A node in a small cgroup is OOM-killed for real (its main process dies of SIGKILL mid-snapshot
and the cgroup's `oom_kill` count moves), the harness records it, the node comes back with a
raised limit holding every job it acknowledged, and the cgroups are gone afterwards; a node
whose state budget sits below its limit survives a flood that keeps the state at the budget
while snapshots are forced. The checker fails an OOM kill outside a squeeze and a squeeze that
killed nothing. The nodes run on loopback (the relay); the cgroups need root and cgroup v1.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from raftcron.chaos.tier2.checkers import RunData, check_memory
from raftcron.chaos.tier2.flood import Flood
from raftcron.chaos.tier2.history import History
from raftcron.chaos.tier2.memory_faults import (
    CGROUP_ROOT,
    JOIN,
    NODE_LIMIT_BYTES,
    STATE_BUDGET_BYTES,
    MemoryCluster,
    MemoryGroups,
    cgroups_possible,
    oom_kill,
    oom_restart,
    remove_leftover_groups,
)
from raftcron.chaos.tier2.nemesis import ADMIN, SUBMIT, Nemesis, wait_until
from raftcron.chaos.tier2.netns import Relay
from raftcron.chaos.tier2.storage_faults import STORAGE_RAFT

MIB = 1 << 20
START_MS = 1_800_000_000_000
LOAD_EVERY_S = 0.05
LOAD_SUBMITS_MAX = 2_000
FLOOD_S = 35.0


def _run(history: list[dict[str, Any]]) -> RunData:
    return RunData(history=history, jobs={}, schedules=[], cluster_events=[], digests={},
                   sink=[])


def _squeeze(start_ms: int, end_ms: int, **outcome: Any) -> list[dict[str, Any]]:
    fields = {"killed_by_sigkill": True, "oom_kills_moved": 1, "exit_code": -9,
              "mid_snapshot": True, "writer_alive_at_kill": True, "limit_bytes": 70 * MIB,
              **outcome}
    return [
        {"kind": "fault", "phase": "start", "id": "f1", "fault": "oom", "targets": ["n2"],
         "t": start_ms},
        {"kind": "oom", "node": "n2", "t": start_ms + 300, "oom_kills": 1,
         "limit_bytes": 70 * MIB, "max_usage_bytes": 90 * MIB, "main_alive": False},
        {"kind": "oom_fault", "id": "f1", "node": "n2", "t": start_ms + 400, **fields},
        {"kind": "fault", "phase": "end", "id": "f1", "fault": "oom", "targets": ["n2"],
         "t": end_ms},
    ]


def test_an_oom_kill_inside_a_squeeze_that_killed_the_main_process_passes() -> None:
    result = check_memory(_run(_squeeze(START_MS, START_MS + 5_000)))
    assert result.ok, result.violations
    assert result.counts["main_oom_killed"] == 1 and result.counts["oom_kills"] == 1


def test_an_oom_kill_outside_any_squeeze_fails() -> None:
    stray = {"kind": "oom", "node": "n1", "t": START_MS + 60_000, "oom_kills": 1,
             "limit_bytes": 128 * MIB, "max_usage_bytes": 128 * MIB, "main_alive": False}
    result = check_memory(_run([*_squeeze(START_MS, START_MS + 5_000), stray]))
    assert not result.ok and "n1 OOM-killed" in result.violations[0]
    assert result.counts["unexpected_oom_kills"] == 1


def test_an_oom_kill_while_the_node_starts_again_after_a_squeeze_fails() -> None:
    """Its start is not part of the squeeze: the node was sized for its limit."""
    restart = [{"kind": "oom", "node": "n2", "t": START_MS + 2_000, "oom_kills": 2,
                "limit_bytes": 128 * MIB, "max_usage_bytes": 128 * MIB, "main_alive": False},
               {"kind": "restart_oom", "id": "f1", "node": "n2", "t": START_MS + 2_100,
                "limit_bytes": 128 * MIB, "exit_code": -9, "max_usage_bytes": 128 * MIB},
               {"kind": "oom_restart", "id": "f1", "node": "n2", "t": START_MS + 4_000,
                "limit_bytes": 256 * MIB, "came_back": True, "max_usage_bytes": 133 * MIB}]
    history = sorted([*_squeeze(START_MS, START_MS + 5_000), *restart], key=lambda e: e["t"])
    result = check_memory(_run(history))
    assert not result.ok
    assert "n2 OOM-killed" in result.violations[0] and "started again" in result.violations[0]
    assert result.counts["restarts_oom_killed"] == 1
    assert result.counts["restarts_under_raised_limit"] == 1


def test_a_squeeze_that_did_not_oom_kill_the_main_process_fails() -> None:
    for outcome in ({"killed_by_sigkill": False, "exit_code": None},
                    {"oom_kills_moved": 0}):
        result = check_memory(_run(_squeeze(START_MS, START_MS + 5_000, **outcome)))
        assert not result.ok and "did not OOM-kill" in result.violations[0]


@pytest.fixture
def memory_cluster(tmp_path: Path) -> Any:
    """A one-node MemoryCluster on loopback; its cgroups must be gone after `close`."""
    why = cgroups_possible()
    assert why is None, f"this test needs memory cgroups: {why}"
    relay = Relay()
    created: list[MemoryCluster] = []

    def make(**options: Any) -> MemoryCluster:
        cluster = MemoryCluster(tmp_path / "nodes", relay, nodes=1, raft=STORAGE_RAFT,
                                **options)
        created.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in created:
            cluster.close()
            assert not cluster.groups.root.exists(), "the run's cgroups were left behind"
        relay.close()


def _load(cluster: MemoryCluster, stop: threading.Event, acked: list[int]) -> None:
    """Jobs with 10 KB payloads until stopped: the node allocates all along."""
    for number in range(LOAD_SUBMITS_MAX):
        if stop.wait(LOAD_EVERY_S):
            return
        try:
            status, job, _ = cluster.call(
                "POST", "/v1/jobs", {"task": "t", "payload": {"n": number, "pad": "x" * 10_000},
                                     "request_id": f"load-{number}"},
                token=SUBMIT, timeout_s=2)
        except Exception:  # the node is being killed: indeterminate, not acknowledged
            continue
        if status in (200, 201):
            acked.append(int(job["id"]))


@pytest.mark.processes
@pytest.mark.timeout(90)
def test_a_node_over_its_limit_is_oom_killed_for_real_and_comes_back_whole(
    memory_cluster: Any, tmp_path: Path,
) -> None:
    cluster = memory_cluster()
    history = History(tmp_path / "history.jsonl")
    cluster.start()
    cluster.wait_ready(60)
    node = cluster.node("n1")
    assert node.pid in cluster.groups.pids("n1")  # joined before exec: the node itself
    cluster.watch(history)
    stop, acked = threading.Event(), []
    load = threading.Thread(target=_load, args=(cluster, stop, acked), daemon=True)
    load.start()
    try:
        assert wait_until(lambda: len(acked) >= 20, 30)
        nemesis = Nemesis(cluster, None, history)
        fault = oom_kill(nemesis, "n1", mid_snapshot=True)
    finally:
        stop.set()
        load.join(10)
    [killed] = history.of("oom_fault")
    assert killed["exit_code"] == -signal.SIGKILL and killed["oom_kills_moved"] >= 1
    assert killed["writer_seen"] and not killed["writer_outlived"]
    assert wait_until(lambda: bool(history.of("oom")), 5)  # the watcher saw it too
    oom_restart(nemesis, fault, "n1", NODE_LIMIT_BYTES, 2 * NODE_LIMIT_BYTES)
    cluster.wait_ready(60)
    assert cluster.groups.limit("n1") == NODE_LIMIT_BYTES  # it came back under its own
    assert history.of("restart_oom") == [] and history.of("oom_restart")[0]["came_back"]
    for job_id in acked:  # every acknowledged job survived the OOM kill
        status, _, _ = cluster.request(node, "GET", f"/v1/jobs/{job_id}", token=ADMIN)
        assert status == 200, job_id
    result = check_memory(_run(history.events))
    assert result.ok and result.counts["main_oom_killed"] == 1, result.violations
    history.close()


@pytest.mark.processes
@pytest.mark.timeout(90)
def test_a_node_whose_budget_is_below_its_limit_survives_a_flood(
    memory_cluster: Any, tmp_path: Path,
) -> None:
    cluster = memory_cluster(settings={"budget": {"bytes": STATE_BUDGET_BYTES}})
    history = History(tmp_path / "history.jsonl")
    cluster.start()
    cluster.wait_ready(60)
    node = cluster.node("n1")
    cluster.watch(history)
    flood = Flood(cluster.urls, history)
    flood.start()
    compactions = 0
    try:
        started = time.monotonic()
        while time.monotonic() - started < FLOOD_S:
            cluster.request(node, "POST", "/v1/cluster/compact", {}, token=ADMIN)
            compactions += 1
            time.sleep(3.0)  # a snapshot writer every few seconds, under the flood
        flood.stop_submitting()
    finally:
        flood.stop()
    usage = [e for e in history.of("usage") if e["budget_bytes"] == STATE_BUDGET_BYTES]
    assert max(e["state_bytes"] for e in usage) >= 0.8 * STATE_BUDGET_BYTES  # at the budget
    assert node.running and cluster.groups.oom_kills("n1") == 0
    assert history.of("oom") == []
    print(f"peak usage {cluster.groups.max_usage('n1') / MIB:.1f} MiB of "
          f"{NODE_LIMIT_BYTES / MIB:.0f}, {compactions} compactions forced")
    history.close()


@pytest.mark.processes
@pytest.mark.timeout(60)
def test_cleanup_removes_a_crashed_runs_cgroups_and_what_runs_in_them() -> None:
    why = cgroups_possible()
    assert why is None, f"this test needs memory cgroups: {why}"
    groups = MemoryGroups("999999999-000000")  # no such PID: its run is gone
    groups.create(["n1"], 64 * MIB)
    process = subprocess.Popen(["sh", "-c", JOIN, str(groups.procs_file("n1")), "sleep", "60"])
    try:
        assert wait_until(lambda: process.pid in groups.pids("n1"), 5)
        assert str(groups.root) in remove_leftover_groups(CGROUP_ROOT)
        assert process.wait(10) == -signal.SIGKILL
        assert not groups.root.exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        groups.remove()
