"""raftcron's storage under real PySyncObj nodes in the simulation (chaos.sim, one SimDisk per
node): restarts load the snapshot and the log, and with durability "fsync" no acknowledged
write is lost to power cuts, while with "os" (no fsync) power cuts do lose some."""

from __future__ import annotations

import random

import pytest

from raftcron.chaos.sim.checks import ReplicaReport, check_replicas, settle
from raftcron.chaos.sim.cluster import Proposal, SimCluster, default_conf
from raftcron.chaos.sim.machines import DATA_DIR, StoredKeyLog, payload_of
from raftcron.cluster.storage.raftlog import RaftLog

# The log claiming every entry durable, whatever it holds: the hooks then ack at once.
EVERYTHING_DURABLE = property(lambda self: 1 << 62, lambda self, value: None)

NODES = ["n1", "n2", "n3"]


def compacting_conf(_node_id: str, journal: str, dump: str) -> object:
    return default_conf(journal, dump, logCompactionMinEntries=12)


def cluster_of(machine: StoredKeyLog, seed: str) -> SimCluster:
    return SimCluster(NODES, machine.build, seed=seed, conf_factory=compacting_conf)  # type: ignore[arg-type]


def propose(cluster: SimCluster, machine: StoredKeyLog, key: str) -> Proposal | None:
    leader = cluster.leader()
    if leader is None:
        return None
    return cluster.propose(leader, key, lambda node, callback:
                           machine.propose(node, key, payload_of(200, key), callback))


def write_keys(cluster: SimCluster, machine: StoredKeyLog, count: int, prefix: str) -> None:
    for number in range(count):
        propose(cluster, machine, f"{prefix}{number}")
        cluster.run_for(0.02)


def final_report(cluster: SimCluster, machine: StoredKeyLog) -> ReplicaReport:
    converged = settle(cluster, machine, timeout_s=15.0)
    return check_replicas(cluster.acknowledged(), cluster.nodes, machine, converged=converged)


def test_a_cluster_restarted_after_compactions_comes_back_with_every_write() -> None:
    """Every node compacted (a snapshot on its disk, the log past it), then all crashed: each
    must load its snapshot at restart (the hooks once asked the real filesystem whether the
    snapshot existed, so on any other Disk the state came back without it)."""
    machine = StoredKeyLog()
    with cluster_of(machine, "restart-after-compaction") as cluster:
        cluster.wait_for(lambda: cluster.leader() is not None, 5.0, "a leader")
        write_keys(cluster, machine, 40, "k")
        cluster.run_for(1.0)
        assert all(disk.exists(f"{DATA_DIR}/snapshot") for disk in cluster.disks.values())
        for node_id in NODES:
            cluster.crash(node_id)
        for node_id in NODES:
            cluster.restart(node_id)
        report = final_report(cluster, machine)
        assert len(report.acknowledged) >= 30
        assert report.ok, report


def power_cut_run(durability: str, seed: int, *, segment_bytes_max: int = 4 << 10
                  ) -> tuple[ReplicaReport, dict[str, str]]:
    """Writes while every node loses power twice (at instants drawn from the seed, each an
    instant after it handled its messages), then restarts, heals, checks."""
    machine = StoredKeyLog(durability=durability, segment_bytes_max=segment_bytes_max)
    rng = random.Random(f"power/{seed}")
    with cluster_of(machine, f"power/{seed}") as cluster:
        cluster.wait_for(lambda: cluster.leader() is not None, 5.0, "a leader")
        for cut in range(2):
            write_keys(cluster, machine, rng.randint(10, 40), f"c{cut}-")
            for node_id in NODES:  # a few milliseconds apart
                cluster.mid_step(lambda node_id=node_id: cluster.power_cut(node_id, rng))
                cluster.run_for(rng.choice([0.0, 0.01, 0.02]))
            cluster.run_for(0.5)
            for node_id in NODES:
                cluster.restart(node_id)
            cluster.wait_for(lambda: cluster.leader() is not None or bool(cluster.refused),
                             10.0, "a leader after the power cut")
        return final_report(cluster, machine), dict(cluster.refused)


def test_with_fsync_no_acknowledged_write_is_lost_to_power_cuts_of_every_node() -> None:
    for seed in range(16):
        report, refused = power_cut_run("fsync", seed)
        assert not refused, (seed, refused)
        assert report.ok and len(report.acknowledged) > 20, (seed, report)


