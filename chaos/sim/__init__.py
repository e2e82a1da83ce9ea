"""Deterministic in-process simulation of real PySyncObj nodes (CHAOS.md, tier 1).

Real ``SyncObj`` objects (``autoTick=False``) on a fake clock and an in-memory network; a seed
decides everything, so a failing run replays. What a chaos suite plugs in is a ``SimMachine``
(how to build a node of its replicated state machine, propose a keyed command, and read back
applied keys and a state digest). The pieces:

* ``SimCluster``: build, step, crash, restart nodes, cut their power; propose commands;
  record answers; trace.
* ``SimDisk``: each node's disk, a page cache over a durable image; power cuts drop what was
  not synced and tear the last write (``StoredKeyLog`` keeps its keys on raftcron's storage).
* ``SimNetwork`` / ``SimTransport``: FIFO links with seeded delay, drop, duplicate, spikes;
  partitions (one-way too), pause/resume, capture/inject for scripted scenarios.
* ``settle`` / ``check_replicas``: heal and converge, then check lost and divergent state.
* ``run_seed``: one randomized fault run with 30 KB commands (``python -m
  chaos.sim FIRST COUNT``).

Nodes run the carried fix (cluster/consensus/raftpatch.py) unless built with ``patched=False``.
"""

from raftcron.chaos.sim.checks import ReplicaReport, check_replicas, settle
from raftcron.chaos.sim.clock import FakeClock, simulated_pysyncobj
from raftcron.chaos.sim.cluster import (
    NodeSpec,
    Proposal,
    SimCluster,
    SimNode,
    default_conf,
    raft_log,
)
from raftcron.chaos.sim.disk import PowerCut, SimDisk
from raftcron.chaos.sim.machines import KeyLog, KeyLogNode, SimMachine, StoredKeyLog, payload_of
from raftcron.chaos.sim.network import LinkFaults, SimNetwork, SimTransport
from raftcron.chaos.sim.randomized import RaftSeedResult, run_seed

__all__ = [
    "FakeClock", "KeyLog", "KeyLogNode", "LinkFaults", "NodeSpec", "PowerCut", "Proposal",
    "RaftSeedResult", "ReplicaReport", "SimCluster", "SimDisk", "SimMachine", "SimNetwork",
    "SimNode", "SimTransport", "StoredKeyLog", "check_replicas", "default_conf", "payload_of",
    "raft_log", "run_seed", "settle", "simulated_pysyncobj",
]
