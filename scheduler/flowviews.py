"""Read-only views of flow control: queues with their limits and what each holds back, and
the dry run of a bulk action. Queries of the read seam (see `scheduler.views`): plain data out,
nothing changed.

What a queue "holds back" is counted by the first limit that stops a queued job, in the order
a claim applies them: `paused` (all of its queued jobs in line), `queue_concurrency` (those past
the room under its cap), `queue_rate` (those past the tokens left), `key_concurrency` (its
jobs held for a full concurrency key, whatever the queue's own state) and `key_rate` (its jobs
held for a rate key's full window, scheduler/ratekeys.py).
"""

from __future__ import annotations

from typing import Any

from raftcron.scheduler import bulk
from raftcron.scheduler.flowspecs import BulkFilter
from raftcron.scheduler.queues import WINDOW, QueueControl, tokens_at
from raftcron.scheduler.state import SchedulerState

HELD_REASONS = ("paused", "queue_concurrency", "queue_rate", "key_concurrency", "key_rate")


def queue_names(state: SchedulerState) -> list[str]:
    """Queues with limits or with jobs queued or running, by name."""
    table = state.table
    names = set(state.queues) | set(table.running_by_queue) | set(table.held_by_queue)
    names.update(table.rates.held_by_queue)
    names.update(name for name, ready in table.ready.items() if len(ready))
    return sorted(names)


def queue_view(state: SchedulerState, name: str) -> dict[str, Any]:
    """One queue (any name: a queue without limits or jobs shows its defaults and zeros)."""
    table = state.table
    control = state.queues.get(name)
    ready = table.ready.get(name)
    in_line = len(ready) if ready is not None else 0
    running = table.running_by_queue.get(name, 0)
    held = dict.fromkeys(HELD_REASONS, 0)
    held["key_concurrency"] = table.held_by_queue.get(name, 0)
    held["key_rate"] = table.rates.held_by_queue.get(name, 0)
    tokens = None
    spec_wire: dict[str, Any] = {"paused": False, "concurrency_max": None, "rate_limit": None}
    updated_ms = None
    rate_rule = None
    if control is not None:
        spec_wire = control.spec.to_wire()
        rate_rule = control.rule if control.per_ms else None
        updated_ms = control.updated_ms
        tokens = tokens_at(control, state.now_ms)
        _count_held(control, held, in_line, running, tokens)
    return {
        "name": name,
        **spec_wire,
        "rate_rule": rate_rule,
        "queued": in_line + held["key_concurrency"] + held["key_rate"],
        "running": running,
        "held": held,
        "tokens": tokens,
        "updated_ms": updated_ms,
    }


def _count_held(
    control: QueueControl, held: dict[str, int], in_line: int, running: int, tokens: int | None
) -> None:
    spec = control.spec
    if spec.paused:
        held["paused"] = in_line
        return
    waiting = in_line
    if spec.concurrency_max is not None:
        room = max(0, spec.concurrency_max - running)
        held["queue_concurrency"] = max(0, waiting - room)
        waiting -= held["queue_concurrency"]
    if tokens is not None:
        held["queue_rate"] = max(0, waiting - tokens)


def names_a_window_queue(state: SchedulerState, names: tuple[str, ...]) -> bool:
    """Whether a claim on `names` is counted by a rate window: the leader stamps it with its
    clock (a Tick in the same log entry), so the window counts the start's real time."""
    controls = state.queues
    if controls:
        for name in names:
            control = controls.get(name)
            if control is not None and control.rule == WINDOW:
                return True
    return False


def all_queues(state: SchedulerState) -> list[dict[str, Any]]:
    return [queue_view(state, name) for name in queue_names(state)]


def bulk_dry_run(
    state: SchedulerState, action: str, where: BulkFilter, *, cursor: int, max_jobs: int
) -> dict[str, Any]:
    """What a BulkJobs with these arguments would match now; `changed` is 0."""
    chosen = bulk.select(state, action, where, cursor=cursor, max_jobs=max_jobs)
    return bulk.answer(chosen, 0)
