"""Randomized fault runs of a simulated cluster, one seed at a time: ``run_seed``.

Owns the seeded workload and nemesis: a client proposing 30 KB commands through random live
nodes while faults hit the cluster (crash and restart of the leader or any node from its
journal, partitions both ways and one way, slow links that make acks late, duplicated and
delayed messages), then a heal phase (everything restarted and reconnected, a barrier
committed) and the checks: every acknowledged command is in every replica's applied state,
all states are identical, and no "truncating already-applied" CRITICAL line was logged.
Everything is drawn from RNGs seeded by the seed: the same seed replays the same trace.

Run many seeds from a shell: ``python -m raftcron.chaos.sim 0 500 [--unpatched]``.
"""

from __future__ import annotations

import argparse
import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from pysyncobj import SyncObjConf

from raftcron.chaos.sim.checks import check_replicas, settle
from raftcron.chaos.sim.cluster import SimCluster, default_conf
from raftcron.chaos.sim.machines import KeyLog, SimMachine, payload_of
from raftcron.chaos.sim.network import LinkFaults, strike_network

COMMAND_BYTES = 30_000


@dataclass(frozen=True)
class RaftProfile:
    """The per-seed shape of a run of bare PySyncObj nodes (a key log, no scheduler), itself
    drawn from the seed; tier 1's run of the replica has its own, `chaos.tier1.Profile`."""

    nodes: int
    chaos_s: float
    propose_p: float  # chance per tick that the client proposes a command
    nemesis_gap_s: tuple[float, float]
    faults: LinkFaults
    conf: dict[str, object] = field(hash=False)

    @staticmethod
    def draw(rng: random.Random) -> RaftProfile:
        faults = LinkFaults(
            delay_max_s=rng.choice([0.004, 0.02]),
            drop_p=rng.choice([0.0, 0.0, 0.01]),
            duplicate_p=rng.choice([0.0, 0.02, 0.05]),
            spike_p=rng.choice([0.0, 0.02]),
        )
        # (election timeout min, max, heartbeat period): the library defaults and a tuned set;
        # SyncObjConf requires the minimum to exceed three periods.
        timeout_min_s, timeout_max_s, period_s = rng.choice(
            [(0.4, 1.4, 0.1), (0.4, 1.4, 0.05), (0.2, 0.6, 0.05)])
        conf: dict[str, object] = {
            "appendEntriesUseBatch": rng.random() < 0.5,
            "appendEntriesPeriod": period_s,
            "raftMinTimeout": timeout_min_s, "raftMaxTimeout": timeout_max_s,
            "leaderFallbackTimeout": rng.choice([1.5, 3.0]),
            # A quarter of the runs compact often: restarts load the full dump, and lagging
            # followers get snapshots instead of entries.
            "logCompactionMinEntries": rng.choice([5000, 5000, 5000, 30]),
        }
        return RaftProfile(nodes=rng.choice([3, 3, 3, 5]), chaos_s=rng.choice([3.0, 4.0, 5.0]),
                       propose_p=rng.choice([0.1, 0.25]), nemesis_gap_s=(0.2, 0.8),
                       faults=faults, conf=conf)


@dataclass(frozen=True)
class RaftSeedResult:
    """What one seed's run of bare PySyncObj nodes found (tier 1's: `chaos.tier1.SeedResult`)."""

    seed: int
    acknowledged: int
    lost: tuple[str, ...]  # acknowledged, missing from some replica's final state
    lost_everywhere: tuple[str, ...]  # acknowledged, applied by no replica
    divergent: bool
    converged: bool  # liveness: every replica caught up after healing
    truncated_applied: int  # "truncating already-applied" CRITICAL lines
    faults_injected: int
    digest: str
    error: str | None = None  # an exception escaped a node: pysyncobj would log and wedge

    @property
    def ok(self) -> bool:
        return self.converged and not self.lost and not self.divergent \
            and self.truncated_applied == 0 and self.error is None

    @property
    def unsafe(self) -> bool:
        """A safety violation whatever the liveness: a fork or a write no replica holds."""
        return self.divergent or bool(self.lost_everywhere) or \
            (self.converged and bool(self.lost))

    def describe(self) -> str:
        return (f"seed={self.seed} ok={self.ok} acknowledged={self.acknowledged} "
                f"lost={len(self.lost)} lost_everywhere={list(self.lost_everywhere)} "
                f"divergent={self.divergent} converged={self.converged} "
                f"truncated_applied={self.truncated_applied} faults={self.faults_injected} "
                f"digest={self.digest[:16]} error={self.error}")


def summarize(results: list[RaftSeedResult]) -> dict[str, int]:
    return {
        "seeds": len(results),
        "ok": sum(result.ok for result in results),
        "acknowledged": sum(result.acknowledged for result in results),
        "unsafe_seeds": sum(result.unsafe for result in results),
        "seeds_with_lost": sum(bool(result.lost) for result in results),
        "seeds_lost_everywhere": sum(bool(result.lost_everywhere) for result in results),
        "lost_everywhere_commands": sum(len(result.lost_everywhere) for result in results),
        "divergent_seeds": sum(result.divergent for result in results),
        "not_converged_seeds": sum(not result.converged for result in results),
        "seeds_with_truncation_critical": sum(result.truncated_applied > 0 for result in results),
        "truncation_critical_lines": sum(result.truncated_applied for result in results),
        "crashed_seeds": sum(result.error is not None for result in results),
    }


