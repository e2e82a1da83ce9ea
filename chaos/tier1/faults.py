"""The shape of one seed's run, and the faults it injects.

Owns ``Profile`` (cluster size, per-node clock offsets, link faults, Raft timings, lease,
workers, phase lengths, drawn from the seed) and ``SimNemesis``: crash a node or the leader (it
restarts from its journal and dump 0.2-2 s later), rarely the whole cluster (down 1-8 s, longer
than a short misfire grace), pause the leader (SIGSTOP: it wakes up believing it still leads),
isolate a node or the leader, cut a link one way, slow a link, duplicate and delay messages,
crash a worker, heal. It always keeps a majority running outside a whole-cluster crash or
power loss, so the run keeps committing. It never sends requests.

On raftcron's storage (a run with a durability) it also cuts power (CHAOS.md, Wave 2): of a
node or the leader, of a majority, of every node, several cuts a few milliseconds apart, each
either an instant after the node handled its messages (before it syncs) or inside one of its
next disk calls (a write torn on the disk); the node's SimDisk keeps what was durable and tears
the rest; the nodes come back 0.5-5.5 s later, not all at once. Those runs compact every few
dozen entries, so cuts land around snapshots and compactions.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pysyncobj import SyncObj

from raftcron.chaos.sim.network import LinkFaults, strike_network
from raftcron.chaos.tier1.world import SimWorld
from raftcron.cluster.config import RaftTuning


class Crashable(Protocol):
    def crash(self) -> None: ...


class NemesisRun(SimWorld, Protocol):
    """What the nemesis needs of the run beyond the `SimWorld` (the `SeedRun` of chaos.tier1.run
    implements both; this module does not import it)."""

    seed: int
    later: list[tuple[float, int, Callable[[], None]]]  # what `after` scheduled; heal drops it

    @property
    def profile(self) -> Profile: ...

    @property
    def workers(self) -> Sequence[Crashable]: ...


POWER_FAULTS = ("power-node", "power-leader", "power-majority", "power-all")
POWER_FAULT_P = 0.25  # of the faults of a run on raftcron's storage


@dataclass(frozen=True)
class Profile:
    """The shape of one seed's run (cluster size, clocks, link faults, timings), drawn from it."""

    nodes: int
    offsets_ms: tuple[int, ...]  # per node, in node order
    faults: LinkFaults
    tuning: RaftTuning
    lease_ms: int
    workers: int
    safety_s: float
    grace_ms: int  # the schedules' misfire grace
    ticker_wake_s: float = 0.0  # from a role change to the ticker's wake (the loop's delay)
    # With the storage: a follower's log batch is written up to this many ticks after it was
    # handed over (cluster/storage/syncworker.py's thread, on a slow disk); 0: at once.
    slow_sync_ticks: int = 0

    @staticmethod
    def draw(rng: random.Random, *, storage: bool = False) -> Profile:
        """The seed's profile; ``storage`` (a run on raftcron's storage) draws a compaction
        every few dozen entries, after everything else (the rest of a seed's run stays)."""
        profile = Profile._draw(rng)
        if not storage:
            return profile
        tuning = dataclasses.replace(profile.tuning,
                                     compaction_min_entries=rng.choice([20, 40, 80]))
        return dataclasses.replace(profile, tuning=tuning,
                                   slow_sync_ticks=rng.choice([0, 3, 30]))

    @staticmethod
    def _draw(rng: random.Random) -> Profile:
        nodes = rng.choice([3, 3, 3, 5])
        clocks = rng.choice(["synced", "skewed", "split30", "split30"])
        if clocks == "synced":
            offsets = [0] * nodes
        elif clocks == "skewed":
            offsets = [rng.randint(-2_000, 2_000) for _ in range(nodes)]
        else:  # a node 30 s ahead, one 30 s behind: leadership moves between them
            offsets = [30_000, -30_000] + [rng.randint(-500, 500) for _ in range(nodes - 2)]
            rng.shuffle(offsets)
        minimum_s, maximum_s, heartbeat_s = rng.choice(
            [(0.4, 1.0, 0.05), (0.2, 0.6, 0.05), (0.4, 1.4, 0.1)]
        )
        tuning = RaftTuning(
            tick_ms=rng.choice([100, 250]),
            election_timeout_min_s=minimum_s,
            election_timeout_max_s=maximum_s,
            heartbeat_s=heartbeat_s,
            leader_fallback_s=rng.choice([1.2, 1.5]),
            # A quarter of the seeds compact often: snapshots of the core are installed on
            # lagging followers and restarts load the full dump.
            compaction_min_entries=rng.choice([100_000, 100_000, 100_000, 40]),
        )
        faults = LinkFaults(
            delay_max_s=rng.choice([0.004, 0.02]),
            drop_p=rng.choice([0.0, 0.0, 0.01]),
            duplicate_p=rng.choice([0.0, 0.02, 0.05]),
            spike_p=rng.choice([0.0, 0.02]),
        )
        return Profile(
            nodes=nodes,
            offsets_ms=tuple(offsets),
            faults=faults,
            tuning=tuning,
            lease_ms=rng.choice([1_500, 3_000]),
            workers=rng.choice([2, 3]),
            safety_s=rng.choice([8.0, 12.0, 16.0]),
            grace_ms=rng.choice([60_000, 5_000]),
            ticker_wake_s=rng.choice([0.0, 0.01, 0.03]),
        )

    @property
    def clock_spread_ms(self) -> int:
        return max(self.offsets_ms) - min(self.offsets_ms)


