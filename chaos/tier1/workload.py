"""Who sends what: each node's ticker, the workers, the clients.

Owns the actors of a run, each stepped by chaos.tier1.run once per simulated step:

* ``SimTicker``: cluster/clock/ticker.py's rules on a node's simulated wall clock (see its
docstring).
* ``SimWorker``: claims, heartbeats and acks like cluster/worker, one request in flight at a
  time; a dishonest one fails, stalls past its lease (then heartbeats and completes with a
  stale token) or crashes holding leases.
* ``SimClient``: puts the schedules (every 1, 2, 3 and 5 s; ``fire_once``, ``fire_all``,
  ``skip``; one fires a diamond workflow; one keeps only two finished runs), submits jobs and
  workflows with idempotency keys (some keys repeated, some requests re-proposed whole),
  backfills the schedule that keeps few runs (over times whose jobs are gone, and from before
  and after the retention horizon), deletes, creates again and triggers a manual schedule.

Requests go through chaos.tier1.requests; nothing here reads the log or judges a result
beyond what the product's own client would do with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pysyncobj import SyncObj

from raftcron.chaos.sim.cluster import Proposal
from raftcron.chaos.tier1.clocks import MAX_SKEW_MS, TICK_SLACK_MS, PausedNodes
from raftcron.chaos.tier1.faults import Profile
from raftcron.chaos.tier1.requests import Request
from raftcron.chaos.tier1.world import SimWorld
from raftcron.cluster.clock.clocks import ClockBook, TickBound, TickDecision, decide_tick
from raftcron.cluster.clock.ticker import leadership_entry
from raftcron.scheduler import limits
from raftcron.scheduler.commands import (
    Ack,
    BackfillSchedule,
    ClaimJobs,
    Command,
    CompleteJob,
    DeleteSchedule,
    FailJob,
    Heartbeat,
    PutSchedule,
    SubmitJobs,
    SubmitWorkflow,
    Tick,
    TriggerSchedule,
)
from raftcron.scheduler.errors import Ok, Rejected, Result
from raftcron.scheduler.gate import DEFAULT_SETTINGS, RELEASE_LEVEL, Finalize
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.specs import JobSpec, WorkflowSpec


class WorkloadRun(SimWorld, Protocol):
    """What the clients, tickers and workers need of the run beyond the `SimWorld` (the
    `SeedRun` of chaos.tier1.run implements both; this module does not import it)."""

    phase: str  # start | safety | liveness
    tick_s: float
    requests_made: int
    all_requests: list[Request]

    @property
    def profile(self) -> Profile: ...

    @property
    def nemesis(self) -> PausedNodes: ...

    def true_ms(self) -> int: ...

    def rid(self) -> str: ...

    def propose_entry(self, node_id: str, commands: list[Command]) -> Proposal: ...

    def request(
        self,
        command: Command,
        origin: str,
        on_answer: Callable[[Result], None] | None = None,
        on_give_up: Callable[[], None] | None = None,
    ) -> Request: ...

    def repeat(self, request: Request) -> Request: ...


POLL_S = 0.2  # an idle worker's pause between empty claims
DIAMOND = {
    "jobs": [
        {"name": "a", "task": "flow"},
        {"name": "b", "task": "flow", "after": ["a"]},
        {"name": "c", "task": "flow", "after": ["a"]},
        {"name": "d", "task": "flow", "after": ["b", "c"]},
    ]
}
KEPT = "kept-1s"  # keeps two finished runs; the only schedule backfilled
MANUAL = "manual"  # fires once a year: only its triggers make jobs; deleted and created again
NOMINAL = ("every-1s", "every-2s", "flow-3s", "every-5s")  # fire by the clock alone
RETENTION_MS = limits.RETENTION_MS_DEFAULT


# -- the leader's clock -----------------------------------------------------------------------


class SimTicker:
    """cluster/clock/ticker.py's Ticker on a simulated wall clock. Like it: asleep while not leader
    (checking every tick_ms, woken at once by a role change, after `wake_s`, the loop's
    delay); on a term not yet begun, [BeginLeadership, Tick] as one entry (a new cluster's
    first leader adds Finalize: the upgrade gate opens at once) and, once it
    commits, a Tick right away; then one Tick in flight at a time, the next after tick_ms or
    sooner when the state has something due (`_next_wait_ms`); a failed or unanswered
    (commit timeout) proposal: sleep tick_ms and start over. Every Tick's time is
    cluster/clock/clocks.py's `decide_tick` on this process's ClockBook (fed by chaos.tier1.clocks)
    and TickBound: skewed, only the majority's time; without evidence of it, nothing."""

    def __init__(self, run: WorkloadRun, node_id: str) -> None:
        self.run, self.node_id = run, node_id
        self.node: SyncObj | None = None
        self.led_term: int | None = None
        self.leading = False  # the role seen at the last step (a change wakes the ticker)
        self.pending: tuple[Proposal, int | None] | None = None  # (proposal, term it begins)
        self.wake_s = 0.0
        self.book, self.bound = self._new_clocks()

    def _new_clocks(self) -> tuple[ClockBook, TickBound]:
        book = ClockBook(self.node_id, list(self.run.cluster.node_ids), max_skew_ms=MAX_SKEW_MS)
        return book, TickBound(TICK_SLACK_MS)

    def decide(self) -> TickDecision:
        assert self.node is not None
        return tick_time(self.book, self.bound, wall_ms=self.run.wall_ms(self.node_id),
                         mono_s=self.run.now_s,
                         state_now_ms=self.run.machine.state(self.node).now_ms)

    def step(self) -> None:
        run, now_s = self.run, self.run.now_s
        if self.node_id in run.nemesis.paused:
            return  # SIGSTOPped: it wakes up with the ticker it had
        node = run.cluster.nodes.get(self.node_id)
        if node is not self.node:  # a new process: nothing carried over
            self.node, self.led_term, self.pending, self.wake_s = node, None, None, 0.0
            self.leading = False
            self.book, self.bound = self._new_clocks()
        if node is None:
            return
        leading = bool(node._isLeader())
        if leading != self.leading:  # cluster/node.py: onStateChanged sets ticker.wake
            self.leading = leading
            self.wake_s = min(self.wake_s, now_s + run.profile.ticker_wake_s)
        if self.pending is not None:
            self._follow_up(now_s)
            return
        if now_s < self.wake_s:
            return
        decision = self.decide()
        if not leading:
            self.led_term, self.wake_s = None, now_s + run.tick_s
            return
        if decision.now_ms is None:  # no evidence of the majority's time: no Tick
            self.led_term, self.wake_s = None, now_s + run.tick_s
            return
        term = int(node.raftCurrentTerm)
        state = self.run.machine.state(node)
        # As cluster/clock/ticker.py's new_cluster_finalize: every simulated node runs this release.
        finalize = (Finalize(None, RELEASE_LEVEL, DEFAULT_SETTINGS)
                    if state.now_ms == 0 and not state.finalized else None)
        entry = leadership_entry(self.led_term, term, self.node_id, decision.now_ms, finalize)
        if entry is not None:
            self.pending = (run.propose_entry(self.node_id, entry), term)
        else:
            self._tick(decision)

    def _follow_up(self, now_s: float) -> None:
        """Once the proposal in flight is answered or timed out: what the product does next."""
        assert self.pending is not None
        proposal, term = self.pending
        timeout_s = self.run.profile.tuning.commit_timeout_s
        if proposal.outcome is None and now_s - proposal.proposed_at_s < timeout_s:
            return
        self.pending = None
        if not proposal.acknowledged:  # Unavailable / Indeterminate: sleep, then start over
            self.wake_s = now_s + self.run.tick_s
        elif term is not None:  # leadership begun: a Tick right away, without a leader check
            self.led_term = term
            self._tick(self.decide())
        else:
            self.wake_s = now_s + self._next_wait_ms() / 1000

    def _tick(self, decision: TickDecision) -> None:
        if decision.now_ms is None:
            self.wake_s = self.run.now_s + self.run.tick_s
            return
        tick = Tick(decision.now_ms, self.node_id)
        self.pending = (self.run.propose_entry(self.node_id, [tick]), None)

    def _next_wait_ms(self) -> int:
        """Until the next tick: tick_ms, or less when something in the state is due sooner."""
        assert self.node is not None
        state = self.run.machine.state(self.node)
        heads = [heap[0][0] for heap in (state.schedule_heap, state.table.delayed) if heap]
        lease_end = state.table.leases.first_ms()
        if lease_end is not None:
            heads.append(lease_end)
        wait_ms = self.run.profile.tuning.tick_ms
        if heads:
            # Against the time the next Tick may carry, not the wall clock: a clock ahead of
            # the bound would otherwise tick every millisecond until the bound caught up.
            ahead_ms = self.decide().now_ms
            now_ms = self.run.wall_ms(self.node_id) if ahead_ms is None else ahead_ms
            wait_ms = max(1, min(wait_ms, min(heads) - now_ms + 1))
        return wait_ms


