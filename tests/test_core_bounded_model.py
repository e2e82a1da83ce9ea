"""A hypothesis state machine that lives at the state budget (DESIGN.md §9.1).

The core model (tests/test_core_model.py) mixes the bounded-state rules in among every other
command, so it rarely fills a budget. This machine starts finalized with a small budget and
tight retention, and does little but fill it: large payloads, workers finishing jobs with
large results, schedules firing every second, triggers, backfills, workflows and retries,
settings changed, time moved, snapshot/restores. After every command, on the state under test
and on a replica fed the same commands: the checks of tests/bounded_model.py (an accepted
creating command leaves the state within its budget, no unfinished job is evicted), the
invariants (the memory model's running counts equal a count from scratch; over the budget
only while nothing finished is left), byte-identical snapshots, and a refused command changed
nothing. The run is checked to have reached the budget: refusals and evictions of each kind.
"""

from __future__ import annotations

import collections
from typing import Any

from bounded_model import BoundedRules, budgets, left_by_rejection, payload_sizes, retentions
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from raftcron.scheduler import codec
from raftcron.scheduler.commands import (
    BackfillSchedule,
    PutSchedule,
    RetryJob,
    SubmitJobs,
    SubmitWorkflow,
    Tick,
    TriggerSchedule,
)
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.errors import Ok, Rejected
from raftcron.scheduler.gate import Finalize
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.settings import Budget, Retention, Settings
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.state import SchedulerState

T0 = 1_800_000_000_000
SEEN: collections.Counter[str] = collections.Counter()  # what the runs reached, checked below


