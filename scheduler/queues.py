"""Queues' limits in the replicated state: pause, a cap on running jobs, a rate of claims.

Owns `QueueControl` (a queue's spec and its rate's state), the commands that set them
(`PutQueue`, `PauseQueue`, `ResumeQueue`) and the arithmetic a claim asks: how many jobs each
queue may hand out now (`claim_budgets`), and recording the jobs it did (`spend`). Everything
is decided at claim time from replicated values, so every replica hands out the same jobs;
nothing here counts what workers do.

A rate limit `{max, per_ms}` is counted by one of two rules (`rate_rule`, DESIGN.md §9.4):

- `window` (a limit put once the cluster is finalized, without `burst`): at most `max` starts
  in ANY window of `per_ms` ms of state time, which is what a metered API on the other side
  counts. The queue keeps the times of its recent starts (runs of [time, count], dropped as
  they leave the window); a claim at `now` may start `max` minus the starts in
  (now - per_ms, now]. A start is recorded at the end of its slice of per_ms / LOG_RUNS_MAX ms
  (exact for windows up to LOG_RUNS_MAX ms; less than 4 ms late for a second, 235 ms for a
  minute): it then counts as a little later than it was and leaves the window a little later. That
  can only delay a start, never allow one more, and a window holds at most LOG_RUNS_MAX + 1
  runs, which bounds the memory a queue takes (a flat array of 64-bit integers: at most
  4 KiB a queue).
- `bucket` (a limit put before finalize, or one with `burst`): a token bucket on state time,
  `burst` tokens (`max` when not given), refilled at `max` per `per_ms`, one token per job
  claimed. Kept in integer units of 1/per_ms token, so the arithmetic is exact: the bucket
  holds at most `burst * per_ms` units, gains `max` units per millisecond and a claim costs
  `per_ms` units. Over a window of W ms it may hand out `burst + W * max // per_ms`: the full
  bucket plus the refill. This is the previous release's meaning, and a limit put before the
  cluster is finalized keeps it until it is put again (an old log entry keeps its meaning).

Both are refilled or pruned lazily (at a claim, from the state's `now_ms`), so a snapshot
carries their state and a restored replica continues exactly. A queue without limits has no
control (queues are named by the jobs in them; setting a queue back to its defaults forgets
it), so claims from unlimited queues do no work here at all.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sized
from typing import Any

from raftcron.scheduler import limits
from raftcron.scheduler.errors import Ok, Rejected, Result
from raftcron.scheduler.flowspecs import QueueSpec
from raftcron.scheduler.startlog import record_starts, slice_end
from raftcron.scheduler.store import JobTable

LOG_RUNS_MAX = 256  # slices of a window a queue's start log tells apart (module docstring)
BUCKET, WINDOW = "bucket", "window"


class QueueControl:
    """A queue's limits and the state of its rate (see the module docstring).

    The spec's numbers are also kept flat (`paused`, `cap`, `rate_max`, `per_ms`, `capacity`;
    derived, never written): a claim reads them for every limited queue it names. `rule` is
    state: which meaning the rate limit was put with."""

    __slots__ = ("cap", "capacity", "log", "paused", "per_ms", "rate_max", "refilled_ms", "rule",
                 "spec", "units", "updated_ms")

    def __init__(self, spec: QueueSpec, now_ms: int, rule: str = BUCKET) -> None:
        self.spec = spec
        self.paused = spec.paused
        self.cap = spec.concurrency_max
        rate = spec.rate_limit
        self.rate_max, self.per_ms = (0, 0) if rate is None else (rate.max, rate.per_ms)
        burst = self.rate_max if rate is None or rate.burst is None else rate.burst
        self.capacity = burst * self.per_ms
        self.units = self.capacity  # a new bucket starts full
        self.refilled_ms = now_ms
        self.updated_ms = now_ms
        self.rule = rule if rate is not None else BUCKET
        # The window rule's recent starts: time, count, time, count..., oldest first.
        self.log = array("q")

    def to_list(self) -> list[Any]:
        # A bucket keeps the previous release's four fields (it reads snapshots of a cluster
        # that is not finalized, where every limit is a bucket).
        fields = [self.spec.to_wire(), self.units, self.refilled_ms, self.updated_ms]
        if self.rule == WINDOW:
            fields += [WINDOW, self.log.tolist()]
        return fields

    @classmethod
    def from_list(cls, data: list[Any]) -> QueueControl:
        spec, units, refilled_ms, updated_ms = data[:4]
        rule = data[4] if len(data) > 4 else BUCKET
        control = cls(QueueSpec.parse(spec), refilled_ms, rule)
        control.units = units
        control.updated_ms = updated_ms
        if rule == WINDOW:
            control.log = array("q", data[5])
        return control


def in_window(control: QueueControl, now_ms: int) -> int:
    """Starts the window rule counts at now_ms: those after now_ms - per_ms."""
    since = now_ms - control.per_ms
    log = control.log
    return sum(log[i + 1] for i in range(0, len(log), 2) if log[i] > since)


def units_at(control: QueueControl, now_ms: int) -> int:
    """The bucket's units at now_ms (refilled, not changed)."""
    assert control.per_ms, "a queue without a rate limit has no bucket"
    units = control.units + max(0, now_ms - control.refilled_ms) * control.rate_max
    return units if units < control.capacity else control.capacity


