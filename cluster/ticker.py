"""The leader's clock: the only source of `Tick` (and of `BeginLeadership`) in the log.

Runs on every node, proposes only while this node leads. On becoming leader it first proposes
`BeginLeadership` (existing leases get a grace period; the state records who leads, so ticks
from anyone else are ignored), then a `Tick(now)` every `tick_ms`, or sooner when something is
due sooner (a schedule's fire time, a delayed job, a lease end), so fires are not late by up
to a whole tick. One Tick is in flight at a time: a slow commit delays the next tick instead
of piling them up.

Deciding "am I leader" here is only an optimisation: a deposed leader's proposals cannot
commit, and a Tick that reaches the log from a node that is not the recorded leader is ignored
by the state machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from cluster.bridge import Proposer, Unavailable
from cluster.metrics import Histogram
from cluster.replica import RaftNode
from scheduler.commands import BeginLeadership, Tick
from scheduler.errors import Ok

log = logging.getLogger("raftcron.ticker")


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Ticker:
    def __init__(
        self,
        node: RaftNode,
        proposer: Proposer,
        *,
        tick_ms: int,
        fire_lateness: Histogram | None = None,
    ) -> None:
        self.node = node
        self.proposer = proposer
        self.tick_ms = tick_ms
        self.led_term: int | None = None  # the term whose BeginLeadership committed
        self.fire_lateness = fire_lateness or Histogram()
        self.ticks = 0
        self.last_tick_ms = 0
        self.wake = asyncio.Event()  # set to re-plan early (a new earlier due time)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="ticker")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run(self) -> None:
        while True:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Unavailable as error:
                log.debug("tick not committed: %s", error)
                await asyncio.sleep(self.tick_ms / 1000)
            except Exception:
                log.exception("ticker step failed")
                await asyncio.sleep(self.tick_ms / 1000)

    async def _step(self) -> None:
        if not self.node.is_leader():
            self.led_term = None
            await self._sleep(self.tick_ms)
            return
        term = self.node.term
        me = self.node.config.node_id
        if self.led_term != term:
            # One log entry: a claim applied between the two would get its lease from the
            # previous leader's (possibly minutes old) time and expire at this first Tick.
            now_ms = wall_ms()
            await self.proposer.propose_together(
                [BeginLeadership(now_ms, me, term), Tick(now_ms, me)]
            )
            self.led_term = term
            log.info(
                "leadership begun in term %d",
                term,
                extra={"action": "leadership_begun", "term": term},
            )
        now_ms = wall_ms()
        result = await self.proposer.propose(Tick(now_ms, me))
        self.ticks += 1
        if isinstance(result, Ok):
            applied_ms = wall_ms()
            for fire_time_ms in result.value.get("fire_times_ms", ()):
                self.fire_lateness.observe(max(0, applied_ms - fire_time_ms) / 1000)
        self.last_tick_ms = now_ms
        await self._sleep(self._next_wait_ms())

    def _next_wait_ms(self) -> int:
        """Until the next tick: tick_ms, or less when something in the state is due sooner."""
        due_ms = self.next_due_ms()
        wait_ms = self.tick_ms
        if due_ms is not None:
            wait_ms = max(1, min(wait_ms, due_ms - wall_ms() + 1))
        return wait_ms

    def next_due_ms(self) -> int | None:
        """The earliest time the state has work to do (heap heads: may be early, never late)."""
        machine = self.node.machine
        with machine.lock:
            state = machine.state
            heads = [
                heap[0][0]
                for heap in (state.schedule_heap, state.table.delayed, state.table.leases)
                if heap
            ]
        return min(heads) if heads else None

    async def _sleep(self, wait_ms: int) -> None:
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), wait_ms / 1000)
