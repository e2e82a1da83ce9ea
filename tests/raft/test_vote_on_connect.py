"""cluster/consensus/leaderloss.py: members that could not stand while connected to no one do not
all stand at once when a connection comes back.

PySyncObj stands for election only while connected to someone. A member that had just
restarted is connected to by a member with a greater address only at that one's next
connection retry; if the leader died in that window, both remaining members' election
deadlines passed while each was connected to no one, and the moment the connection came up
both stood in the same instant: a split vote, and a whole election timeout more (the bench saw
failovers of 0.9-1.2 s, 3 in 30, this way). Now a member that comes to be connected after
being connected to no one stands in the same order as after losing its leader.
"""

from __future__ import annotations

from typing import Any

import pytest

from raftcron.chaos.sim.cluster import SimCluster, default_conf
from raftcron.chaos.sim.machines import KeyLog
from raftcron.cluster.consensus import raftpatch

MACHINE = KeyLog()
ELECTION_S = (2.0, 3.0)  # long: a leader sooner than this comes from the early rules alone
CANDIDATE = 1


def conf(_node_id: str, journal: str, dump: str) -> Any:
    return default_conf(journal, dump, raftMinTimeout=ELECTION_S[0],
                        raftMaxTimeout=ELECTION_S[1], appendEntriesPeriod=0.05,
                        leaderFallbackTimeout=4.0)


def disconnect(cluster: SimCluster, a: str, b: str) -> None:
    for src, dst in ((a, b), (b, a)):
        cluster.network.cut(src, dst)
        cluster.network.transports[src].peer_disconnected(dst)


def reconnect(cluster: SimCluster, a: str, b: str) -> None:
    for src, dst in ((a, b), (b, a)):
        cluster.network.link(src, dst).cut = False
        cluster.network.transports[src].peer_connected(dst)


def candidacies(cluster: SimCluster, nodes: tuple[str, ...]) -> set[str]:
    return {n for n in nodes if cluster.nodes[n]._SyncObj__raftState == CANDIDATE}


@pytest.mark.parametrize("patched", [True, False])
def test_a_connection_after_the_leader_died_starts_one_election_not_two(patched: bool) -> None:
    raftpatch.install()
    with SimCluster(["n1", "n2", "n3"], MACHINE.build, seed="vote-on-connect",
                    conf_factory=conf, patched=patched) as cluster:
        cluster.wait_for(lambda: cluster.leader() is not None, 10, "a first leader")
        leader = cluster.leader()
        assert leader is not None
        rest = tuple(sorted(set(cluster.node_ids) - {leader}))
        cluster.wait_for(lambda: all(cluster.nodes[n]._SyncObj__raftLeader for n in rest), 1,
                         "both followers hearing the leader")
        disconnect(cluster, *rest)  # one of them restarted; the other has not reconnected
        cluster.crash(leader)
        cluster.run_for(0.5)  # both early deadlines pass; neither may stand, alone as it is
        assert not candidacies(cluster, rest)
        reconnect(cluster, *rest)
        reconnected_at = cluster.now_s
        stood: set[str] = set()
        elected = cluster.run_until(
            lambda: stood.update(candidacies(cluster, rest)) or cluster.leader() is not None,
            1.5)
        if patched:
            assert elected, f"no leader within 1.5 s of the connection; candidates {stood}"
            assert cluster.now_s - reconnected_at < 0.4
            assert len(stood) == 1, stood
        else:
            assert not elected  # 0.3.17: its own election timeout, 2-3 s after the last heartbeat
