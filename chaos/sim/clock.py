"""Fake time and seeded randomness for PySyncObj, so that a simulation replays from its seed.

Owns the pysyncobj module globals that read a clock or draw random numbers. Every clock read in
pysyncobj goes through a module-level ``monotonicTime`` imported by name (syncobj, transport,
tcp_connection, dns_resolver); randomness is the ``random`` module in syncobj (election
timeouts), transport (TCP send jitter) and dns_resolver (address choice). ``time.sleep`` is
only reached with autoTick or an unready transport, neither of which a simulation uses.
Must not be nested: the patch is process-global, one simulation at a time.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CLOCK_USERS = (
    "pysyncobj.syncobj",
    "pysyncobj.transport",
    "pysyncobj.tcp_connection",
    "pysyncobj.dns_resolver",
)
RANDOM_USERS = ("pysyncobj.syncobj", "pysyncobj.transport", "pysyncobj.dns_resolver")


class FakeClock:
    """Monotonic seconds that move when the simulation says so, plus a little per read.

    Every read costs ``read_cost_s``: work takes time. pysyncobj bounds some loops only by a
    time budget (``__sendAppendEntries`` spins while the serializer is busy, until
    ``appendEntriesPeriod`` has passed); on a clock that never moved they would never end.
    """

    def __init__(self, start_s: float = 1000.0, read_cost_s: float = 0.00005) -> None:
        self.now_s = start_s
        self.read_cost_s = read_cost_s

    def __call__(self) -> float:
        self.now_s += self.read_cost_s
        return self.now_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock does not go back")
        self.now_s += seconds

    def advance_to(self, instant_s: float) -> None:
        """Move to an instant unless reads already carried the clock past it."""
        self.now_s = max(self.now_s, instant_s)


_active = False


@contextmanager
def simulated_pysyncobj(clock: FakeClock, rng: random.Random) -> Iterator[None]:
    """Route pysyncobj's clock reads to ``clock`` and its random draws to ``rng``."""
    global _active
    if _active:
        raise RuntimeError("pysyncobj is already under simulation in this process")
    saved: list[tuple[Any, str, Any]] = []
    try:
        _active = True
        # random.Random has the same random()/choice() surface as the random module.
        replacements = (("monotonicTime", CLOCK_USERS, clock), ("random", RANDOM_USERS, rng))
        for attribute, module_names, replacement in replacements:
            for name in module_names:
                module = importlib.import_module(name)
                saved.append((module, attribute, getattr(module, attribute)))
                setattr(module, attribute, replacement)
        yield
    finally:
        for module, attribute, value in reversed(saved):
            setattr(module, attribute, value)
        _active = False
