"""Rule 8 of cluster/consensus/raftpatch.py: a leader ignores an answer to an append from a
node it replicates to no more (a member a configuration entry removed just after the leader
sent it entries, a learner it dropped). Unpatched 0.3.17 reads that node's match index and
raises KeyError out of the tick (shown too)."""

from __future__ import annotations

import pytest

from raftcron.chaos.sim.cluster import SimCluster, SimNode
from raftcron.chaos.sim.machines import KeyLog
from raftcron.cluster.consensus import raftpatch

MACHINE = KeyLog()


@pytest.mark.parametrize("reset", [False, True])
@pytest.mark.parametrize("patched", [True, False])
def test_an_answer_from_a_node_no_longer_replicated_to_is_ignored(
        patched: bool, reset: bool) -> None:
    raftpatch.install()
    with SimCluster(["n1", "n2", "n3"], MACHINE.build, seed="removed-acks",
                    patched=patched) as cluster:
        leader_id = cluster.wait_leader(10)
        gone = next(n for n in ["n1", "n2", "n3"] if n != leader_id)
        leader = cluster.nodes[leader_id]
        node = SimNode(gone)
        # As a configuration entry removing `gone` does on the leader (__doChangeCluster).
        leader._SyncObj__otherNodes.discard(node)
        leader._SyncObj__raftNextIndex.pop(node, None)
        leader._SyncObj__raftMatchIndex.pop(node, None)
        answer = {"type": "next_node_idx", "next_node_idx": 2, "reset": reset,
                  "success": not reset}
        if patched:
            cluster.network.deliver_now(gone, leader_id, answer)
            assert node not in leader._SyncObj__raftNextIndex
            assert node not in leader._SyncObj__raftMatchIndex
        elif reset:
            cluster.network.deliver_now(gone, leader_id, answer)
            assert leader._SyncObj__raftNextIndex[node] == 2  # tracked again, for nothing
        else:
            with pytest.raises(KeyError):
                cluster.network.deliver_now(gone, leader_id, answer)
