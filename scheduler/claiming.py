"""`ClaimJobs`: a worker's acks, then the jobs it is handed, within every limit.

Acks come first (a finished job frees its queue's and its key's slots for this very claim).
Then, up to `max` times, the best ready head among the requested queues that may hand out
more (`queues.claim_budgets`: not paused, below the concurrency cap, a token left) is leased:
a fresh fencing token, `lease_ms` from the state's time, an attempt in its history. A head whose
concurrency key is full (possible only when a key's jobs give different maxes, see
`scheduler.store`) is held back and the next one is tried, so no key blocks a queue.

Cost per claim: one dict lookup per requested queue, plus O(log n) per job handed out; held
jobs are never in a ready heap, so none are scanned.
"""

from __future__ import annotations

from raftcron.scheduler import jobs as j
from raftcron.scheduler import limits, queues
from raftcron.scheduler.commands import ClaimJobs
from raftcron.scheduler.errors import Ok, Result
from raftcron.scheduler.flowstate import FlowState
from raftcron.scheduler.jobs import Attempt, Job


def claim(state: FlowState, command: ClaimJobs) -> Result:
    acks = []
    for ack in command.acks:
        outcome = state.ack(ack)
        acks.append([ack.job_id, "ok" if isinstance(outcome, Ok) else outcome.code])
    claimed: list[list[int]] = []
    table = state.table
    budgets = (
        queues.claim_budgets(state.queues, table, command.queues, state.now_ms)
        if state.queues
        else {}
    )
    granted = dict(budgets)
    open_queues = command.queues
    if budgets:
        open_queues = tuple(q for q in open_queues if budgets.get(q) != 0)
    held_back = 0
    # Jobs started per queue, counted once per queue after the loop (in the order the queues
    # were first met, as counting each job did: the counters' order is part of the state).
    started: dict[str, int] = {}
    while len(claimed) < command.max:
        name = table.best_ready(open_queues)
        if name is None:
            break
        line = table.ready[name]
        job = table.jobs[line.pop()]
        assert isinstance(job, Job)  # queued: never frozen
        if job.concurrency_key is not None and not table.key_has_room(job):
            table.hold_back(job)
            line.give_back()  # it did not start: its fairness key keeps the turn
            held_back += 1
            if held_back > limits.CLAIM_MAX:
                break  # bounded work; the rest are held back by the next claims
            continue
        if job.rate is not None and not table.rates.can_start(job, state.now_ms):
            table.hold_back_rate(job)  # its key's window is full: out of line until it opens
            line.give_back()
            held_back += 1
            if held_back > limits.CLAIM_MAX:
                break
            continue
        _start_attempt(state, job, command)
        claimed.append([job.id, state.fence])
        started[name] = started.get(name, 0) + 1
        if budgets:  # the common claim names no limited queue: nothing to count
            left = budgets.get(name)
            if left is not None:
                budgets[name] = left - 1
                if left == 1:  # its budget is spent: the rest of this claim skips it
                    open_queues = tuple(q for q in open_queues if q != name)
    for name, count in started.items():
        state.count("claimed", name, count)
    for name, left in budgets.items():  # the tokens of what each limited queue handed out
        queues.spend(state.queues[name], state.now_ms, granted[name] - left)
    return Ok({"jobs": claimed, "acks": acks})


def _start_attempt(state: FlowState, job: Job, command: ClaimJobs) -> None:
    state.fence += 1
    job.attempts += 1
    job.token = state.fence
    job.lease_ms = command.lease_ms
    job.lease_until_ms = state.now_ms + command.lease_ms
    job.worker = command.worker
    job.add_attempt(Attempt(job.attempts, state.fence, command.worker, command.node, state.now_ms))
    if job.rate is not None:  # counted before it leaves the line: no room is freed by it
        state.table.rates.started(job, state.now_ms)
    state.table.set_status(job, j.RUNNING)
