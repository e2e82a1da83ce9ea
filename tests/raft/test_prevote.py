"""cluster/consensus/prevote.py: a member that stalls (its Raft thread in a slow fsync, reading
nothing) does not depose a healthy leader; a stalled leader is replaced once, and then its stalls
disturb nobody; a member stuck at a higher term is let back in; a crashed leader is still
replaced at once.

A stall is what a slow sync does to a member: it ticks not at all for a while, the messages
sent to it queue, and when it runs again its first tick finds the election deadline passed
before it reads what queued (0.3.17 stands for election right there).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from raftcron.chaos.sim.cluster import SimCluster, default_conf
from raftcron.chaos.sim.machines import KeyLog
from raftcron.cluster.consensus import prevote, raftpatch

MACHINE = KeyLog()


def product_conf(_node_id: str, journal: str, dump: str) -> Any:
    # cluster/config.py's RaftTuning defaults
    return default_conf(journal, dump, raftMinTimeout=0.4, raftMaxTimeout=1.0,
                        leaderFallbackTimeout=1.2, appendEntriesPeriod=0.05,
                        connectionTimeout=2.0)


@contextmanager
def cluster_of_three(seed: str, *, with_prevote: bool) -> Iterator[SimCluster]:
    raftpatch.install()
    with SimCluster(["n1", "n2", "n3"], MACHINE.build, seed=seed, conf_factory=product_conf,
                    prevote=with_prevote) as cluster:
        cluster.wait_for(lambda: cluster.leader() is not None, 10, "a first leader")
        cluster.run_for(1.0)
        yield cluster


def stall(cluster: SimCluster, node_id: str, seconds: float) -> None:
    node = cluster.nodes[node_id]
    others = [other for other in cluster.node_ids if other != node_id]
    for other in others:
        cluster.network.pause(other, node_id)
    node.doTick = lambda *_args: None  # its Raft thread sits in a sync
    try:
        cluster.run_for(seconds)
    finally:
        del node.doTick
    cluster.step()  # it runs again; the heartbeats that queued are read only after this tick
    for other in others:
        cluster.network.resume(other, node_id)


def leader_changes(cluster: SimCluster, action: Any) -> int:
    """How many times the leader changed (to another node or to none) while `action` ran,
    plus what settles within 3 s after it."""
    seen = [cluster.leader()]
    step = cluster.step

    def observed_step() -> None:
        step()
        now = cluster.leader()
        if now != seen[-1]:
            seen.append(now)

    cluster.step = observed_step  # type: ignore[method-assign]
    try:
        action()
        cluster.run_for(3.0)
    finally:
        del cluster.step
    return sum(1 for leader in seen[1:] if leader is not None)


def put(cluster: SimCluster, node_id: str, key: str) -> Any:
    return cluster.propose(node_id, key,
                           lambda node, callback: MACHINE.propose(node, key, b"", callback))


def follower_of(cluster: SimCluster) -> str:
    return next(node_id for node_id in cluster.node_ids if node_id != cluster.leader())


def stalls(cluster: SimCluster, node_id: str, times: int) -> None:
    for _ in range(times):
        stall(cluster, node_id, 2.0)
        cluster.run_for(0.5)


@pytest.mark.parametrize("seed", ["a", "b", "c"])
def test_a_stalled_follower_deposes_nobody(seed: str) -> None:
    with cluster_of_three(seed, with_prevote=True) as cluster:
        leader, follower = cluster.leader(), follower_of(cluster)
        terms = {node_id: node.raftCurrentTerm for node_id, node in cluster.nodes.items()}
        assert leader_changes(cluster, lambda: stalls(cluster, follower, 5)) == 0
        assert cluster.leader() == leader
        assert {n: node.raftCurrentTerm for n, node in cluster.nodes.items()} == terms
        state = prevote.state_of(cluster.nodes[follower])
        assert state is not None and state.rounds >= 5 and state.elections == 0


def test_without_prevote_a_stalled_follower_deposes_the_leader() -> None:
    """What the rules fix: 0.3.17's way, as a cluster runs it before it is finalized."""
    with cluster_of_three("a", with_prevote=False) as cluster:
        follower = follower_of(cluster)
        assert leader_changes(cluster, lambda: stalls(cluster, follower, 5)) >= 3


@pytest.mark.parametrize("seed", ["a", "b", "c"])
def test_a_stalled_leader_is_replaced_once_and_then_disturbs_nobody(seed: str) -> None:
    with cluster_of_three(seed, with_prevote=True) as cluster:
        old = cluster.leader()
        assert old is not None
        assert leader_changes(cluster, lambda: stalls(cluster, old, 5)) == 1
        assert cluster.leader() not in (None, old)