class SimNemesis:
    """Injects one random fault at a time into a run; `heal` undoes what is still undone."""

    def __init__(self, run: NemesisRun, *, power: bool = False) -> None:
        self.run = run
        self.power = power  # power faults too (nodes on raftcron's storage)
        self.disk_rng = random.Random(f"{run.seed}/disk")  # how power cuts tear the files
        self.paused: dict[str, SyncObj] = {}  # SIGSTOPped nodes, out of the cluster's nodes
        self.armed: dict[str, float] = {}  # node -> its downtime, once its armed cut fires
        if power:
            run.cluster.power_lost_observers.append(self._lost_power_inside_a_call)

    def strike(self) -> None:
        run = self.run
        cluster, network, rng = run.cluster, run.cluster.network, run.rng
        ids = cluster.node_ids
        node = rng.choice(ids)
        other = rng.choice([peer for peer in ids if peer != node])
        leader = cluster.leader()
        action = rng.choice(["crash-leader", "crash", "pause-leader", "isolate",
                             "isolate-leader", "one-way", "slow-link", "duplicates",
                             "worker-crash", "heal"])
        if rng.random() < 0.05:
            action = "crash-all"
        if self.power and rng.random() < POWER_FAULT_P:  # drawn only then: other seeds stay
            action = rng.choice(POWER_FAULTS)
        run.note("nemesis", action, node, other)
        if action in POWER_FAULTS:
            self.power_loss(action, node, leader)
        elif action == "crash-all":
            self.crash_all(rng.uniform(1.0, 8.0))
        elif action in ("crash-leader", "crash"):
            self.crash(leader if action == "crash-leader" else node)
        elif action == "pause-leader" and leader is not None:
            self.pause(leader, rng.uniform(0.5, 2.5))
        elif action == "worker-crash":
            rng.choice(run.workers).crash()
        elif not strike_network(network, action, node=node, other=other, leader=leader, ids=ids,
                                rng=rng, later=run.after, isolate_s=(0.3, 2.0)):
            network.heal()

    def crash(self, node_id: str | None) -> None:
        cluster = self.run.cluster
        alive = len(cluster.nodes)
        if node_id not in cluster.nodes or alive - 1 <= self.run.profile.nodes // 2:
            return  # keep a majority running, so the run keeps committing
        assert node_id is not None
        cluster.crash(node_id)
        self.run.after(self.run.rng.uniform(0.2, 2.0), lambda: self.restart(node_id))

    def crash_all(self, down_s: float) -> None:
        """Whole-cluster downtime (longer than a short misfire grace), then all restart."""
        cluster = self.run.cluster
        for node_id in sorted(self.paused):
            self.resume(node_id)
        for node_id in sorted(cluster.nodes):
            cluster.crash(node_id)
        for node_id in cluster.node_ids:
            self.run.after(down_s, functools.partial(self.restart, node_id))

    def power_loss(self, action: str, node_id: str, leader: str | None) -> None:
        """One node's, a majority's or every node's machine loses power (see the module)."""
        cluster, rng = self.run.cluster, self.run.rng
        ids = cluster.node_ids
        if action in ("power-node", "power-leader"):
            target = leader if action == "power-leader" and leader is not None else node_id
            if target in cluster.nodes and len(cluster.nodes) - 1 <= len(ids) // 2:
                return  # keep a majority running, as a crash does
            targets = [target]
        elif action == "power-majority":
            targets = rng.sample(ids, len(ids) // 2 + 1)
        else:
            targets = rng.sample(ids, len(ids))
        spacing_s = rng.choice([0.0, 0.01, 0.02, 0.05])
        down_s = rng.uniform(0.5, 4.0)
        for number, target in enumerate(targets):
            cut_s = number * spacing_s
            back_s = down_s + rng.uniform(0.0, 1.5)
            if rng.random() < 0.5:
                self.run.after(cut_s, functools.partial(self._cut_inside_a_call, target, back_s))
            else:
                self.run.after(cut_s, functools.partial(self._cut_at_mid_step, target))
                self.run.after(cut_s + back_s, functools.partial(self.restart, target))

    def _cut_inside_a_call(self, node_id: str, back_s: float) -> None:
        """The power fails inside one of the node's next few disk calls (a running node)."""
        if node_id not in self.run.cluster.nodes:  # down or stopped: no call to land in
            self._cut_at_mid_step(node_id)
            self.run.after(back_s, functools.partial(self.restart, node_id))
            return
        self.armed[node_id] = back_s
        self.run.cluster.disks[node_id].cut_power_at(self.disk_rng.randint(0, 3), self.disk_rng)

    def _lost_power_inside_a_call(self, node_id: str) -> None:
        self.run.note("power-cut-inside-a-call", node_id)
        back_s = self.armed.pop(node_id, None)
        if back_s is not None:
            self.run.after(back_s, functools.partial(self.restart, node_id))

    def _cut_at_mid_step(self, node_id: str) -> None:
        def cut() -> None:
            self.resume(node_id)  # a SIGSTOPped process dies with its machine too
            self.run.cluster.power_cut(node_id, self.disk_rng)
            self.run.note("power-cut", node_id)

        self.run.cluster.mid_step(cut)

    def restart(self, node_id: str) -> None:
        cluster = self.run.cluster
        if node_id not in cluster.nodes and node_id not in self.paused and \
                node_id not in cluster.refused:
            cluster.restart(node_id)

    def pause(self, node_id: str, seconds: float) -> None:
        """SIGSTOP: the node neither ticks nor reads; it wakes up believing what it believed."""
        cluster = self.run.cluster
        if node_id in self.paused or node_id not in cluster.nodes:
            return
        self.paused[node_id] = cluster.nodes.pop(node_id)
        for peer in cluster.node_ids:
            if peer != node_id:
                cluster.network.pause(peer, node_id)
        self.run.after(seconds, lambda: self.resume(node_id))

    def resume(self, node_id: str) -> None:
        node = self.paused.pop(node_id, None)
        if node is None:
            return
        cluster = self.run.cluster
        cluster.nodes[node_id] = node
        for peer in cluster.node_ids:
            if peer != node_id:
                cluster.network.resume(peer, node_id)

    def heal(self) -> None:
        for node_id in sorted(self.paused):
            self.resume(node_id)
        for disk in self.run.cluster.disks.values():
            disk.disarm()
        self.armed.clear()
        self.run.later = []
