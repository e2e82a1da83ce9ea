"""Hypothesis rules for leaders, clocks, duplicates and schedules, to mix into a core model.

Owns ``LeadersClocksDuplicates``, a mixin for a ``RuleBasedStateMachine`` that owns ``state``
(a ``SchedulerState`` that has never ticked), ``apply(command)`` and ``rid()``. Its rules: a
new cluster whose first requests race its first leader's first Tick (refused ``not_ready``,
then retried), leadership moving between nodes with newer and stale terms (and the product's
way: BeginLeadership and Tick in one entry, then claims), ticks from the leader and from
deposed nodes, clock jumps (hours and days forward, backwards, a leader 30 s ahead handing over
to one 30 s behind), the same encoded command applied twice, schedules that keep few runs or
are deleted, created again and triggered, and backfills of retained-away, long-ago and too-old
times. Every command the machine applies goes through ``chaos.model.history.HistoryChecker``,
and a request answered from the dedupe table must change no byte of the state. It does no I/O
and steers around nothing: a machine that must avoid an open product bug does so in its own
``apply`` (see ``chaos.model.OPEN_PRODUCT_BUGS``).
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from raftcron.chaos.model.history import RETENTION_MS, HistoryChecker, StepFacts, events_of
from raftcron.scheduler import codec, limits, requests
from raftcron.scheduler import jobs as j
from raftcron.scheduler.commands import (
    BackfillSchedule,
    Barrier,
    BeginLeadership,
    ClaimJobs,
    Command,
    CompleteJob,
    DeleteSchedule,
    PutSchedule,
    SubmitJobs,
    Tick,
    TriggerSchedule,
)
from raftcron.scheduler.errors import Ok, Rejected, Result
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.snapshot import snapshot
from raftcron.scheduler.specs import JobSpec
from raftcron.scheduler.state import SchedulerState

# -- hypothesis rules ---------------------------------------------------------------------------

NODES = ("n0", "n1", "n2", "n3", "n4")
SCHEDULES = ("s1", "s2")
START_MS = 1_800_000_000_000  # the first Tick of a model run (tests/test_core_model.py's T0)
HOUR_MS = limits.HOUR_MS
DAY_MS = limits.DAY_MS
forward_jumps_ms = st.sampled_from([HOUR_MS, 6 * HOUR_MS, DAY_MS, 3 * DAY_MS, 8 * DAY_MS])
backward_jumps_ms = st.sampled_from([1, 999, 30_000, HOUR_MS, DAY_MS])
clock_skews_ms = st.sampled_from([0, 0, 250, -250, 30_000, -30_000, 5_000, -5_000])
small_retention = st.sampled_from([1, 2, 5])
# How far back a backfill starts: within a day, the key window, the retention and beyond.
backfill_ages_ms = st.sampled_from([
    5_000, DAY_MS + 1, 3 * DAY_MS, RETENTION_MS - 1_000, RETENTION_MS - 1, RETENTION_MS,
    RETENTION_MS + 1, 8 * DAY_MS, 30 * DAY_MS,
])
EARLY_REQUESTS = ("submit", "claim", "schedule", "trigger", "backfill", "complete")

class LeadersClocksDuplicates:
    """Rules and checks to mix into a machine with `state`, `apply(command)` and `rid()`.

    Put it first in the bases (``class M(LeadersClocksDuplicates, CoreModel)``): its `apply`
    wraps the machine's, so every command of every rule is observed. The machine's state must
    start as a new cluster's does, never ticked: `a_new_cluster_starts` ticks it to START_MS.
    """

    state: SchedulerState
    rid: Callable[[], str]
    start_ms = START_MS

    def __init__(self) -> None:
        self.history = HistoryChecker()
        self.last_command: Command | None = None
        self.terms_used = 0
        super().__init__()

    # -- observing every command --------------------------------------------------------------

    def apply(self, command: Command) -> Result:
        facts = StepFacts.capture(self.state, command)
        before = snapshot(self.state) if facts.remembered is not None else None
        result: Result = super().apply(command)  # type: ignore[misc]
        if facts.remembered is not None:
            # The first answer as the table keeps it: a success's value, or a refusal for
            # space (state_full) without its details.
            assert result == requests.answer(facts.remembered), (
                f"a repeat of {command} got {result}")
            assert snapshot(self.state) == before, f"a repeat of {command} changed the state"
        for event in events_of(facts, command, result, self.state):
            self.history.feed(event)
        assert not self.history.problems, self.history.problems
        self.last_command = command
        return result

    def leader_node(self) -> str | None:
        return None if self.state.leader is None else self.state.leader[0]

    def new_term(self, step: int = 1) -> int:
        recorded = 0 if self.state.leader is None else self.state.leader[1]
        self.terms_used = max(self.terms_used, recorded) + step
        return self.terms_used

    # -- a new cluster ------------------------------------------------------------------------

    @initialize(early=st.lists(st.sampled_from(EARLY_REQUESTS), max_size=4),
                node=st.sampled_from(NODES), barrier_first=st.booleans())
    def a_new_cluster_starts(self, early: list[str], node: str, barrier_first: bool) -> None:
        """Requests that reach the log before the first leader's [BeginLeadership, Tick] are
        refused `not_ready` and change nothing; their retries (same bytes) are applied once."""
        if self.state.now_ms != 0:
            return  # the machine started ticked
        if barrier_first:
            assert self.apply(Barrier(self.rid())) == Ok({})
        refused = [self.early_request(kind) for kind in early]
        for command in refused:
            before = snapshot(self.state)
            result = self.apply(command)
            assert isinstance(result, Rejected) and result.code == "not_ready", result
            assert snapshot(self.state) == before, f"a refused {command} changed the state"
        term = self.new_term()
        self.apply(BeginLeadership(self.start_ms, node, term))
        self.apply(Tick(self.start_ms, node))
        assert self.state.now_ms == self.start_ms
        for command in refused:
            first = self.apply(command)
            assert not (isinstance(first, Rejected) and first.code == "not_ready"), first
            if isinstance(first, Ok):
                assert self.apply(command) == first, f"the retry of {command} is forgotten"

    def early_request(self, kind: str) -> Command:
        """A client's or a worker's request, sent as the cluster starts."""
        match kind:
            case "submit":
                return SubmitJobs(self.rid(), (JobSpec.parse({"task": "t", "key": "k1"}),))
            case "claim":
                return ClaimJobs(self.rid(), "w1", ("default",), 1, 5_000, ())
            case "schedule":
                spec = ScheduleSpec.parse({"every": "1s", "job": {"task": "t"}})
                return PutSchedule(self.rid(), "s1", spec)
            case "trigger":
                return TriggerSchedule(self.rid(), "s1")
            case "backfill":
                return BackfillSchedule(self.rid(), "s1", 1_000, 5_000)
        return CompleteJob(self.rid(), 1, 1, None)

    # -- leaders ------------------------------------------------------------------------------

    @rule(node=st.sampled_from(NODES), step=st.integers(1, 3), skew=clock_skews_ms)
    def leadership_moves_to_a_newer_term(self, node: str, step: int, skew: int) -> None:
        term = self.new_term(step)
        command = BeginLeadership(self.state.now_ms + skew, node, term)
        base_ms = max(self.state.now_ms, command.now_ms)
        self.apply(command)
        assert self.state.leader == (node, term)
        for job_id in self.state.table.by_status[j.RUNNING]:
            job = self.state.table.jobs[job_id]
            assert job.lease_until_ms is not None and job.lease_ms is not None
            assert job.lease_until_ms >= base_ms + job.lease_ms, f"job {job_id} got no grace"

    @rule(node=st.sampled_from(NODES), skew=clock_skews_ms, count=st.integers(1, 3),
          lease_ms=st.sampled_from([1_000, 5_000]), later_ms=st.integers(0, 999))
    def a_new_leader_leases_from_its_own_time(
        self, node: str, skew: int, count: int, lease_ms: int, later_ms: int
    ) -> None:
        """cluster/clock/ticker.py: [BeginLeadership(now), Tick(now)] as one entry, then claims: a
        lease counts from the new leader's time and its next Tick does not end it."""
        clock_ms = self.state.now_ms + skew
        self.apply(BeginLeadership(clock_ms, node, self.new_term()))
        self.apply(Tick(clock_ms, node))
        base_ms = self.state.now_ms
        result = self.apply(ClaimJobs(self.rid(), "w1", ("default", "emails"), count, lease_ms))
        assert isinstance(result, Ok), result
        for job_id, _token in result.value["jobs"]:
            job = self.state.table.jobs[job_id]
            assert job.lease_until_ms == base_ms + lease_ms, f"job {job_id}: {job.lease_until_ms}"
        expired = dict(self.state.counters.get("lease_expired", {}))
        self.apply(Tick(clock_ms + later_ms, node))
        assert self.state.counters.get("lease_expired", {}) == expired, "a lease ended at once"

    @precondition(lambda self: self.state.leader is not None)
    @rule(node=st.sampled_from(NODES), back=st.integers(0, 3), skew=clock_skews_ms)
    def a_stale_term_changes_nothing(self, node: str, back: int, skew: int) -> None:
        assert self.state.leader is not None
        term = max(0, self.state.leader[1] - back)
        before = snapshot(self.state)
        result = self.apply(BeginLeadership(self.state.now_ms + skew, node, term))
        assert isinstance(result, Ok) and "ignored" in result.value, f"term {term}: {result}"
        assert snapshot(self.state) == before, f"a stale term {term} changed the state"

    @precondition(lambda self: self.state.leader is not None)
    @rule(advance_ms=st.integers(0, 5_000))
    def the_leader_ticks(self, advance_ms: int) -> None:
        target_ms = self.state.now_ms + advance_ms
        self.apply(Tick(target_ms, self.leader_node()))
        assert self.state.now_ms == target_ms

    @precondition(lambda self: self.state.leader is not None)
    @rule(node=st.sampled_from(NODES), advance_ms=st.sampled_from([0, 1_000, 30_000, DAY_MS]))
    def a_deposed_leader_ticks_in_vain(self, node: str, advance_ms: int) -> None:
        if node == self.leader_node():
            return
        before = snapshot(self.state)
        result = self.apply(Tick(self.state.now_ms + advance_ms, node))
        assert isinstance(result, Ok) and "ignored" in result.value, f"{node}'s tick: {result}"
        assert snapshot(self.state) == before, "a deposed leader's tick changed the state"

    # -- clocks -------------------------------------------------------------------------------

    @rule(jump_ms=forward_jumps_ms)
    def the_clock_jumps_forward(self, jump_ms: int) -> None:
        target_ms = self.state.now_ms + jump_ms
        self.apply(Tick(target_ms, self.leader_node()))
        assert self.state.now_ms == target_ms

    @rule(back_ms=backward_jumps_ms)
    def the_clock_jumps_backwards(self, back_ms: int) -> None:
        now_ms = self.state.now_ms
        self.apply(Tick(now_ms - back_ms, self.leader_node()))
        assert self.state.now_ms == now_ms

    @rule(
        ahead_ms=st.integers(20_000, 40_000),
        behind_ms=st.integers(20_000, 40_000),
        ticks=st.integers(1, 5),
        step_ms=st.sampled_from([200, 1_000, 7_000]),
        nodes=st.permutations(NODES),
    )
    def a_fast_leader_hands_over_to_a_slow_one(
        self, ahead_ms: int, behind_ms: int, ticks: int, step_ms: int, nodes: list[str]
    ) -> None:
        fast, slow = nodes[0], nodes[1]
        true_ms = self.state.now_ms  # what a correct clock reads now
        self.apply(BeginLeadership(true_ms + ahead_ms, fast, self.new_term()))
        for _ in range(ticks):
            true_ms += step_ms
            self.apply(Tick(true_ms + ahead_ms, fast))
        peak_ms = self.state.now_ms
        self.apply(BeginLeadership(true_ms - behind_ms, slow, self.new_term()))
        for _ in range(ticks):
            true_ms += step_ms
            self.apply(Tick(true_ms + ahead_ms, fast))  # the deposed one is still ticking
            self.apply(Tick(true_ms - behind_ms, slow))
            assert self.state.now_ms == max(peak_ms, true_ms - behind_ms)

    # -- duplicates ---------------------------------------------------------------------------

    @precondition(lambda self: self.last_command is not None)
    @rule()
    def the_same_entry_is_applied_twice(self) -> None:
        """A re-sent log entry right after the first: the second changes nothing."""
        assert self.last_command is not None
        command = codec.decode(codec.encode(self.last_command))
        before = snapshot(self.state)
        self.apply(command)
        assert snapshot(self.state) == before, f"applying {command} twice changed the state"

    # -- schedules: retention, incarnations, backfills ----------------------------------------

    @rule(name=st.sampled_from(SCHEDULES), retain=small_retention,
          every=st.sampled_from(["1s", "2s"]))
    def a_schedule_keeps_few_finished_runs(self, name: str, retain: int, every: str) -> None:
        spec = ScheduleSpec.parse({"every": every, "retain": retain, "job": {"task": "t"}})
        self.apply(PutSchedule(self.rid(), name, spec))

    @rule(name=st.sampled_from(SCHEDULES), every=st.sampled_from(["1s", "1h"]),
          overlap=st.sampled_from(["allow", "buffer_one", "forbid"]), triggers=st.integers(1, 3))
    def a_schedule_is_created_again_and_triggered(
        self, name: str, every: str, overlap: str, triggers: int
    ) -> None:
        self.apply(DeleteSchedule(self.rid(), name))
        spec = ScheduleSpec.parse({"every": every, "overlap": overlap, "job": {"task": "t"}})
        self.apply(PutSchedule(self.rid(), name, spec))
        for _ in range(triggers):
            self.apply(TriggerSchedule(self.rid(), name))  # the checker reads every answer

    @rule(name=st.sampled_from(SCHEDULES), age_ms=backfill_ages_ms,
          width_ms=st.integers(1, 4_000))
    def a_backfill_reaches_far_back(self, name: str, age_ms: int, width_ms: int) -> None:
        from_ms = max(0, self.state.now_ms - age_ms)
        self.apply(BackfillSchedule(self.rid(), name, from_ms, from_ms + width_ms))

    @precondition(lambda self: self.history.fires)
    @rule(index=st.integers(0, 1_000), before_ms=st.integers(0, 3_000),
          after_ms=st.integers(1, 3_000))
    def a_backfill_covers_times_that_fired(
        self, index: int, before_ms: int, after_ms: int
    ) -> None:
        """Times fired once, their jobs perhaps deleted by `retain` or retention since."""
        name, fire_ms = self.fired(index)
        self.apply(BackfillSchedule(self.rid(), name, fire_ms - before_ms, fire_ms + after_ms))

    @precondition(lambda self: self.history.fires)
    @rule(index=st.integers(0, 1_000), edge_ms=st.sampled_from([-1, 0, 0, 1, 1_000]))
    def a_backfill_at_the_retention_edge_of_a_fire(self, index: int, edge_ms: int) -> None:
        """Time moves to about one retention after a fire; a backfill reaches back that far."""
        name, fire_ms = self.fired(index)
        target_ms = fire_ms + RETENTION_MS + edge_ms
        if target_ms > self.state.now_ms:
            self.apply(Tick(target_ms, self.leader_node()))
        oldest_ms = self.history.backfill_reach_ms(self.state.now_ms)
        for from_ms in (oldest_ms, oldest_ms + 1):  # refused for its age, then the first allowed
            self.apply(BackfillSchedule(self.rid(), name, from_ms, from_ms + 1_000))

    def fired(self, index: int) -> tuple[str, int]:
        keys = list(self.history.fires)
        name, _, fire_ms = keys[index % len(keys)].rpartition("@")
        return name, int(fire_ms)

    def forgotten_fires(self, name: str, from_ms: int, to_ms: int) -> list[str]:
        """Fire keys of `name` in [from_ms, to_ms) that fired and the state no longer knows."""
        forgotten = []
        for key in self.history.fires:
            schedule, _, fire_ms = key.rpartition("@")
            in_range = schedule == name and from_ms <= int(fire_ms) < to_ms
            if in_range and not self.state.table.remembers_key(key):
                forgotten.append(key)
        return forgotten

    # -- checks after every step --------------------------------------------------------------

    @invariant()
    def the_history_keeps_its_rules(self) -> None:
        assert self.history.problems == []
        assert self.state.now_ms == self.history.now_ms
        assert self.state.fence == self.history.token_max, "a token was handed out unseen"
