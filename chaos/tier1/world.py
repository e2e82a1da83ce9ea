"""`SimWorld`: what every part of a tier-1 run reads of the run (the `SeedRun` of chaos.tier1.run):
its simulated time, cluster and replicas, its RNG, notes, problems and timers.

The parts (the outbox, the clocks, the nemesis, the audit, the workload) each extend it with
the few things of their own, so none of them imports run.py, which builds them all.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from raftcron.chaos.tier1.machine import RecordingCluster, ReplicaMachine


class SimWorld(Protocol):
    rng: random.Random
    problems: list[str]  # seen while running (the rest: audit, at the end)
    start_s: float

    @property
    def now_s(self) -> float: ...

    @property
    def cluster(self) -> RecordingCluster: ...

    @property
    def machine(self) -> ReplicaMachine: ...

    def wall_ms(self, node_id: str) -> int:
        """What node_id's wall clock reads now (its offset and skew included)."""
        ...

    def note(self, *fields: object) -> None: ...

    def after(self, delay_s: float, action: Callable[[], None]) -> None: ...