def tokens_at(control: QueueControl, now_ms: int) -> int | None:
    """Claims the rate allows at now_ms; None without a rate limit."""
    if not control.per_ms:
        return None
    if control.rule == WINDOW:
        left = control.rate_max - in_window(control, now_ms)
        return left if left > 0 else 0
    return units_at(control, now_ms) // control.per_ms


def window_opens_ms(control: QueueControl, now_ms: int) -> int | None:
    """When a window queue with no start left at now_ms may start one again (the oldest run
    in its window leaves it), or None when it has room or is not a window queue."""
    if control.rule != WINDOW or tokens_at(control, now_ms) != 0:
        return None
    since = now_ms - control.per_ms
    log = control.log
    for i in range(0, len(log), 2):
        if log[i] > since:
            return log[i] + control.per_ms
    return None


def windows_opening(
    controls: dict[str, QueueControl], ready: Mapping[str, Sized], now_ms: int
) -> list[int]:
    """When each full window queue with jobs in line may start one again: a Tick then lets
    the claims waiting for it through at the time the window opens, not at the next tick."""
    times: list[int] = []
    for name, control in controls.items():
        if control.rule == WINDOW and len(ready.get(name, ())):
            opens = window_opens_ms(control, now_ms)
            if opens is not None:
                times.append(opens)
    return times


def claim_budget(
    control: QueueControl | None, table: JobTable, name: str, now_ms: int
) -> int | None:
    """Jobs the queue may hand out now: 0 while paused, else the room under its concurrency
    cap and its tokens, whichever is less; None when neither limits it."""
    if control is None:
        return None
    if control.paused:
        return 0
    budget = tokens_at(control, now_ms)
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
    """Record the jobs a claim handed out of this queue: a token each, or starts at now_ms."""
    if control is None or not control.per_ms or not claimed:
        return
    if control.rule == WINDOW:
        record_starts(control.log, now_ms, claimed, control.per_ms, LOG_RUNS_MAX)
        return
    units = units_at(control, now_ms) - claimed * control.per_ms
    assert units >= 0, "a claim handed out more than the bucket held"
    control.units = units
    control.refilled_ms = max(control.refilled_ms, now_ms)


def _resliced(log: array[int], now_ms: int, window_ms: int) -> array[int]:
    """A start log carried to a changed window: the runs still in it, each moved to the end
    of its slice of the new window (later, never earlier), runs of one slice merged."""
    out = array("q")
    for i in range(0, len(log), 2):
        if log[i] <= now_ms - window_ms:
            continue
        at_ms = slice_end(log[i], window_ms, LOG_RUNS_MAX)
        if out and out[-2] >= at_ms:
            out[-1] += log[i + 1]
        else:
            out.append(at_ms)  # later than the run before (the test above)
            out.append(log[i + 1])
    return out


def put(
    controls: dict[str, QueueControl],
    name: str,
    spec: QueueSpec,
    now_ms: int,
    *,
    finalized: bool = False,
    keep_rule: bool = False,
) -> Result:
    """Set a queue's limits. Once the cluster is finalized a rate limit without `burst` is
    counted in the exact window, one with `burst` as a bucket (refused before: the previous
    release knows no `burst`); before, every limit is the previous release's bucket.
    `keep_rule`: pausing or resuming keeps the rule the limit was put with.

    A changed limit never grants a fresh burst: a bucket keeps the tokens left (at most the new
    size), a window keeps its starts, and a bucket turning into a window counts the tokens it
    had spent as starts made now. A new limit starts with full room."""
    rate = spec.rate_limit
    if rate is not None and rate.burst is not None and not finalized:
        return Rejected(
            "not_finalized",
            "a rate limit's burst takes effect once the cluster is finalized "
            "(raftcron cluster finalize)",
            "rate_limit.burst",
        )
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
    if keep_rule and old is not None:
        rule = old.rule
    else:
        rule = WINDOW if finalized and rate is not None and rate.burst is None else BUCKET
    control = QueueControl(spec, now_ms, rule)
    if old is not None:
        control.updated_ms = now_ms
        _carry_rate(old, control, now_ms)
    controls[name] = control
    return Ok({})


def _carry_rate(old: QueueControl, new: QueueControl, now_ms: int) -> None:
    """What the new limit inherits of the old one's rate (see `put`)."""
    old_rate, new_rate = old.spec.rate_limit, new.spec.rate_limit
    if old_rate is None or new_rate is None:
        return
    if new.rule == WINDOW:
        if old.rule == WINDOW:
            new.log = _resliced(old.log, now_ms, new.per_ms)
        else:
            spent = max(0, old_rate.max - units_at(old, now_ms) // old_rate.per_ms)
            if spent:
                record_starts(new.log, now_ms, spent, new.per_ms, LOG_RUNS_MAX)
        return
    if old.rule == BUCKET and old_rate == new_rate:
        new.units, new.refilled_ms = old.units, old.refilled_ms
        return
    left = tokens_at(old, now_ms) or 0
    new.units = min(left, new.capacity // new.per_ms) * new.per_ms


def set_paused(
    controls: dict[str, QueueControl], name: str, paused: bool, now_ms: int
) -> Result:
    old = controls.get(name)
    spec = QueueSpec() if old is None else old.spec
    return put(
        controls, name, QueueSpec(paused, spec.concurrency_max, spec.rate_limit), now_ms,
        finalized=True, keep_rule=True,
    )
