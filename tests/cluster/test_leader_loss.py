"""A leader that crashes closes its connections, and a follower that sees its leader's go calls
an election soon instead of waiting out the election timeout (cluster/leaderloss.py)."""

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

