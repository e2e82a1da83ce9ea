"""A leader that crashes closes its connections, and a follower that sees its leader's go calls
an election soon instead of waiting out the election timeout (cluster/consensus/leaderloss.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from raftcron.cluster.dev.localcluster import FAST_RAFT

pytestmark = pytest.mark.processes  # starts nodes: make integration

# Election timeouts far longer than the early election: a new leader within them can only
# come from it (PySyncObj's own timer cannot fire before election_timeout_min_s).
SLOW_TIMEOUTS = {**FAST_RAFT, "election_timeout_min_s": 3.0, "election_timeout_max_s": 4.0,
                 "connection_timeout_s": 4.0, "leader_fallback_s": 4.0}


def test_a_crashed_leader_is_replaced_well_before_the_election_timeout(
    cluster_factory: Any,
) -> None:
    cluster = cluster_factory.open(raft=SLOW_TIMEOUTS)
    leader = cluster.leader()
    cluster.kill(leader)  # SIGKILL: the kernel closes its connections
    killed = time.monotonic()
    successor = cluster.leader(timeout_s=2.5)
    assert successor is not leader
    assert time.monotonic() - killed < 2.5
    cluster.start_node(leader)
    cluster.wait_ready(timeout_s=30)



def test_a_leader_that_led_for_a_while_is_replaced_as_fast(cluster_factory: Any) -> None:
    """Two followers send each other nothing while a leader lives, and PySyncObj finds a
    connection timed out only when something is sent on it: after a stable leader's crash
    the first vote request dropped the link it was sent on, and the election waited for a
    reconnection (0.5-1.1 s, every time). The nodes' keepalives (cluster/consensus/leaderloss.py
    LinkKeeper) keep those links read from."""
    cluster = cluster_factory.open(raft=FAST_RAFT)
    timeout_s = float(FAST_RAFT["connection_timeout_s"])  # type: ignore[arg-type]
    took = []
    for _ in range(3):
        leader = cluster.wait_ready(timeout_s=30)
        # The fault: a leader that has led, and followers that have not spoken to each
        # other, for longer than the connection timeout (idleness is what is injected here).
        time.sleep(2.5 * timeout_s)
        cluster.kill(leader)
        killed = time.monotonic()
        successor = cluster.leader(timeout_s=10)
        took.append(time.monotonic() - killed)
        assert successor is not leader
        cluster.start_node(leader)
    took.sort()
    assert took[1] < 0.4, f"failovers of leaders that led for {2.5 * timeout_s:g} s: {took}"
