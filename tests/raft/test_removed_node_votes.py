"""Rule 6 of cluster/consensus/raftpatch.py: a vote request from a node outside the receiver's
configuration (a removed node that never heard of its removal, which the transport still
connects: cluster/consensus/raftguard.py, rule 4) is ignored, so its ever higher terms depose
nobody. Unpatched 0.3.17 adopts the term and votes (shown too)."""

from __future__ import annotations

import pytest

from raftcron.chaos.sim.cluster import SimCluster, SimNode
from raftcron.chaos.sim.machines import KeyLog
from raftcron.cluster.consensus import raftpatch

MACHINE = KeyLog()


@pytest.mark.parametrize("patched", [True, False])
def test_a_vote_request_from_a_removed_node_changes_nothing(patched: bool) -> None:
    raftpatch.install()
    with SimCluster(["n1", "n2", "n3"], MACHINE.build, seed="removed",
                    patched=patched) as cluster:
        n2 = cluster.nodes["n2"]
        n2._SyncObj__otherNodes.discard(SimNode("n1"))  # n1 was removed, as n2's log says
        replies = cluster.network.capture("n2", "n1", lambda message: True)
        term = n2.raftCurrentTerm
        cluster.network.deliver_now("n1", "n2", {
            "type": "request_vote", "term": term + 50, "last_log_index": 10**6,
            "last_log_term": term + 49})
        if patched:
            assert n2.raftCurrentTerm == term and not replies
        else:
            assert n2.raftCurrentTerm == term + 50
            assert [m["type"] for m in replies] == ["response_vote"]
