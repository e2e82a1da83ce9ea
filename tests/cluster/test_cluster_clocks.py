"""A node whose wall clock is 10 days ahead cannot move the cluster's time (DESIGN.md §8.2):
leading or not, its Ticks carry the majority's time.

Real `raftcron node` processes on loopback. n1's wall clock is offset by chaos.nemesis's
CLOCK_HOOK (wall time only; monotonic time, which every Raft timeout reads, is true) and its
election timeouts are the shortest, so it is the first to stand for election: before §8.2 it
then led and its first Tick moved the replicated time 10 days ahead for good.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from problems import cluster_problems

from raftcron.chaos.tier2.nemesis import CLOCK_HOOK
from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

DAY_MS = 86_400_000
FAST_NODE = "n1"
OFFSET_MS = 10 * DAY_MS
BOUND_MS = 1_000  # [clock] max_skew_ms: the state's time is never further ahead of true time


class FastClockCluster(LocalCluster):
    """n1 10 days ahead, and the quickest to call an election."""

    _starting: LocalNode | None = None

    def start_node(self, node: LocalNode) -> None:
        self._starting = node
        try:
            super().start_node(node)
        finally:
            self._starting = None

    def _environment(self) -> dict[str, str]:
        env = super()._environment()
        if self._starting is not None and self._starting.node_id == FAST_NODE:
            hook = self.base_dir / "clockhook"
            hook.mkdir(parents=True, exist_ok=True)
            (hook / "sitecustomize.py").write_text(CLOCK_HOOK)
            env["PYTHONPATH"] = str(hook) + os.pathsep + env["PYTHONPATH"]
            env["CHAOS_CLOCK_OFFSET_MS"] = str(OFFSET_MS)
        return env

    def config_text(self, node: LocalNode) -> str:
        text = super().config_text(node)
        if node.node_id == FAST_NODE:
            text = text.replace("election_timeout_min_s = 0.5", "election_timeout_min_s = 0.25")
            text = text.replace("election_timeout_max_s = 1.0", "election_timeout_max_s = 0.3")
        return text


def cluster_view(cluster: LocalCluster, node: LocalNode) -> dict[str, Any] | None:
    try:
        status, body, _ = cluster.request(node, "GET", "/v1/cluster", timeout_s=5)
    except OSError:
        return None
    return body if status == 200 and isinstance(body, dict) else None


@pytest.mark.processes
def test_a_node_ten_days_ahead_does_not_move_the_clusters_time(tmp_path: Path) -> None:
    with FastClockCluster(tmp_path, raft=FAST_RAFT) as cluster:
        passed = False
        try:
            cluster.start()
            nodes = {node.node_id: node for node in cluster.configure()}
            fast = nodes[FAST_NODE]

            def skewed_and_ticking() -> dict[str, Any] | None:
                view = cluster_view(cluster, fast)
                if view is None or not (view.get("clock") or {}).get("skewed"):
                    return None
                # skewed is known from a majority's clocks (itself and one peer): wait for all
                if any(m["clock_offset_ms"] is None for m in view["members"]):
                    return None
                return view if view["state"]["now_ms"] else None

            # Whatever the first elections did, the state's time is checked all along.
            deadline = time.monotonic() + 40
            seen: dict[str, Any] | None = None
            while time.monotonic() < deadline:
                for node_id in sorted(nodes):
                    view = cluster_view(cluster, nodes[node_id])
                    if view is not None and view["state"]["now_ms"]:
                        ahead_ms = view["state"]["now_ms"] - time.time_ns() // 1_000_000
                        assert ahead_ms <= BOUND_MS, (
                            f"{node_id}'s state time is {ahead_ms} ms ahead of true time")
                seen = seen or skewed_and_ticking()
                if seen is not None:
                    break
                time.sleep(0.2)
            assert seen is not None, "n1 never reported itself skewed while the cluster ticked"
            clock = seen["clock"]
            assert abs(clock["skew_ms"] - OFFSET_MS) < 5_000, clock
            offsets = {m["node_id"]: m["clock_offset_ms"] for m in seen["members"]}
            assert offsets[FAST_NODE] == 0
            assert all(abs(offsets[n] + OFFSET_MS) < 5_000 for n in nodes if n != FAST_NODE)
            # It says so: its log, its metrics; and the cluster's time keeps to the true one.
            cluster.wait_for(lambda: any('"action": "clock_skewed"' in line
                                         for line in cluster.log_lines(fast)), 10,
                             "n1's clock_skewed log line")
            status, text, _ = cluster.request(fast, "GET", "/metrics")
            assert status == 200
            skew_lines = [line for line in text.splitlines()
                          if line.startswith("raftcron_clock_skew_seconds{")]
            assert len(skew_lines) == 1, skew_lines
            assert float(skew_lines[0].split()[-1]) > 9 * 86_400, skew_lines
            assert 'raftcron_clock_skewed{node="n1"} 1' in text
            assert "raftcron_state_now_seconds " in text and "raftcron_state_now_ms" not in text
            status, job, _ = cluster.call("POST", "/v1/jobs", {
                "task": "soon", "delay_ms": 60_000, "request_id": "clock-test-1"})
            assert status == 201
            status, body, _ = cluster.call("GET", f"/v1/jobs/{job['id']}")
            assert body["status"] == "scheduled", body  # not due: time did not leap
            passed = True
        finally:
            problems = cluster_problems(cluster, check_convergence=passed)
        assert not problems, problems