class _Run:
    def __init__(self, cluster: SimCluster, machine: SimMachine, profile: RaftProfile,
                 rng: random.Random) -> None:
        self.cluster, self.machine, self.profile, self.rng = cluster, machine, profile, rng
        self.pending: list[tuple[float, int, Callable[[], None]]] = []  # (due, order, action)
        self.scheduled = 0  # tie-breaker: actions due at the same instant run in order
        self.commands = 0
        self.faults = 0

    def later(self, delay_s: float, action: Callable[[], None]) -> None:
        self.scheduled += 1
        self.pending.append((self.cluster.now_s + delay_s, self.scheduled, action))

    def run_due(self) -> None:
        due = sorted(item for item in self.pending if item[0] <= self.cluster.now_s)
        self.pending = [item for item in self.pending if item[0] > self.cluster.now_s]
        for _, _, action in due:
            action()

    def propose(self) -> None:
        live = sorted(self.cluster.nodes)
        leader = self.cluster.leader()
        target = leader if leader is not None and self.rng.random() < 0.7 else self.rng.choice(live)
        self.commands += 1
        key = f"k{self.commands}"
        payload = payload_of(COMMAND_BYTES, key)
        self.cluster.propose(target, key, lambda node, callback:
                             self.machine.propose(node, key, payload, callback))

    def restart(self, node_id: str) -> None:
        if node_id not in self.cluster.nodes:
            self.cluster.restart(node_id)

    def crash(self, node_id: str | None) -> None:
        quorum = self.profile.nodes // 2 + 1
        if node_id not in self.cluster.nodes or len(self.cluster.nodes) - 1 < quorum:
            return  # keep a majority up, so the run keeps committing and acknowledging
        self.cluster.crash(node_id)
        self.later(self.rng.uniform(0.2, 1.5), lambda: self.restart(node_id))

    def nemesis(self) -> None:
        cluster, network, rng = self.cluster, self.cluster.network, self.rng
        ids = cluster.node_ids
        node = rng.choice(ids)
        other = rng.choice([peer for peer in ids if peer != node])
        leader = cluster.leader()
        action = rng.choice(["crash-leader", "crash-leader", "crash", "isolate", "isolate-leader",
                             "one-way", "slow-link", "slow-link", "duplicates", "heal"])
        self.faults += 1
        cluster.trace.record(round(cluster.now_s * 1e6), "nemesis", action, node, other)
        if action == "crash-leader":
            self.crash(leader)
        elif action == "crash":
            self.crash(node)
        elif not strike_network(network, action, node=node, other=other, leader=leader,
                                ids=ids, rng=rng, later=self.later):
            network.heal()

    def chaos(self) -> None:
        cluster, rng = self.cluster, self.rng
        end_s = cluster.now_s + self.profile.chaos_s
        next_fault_s = cluster.now_s + rng.uniform(*self.profile.nemesis_gap_s)
        while cluster.now_s < end_s:
            self.run_due()
            if cluster.now_s >= next_fault_s:
                self.nemesis()
                next_fault_s = cluster.now_s + rng.uniform(*self.profile.nemesis_gap_s)
            if rng.random() < self.profile.propose_p:
                self.propose()
            cluster.step()


def run_seed(
    seed: int, machine: SimMachine | None = None, *, patched: bool = True
) -> RaftSeedResult:
    """One randomized run; deterministic for a given seed, machine and patch state."""
    machine = machine or KeyLog()
    rng = random.Random(f"{seed}/workload")
    profile = RaftProfile.draw(rng)
    node_ids = [f"n{i}" for i in range(1, profile.nodes + 1)]

    def conf(node_id: str, journal: str, dump: str) -> SyncObjConf:
        return default_conf(journal, dump, **profile.conf)

    with SimCluster(node_ids, machine.build, seed=seed, conf_factory=conf,
                    faults=profile.faults, patched=patched) as cluster:
        run = _Run(cluster, machine, profile, rng)
        try:
            cluster.run_until(lambda: cluster.leader() is not None, 5.0)
            run.chaos()
            converged = settle(cluster, machine, timeout_s=20.0)
        except Exception as error:  # the seed failed; keep the others running
            where = traceback.extract_tb(error.__traceback__)[-1]
            return RaftSeedResult(seed, len(cluster.acknowledged()), (), (), False, False,
                              cluster.log.truncated_applied, run.faults, cluster.trace.digest,
                              f"{error!r} at {where.filename}:{where.lineno}")
        report = check_replicas(cluster.acknowledged(), cluster.nodes, machine,
                                converged=converged)
        return RaftSeedResult(seed, len(report.acknowledged), tuple(report.lost),
                          tuple(report.lost_everywhere), report.divergent, converged,
                          cluster.log.truncated_applied, run.faults, cluster.trace.digest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=int)
    parser.add_argument("count", type=int)
    parser.add_argument("--unpatched", action="store_true", help="run pysyncobj 0.3.17 as is")
    args = parser.parse_args(argv)
    results = []
    for seed in range(args.first, args.first + args.count):
        results.append(run_seed(seed, patched=not args.unpatched))
        if not results[-1].ok:
            print(results[-1].describe(), flush=True)
    summary = summarize(results)
    print(" ".join(f"{name}={value}" for name, value in summary.items()))
    return 0 if summary["ok"] == summary["seeds"] else 1
