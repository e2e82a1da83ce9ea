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

The time a Tick carries is not simply this node's wall clock (cluster/clock/clocks.py, DESIGN.md
§8.2): it is bounded by the majority's clocks (or by the monotonic time elapsed since the last
evidence), so one wrong clock cannot move the cluster's time for good. A node whose clock is
off from the majority's by more than `[clock] max_skew_ms` never proposes its own clock: while
it leads, its Ticks carry the majority's time (nothing while that is unknown), and it says so
in its log (`action=clock_skewed`), once per change. It does not hand leadership away: the
Raft TimeoutNow transfer (`RaftNode.step_down`) forked the log in a tier-1 power-loss run
(seed 17) and stays unused until that is understood.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from raftcron.cluster.clock.clocks import ClockBook, ClockView, TickBound, TickDecision, decide_tick
from raftcron.cluster.consensus.proposer import ProposalFailed, Proposer
from raftcron.cluster.consensus.replica import RaftNode, StateUnavailable
from raftcron.cluster.telemetry.histogram import Histogram
from raftcron.scheduler import views
from raftcron.scheduler.commands import BeginLeadership, Command, Tick
from raftcron.scheduler.errors import Ok
from raftcron.scheduler.gate import RELEASE_LEVEL, Finalize

log = logging.getLogger("raftcron.ticker")


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def leadership_entry(
    led_term: int | None, term: int, node_id: str, now_ms: int,
    finalize: Finalize | None = None,
) -> list[Command] | None:
    """The entry a leader proposes before its next Tick: on a term it has not begun,
    BeginLeadership and a first Tick as ONE entry (a claim applied between the two would get
    its lease from the previous leader's, possibly minutes old, time and expire at this first
    Tick); None once the term is begun. `finalize`: the first leader of a new cluster opens the
    upgrade gate in the same entry, after the Tick (nothing but time is applied before it), so
    no request ever meets the new cluster unfinalized. chaos/tier1 proposes through this very
    function."""
    if led_term == term:
        return None
    entry: list[Command] = [BeginLeadership(now_ms, node_id, term), Tick(now_ms, node_id)]
    if finalize is not None:
        entry.append(finalize)
    return entry