def tick_time(book: ClockBook, bound: TickBound, *, wall_ms: int, mono_s: float,
              state_now_ms: int) -> TickDecision:
    """The product's rule (a seam: a self-test puts the unbounded `Tick(wall clock)` back)."""
    return decide_tick(book, bound, wall_ms=wall_ms, mono_s=mono_s, state_now_ms=state_now_ms)


# -- workers --------------------------------------------------------------------------------


@dataclass
class Held:
    token: int
    fate: str  # succeed | fail | fatal | stall | crash
    done_s: float
    beat_s: float


class SimWorker:
    """Claims, heartbeats and acks like cluster/worker, one request in flight at a time."""

    def __init__(
        self, run: WorkloadRun, name: str, queues: tuple[str, ...], *, honest: bool
    ) -> None:
        self.run, self.name, self.queues, self.honest = run, name, queues, honest
        self.held: dict[int, Held] = {}
        self.acks: list[Ack] = []  # to send with the next claim
        self.busy = False
        self.next_claim_s = 0.0
        self.dead_until_s = 0.0
        self.enabled = True

    def step(self) -> None:
        now_s = self.run.now_s
        if self.busy or now_s < self.dead_until_s or not self.enabled:
            return
        for job_id, held in list(self.held.items()):
            if now_s >= held.done_s:
                self._finish(job_id, held)
                return
            if now_s >= held.beat_s and held.fate != "stall":
                held.beat_s = now_s + self.run.profile.lease_ms / 3_000
                beat = Heartbeat(self.run.rid(), job_id, held.token)
                self._send(beat, self._on_heartbeat(job_id))
                return
        if len(self.held) < 2 and now_s >= self.next_claim_s:
            acks, self.acks = tuple(self.acks), []
            claim = ClaimJobs(
                self.run.rid(), self.name, self.queues, self.run.rng.choice([1, 1, 2]),
                self.run.profile.lease_ms, acks,
            )
            self._send(claim, self._on_claim, on_give_up=lambda: self.acks.extend(acks))

    def crash(self) -> None:
        """The process dies: every lease it holds is left to expire; it comes back later."""
        self.held.clear()
        self.acks.clear()
        self.busy = False
        self.dead_until_s = self.run.now_s + self.run.rng.uniform(1.0, 3.0)
        self.run.note("worker-crash", self.name)

    def _finish(self, job_id: int, held: Held) -> None:
        rng = self.run.rng
        del self.held[job_id]
        if held.fate == "crash":
            self.crash()
            return
        if held.fate == "stall":  # wakes up as if nothing happened: heartbeat, then complete
            complete = CompleteJob(self.run.rid(), job_id, held.token, {"by": self.name})
            beat = Heartbeat(self.run.rid(), job_id, held.token)
            self._send(beat, lambda _answer: self._send(complete))
            return
        if held.fate == "succeed":
            ack = Ack(job_id, held.token, "succeeded", result={"by": self.name})
        else:
            ack = Ack(job_id, held.token, "failed", error="boom", retryable=held.fate == "fail")
        if rng.random() < 0.4:
            self.acks.append(ack)  # rides on the next claim
        elif ack.outcome == "succeeded":
            self._send(CompleteJob(self.run.rid(), job_id, held.token, ack.result))
        else:
            self._send(FailJob(self.run.rid(), job_id, held.token, ack.error, ack.retryable))

    def _send(
        self,
        command: Command,
        on_answer: Callable[[Result], None] | None = None,
        on_give_up: Callable[[], None] | None = None,
    ) -> None:
        self.busy = True
        incarnation = self.dead_until_s

        def answered(result: Result) -> None:
            if self.dead_until_s == incarnation:  # a dead process hears nothing
                self.busy = False
                if on_answer is not None:
                    on_answer(result)

        def gave_up() -> None:
            if self.dead_until_s == incarnation:
                self.busy = False
                if on_give_up is not None:
                    on_give_up()

        self.run.request(command, self.name, answered, gave_up)

    def _on_claim(self, result: Result) -> None:
        run, rng = self.run, self.run.rng
        jobs = result.value["jobs"] if isinstance(result, Ok) else []
        if not jobs:
            self.next_claim_s = run.now_s + POLL_S
        lease_s = run.profile.lease_ms / 1000
        for job_id, token in jobs:
            fate = "succeed"
            if not self.honest:
                fate = rng.choices(
                    ["succeed", "fail", "fatal", "stall", "crash"], [70, 10, 3, 12, 5]
                )[0]
            elif run.phase == "liveness":
                fate = rng.choices(["succeed", "fail"], [85, 15])[0]
            work_s = rng.uniform(0.1, 1.2)
            if fate == "stall":  # stops heartbeating, then acks after its lease ended
                work_s = lease_s + rng.uniform(0.2, 5.0)
            self.held[job_id] = Held(token, fate, run.now_s + work_s, run.now_s + lease_s / 3)

    def _on_heartbeat(self, job_id: int) -> Callable[[Result], None]:
        def answered(result: Result) -> None:
            if isinstance(result, Rejected):
                self.held.pop(job_id, None)  # lease lost or job cancelled: stop working on it

        return answered


