"""This node's recent activity, for the dashboard's charts: per-queue throughput (jobs
submitted, succeeded and failed per second) and claim latency (p50, p99), sampled every
`SAMPLE_S` over the last `KEPT_S`, served by `GET /v1/activity` (cluster/http/activity.py).

What it owns: turning cumulative figures the node already has into per-interval figures. The
job counters are the replicated state's (`raftcron_jobs_*_total`, the same on every node); the
claim latencies are this node's `NodeStats.claim_latency` histogram (claims it served). A
sample is the difference between two readings, so nothing here counts anything twice.

The rules:
- A counter that went down was reset (as Prometheus' `rate` reads one): its increase over the
  interval is its new value. A queue not seen before counts from 0.
- The first reading, and any reading while the node is not ready (replaying its log, or without
  a leader: its copy of the counters then climbs by whatever it applies, not by what happened
  in the interval), is a gap: the charts break their lines there rather than draw a burst.
- Bounded: at most `SAMPLES_KEPT` samples, each naming at most `QUEUES_PER_SAMPLE_MAX`
  queues (the busiest in that interval; the rest are summed as `other_queues`), and queues
  idle in an interval are left out of it. Beside the ring the node keeps one reading of
  every queue's counters (as many entries as the state has queues, which its budget bounds).

What it must not do: go into the replicated state (this is one node's observation: two nodes
sample at different moments, and a restart starts the ring again), or read a clock:
`ActivityRing` takes time in, and only `ActivitySampler` reads one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raftcron.cluster.consensus.replica import StateUnavailable
from raftcron.cluster.telemetry.histogram import Histogram

log = logging.getLogger("raftcron.activity")
SAMPLE_S = 5.0
KEPT_S = 15 * 60
SAMPLES_KEPT = int(KEPT_S / SAMPLE_S)
QUEUES_PER_SAMPLE_MAX = 20
COUNTERS = ("submitted", "succeeded", "failed")
QUANTILES = {"p50_ms": 0.5, "p99_ms": 0.99}

CounterTotals = dict[str, dict[str, int]]  # counter -> queue -> cumulative count


@dataclass(frozen=True)
class ActivityReading:
    """What the node has at one moment: cumulative counters and the claim histogram's buckets."""

    at_ms: int  # wall clock: where the sample sits on the charts' time axis
    mono_s: float  # monotonic: how long an interval lasted (a wall clock may jump)
    totals: CounterTotals
    claim_buckets: tuple[int, ...]  # Histogram.counts: per bucket, not cumulative
    ready: bool


def increase(before: int, after: int) -> int:
    """A counter's increase between two readings; a counter that went down was reset."""
    return after if after < before else after - before


def bucket_increase(before: tuple[int, ...], after: tuple[int, ...]) -> tuple[int, ...]:
    """The histogram's observations between two readings (all of `after` after a reset)."""
    if len(before) != len(after) or any(b < a for a, b in zip(before, after, strict=True)):
        return after
    return tuple(b - a for a, b in zip(before, after, strict=True))


def quantile_ms(q: float, buckets: tuple[int, ...], bounds_s: tuple[float, ...]) -> float | None:
    """The q-quantile of per-bucket counts, interpolated inside its bucket as Prometheus'
    `histogram_quantile` does (the +Inf bucket answers the highest finite bound); None when
    the buckets are empty."""
    total = sum(buckets)
    if total == 0:
        return None
    rank = q * total
    running = 0
    for index, count in enumerate(buckets):
        if running + count >= rank and count:
            if index >= len(bounds_s):
                return bounds_s[-1] * 1000
            low = bounds_s[index - 1] if index else 0.0
            high = bounds_s[index]
            return round((low + (high - low) * (rank - running) / count) * 1000, 3)
        running += count
    return bounds_s[-1] * 1000


def _per_s(count: int, seconds: float) -> float:
    return round(count / seconds, 4)