class BoundedModel(BoundedRules, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = SchedulerState()
        self.replica = SchedulerState()
        self.requests = 0
        self.apply(Tick(T0))

    def rid(self) -> str:
        self.requests += 1
        return f"r{self.requests}"

    def apply(self, command: Any) -> Any:
        data = codec.encode(command)
        before = snapshot(self.state)
        finals = {job.id: job.final for job in self.state.table}
        decoded = codec.decode(data)
        result = self.state.apply(decoded)
        assert result == self.replica.apply(command)
        if not isinstance(result, Ok):
            assert snapshot(self.state) == left_by_rejection(
                self.state, before, command, result), f"rejected {command} changed the state"
            if isinstance(result, Rejected) and result.code == "state_full":
                SEEN["state_full"] += 1
        self.check_bounded(command, result, finals)
        for reason, count in self.state.counters.get("evicted", {}).items():
            SEEN[f"evicted_{reason}"] = max(SEEN[f"evicted_{reason}"], count)
        if any(s.misfires_state_full for s in self.state.schedules.values()):
            SEEN["misfire_state_full"] += 1
        return result

    @initialize(budget=budgets, retention=retentions, fires=st.booleans())
    def start(self, budget: int, retention: dict[str, Any], fires: bool) -> None:
        self.apply(Finalize(self.rid(), settings=Settings(Retention.parse(retention),
                                                          Budget(budget))))
        job = {"task": "fired", "payload": "f" * 20_000}
        spec = ScheduleSpec.parse({"every": "1s" if fires else "5s", "job": job,
                                   "overlap": "allow", "misfire_grace_ms": 120_000})
        self.apply(PutSchedule(self.rid(), "s", spec))

    @rule(advance=st.sampled_from([1, 500, 1_000, 3_000, 60_000, 3_600_000]))
    def tick(self, advance: int) -> None:
        self.apply(Tick(self.state.now_ms + advance))

    @rule(force=st.booleans())
    def trigger(self, force: bool) -> None:
        self.apply(TriggerSchedule(self.rid(), "s", force))

    @rule(back_ms=st.integers(1_000, 30_000))
    def backfill(self, back_ms: int) -> None:
        now = self.state.now_ms
        self.apply(BackfillSchedule(self.rid(), "s", now - back_ms, now))

    @rule(size=payload_sizes)
    def submit_workflow(self, size: int) -> None:
        jobs = [{"name": "a", "task": "t", "payload": "w" * size},
                {"name": "b", "task": "t", "after": ["a"], "payload": "w" * size}]
        self.apply(SubmitWorkflow(self.rid(), WorkflowSpec.parse({"jobs": jobs})))

    @rule(index=st.integers(0, 100))
    def retry(self, index: int) -> None:
        ids = sorted(job.id for job in self.state.table if job.status in ("failed", "cancelled"))
        if ids:
            self.apply(RetryJob(self.rid(), ids[index % len(ids)]))

    @rule()
    def snapshot_and_restore(self) -> None:
        self.state = restore(snapshot(self.state))

    @invariant()
    def invariants_hold(self) -> None:
        assert violations(self.state) == []

    @invariant()
    def the_replica_is_identical(self) -> None:
        assert snapshot(self.state) == snapshot(self.replica)


def test_the_state_stays_within_its_budget_under_any_sequence() -> None:
    SEEN.clear()
    BoundedModel.TestCase.settings = settings(max_examples=150, stateful_step_count=60,
                                              deadline=None)
    # The runs reached what this model is for: a test that never fills the budget proves nothing.
    # Random runs miss a rare one now and then (150 of them reached no count eviction once in a
    # unit tier of 2,916 tests here): another 150 then, at most twice, keep the generation random.
    reach = ("state_full", "evicted_budget", "evicted_count", "evicted_age", "misfire_state_full")
    for _batch in range(3):
        BoundedModel.TestCase().runTest()
        if all(SEEN[reached] > 0 for reached in reach):
            break
    for reached in reach:
        assert SEEN[reached] > 0, f"no run reached {reached}: {dict(SEEN)}"


def test_a_repeat_of_a_request_refused_for_space_is_expected_to_change_nothing() -> None:
    """The models' expectation of a rejection (`left_by_rejection`): the first refusal for
    space adds its entry to the request table; a repeat is answered from that entry and leaves
    the table as it was: the entry keeps its place and its time (it lives REQUEST_WINDOW_MS
    from the first answer), though other requests came between. The core model expected the
    repeat to remember the refusal again, at the end of the table and at the repeat's time."""
    d = Driver()
    d.finalize(budget={"bytes": 1 << 20})
    d.submit_many(16, payload="q" * 60_000)  # unfinished: never evicted
    spec = JobSpec.parse({"task": "t", "payload": "z" * 60_000})
    request_id = d.request_id()
    command = SubmitJobs(request_id, (spec,) * 2)
    before = snapshot(d.state)
    refused = d.apply(command)
    assert isinstance(refused, Rejected) and refused.code == "state_full"
    assert d.state.requests.get(request_id) is not None
    assert snapshot(d.state) == left_by_rejection(d.state, before, command, refused)
    d.submit(payload="small")  # another request after it in the table
    d.tick(advance_ms=1_000)
    before = snapshot(d.state)
    again = d.apply(command)
    # The first answer as the table keeps it: its code and message (not its details).
    assert isinstance(again, Rejected)
    assert (again.code, again.message) == (refused.code, refused.message)
    assert snapshot(d.state) == before
    assert left_by_rejection(d.state, before, command, again) == before


def test_a_submit_that_creates_no_job_is_not_held_to_a_budget_lowered_below_the_state() -> None:
    """The models' budget check (`check_bounded`): a budget lowered below what unfinished jobs
    take leaves the state over it, and a submit whose key answers an existing job creates
    nothing: accepted, and not a breach. The check held it to the budget anyway (found by a
    saved example of the core model)."""
    import types

    d = Driver()
    d.finalize(budget={"bytes": 4 << 20})
    [keyed] = d.submit_many(1, key="k1")
    d.submit_many(32, payload="q" * 60_000)  # unfinished: never evicted
    d.put_settings("budget", {"bytes": 1 << 20})
    assert d.state.state_bytes() > 1 << 20
    before = {job.id: job.final for job in d.state.table}
    command = SubmitJobs(d.request_id(), (JobSpec.parse({"task": "t", "key": "k1"}),))
    answered = d.apply(command)
    assert isinstance(answered, Ok) and answered.value["jobs"] == [[keyed, False]]
    BoundedRules.check_bounded(types.SimpleNamespace(state=d.state), command, answered, before)
