"""The soak's load: producers of no-op jobs at a rate or as fast as accepted, and the ramp.

What it owns: submitting batches (1,000 jobs; 8 when each carries a large payload) to one
queue, paced at `rate` jobs/s with a few batches in flight, or flooding (every client sends its
next batch as soon as the last was answered); counting what was accepted and what was refused
`state_full`; and the ramp that finds the highest rate the cluster sustains with a flat
backlog. A 507 is counted and never retried here: that is what the soak reports. Any other
answer but 201 stops the producer with an error. Every loop is bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from raftcron.cluster.dev.bench.soakrecord import FLAT_SHARE, ProducerCounts
from raftcron.cluster.dev.bench.target import BenchTarget

BATCH_JOBS = 1_000
PAYLOAD_BATCH_JOBS = 8  # 8 x 60 KB: a body well under the API's 8 MiB
IN_FLIGHT_MAX = 4  # paced batches at once: enough for 50,000 jobs/s on a quiet cluster
FLOOD_CLIENTS = 2  # without payloads; with them, one client
REFUSED_PAUSE_S = 1.0  # a flood client's pause after a 507 (Retry-After asks 5 s: it floods)
CREDIT_MAX_S = 1.0  # a paced producer that fell behind catches up at most this much at once

RAMP_START_PER_S = 3_000
FILL_S_MAX = 1_200.0  # the fill before the ramp: a million small jobs at 3,000/s take ~6 min
RAMP_WINDOW_S = 10.0
RAMP_WINDOWS_MAX = 12
RAMP_RAISE = 1.25
RAMP_BACK_OFF = 0.75
RAMP_RATE_MIN_PER_S = 100
RAMP_DONE_SHARE = 0.95  # jobs succeeded over a window, as a share of those submitted
HOLD_SHARE = 0.9
SETTLE_S_MAX = 120.0  # after the ramp, the longest wait for its backlog to drain


class Producer:
    """Submits jobs to `queue` until stopped or `until` (time.monotonic()); `rate` None floods,
    0 pauses a paced producer."""

    def __init__(
        self, target: BenchTarget, queue: str, *, rate: float | None, payload_kb: int, until: float
    ) -> None:
        self.target = target
        self.rate = rate
        self.until = until
        self.batch = PAYLOAD_BATCH_JOBS if payload_kb else BATCH_JOBS
        job: dict[str, Any] = {"task": "noop", "queue": queue}
        if payload_kb:
            job["payload"] = {"blob": "x" * (payload_kb * 1024 - 16)}
        self.body = {"jobs": [job] * self.batch}
        self.clients = 1 if payload_kb else FLOOD_CLIENTS
        self.submitted = self.refused = self.refused_jobs = 0
        self._stopped = asyncio.Event()

    def counts(self) -> ProducerCounts:
        return ProducerCounts(self.submitted, self.refused, self.refused_jobs)

    def stop(self) -> None:
        self._stopped.set()

    async def run(self) -> None:
        if self.rate is None:
            await asyncio.gather(*(self._flood() for _ in range(self.clients)))
        else:
            await self._paced()

    def _going(self) -> bool:
        return not self._stopped.is_set() and time.monotonic() < self.until

    async def _submit(self) -> bool:
        """One batch; True when accepted, False when refused for want of room."""
        status, answer = await self.target.call("POST", "/v1/jobs/batch", self.body)
        if status == 201:
            self.submitted += self.batch
            return True
        if status == 507:
            self.refused += 1
            self.refused_jobs += self.batch
            return False
        raise RuntimeError(f"batch submit answered {status}: {str(answer)[:300]}")

    async def _flood(self) -> None:
        while self._going():
            if not await self._submit():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), REFUSED_PAUSE_S)

    async def _paced(self) -> None:
        credit, last = 0.0, time.monotonic()
        pending: set[asyncio.Task[bool]] = set()
        try:
            while self._going():
                rate, now = self.rate or 0.0, time.monotonic()
                if rate <= 0:
                    credit, last = 0.0, now
                    await asyncio.sleep(0.05)
                    continue
                credit = min(credit + rate * (now - last),
                             max(rate * CREDIT_MAX_S, self.batch * IN_FLIGHT_MAX))
                last = now
                while credit >= self.batch and len(pending) < IN_FLIGHT_MAX:
                    credit -= self.batch
                    pending.add(asyncio.create_task(self._submit()))
                for task in [task for task in pending if task.done()]:
                    pending.discard(task)
                    task.result()  # what a submit raised stops the producer
                wait_s = (self.batch - credit) / rate if credit < self.batch else 0.0
                await asyncio.sleep(min(max(wait_s, 0.005), 0.25))
            await asyncio.gather(*pending)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


# -- the ramp -----------------------------------------------------------------------------

Probe = Callable[[], Awaitable[tuple[float, float]]]  # () -> (backlog, jobs succeeded)


async def find_rate(
    producer: Producer, probe: Probe, *, say: Callable[[str], None]
) -> tuple[int | None, list[dict[str, Any]]]:
    """Raise the producer's rate while the backlog stays flat over a window; the last rate
    that did (None if none did within RAMP_WINDOWS_MAX windows) and every window's figures.
    A start rate that already grows the backlog is lowered until one does not."""
    rate, found = float(RAMP_START_PER_S), None
    windows: list[dict[str, Any]] = []
    for _ in range(RAMP_WINDOWS_MAX):
        producer.rate = rate
        window = await _window(producer, probe, rate)
        windows.append(window)
        say(f"ramp {window['rate_per_s']:,}/s: backlog {window['backlog_growth_per_s']:+,}/s "
            f"-> {'flat' if window['flat'] else 'grows'}")
        if window["flat"]:
            found = window["rate_per_s"]
            rate *= RAMP_RAISE
        elif found is not None or rate <= RAMP_RATE_MIN_PER_S:
            break  # grew past the rate found, or grows even at the lowest rate tried
        else:
            rate = max(RAMP_RATE_MIN_PER_S, rate * RAMP_BACK_OFF)
    return found, windows


async def _window(producer: Producer, probe: Probe, rate: float) -> dict[str, Any]:
    """Hold `rate` for RAMP_WINDOW_S, sampling the backlog each second: flat when its least-
    squares slope stays under a share of the rate (one batch over the window at least), the
    producer got its submits through and the workers ran nearly as many."""
    started, submitted = time.monotonic(), producer.submitted
    samples: list[tuple[float, float]] = []
    succeeded_first = succeeded = 0.0
    for index in range(int(RAMP_WINDOW_S) + 1):
        await asyncio.sleep(max(0.0, started + index - time.monotonic()))
        backlog, succeeded = await probe()
        samples.append((time.monotonic() - started, backlog))
        if index == 0:
            succeeded_first = succeeded
    elapsed_s = max(time.monotonic() - started, 1e-9)
    slope = backlog_slope(samples)
    submit_per_s = (producer.submitted - submitted) / elapsed_s
    succeeded_per_s = (succeeded - succeeded_first) / max(samples[-1][0], 1e-9)
    allowed = max(FLAT_SHARE * rate, producer.batch / RAMP_WINDOW_S)
    return {
        "rate_per_s": round(rate),
        "submit_per_s": round(submit_per_s),
        "succeeded_per_s": round(succeeded_per_s),
        "backlog_growth_per_s": round(slope),
        "flat": slope <= allowed
        and submit_per_s >= HOLD_SHARE * rate
        and succeeded_per_s >= RAMP_DONE_SHARE * submit_per_s,
    }


Evictions = Callable[[], Awaitable[int]]  # () -> finished jobs evicted so far, by any reason


async def fill(producer: Producer, evictions: Evictions, *, rate: float,
               say: Callable[[str], None]) -> float:
    """Run at `rate` until the state evicts (its retention or its budget is reached: the
    steady state of a cluster that runs for months), bounded by FILL_S_MAX; the seconds it
    took. A ramp on an empty state finds a rate it cannot hold once every finished job must
    also be evicted."""
    producer.rate = rate
    started = time.monotonic()
    while time.monotonic() - started < FILL_S_MAX:
        if await evictions() > 0:
            break
        await asyncio.sleep(2.0)
    took = time.monotonic() - started
    say(f"filled: the state evicts after {took:.0f} s at {round(rate):,}/s")
    return took


async def settle(producer: Producer, probe: Probe) -> float:
    """Pause the producer until the backlog the ramp left is down to two batches (bounded by
    SETTLE_S_MAX), so the soak starts flat; the seconds it took."""
    rate, producer.rate = producer.rate, 0.0
    started = time.monotonic()
    try:
        while time.monotonic() - started < SETTLE_S_MAX:
            backlog, _ = await probe()
            if backlog <= 2 * producer.batch:
                break
            await asyncio.sleep(0.5)
    finally:
        producer.rate = rate
    return time.monotonic() - started


def backlog_slope(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, backlog) samples (0 with fewer than two)."""
    if len(samples) < 2:
        return 0.0
    mean_t = sum(t for t, _ in samples) / len(samples)
    mean_b = sum(b for _, b in samples) / len(samples)
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (b - mean_b) for t, b in samples) / spread