def sample(
    before: ActivityReading, after: ActivityReading, bounds_s: tuple[float, ...]
) -> dict[str, Any]:
    """The JSON sample of the interval between two readings (see the module's rules)."""
    seconds = after.mono_s - before.mono_s
    out: dict[str, Any] = {"at_ms": after.at_ms, "interval_ms": round(seconds * 1000)}
    if not (before.ready and after.ready) or seconds <= 0:
        return {**out, "gap": True, "queues": {}, "other_queues": None, "claims": None}
    moved: dict[str, dict[str, int]] = {}
    for counter in COUNTERS:
        old = before.totals.get(counter, {})
        for queue, value in after.totals.get(counter, {}).items():
            delta = increase(old.get(queue, 0), value)
            if delta:
                moved.setdefault(queue, dict.fromkeys(COUNTERS, 0))[counter] = delta
    busiest = sorted(moved, key=lambda queue: (-sum(moved[queue].values()), queue))
    kept, rest = busiest[:QUEUES_PER_SAMPLE_MAX], busiest[QUEUES_PER_SAMPLE_MAX:]
    queues = {
        queue: {f"{c}_per_s": _per_s(moved[queue][c], seconds) for c in COUNTERS}
        for queue in sorted(kept)
    }
    other = None
    if rest:
        other = {"queues": len(rest)} | {
            f"{c}_per_s": _per_s(sum(moved[queue][c] for queue in rest), seconds)
            for c in COUNTERS
        }
    claimed = bucket_increase(before.claim_buckets, after.claim_buckets)
    claims = {"count": sum(claimed)} | {
        name: quantile_ms(q, claimed, bounds_s) for name, q in QUANTILES.items()
    }
    return {**out, "gap": False, "queues": queues, "other_queues": other, "claims": claims}


class ActivityRing:
    """The last `SAMPLES_KEPT` samples, and the reading the next one is measured from."""

    def __init__(self, bounds_s: tuple[float, ...] = Histogram.SECONDS,
                 samples_kept: int = SAMPLES_KEPT) -> None:
        self.bounds_s = bounds_s
        self.samples: deque[dict[str, Any]] = deque(maxlen=samples_kept)
        self.last: ActivityReading | None = None
        self.started_ms: int | None = None

    def record(self, reading: ActivityReading) -> None:
        if self.last is None:
            self.started_ms = reading.at_ms
            self.samples.append({"at_ms": reading.at_ms, "interval_ms": 0, "gap": True,
                                 "queues": {}, "other_queues": None, "claims": None})
        else:
            self.samples.append(sample(self.last, reading, self.bounds_s))
        self.last = reading

    def since(self, after_ms: int) -> list[dict[str, Any]]:
        """The samples taken after `after_ms` (wall clock), oldest first."""
        return [s for s in self.samples if s["at_ms"] > after_ms]


def counter_totals(state: Any) -> CounterTotals:
    """A copy of the job counters the charts draw (a query run under the apply lock)."""
    return {counter: dict(state.counters.get(counter, {})) for counter in COUNTERS}


class ActivitySampler:
    """Reads the node's figures into an `ActivityRing` every `SAMPLE_S`, until stopped."""

    def __init__(self, ring: ActivityRing, *, totals: Callable[[], CounterTotals],
                 claim_latency: Histogram, ready: Callable[[], bool]) -> None:
        self.ring = ring
        self.totals = totals  # the counters, read through the replica's seam
        self.claim_latency = claim_latency
        self.ready = ready
        self._task: asyncio.Task[None] | None = None

    def take(self) -> None:
        self.ring.record(ActivityReading(
            at_ms=time.time_ns() // 1_000_000,
            mono_s=time.monotonic(),
            totals=self.totals(),
            claim_buckets=tuple(self.claim_latency.counts),
            ready=self.ready(),
        ))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="activity-sampler")

    async def run(self) -> None:
        while True:
            try:
                self.take()
            except StateUnavailable:  # a snapshot install is replacing the state: no sample
                pass
            except Exception:  # a bug here must not stop the sampling, nor the node
                log.exception("activity sample failed", extra={"action": "activity_failed"})
            await asyncio.sleep(SAMPLE_S)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
