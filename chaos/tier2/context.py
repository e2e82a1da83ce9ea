"""`Context`: what a tier-2 plan uses while it injects faults: the nemesis, a seeded RNG, the
clock of the fault phase, progress, and the waits every plan needs (a ready cluster, a leader,
leadership moved to a node). The plans are in chaos/tier2/plans.py and the fault kinds of their own
(chaos/tier2/storage_faults.py, chaos/tier2/power_faults.py); all of them take a Context.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from raftcron.chaos.tier2.history import History
from raftcron.chaos.tier2.nemesis import Nemesis
from raftcron.chaos.tier2.netns import Namespaces
from raftcron.cluster.dev.nodeprocesses import ClusterError


class Context:
    """What a plan uses: the nemesis, a seeded RNG, the clock of the fault phase, progress."""

    def __init__(
        self, scenario: str, nemesis: Nemesis, rng: random.Random, duration_s: float,
        history: History, progress: Callable[[str], None],
    ) -> None:
        self.scenario = scenario  # its name
        self.nemesis = nemesis
        self.cluster = nemesis.cluster
        self.workers = nemesis.workers
        self.rng = rng
        self.history = history
        self.started = time.monotonic()
        self.deadline = self.started + duration_s
        self.duration_s = duration_s
        self.progress = progress
        self._last_progress = 0.0

    @property
    def namespaces(self) -> bool:
        return isinstance(self.cluster.net, Namespaces)

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def hold(self, seconds: float) -> None:
        """Keep the current fault (or the quiet) for `seconds`, reporting progress."""
        end = time.monotonic() + seconds
        while True:
            self.tick()
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(0.25, remaining))

    def tick(self) -> None:
        for node in self.cluster.crashed_nodes():
            if not node.crash_reported:
                node.crash_reported = True
                tail = " | ".join(self.cluster.log_lines(node)[-5:])
                self.history.record(
                    "note", crash=True, node=node.node_id,
                    text=f"{node.node_id} exited by itself: {tail[-600:]}",
                )
                self.cluster.start_node(node)
        now = time.monotonic()
        if now - self._last_progress >= 2.0:
            self._last_progress = now
            elapsed = now - self.started
            self.progress(
                f"{self.scenario}: {elapsed:5.0f}/{self.duration_s:.0f} s, "
                f"{self.nemesis.faults} faults"
            )

    def leader(self) -> str | None:
        try:
            return self.nemesis.pick_leader()
        except ClusterError:
            return None

    def wait_ready(self, timeout_s: float = 30) -> bool:
        # never far past the plan's deadline: a cluster that does not recover must not stall
        # the run (the final heal and the liveness checker then judge it)
        timeout_s = min(timeout_s, max(5.0, self.left_s() + 20))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.tick()
            try:
                self.cluster.wait_ready(min(5.0, max(0.5, deadline - time.monotonic())))
                return True
            except ClusterError:
                continue
        self.history.record("note", text=f"cluster not ready within {timeout_s} s")
        return False

    def node_ids(self) -> list[str]:
        return [node.node_id for node in self.cluster.nodes]

    def move_leadership_to(self, target: str, attempts: int = 6) -> bool:
        """Pause whoever leads (a fault) until `target` leads; bounded attempts."""
        for _ in range(attempts):
            if self.left_s() <= 0:
                break
            leader = self.leader()
            if leader == target:
                return True
            if leader is None:
                self.wait_ready(15)
                continue
            fault = self.nemesis.pause([leader], fault="force_leader")
            self.hold(2.5)
            self.nemesis.resume(fault, [leader])
            self.wait_ready(15)
        return self.leader() == target


# -- plans ---------------------------------------------------------------------------------
