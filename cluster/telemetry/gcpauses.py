"""`GcPauses`: how long this process's cycle collector ran, each time, by generation.

A collection holds the GIL from its start to its end: every thread of a node (the Raft loop,
the HTTP loop, the log's writes) waits meanwhile, so a long one shows as a step in every
latency at once. A node keeps a million-job state on its heap: at 4,900 jobs/s a young
collection took 25-28 ms on average and a middle one 100-250 ms (docs/proof/benchmarks.md,
fifth sitting); the histogram lets an operator tell such a pause from a slow disk or a slow
peer.

One recorder per process (`process_pauses`), fed by `gc.callbacks`: the collector is the
process's, whatever number of nodes a test runs in it.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

from raftcron.cluster.telemetry.histogram import Histogram

GENERATIONS = (0, 1, 2)
# From a young collection of a small heap (well under a millisecond) to a full one of a large
# heap (seconds).
PAUSE_SECONDS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0
)


class GcPauses:
    """A histogram of collection pauses per generation; a `gc.callbacks` entry."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.pauses = {generation: Histogram(PAUSE_SECONDS) for generation in GENERATIONS}
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        # The collector runs one collection at a time, holding the GIL: a start is always
        # followed by its own stop, with nothing between them.
        if phase == "start":
            self._started = self.clock()
            return
        started, self._started = self._started, None
        generation = info.get("generation")
        if started is not None and generation in self.pauses:
            self.pauses[generation].observe(self.clock() - started)


_process: GcPauses | None = None
_process_lock = threading.Lock()


def process_pauses() -> GcPauses:
    """This process's recorder, hooked into the collector on the first call."""
    global _process
    with _process_lock:
        if _process is None:
            _process = GcPauses()
            gc.callbacks.append(_process)
        return _process
