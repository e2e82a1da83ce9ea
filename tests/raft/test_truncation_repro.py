"""The two reproductions of PySyncObj 0.3.17 deleting acknowledged entries, run as scripts on
the deterministic simulation. Each scenario runs twice: with cluster/raftpatch installed it
must lose nothing; under ``raftpatch.uninstalled()`` the same script must show the loss, which
proves the test can fail (research: /work/shared/research/pysyncobj-truncation.md, section 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from raftcron.chaos.sim.checks import ReplicaReport, check_replicas, settle
from raftcron.chaos.sim.cluster import Proposal, SimCluster, raft_log
from raftcron.chaos.sim.machines import KeyLog, payload_of
from raftcron.cluster.consensus import raftpatch

MACHINE = KeyLog()


@dataclass(frozen=True)
class Outcome:
    report: ReplicaReport
    truncated_applied: int  # "truncating already-applied" CRITICAL lines
    patched: bool  # whether the follower that gets the stale append runs the fix
    log_end_after: int  # the follower's last log index right after the stale append
    stale_append: bool = False  # scenario 2: the follower got the leader's rollback re-send


def put(cluster: SimCluster, node_id: str, key: str, size_bytes: int = 16) -> Proposal:
    payload = payload_of(size_bytes, key)
    return cluster.propose(node_id, key, lambda node, callback:
                           MACHINE.propose(node, key, payload, callback))


def start_with_leader(cluster: SimCluster) -> tuple[str, str, str]:
    """Elect a leader and commit 'init' everywhere; log: 1 no-op, 2 leader no-op, 3 init."""
    leader = cluster.wait_leader(5.0)
    init = put(cluster, leader, "init")
    cluster.wait_for(lambda: init.acknowledged and all(
        node.raftLastApplied == 3 for node in cluster.nodes.values()), 2.0, "init applied")
    first, second = (node_id for node_id in cluster.node_ids if node_id != leader)
    return leader, first, second


def last_index(cluster: SimCluster, node_id: str) -> int:
    return raft_log(cluster.nodes[node_id])[-1][0]


def is_heartbeat_after(index: int) -> Any:
    return lambda message: (message.get("type") == "append_entries"
                            and message.get("prevLogIdx") == index and not message["entries"])


def duplicated_heartbeat() -> Outcome:
    """Scenario 1: a follower gets an old heartbeat again after acking and applying 'A'."""
    with SimCluster(["n1", "n2", "n3"], MACHINE.build, seed="duplicated-heartbeat") as cluster:
        leader, follower, cut_off = start_with_leader(cluster)
        patched = cluster.is_patched(follower)
        cluster.network.isolate(cut_off, cluster.node_ids)
        heartbeats = cluster.network.capture(leader, follower, is_heartbeat_after(3))
        cluster.wait_for(lambda: bool(heartbeats), 1.0, "a heartbeat after index 3")

        write = put(cluster, leader, "A")
        cluster.wait_for(lambda: write.acknowledged and "A" in MACHINE.applied_keys(
            cluster.nodes[follower]), 2.0, "'A' acknowledged and applied on the follower")

        cluster.network.deliver_now(leader, follower, heartbeats[0])  # the duplicate
        log_end_after = last_index(cluster, follower)
        cluster.crash(leader)
        cluster.network.heal()  # the cut-off node rejoins; the old leader stays down
        converged = settle(cluster, MACHINE, restart_down=False)
        report = check_replicas(cluster.acknowledged(), cluster.nodes, MACHINE,
                                converged=converged)
        return Outcome(report, cluster.log.truncated_applied, patched, log_end_after)


def rollback_resend_then_leader_crash(*, unpatched_leader: bool = False) -> Outcome:
    """Scenario 2: ordered links, default config; the leader's own re-send after a late ack
    reaches the follower, then the leader dies before the rest of the re-send.

    With ``unpatched_leader`` only the follower runs the fix (a half-upgraded cluster), so
    the leader still re-sends and the follower-side rule alone must keep the entries.
    """
    with SimCluster(["n1", "n2", "n3"], MACHINE.build, seed="rollback-resend",
                    patched=not unpatched_leader) as cluster:
        leader, follower, crashed = start_with_leader(cluster)
        if unpatched_leader:
            cluster.crash(follower)
            cluster.restart(follower, patched=True)
            cluster.wait_for(lambda: cluster.nodes[follower].raftLastApplied == 3, 2.0,
                             "the restarted follower caught up")
        patched = cluster.is_patched(follower)
        network = cluster.network
        cluster.crash(crashed)
        network.pause(follower, leader)  # the follower's acks are slow

        # Six 33 KB commands: with the 64 KiB batch limit they go out as three batches of
        # two, AE(prev=3,[4,5]), AE(prev=5,[6,7]), AE(prev=7,[8,9]), in one send loop.
        writes = [put(cluster, leader, f"c{n}", 33_000) for n in range(1, 7)]
        cluster.wait_for(lambda: last_index(cluster, follower) == 9, 1.0, "batches stored")

        # Only the first ack (next index 6) reaches the leader before its heartbeat timer.
        while network.deliver_head(follower, leader)["next_node_idx"] != 6:
            pass
        network.pause(leader, follower)
        cluster.wait_for(lambda: bool(network.pending(leader, follower)), 0.3,
                         "the leader's next append")
        network.resume(follower, leader)  # the other acks: every command commits
        cluster.wait_for(lambda: all(write.acknowledged for write in writes), 0.2,
                         "all six acknowledged")
        assert cluster.nodes[follower].raftCurrentTerm == cluster.nodes[leader].raftCurrentTerm

        head = network.deliver_head(leader, follower)  # the next append after the ack ...
        log_end_after = last_index(cluster, follower)
        cluster.crash(leader)  # ... and the leader dies with the rest in flight
        cluster.restart(crashed)
        converged = settle(cluster, MACHINE, restart_down=False)
        report = check_replicas(cluster.acknowledged(), cluster.nodes, MACHINE,
                                converged=converged)
        stale = head["prevLogIdx"] == 5 and bool(head["entries"])
        return Outcome(report, cluster.log.truncated_applied, patched, log_end_after, stale)


@pytest.fixture(autouse=True)
def _patch_installed() -> None:
    raftpatch.install()


def test_duplicated_heartbeat_loses_nothing_with_the_fix() -> None:
    outcome = duplicated_heartbeat()
    assert outcome.patched
    assert outcome.log_end_after == 4  # 'A' at index 4 stays
    assert outcome.report.ok, outcome.report
    assert "A" in outcome.report.acknowledged
    assert outcome.truncated_applied == 0


def test_duplicated_heartbeat_loses_an_applied_write_without_the_fix() -> None:
    with raftpatch.uninstalled():
        outcome = duplicated_heartbeat()
    assert not outcome.patched
    assert outcome.log_end_after == 3  # the duplicate deleted the applied 'A'
    assert outcome.report.lost == ["A"]
    assert outcome.report.divergent
    assert outcome.truncated_applied >= 1


def test_rollback_resend_loses_nothing_with_the_fix() -> None:
    outcome = rollback_resend_then_leader_crash()
    assert outcome.patched
    assert not outcome.stale_append  # the leader-side rule: no rollback, no re-send
    assert outcome.log_end_after == 9
    assert outcome.report.ok, outcome.report
    assert {"c5", "c6"} <= set(outcome.report.acknowledged)
    assert outcome.truncated_applied == 0


def test_patched_follower_keeps_entries_an_unpatched_leader_resends() -> None:
    outcome = rollback_resend_then_leader_crash(unpatched_leader=True)
    assert outcome.patched
    assert outcome.stale_append  # the follower-side rule alone has to save c5 and c6
    assert outcome.log_end_after == 9  # AE(prev=5, [6, 7]) repeated entries: kept 8 and 9
    assert outcome.report.ok, outcome.report
    assert {"c5", "c6"} <= set(outcome.report.acknowledged)


def test_rollback_resend_loses_two_acknowledged_commands_without_the_fix() -> None:
    with raftpatch.uninstalled():
        outcome = rollback_resend_then_leader_crash()
    assert not outcome.patched
    assert outcome.stale_append
    assert outcome.log_end_after == 7  # AE(prev=5, [6, 7]) deleted the acknowledged 8 and 9
    assert outcome.report.lost == ["c5", "c6"]
    assert not outcome.report.divergent  # both survivors lost them the same way
