"""The core model fails when flow control is broken: each mutation below weakens one rule of
the enforcement (in the core, as a bug would), and the model of tests/test_core_model.py must
find a run that shows it. A model that passes with a broken limit proves nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from test_core_model import CoreModel

from raftcron.scheduler import bulk, queues, uniqueness
from raftcron.scheduler.jobs import STATUSES
from raftcron.scheduler.store import JobTable

QUICK = settings(
    max_examples=400,
    stateful_step_count=60,
    deadline=None,
    phases=[Phase.generate],  # no shrinking: failing at all is the point
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=True,  # the same runs every time: a mutation found once is found always
)
original_budget = queues.claim_budget


def budget_without(limit: str) -> Callable[..., int | None]:
    """claim_budget as if the queue's spec did not have `limit`."""

    def broken(control: Any, table: Any, name: str, now_ms: int) -> int | None:
        if control is None:
            return None
        spec = control.spec
        fields = {"paused": spec.paused, "concurrency_max": spec.concurrency_max,
                  "rate_limit": spec.rate_limit, limit: None if limit != "paused" else False}
        shadow = queues.QueueControl(queues.QueueSpec(**fields), control.refilled_ms,
                                     control.rule)
        shadow.units, shadow.refilled_ms = control.units, control.refilled_ms
        shadow.log = control.log  # a window's starts, as they are
        return original_budget(shadow, table, name, now_ms)

    return broken


def release_without_room(self: JobTable, key: str) -> None:
    """Lets every held job of the key in line, room or not."""
    held = self.held.pop(key, None)
    if held is None:
        return
    for job_id in sorted(held.members):
        job = self.jobs[job_id]
        self.held_by_queue[job.queue] -= 1
        if not self.held_by_queue[job.queue]:
            del self.held_by_queue[job.queue]
        self._push_ready(job)  # type: ignore[arg-type]


def select_ignoring_the_queue(state: Any, action: str, where: Any, **kwargs: Any) -> Any:
    return original_select(state, action, type(where)(where.status, None, where.task,
                                                      where.schedule), **kwargs)


original_select = bulk.select
original_submit = uniqueness.submit


def unique_ignoring_states(state: Any, spec: Any, index: int, notes: Any) -> Any:
    """Any state of the holder conflicts, as the plain key does."""
    if spec.unique is not None:
        spec = dataclasses.replace(spec, unique=dataclasses.replace(spec.unique, states=STATUSES))
    return original_submit(state, spec, index, notes)


# name -> (owner, attribute, broken version, what the failure says (None: any assertion))
MUTATIONS: dict[str, tuple[Any, str, Any, str | None]] = {
    "queue cap ignored": (queues, "claim_budget", budget_without("concurrency_max"),
                          "over its cap"),
    # Caught by the model's window check, or first by the core's own assertion in `spend`.
    "rate limit ignored": (queues, "claim_budget", budget_without("rate_limit"),
                           "claims in|starts within|more than the bucket held"),
    "pause ignored": (queues, "claim_budget", budget_without("paused"), "paused .* handed out"),
    "key let in line without room": (JobTable, "_release", release_without_room,
                                     "running or in line"),
    "key not checked at all": (JobTable, "_release", release_without_room, "key [ab]: "),
    "bulk ignores the queue filter": (bulk, "select", select_ignoring_the_queue, None),
    "unique ignores the states": (uniqueness, "submit", unique_ignoring_states, None),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_model_catches_broken_flow_control(
    mutation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, name, broken, says = MUTATIONS[mutation]
    monkeypatch.setattr(owner, name, broken)
    if mutation == "key not checked at all":  # nor at claim time
        monkeypatch.setattr(JobTable, "key_has_room", lambda self, job: True)
    with pytest.raises(AssertionError, match=says):
        run_state_machine_as_test(CoreModel, settings=QUICK)
