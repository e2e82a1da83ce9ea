"""Queues' limits in the replicated state: pause, a cap on running jobs, a rate of claims.

Owns `QueueControl` (a queue's spec and its token bucket), the commands that set them
(`PutQueue`, `PauseQueue`, `ResumeQueue`) and the arithmetic a claim asks: how many jobs each
queue may hand out now (`claim_budgets`), and spending tokens for the jobs it did (`spend`).
Everything is decided at claim time from replicated values, so every replica hands out the
same jobs; nothing here counts what workers do.

The rate limit is a token bucket on state time: `max` tokens, refilled at `max` per `per_ms`,
one token per job claimed. Kept in integer units of 1/per_ms token, so the arithmetic is exact:
the bucket holds at most `max * per_ms` units, gains `max` units per millisecond of state time
and a claim costs `per_ms` units. Refilled lazily (at a claim, from the state's `now_ms`), so a
snapshot carries (units, refilled_ms) and a restored replica continues exactly. Over any window
of W ms a queue hands out at most `max + W * max // per_ms` jobs: the full bucket plus what
the window refills; sustained, `max` per `per_ms`.

A queue without limits has no control (queues are named by the jobs in them; setting a queue
back to its defaults forgets it), so claims from unlimited queues do no work here at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raftcron.scheduler import limits
from raftcron.scheduler.errors import Ok, Rejected, Result
from raftcron.scheduler.flowspecs import QueueSpec
from raftcron.scheduler.store import JobTable


class QueueControl:
    """A queue's limits and the state of its rate bucket (units: see the module docstring).

    The spec's numbers are also kept flat (`paused`, `cap`, `rate_max`, `per_ms`, `capacity`;
    derived, never written): a claim reads them for every limited queue it names."""

    __slots__ = ("cap", "capacity", "paused", "per_ms", "rate_max", "refilled_ms", "spec",
                 "units", "updated_ms")

    def __init__(self, spec: QueueSpec, now_ms: int) -> None:
        self.spec = spec
        self.paused = spec.paused
        self.cap = spec.concurrency_max
        rate = spec.rate_limit
        self.rate_max, self.per_ms = (0, 0) if rate is None else (rate.max, rate.per_ms)
        self.capacity = self.rate_max * self.per_ms
        self.units = self.capacity  # a new bucket starts full
        self.refilled_ms = now_ms
        self.updated_ms = now_ms

    def to_list(self) -> list[Any]:
        return [self.spec.to_wire(), self.units, self.refilled_ms, self.updated_ms]

    @classmethod
    def from_list(cls, data: list[Any]) -> QueueControl:
        spec, units, refilled_ms, updated_ms = data
        control = cls(QueueSpec.parse(spec), refilled_ms)
        control.units = units
        control.updated_ms = updated_ms
        return control


def units_at(control: QueueControl, now_ms: int) -> int:
    """The bucket's units at now_ms (refilled, not changed)."""
    assert control.per_ms, "a queue without a rate limit has no bucket"
    units = control.units + max(0, now_ms - control.refilled_ms) * control.rate_max
    return units if units < control.capacity else control.capacity


def tokens_at(control: QueueControl, now_ms: int) -> int | None:
    """Claims the bucket allows at now_ms; None without a rate limit."""
    return units_at(control, now_ms) // control.per_ms if control.per_ms else None


def claim_budget(
    control: QueueControl | None, table: JobTable, name: str, now_ms: int
) -> int | None:
    """Jobs the queue may hand out now: 0 while paused, else the room under its concurrency
    cap and its tokens, whichever is less; None when neither limits it."""
    if control is None:
        return None
    if control.paused:
        return 0
    budget = units_at(control, now_ms) // control.per_ms if control.per_ms else None
    cap = control.cap
    if cap is not None:
        room = cap - table.running_by_queue.get(name, 0)
        room = room if room > 0 else 0
        budget = room if budget is None or room < budget else budget
    return budget


def claim_budgets(
    controls: dict[str, QueueControl], table: JobTable, names: Iterable[str], now_ms: int
) -> dict[str, int]:
    """The limited queues among `names` and what each may hand out now (unlimited ones are
    left out: most claims name no limited queue and pay one dict lookup per queue)."""
    budgets: dict[str, int] = {}
    if controls:
        for name in names:
            budget = claim_budget(controls.get(name), table, name, now_ms)
            if budget is not None:
                budgets[name] = budget
    return budgets


def spend(control: QueueControl | None, now_ms: int, claimed: int) -> None:
    """Take one token per job a claim handed out of this queue."""
    if control is None or not control.per_ms or not claimed:
        return
    units = units_at(control, now_ms) - claimed * control.per_ms
    assert units >= 0, "a claim handed out more than the bucket held"
    control.units = units
    control.refilled_ms = max(control.refilled_ms, now_ms)


def put(controls: dict[str, QueueControl], name: str, spec: QueueSpec, now_ms: int) -> Result:
    """Set a queue's limits. A rate limit that changes keeps the tokens left (at most the new
    max), so rewriting a queue's spec never grants a fresh burst; a new one starts full."""
    old = controls.get(name)
    if spec.is_default:
        controls.pop(name, None)
        return Ok({})
    if old is None and len(controls) >= limits.QUEUES_MAX:
        return Rejected(
            "too_large",
            f"{limits.QUEUES_MAX} queues have limits already; set one back to its defaults first",
            "name",
        )
    control = QueueControl(spec, now_ms)
    if old is not None:
        control.updated_ms = now_ms
        old_rate, new_rate = old.spec.rate_limit, spec.rate_limit
        if old_rate == new_rate:
            control.units, control.refilled_ms = old.units, old.refilled_ms
        elif old_rate is not None and new_rate is not None:
            tokens = units_at(old, now_ms) // old_rate.per_ms
            control.units = min(tokens, new_rate.max) * new_rate.per_ms
    controls[name] = control
    return Ok({})


def set_paused(
    controls: dict[str, QueueControl], name: str, paused: bool, now_ms: int
) -> Result:
    old = controls.get(name)
    spec = QueueSpec() if old is None else old.spec
    return put(
        controls, name, QueueSpec(paused, spec.concurrency_max, spec.rate_limit), now_ms
    )
