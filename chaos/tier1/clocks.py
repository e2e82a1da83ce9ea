"""The nodes' wall clocks in a tier-1 run: their faults, their exchange, and the time checker.

Owns ``SimClocks`` (each node's wall clock: the profile's fixed offset, plus the leaps and the
drift the clock nemesis adds: a leader 10 days ahead, a node a day behind, NTP-style steps of
+-5 minutes, a slow drift; one node at a time, so a majority's clocks stay true; undone some
seconds later or at the heal), ``sample`` (what cluster/clock/clockpoll.py does over HTTP: every
node reads the clocks of the peers it can reach, into its ticker's ``ClockBook``) and
``TimeChecker`` (CHAOS.md, Wave 2: the state time a node applied is never ahead of the
majority's clocks, the k-th largest of all the members' wall clocks, by more than
``AHEAD_MS_MAX``).

Monotonic clocks are true in this fault model (a wall clock leaps, a monotonic one does not):
every node's monotonic clock is the simulation's. The clock faults draw from their own random
stream, so a seed's other faults and requests are the ones it had before they existed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pysyncobj import SyncObj

from raftcron.chaos.tier1.world import SimWorld
from raftcron.cluster.clock.clocks import ClockBook
from raftcron.cluster.config import ClockSettings


class ClockHolder(Protocol):
    """A node's ticker, as the clock sampler sees it (chaos.tier1.workload.SimTicker)."""

    @property
    def node_id(self) -> str: ...

    @property
    def node(self) -> SyncObj | None: ...

    @property
    def book(self) -> ClockBook: ...


class PausedNodes(Protocol):
    @property
    def paused(self) -> dict[str, SyncObj]: ...


class ClockRun(SimWorld, Protocol):
    """What the clock faults, the sampler and the checker need of the run beyond the
    `SimWorld` (the `SeedRun` of chaos.tier1.run implements both; this module does not import
    it)."""

    @property
    def nemesis(self) -> PausedNodes: ...

    @property
    def tickers(self) -> Sequence[ClockHolder]: ...


MAX_SKEW_MS = ClockSettings.max_skew_ms
TICK_SLACK_MS = ClockSettings.tick_slack_ms
SAMPLE_S = ClockSettings.poll_ms / 1000
AHEAD_MS_MAX = MAX_SKEW_MS  # the checker's bound: the contract's, not the Tick's slack
DAY_MS = 86_400_000
CLOCK_FAULTS = ("leap-leader-10d", "behind-1d", "step-5min", "drift")
CLOCK_FAULT_GAP_S = (1.0, 4.0)  # between two clock faults of a run
# The clock nemesis runs only where the fixed offsets are this close: a clock of the majority
# that steps back lowers the majority's time to the next true clock down, and the state's time
# (which never goes back) is then ahead of it by as much as the true clocks disagree.
CLOCK_FAULTS_SPREAD_MS = 500


@dataclass
class Skew:
    """One node's clock fault: a fixed leap, plus a drift (ms of error per simulated s)."""

    leap_ms: int = 0
    drift_ms_per_s: float = 0.0
    since_s: float = 0.0

    def error_ms(self, now_s: float) -> int:
        return self.leap_ms + round(self.drift_ms_per_s * (now_s - self.since_s))


@dataclass
class SimClocks:
    base_ms: dict[str, int]  # the profile's fixed offsets
    faults: bool  # the clock nemesis runs (only when the fixed offsets are small)
    rng: random.Random
    skews: dict[str, Skew] = field(default_factory=dict)
    next_fault_s: float = 0.0
    injected: int = 0

    def offset_ms(self, node_id: str, now_s: float) -> int:
        skew = self.skews.get(node_id)
        return self.base_ms[node_id] + (0 if skew is None else skew.error_ms(now_s))

    def strike(self, run: ClockRun) -> None:
        """Between safety-phase steps: maybe the next clock fault (one node at a time)."""
        if not self.faults or run.now_s < self.next_fault_s:
            return
        rng = self.rng
        self.next_fault_s = run.now_s + rng.uniform(*CLOCK_FAULT_GAP_S)
        kind = rng.choice(CLOCK_FAULTS)
        ids = run.cluster.node_ids
        leader = run.cluster.leader()
        node_id = leader if kind == "leap-leader-10d" and leader is not None else rng.choice(ids)
        if kind == "leap-leader-10d":
            skew = Skew(leap_ms=10 * DAY_MS)
        elif kind == "behind-1d":
            skew = Skew(leap_ms=-DAY_MS)
        elif kind == "step-5min":
            skew = Skew(leap_ms=rng.choice([-1, 1]) * 300_000)
        else:  # 5% fast or slow: past max_skew_ms within seconds (a real one takes hours)
            skew = Skew(drift_ms_per_s=rng.choice([-50.0, 50.0]), since_s=run.now_s)
        self.skews = {node_id: skew}  # the previous fault is undone: one bad clock at a time
        self.injected += 1
        run.note("clock", kind, node_id)
        run.after(rng.uniform(1.0, 3.0), lambda: self._undo(run, node_id, skew))

    def _undo(self, run: ClockRun, node_id: str, skew: Skew) -> None:
        if self.skews.get(node_id) is skew:
            del self.skews[node_id]
            run.note("clock", "fixed", node_id)

    def heal(self) -> None:
        self.skews.clear()
        self.faults = False


def sample(run: ClockRun) -> None:
    """Every running node reads the wall clock of each running peer it can reach both ways."""
    cluster, now_s = run.cluster, run.now_s
    network = cluster.network
    up = sorted(node_id for node_id in cluster.nodes if node_id not in run.nemesis.paused)
    for ticker in run.tickers:
        if ticker.node_id not in up or ticker.node is not cluster.nodes.get(ticker.node_id):
            continue
        for peer in up:
            if peer == ticker.node_id:
                continue
            if network.link(ticker.node_id, peer).cut or network.link(peer, ticker.node_id).cut:
                continue
            ticker.book.observe(peer, peer_wall_ms=run.wall_ms(peer), sent_mono_s=now_s - 0.001,
                                received_mono_s=now_s + 0.001)


class TimeChecker:
    """State time applied on any node <= the majority's clocks + AHEAD_MS_MAX, at every step."""

    def __init__(self) -> None:
        self.worst_ahead_ms = 0
        self.violations: list[str] = []
        self.checks = 0

    def check(self, run: ClockRun) -> None:
        clocks = sorted((run.wall_ms(node_id) for node_id in run.cluster.node_ids), reverse=True)
        majority_ms = clocks[len(clocks) // 2]  # the k-th largest, k a majority
        for node_id in sorted(run.cluster.nodes):
            state = run.machine.state(run.cluster.nodes[node_id])
            if state.now_ms == 0:
                continue
            self.checks += 1
            ahead_ms = state.now_ms - majority_ms
            self.worst_ahead_ms = max(self.worst_ahead_ms, ahead_ms)
            if ahead_ms > AHEAD_MS_MAX and len(self.violations) < 5:
                self.violations.append(
                    f"time: {node_id}'s state time is {ahead_ms} ms ahead of the majority's "
                    f"clocks (bound {AHEAD_MS_MAX} ms) at {run.now_s - run.start_s:.2f} s")
