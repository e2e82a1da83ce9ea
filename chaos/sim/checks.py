"""Safety checks over a simulated cluster: lost acknowledged commands and divergent replicas.

Owns two things: ``settle`` (heal every fault, restart every crashed node, commit a barrier
through the leader and wait until every replica applied it at the same index) and
``check_replicas`` (for every acknowledged command, is it in every replica's applied state,
and are all replicas' states identical). A check must be able to fail: the tests feed it
states with a lost key and with divergent replicas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pysyncobj import SyncObj

from raftcron.chaos.sim.cluster import SimCluster
from raftcron.chaos.sim.machines import SimMachine, payload_of
from raftcron.chaos.sim.network import LinkFaults


@dataclass(frozen=True)
class ReplicaReport:
    acknowledged: tuple[str, ...]
    missing: Mapping[str, tuple[str, ...]]  # replica -> acknowledged keys it never applied
    applied: Mapping[str, tuple[str, ...]] = field(repr=False)  # replica -> keys, in order
    digests: Mapping[str, str] = field(default_factory=dict)
    converged: bool = True  # every replica applied the final barrier at the same index

    @property
    def lost(self) -> list[str]:
        """Acknowledged keys missing from some replica's final state."""
        return sorted({key for keys in self.missing.values() for key in keys})

    @property
    def lost_everywhere(self) -> list[str]:
        """Acknowledged keys that no replica applied at all."""
        everywhere = set.intersection(*(set(keys) for keys in self.missing.values())) \
            if len(self.missing) == len(self.applied) else set()
        return sorted(everywhere)

    @property
    def divergent(self) -> bool:
        """Replicas applied different histories: one is not a prefix of another, or they
        settled at the same index with different states."""
        longest = max(self.applied.values(), key=len, default=())
        forked = any(keys != longest[:len(keys)] for keys in self.applied.values())
        return forked or (self.converged and len(set(self.digests.values())) > 1)

    @property
    def ok(self) -> bool:
        return self.converged and not self.lost and not self.divergent


def check_replicas(acknowledged: Sequence[str], replicas: Mapping[str, SyncObj],
                   machine: SimMachine, *, converged: bool = True) -> ReplicaReport:
    missing: dict[str, tuple[str, ...]] = {}
    applied: dict[str, tuple[str, ...]] = {}
    digests: dict[str, str] = {}
    for node_id in sorted(replicas):
        applied[node_id] = tuple(machine.applied_keys(replicas[node_id]))
        present = set(applied[node_id])
        absent = tuple(key for key in acknowledged if key not in present)
        if absent:
            missing[node_id] = absent
        digests[node_id] = machine.state_digest(replicas[node_id])
    return ReplicaReport(tuple(acknowledged), missing, applied, digests, converged)


def settle(cluster: SimCluster, machine: SimMachine, *, timeout_s: float = 15.0,
           barrier_key: str = "barrier", restart_down: bool = True) -> bool:
    """Heal, restart the crashed, commit a barrier; True when all live replicas applied it
    at the same index."""
    cluster.network.heal()
    cluster.network.faults = LinkFaults()
    cluster.network.link_faults.clear()
    for node_id in cluster.down() if restart_down else []:
        cluster.restart(node_id)
    deadline_s = cluster.now_s + timeout_s
    attempt = 0
    acknowledged = False
    key = barrier_key
    while not acknowledged and cluster.now_s < deadline_s:
        attempt += 1
        key = f"{barrier_key}-{attempt}"
        acknowledged = _commit_through_leader(cluster, machine, key, deadline_s)
    if not acknowledged:
        return False

    def all_applied_alike() -> bool:
        nodes = list(cluster.nodes.values())
        applied = {node.raftLastApplied for node in nodes}
        committed = {node.raftCommitIndex for node in nodes}
        return (len(applied) == 1 and applied == committed
                and all(key in machine.applied_keys(node) for node in nodes))

    return cluster.run_until(all_applied_alike, max(0.0, deadline_s - cluster.now_s))


def _commit_through_leader(cluster: SimCluster, machine: SimMachine, key: str,
                           deadline_s: float) -> bool:
    if not cluster.run_until(lambda: cluster.leader() is not None, deadline_s - cluster.now_s):
        return False
    leader = cluster.leader()
    assert leader is not None
    proposal = cluster.propose(leader, key, lambda node, callback:
                               machine.propose(node, key, payload_of(16, key), callback))
    cluster.run_until(lambda: proposal.outcome is not None, min(3.0, deadline_s - cluster.now_s))
    return proposal.acknowledged