def test_with_durability_os_a_power_cut_costs_unsynced_writes_not_the_node() -> None:
    """"os" keeps the log's writes in the page cache only: a power loss may cost the last
    writes, but a node must still start. It used to refuse (LogDamaged) on every one of these
    seeds: an older segment's tail, a snapshot renamed into place and a compaction that
    deleted segments were left unsynced, so after the cut they were torn or gone while newer
    files were there. Seeds 0, 1, 2, 4 and 5 lose acknowledged writes (15 on seed 1 since the
    early election of cluster/consensus/leaderloss.py; 14 before): the check sees them."""
    lost = {}
    for seed in range(8):
        report, refused = power_cut_run("os", seed)
        assert not refused, (seed, refused)
        lost[seed] = len(report.lost)
    assert lost[1] > 0, lost


def cut_followers_right_after_they_take_an_entry(seed: str) -> tuple[Proposal, ReplicaReport]:
    """A leader sends entry x; both followers lose power the instant after they handled it
    (before their next tick, where the storage syncs), the leader 50 ms later; the followers
    come back first and elect one of them, which commits a write; then the leader returns."""
    machine = StoredKeyLog()
    rng = random.Random(seed)
    with cluster_of(machine, seed) as cluster:
        cluster.wait_for(lambda: cluster.leader() is not None, 5.0, "a leader")
        write_keys(cluster, machine, 5, "before-")
        cluster.run_for(0.5)
        leader = cluster.leader()
        assert leader is not None
        followers = [node_id for node_id in NODES if node_id != leader]
        proposal = propose(cluster, machine, "x")
        assert proposal is not None
        target = cluster.nodes[leader]._SyncObj__raftLog[-1][1] + 1  # x's index, once added

        def took_it() -> bool:
            return all(node_id in cluster.nodes and
                       cluster.nodes[node_id]._SyncObj__raftLog[-1][1] >= target
                       for node_id in followers)

        def watch() -> None:
            if took_it():
                for node_id in followers:
                    cluster.power_cut(node_id, rng)
            else:
                cluster.mid_step(watch)

        cluster.mid_step(watch)
        cluster.wait_for(lambda: not any(f in cluster.nodes for f in followers), 3.0, "cuts")
        cluster.run_for(0.05)
        cluster.power_cut(leader, rng)
        for node_id in followers:
            cluster.restart(node_id)
        cluster.wait_for(lambda: cluster.leader() is not None, 10.0, "a follower elected")
        write_keys(cluster, machine, 3, "after-")
        cluster.run_for(0.5)
        return proposal, final_report(cluster, machine)


def test_a_follower_acks_entries_only_once_they_are_durable() -> None:
    proposal, report = cut_followers_right_after_they_take_an_entry("held-acks")
    assert not proposal.acknowledged  # the followers never acked it: nothing was promised
    assert report.ok, report


def test_without_held_acks_a_power_cut_loses_a_write_the_leader_acknowledged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: the hooks put back to ack at once (the log claims every
    entry is durable), the leader commits x on acks from followers that then lose it."""
    monkeypatch.setattr(RaftLog, "durable_through", EVERYTHING_DURABLE, raising=False)
    proposal, report = cut_followers_right_after_they_take_an_entry("held-acks")
    assert proposal.acknowledged
    assert "x" in report.lost_everywhere or "x" in report.lost, report


def test_a_power_cut_inside_a_disk_call_kills_the_node_and_its_torn_tail_is_cut() -> None:
    """The cut lands inside the node's n-th next disk call (a write reaches the page cache and
    is torn): the node dies there, restarts with the tail cut, and loses nothing acknowledged."""
    torn = 0
    for operation in range(6):
        machine = StoredKeyLog()
        with cluster_of(machine, f"inside-{operation}") as cluster:
            cluster.wait_for(lambda: cluster.leader() is not None, 5.0, "a leader")
            victim = next(node_id for node_id in NODES if node_id != cluster.leader())
            cluster.disks[victim].cut_power_at(operation, random.Random(operation))
            write_keys(cluster, machine, 30, "k")
            assert victim not in cluster.nodes and cluster.disks[victim].power_cuts == 1
            cluster.run_for(0.3)
            cluster.restart(victim)
            torn += machine.storages[victim].load_report.torn_segment is not None
            report = final_report(cluster, machine)
            assert report.ok and len(report.acknowledged) == 31, report  # and the barrier
    assert torn > 0