class Ticker:
    def __init__(
        self,
        node: RaftNode,
        proposer: Proposer,
        *,
        tick_ms: int,
        clocks: ClockBook | None = None,
        bound: TickBound | None = None,
        fire_lateness: Histogram | None = None,
        releases: Callable[[], dict[str, int | None]] | None = None,
    ) -> None:
        self.node = node
        # The peers' release levels as the clock poller last heard them
        # (cluster/clock/clockpoll.py).
        self.releases = releases or dict
        self.proposer = proposer
        self.tick_ms = tick_ms
        if clocks is None:
            members = [peer.node_id for peer in node.config.members]
            clocks = ClockBook(
                node.config.node_id, members, max_skew_ms=node.config.clock.max_skew_ms
            )
        self.clocks = clocks
        self.bound = bound or TickBound(node.config.clock.tick_slack_ms)
        self.last_view: ClockView | None = None  # for /v1/cluster and /metrics
        self.skewed = False
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
            except ProposalFailed as error:
                log.debug("tick not committed: %s", error)
                await asyncio.sleep(self.tick_ms / 1000)
            except StateUnavailable:  # a snapshot install is replacing the state: shortly back
                await asyncio.sleep(self.tick_ms / 1000)
            except Exception:
                log.exception("ticker step failed")
                await asyncio.sleep(self.tick_ms / 1000)

    def decide(self) -> TickDecision:
        state_now_ms = self.node.machine.read(views.now_ms)
        decision = decide_tick(
            self.clocks,
            self.bound,
            wall_ms=wall_ms(),
            mono_s=time.monotonic(),
            state_now_ms=state_now_ms,
        )
        self.last_view = decision.view
        skewed = decision.reason == "skewed"
        if skewed != self.skewed:
            self.skewed = skewed
            skew_ms = decision.view.skew_ms
            if skewed:
                log.warning(
                    "this node's clock is %d ms off from the majority's (max_skew_ms %d): "
                    "its Ticks carry the majority's time only, until it agrees again",
                    skew_ms,
                    decision.view.max_skew_ms,
                    extra={"action": "clock_skewed", "skew_ms": skew_ms},
                )
            else:
                log.info(
                    "this node's clock agrees with the majority's again",
                    extra={"action": "clock_agrees", "skew_ms": skew_ms},
                )
        return decision

    async def _step(self) -> None:
        decision = self.decide()
        if not self.node.is_leader():
            self.led_term = None
            await self._sleep(self.tick_ms)
            return
        if decision.now_ms is None:
            log.debug("no Tick: the majority's clocks are not known (%s)", decision.reason)
            self.led_term = None
            await self._sleep(self.tick_ms)
            return
        now_ms: int = decision.now_ms
        term = self.node.term
        me = self.node.config.node_id
        entry = leadership_entry(self.led_term, term, me, now_ms, self.new_cluster_finalize())
        if entry is not None:
            await self.proposer.propose_together(entry)
            self.led_term = term
            log.info(
                "leadership begun in term %d",
                term,
                extra={"action": "leadership_begun", "term": term},
            )
            after = self.decide().now_ms
            if after is None:
                return
            now_ms = after
        result = await self.proposer.propose(Tick(now_ms, me))
        self.ticks += 1
        if isinstance(result, Ok):
            applied_ms = wall_ms()
            for fire_time_ms in result.value.get("fire_times_ms", ()):
                self.fire_lateness.observe(max(0, applied_ms - fire_time_ms) / 1000)
        self.last_tick_ms = now_ms
        await self._sleep(self._next_wait_ms())

    def stamp(self) -> Tick | None:
        """A Tick to put before a command in one log entry, so the command is applied at this
        leader's time rather than the last Tick's (a claim counted by a rate window, DESIGN.md
        §9.4); None when this node does not lead a committed term or has no agreed time."""
        if not self.node.is_leader() or self.led_term != self.node.term:
            return None
        now_ms = self.decide().now_ms
        return None if now_ms is None else Tick(now_ms, self.node.config.node_id)

    def new_cluster_finalize(self) -> Finalize | None:
        """A Finalize when this node is the first leader of a new cluster (its state never
        ticked) and no member it has heard from runs an older release (DESIGN.md §9.0: a new
        cluster starts finalized). A member not heard from yet is taken to be of this release,
        as the members of a new cluster start from one install; an older one that answered
        leaves the cluster unfinalized until `raftcron cluster finalize`."""
        new = self.node.machine.read(lambda state: state.now_ms == 0 and not state.finalized)
        if not new:
            return None
        releases = self.releases()
        if any(level is None or level < RELEASE_LEVEL for level in releases.values()):
            log.warning(
                "a new cluster is not finalized: a member runs an older release (%s)",
                ", ".join(f"{node} {level}" for node, level in sorted(releases.items())),
                extra={"action": "finalize_skipped"},
            )
            return None
        return Finalize(None, RELEASE_LEVEL, self.node.config.settings)

    def _next_wait_ms(self) -> int:
        """Until the next tick: tick_ms, or less when something in the state is due sooner."""
        due_ms = self.next_due_ms()
        wait_ms = self.tick_ms
        if due_ms is not None:
            # Against the time the next Tick may carry, not the wall clock: a clock ahead of
            # the bound would otherwise tick every millisecond until the bound caught up.
            ahead_ms = self.decide().now_ms
            now_ms = wall_ms() if ahead_ms is None else ahead_ms
            wait_ms = max(1, min(wait_ms, due_ms - now_ms + 1))
        return wait_ms

    def next_due_ms(self) -> int | None:
        """The earliest time the state has work to do (SchedulerState.next_due_ms)."""
        machine = self.node.machine
        return machine.read(views.next_due_ms)

    async def _sleep(self, wait_ms: int) -> None:
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), wait_ms / 1000)