# -- clients ----------------------------------------------------------------------------------


class SimClient:
    """The API's users: schedules, submits, repeats, backfills, triggers (see the module)."""

    def __init__(self, run: WorkloadRun) -> None:
        self.run = run
        self.manual_overlaps = ("allow", "buffer_one", "forbid")
        self.incarnations = 0  # of the manual schedule

    def put_schedules(self) -> list[Request]:
        grace = self.run.profile.grace_ms
        specs: dict[str, dict[str, Any]] = {
            "every-1s": {"every": "1s", "misfire": "fire_once", "job": {"task": "fired"}},
            "every-2s": {"cron": "*/2 * * * * *", "misfire": "fire_all", "job": {"task": "fired"}},
            "flow-3s": {"every": "3s", "misfire": "fire_once", "workflow": DIAMOND},
            "every-5s": {"every": "5s", "misfire": "skip", "job": {"task": "fired"}},
            KEPT: {"every": "1s", "misfire": "fire_once", "retain": 2, "job": {"task": "fired"}},
        }
        requests = [
            self.run.request(PutSchedule(self.run.rid(), name, ScheduleSpec.parse(
                {**spec, "misfire_grace_ms": grace})), "client")
            for name, spec in specs.items()
        ]
        return [*requests, self._put_manual()]

    def step(self) -> None:
        run, rng = self.run, self.run.rng
        roll = rng.random()
        if roll < 0.015:
            key = rng.choice([f"key-{rng.randint(1, 8)}", f"once-{run.requests_made}", None])
            spec = JobSpec.parse({
                "task": "submitted", "key": key, "delay_ms": rng.choice([0, 0, 0, 500, 1_500]),
                "max_attempts": rng.choice([2, 3]), "backoff": {"initial_ms": 200},
            })
            run.request(SubmitJobs(run.rid(), (spec,)), "client")
        elif roll < 0.018:
            workflow = WorkflowSpec.parse({**DIAMOND, "key": f"wf-{rng.randint(1, 4)}"})
            run.request(SubmitWorkflow(run.rid(), workflow), "client")
        elif roll < 0.020:
            earlier = [r for r in run.all_requests if r.origin == "client"]
            if earlier:
                run.repeat(rng.choice(earlier))
        elif roll < 0.024:
            self._backfill()
        elif roll < 0.029:
            run.request(TriggerSchedule(run.rid(), MANUAL, rng.random() < 0.2), "client")
        elif roll < 0.0305:
            run.request(DeleteSchedule(run.rid(), MANUAL), "client")
            self._put_manual()

    def _put_manual(self) -> Request:
        """The manual schedule, (re)created with the next overlap policy."""
        overlap = self.manual_overlaps[self.incarnations % len(self.manual_overlaps)]
        self.incarnations += 1
        spec = ScheduleSpec.parse({"cron": "0 0 1 1 *", "overlap": overlap,
                                   "job": {"task": "fired"}})
        return self.run.request(PutSchedule(self.run.rid(), MANUAL, spec), "client")

    def _backfill(self) -> None:
        """Mostly the last seconds (times whose runs `retain` deleted); sometimes from just
        inside the retention horizon (times before the schedule existed), or from beyond it
        (to be refused). The client's clock is true time: the state's may be off by seconds."""
        run, rng = self.run, self.run.rng
        now_ms = run.true_ms()
        kind = rng.choices(["recent", "horizon", "too-old"], [80, 10, 10])[0]
        if kind == "recent":
            from_ms = now_ms - rng.randint(1_000, 8_000)
        elif kind == "horizon":
            from_ms = now_ms - RETENTION_MS + rng.randint(60_000, 120_000)
        else:
            from_ms = now_ms - RETENTION_MS - rng.randint(1, 60_000)
        to_ms = from_ms + rng.randint(500, 3_000)
        run.request(BackfillSchedule(run.rid(), KEPT, from_ms, to_ms), "client")
