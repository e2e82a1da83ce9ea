"""Bounded state in the core model: hypothesis rules and the checks they must pass.

`BoundedRules` is a mixin for tests/test_core_model.py's `CoreModel` (and so for tier 0's
`ChaosCoreModel`): rules that finalize the cluster (the upgrade gate) with small budgets and
retention rules, change them, and submit payloads big enough to reach the budget. Most runs
open the gate at some step, so commands before and after it are both exercised, on the state
under test and on a replica, across snapshot/restores. `check_bounded` runs after EVERY
command any rule applies:

* once finalized, a command that creates jobs (submit, workflow, trigger, backfill) and was
  accepted leaves the state within its budget: eviction of finished jobs made the room, or it
  was refused (`state_full`, 507) and changed nothing (the model's own check of rejections);
* no unfinished job is ever evicted: the job table refuses to remove one (an assertion in
  `JobTable.remove`, which a run would hit);
* the invariants (scheduler/invariants.py) hold the memory model's running counts equal to a
  count from scratch after every command, and the state over its budget only while nothing
  finished is left, or a Tick left eviction for the next one.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from raftcron.scheduler import requests
from raftcron.scheduler.commands import (
    Ack,
    BackfillSchedule,
    ClaimJobs,
    SubmitJobs,
    SubmitWorkflow,
    TriggerSchedule,
    command_fingerprint,
)
from raftcron.scheduler.errors import Ok
from raftcron.scheduler.gate import Finalize, PutSettings
from raftcron.scheduler.settings import Budget, Retention, Settings
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec
from raftcron.scheduler.state import SchedulerState

CREATING = (SubmitJobs, SubmitWorkflow, TriggerSchedule, BackfillSchedule)
budgets = st.sampled_from([1 << 20, 1 << 20, 1 << 20, 3 << 19, 2 << 20, 64 << 20])
rules = st.fixed_dictionaries(
    {},
    optional={
        "max_age_ms": st.sampled_from([0, 2_000, 60_000, 3_600_000]),
        "max_count": st.sampled_from([0, 1, 3, 10]),
    },
)
retentions = st.fixed_dictionaries(
    {},
    optional={
        "succeeded": rules,
        "failed": rules,
        "cancelled": rules,
        "queues": st.dictionaries(st.sampled_from(["default", "emails"]),
                                  st.fixed_dictionaries({}, optional={"succeeded": rules,
                                                                      "failed": rules}),
                                  max_size=2).map(lambda q: {k: v for k, v in q.items() if v}),
    },
)
payload_sizes = st.sampled_from([0, 1_000, 30_000, 60_000, 60_000])


class BoundedRules:
    """Mix into a machine with `state`, `apply(command)` and `rid()`."""

    state: Any

    def apply(self, command: Any) -> Any:  # provided by the machine
        raise NotImplementedError

    def rid(self) -> str:
        raise NotImplementedError

    @rule(budget=budgets, retention=retentions)
    def finalize(self, budget: int, retention: dict[str, Any]) -> None:
        settings = Settings(Retention.parse(retention), Budget(budget))
        self.apply(Finalize(self.rid(), settings=settings))

    @rule(retention=retentions)
    def put_retention(self, retention: dict[str, Any]) -> None:
        self.apply(PutSettings(self.rid(), "retention", Retention.parse(retention)))

    @rule(budget=budgets)
    def put_budget(self, budget: int) -> None:
        self.apply(PutSettings(self.rid(), "budget", Budget(budget)))

    @rule(size=payload_sizes, count=st.integers(1, 8), queue=st.sampled_from(["default", "emails"]))
    def submit_large(self, size: int, count: int, queue: str) -> None:
        spec = JobSpec.parse({"task": "big", "queue": queue, "payload": "p" * size,
                              "max_attempts": 1})
        self.apply(SubmitJobs(self.rid(), (spec,) * count))

    @rule(count=st.integers(1, 10), outcome=st.sampled_from(["succeeded", "failed"]),
          result=payload_sizes)
    def work_through(self, count: int, outcome: str, result: int) -> None:
        """A worker: claim up to `count` jobs, then ack every running job in one claim."""
        self.apply(ClaimJobs(self.rid(), "w9", ("default", "emails"), count))
        running = [job for job in self.state.table if job.status == "running"]
        acks = tuple(Ack(job.id, job.token, outcome, result="r" * result if result else None,
                         error="boom", retryable=False) for job in running)
        self.apply(ClaimJobs(self.rid(), "w9", ("default",), 0, acks=acks))

    def check_bounded(self, command: Any, result: Any, before: Any) -> None:
        state = self.state
        if not state.finalized or not isinstance(result, Ok):
            return
        # A submit that created nothing (its key named a job it answered) is not held to the
        # budget: a budget lowered below what unfinished jobs take leaves the state over it,
        # and what only answers adds no job (its request entry is bounded by the request log).
        created = any(job.id not in before for job in state.table)
        if isinstance(command, CREATING) and created:
            budget = state.settings.budget.bytes
            assert state.state_bytes() <= budget, (
                f"{type(command).__name__} took the state to {state.state_bytes()} bytes, "
                f"past its budget of {budget}")


def left_by_rejection(state: SchedulerState, before: bytes, command: Any, result: Any) -> bytes:
    """The snapshot a rejected command may leave: the state as it was, but for a refusal the
    request table keeps for the request's repeats (`state_full`: scheduler/requests.py).

    Only the first refusal adds that entry. A repeat of the request is answered from it
    (`SchedulerState.apply`) and leaves the table as it was: the entry keeps its place and
    its time, since it lives `REQUEST_WINDOW_MS` from the first answer, as a success's does."""
    request_id = getattr(command, "request_id", None)
    if request_id is None or not requests.remembered(result) or \
            state.requests.get(request_id) is None:
        return before
    expected = restore(before)
    if expected.requests.get(request_id) is not None:  # a repeat, answered from the table
        return before
    expected.requests.remember(request_id, command.TAG, command_fingerprint(command),
                               requests.value_of(result), state.now_ms)
    return snapshot(expected)