def test_a_proposal_commits_while_a_follower_stalls() -> None:
    with cluster_of_three("commit", with_prevote=True) as cluster:
        follower, leader = follower_of(cluster), cluster.leader()
        assert leader is not None
        node = cluster.nodes[follower]
        others = [other for other in cluster.node_ids if other != follower]
        for other in others:
            cluster.network.pause(other, follower)
        node.doTick = lambda *_args: None
        try:
            proposal = put(cluster, leader, "k1")
            cluster.run_for(0.5)
            assert proposal.acknowledged  # the leader and the other follower are a majority
        finally:
            del node.doTick
            for other in others:
                cluster.network.resume(other, follower)


def test_a_crashed_leaders_followers_elect_at_once() -> None:
    """The lease ends with the leader's connection (leaderloss), so PreVote costs the fast
    failover nothing it needs: a new leader within a second of the crash."""
    with cluster_of_three("crash", with_prevote=True) as cluster:
        old = cluster.leader()
        assert old is not None
        cluster.crash(old)
        started = cluster.now_s
        cluster.wait_for(lambda: cluster.leader() not in (None, old), 5, "a new leader")
        assert cluster.now_s - started < 1.0


def test_a_member_at_a_higher_term_is_let_back_in() -> None:
    """Rule 3: a member whose term went up (it stood while cut off, as 0.3.17 did before the
    cluster was finalized) is refused by the others' leases; its answer to the leader's
    append makes the leader step down, and an election at the higher term takes it back."""
    with cluster_of_three("higher", with_prevote=True) as cluster:
        follower = follower_of(cluster)
        node = cluster.nodes[follower]
        term = max(n.raftCurrentTerm for n in cluster.nodes.values())
        node._SyncObj__setCurrentTerm(term + 5, None)
        cluster.wait_for(lambda: cluster.leader() is not None and all(
            n.raftCurrentTerm >= term + 5 for n in cluster.nodes.values()), 10,
            "every member at the higher term, under a leader")
        leader = cluster.leader()
        assert leader is not None
        proposal = put(cluster, leader, "back")
        cluster.wait_for(lambda: proposal.acknowledged and "back" in node.keys, 10,
                         "the member applies what the leader commits")


def test_a_vote_request_of_a_higher_term_is_ignored_while_the_leader_lives() -> None:
    with cluster_of_three("lease", with_prevote=True) as cluster:
        follower = follower_of(cluster)
        target = next(n for n in cluster.node_ids if n not in (follower, cluster.leader()))
        node = cluster.nodes[target]
        term = node.raftCurrentTerm
        cluster.network.deliver_now(follower, target, {
            "type": "request_vote", "term": term + 1, "last_log_index": 10**6,
            "last_log_term": term})
        assert node.raftCurrentTerm == term
        state = prevote.state_of(node)
        assert state is not None and state.votes_ignored == 1


def test_a_pre_vote_is_answered_no_while_the_leader_lives_and_changes_nothing() -> None:
    with cluster_of_three("answer", with_prevote=True) as cluster:
        follower = follower_of(cluster)
        target = next(n for n in cluster.node_ids if n not in (follower, cluster.leader()))
        replies = cluster.network.capture(target, follower, lambda m: isinstance(m, dict))
        node = cluster.nodes[target]
        term = node.raftCurrentTerm
        cluster.network.deliver_now(follower, target, {
            "type": prevote.PRE_VOTE, "term": term + 1, "last_log_index": 10**6,
            "last_log_term": term})
        assert node.raftCurrentTerm == term
        assert {"type": prevote.PRE_VOTE_REPLY, "term": term + 1, "granted": False} in replies


def test_before_the_cluster_is_finalized_a_vote_request_is_taken_as_before() -> None:
    """An older member does not send the higher-term reply: a lease would lock it out once
    it stood while cut off, so rules 1 and 2 wait for a finalized cluster."""
    with cluster_of_three("mixed", with_prevote=True) as cluster:
        follower = follower_of(cluster)
        target = next(n for n in cluster.node_ids if n not in (follower, cluster.leader()))
        node = cluster.nodes[target]
        state = prevote.state_of(node)
        assert state is not None
        state.enabled = lambda: False
        term = node.raftCurrentTerm
        cluster.network.deliver_now(follower, target, {
            "type": "request_vote", "term": term + 1, "last_log_index": 10**6,
            "last_log_term": term})
        assert node.raftCurrentTerm == term + 1 and state.votes_ignored == 0
