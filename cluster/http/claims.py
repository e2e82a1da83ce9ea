"""`POST /v1/claims`: a worker acks finished jobs and claims new ones in one round trip,
long-polling up to `wait_ms` when nothing is queued.

The wait happens before proposing: the handler waits until this node's state shows queued jobs
in one of the requested queues (`ClaimWaiters` is woken from the Raft thread when an applied
entry leaves jobs queued), then proposes ONE claim. When the claim comes back empty (another
worker was faster) and time remains, it waits and proposes again under `<request_id>/<n>`, so
a worker that re-sends a lost request with the same request_id replays the same commands and
gets the same jobs and tokens back. A replay does not wait before a round this node already
applied (it is answered from the request-id table at once: waiting would strand the jobs that
round leased until their lease ended), and it hands back only the jobs still leased under the
token it claimed them with (a lease that ended and went to another worker is not handed out).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from aiohttp import web

from raftcron.cluster.http.common import (
    commit,
    json_response,
    object_body,
    only,
    parse_or_400,
    read_json,
    requires,
    services,
    take_request_id,
)
from raftcron.scheduler import parse
from raftcron.scheduler.commands import ClaimJobs
from raftcron.scheduler.frozen import FrozenJob
from raftcron.scheduler.jobs import RUNNING, Job
from raftcron.scheduler.state import SchedulerState
from raftcron.scheduler.views import claimed_job_view

WAIT_MS_MAX = 30_000
CLAIM_ROUNDS_MAX = 8


class ClaimWaiters:
    """Wakes the long-polling claims of a queue when jobs in that queue may have become
    claimable. Per queue: a job queued in one queue wakes no claim waiting on others (500
    waiters on an idle queue cost a tenth of a core when every entry woke them all)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.events: dict[str, asyncio.Event] = {}  # queue -> the event its waiters wait on
        self.counts: dict[str, int] = {}  # queue -> waiters (on the loop thread)
        # The queues with waiters, replaced whole on the loop thread and read by the Raft
        # thread: a tuple is never seen half-changed.
        self.watched: tuple[str, ...] = ()
        self.lock = threading.Lock()  # guards `due` between the Raft thread and the loop
        self.due: set[str] = set()  # queues to wake, collected on the Raft thread

    @property
    def waiting(self) -> int:
        return sum(self.counts.values())

    def on_applied(self, state: SchedulerState) -> None:
        """On the Raft thread, after every applied entry: cheap, and at most one wake queued."""
        watched = self.watched
        if not watched:
            return
        ready = state.table.ready
        due = [queue for queue in watched if len(ready.get(queue) or ())]
        if not due:
            return
        with self.lock:
            first = not self.due
            self.due.update(due)
        if first:
            self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self.lock:
            due, self.due = self.due, set()
        for queue in sorted(due):
            event = self.events.pop(queue, None)
            if event is not None:
                event.set()

    async def wait(self, queues: tuple[str, ...], timeout_s: float) -> None:
        events = []
        for queue in queues:
            event = self.events.get(queue)
            if event is None:
                event = self.events[queue] = asyncio.Event()
            events.append(event)
            self.counts[queue] = self.counts.get(queue, 0) + 1
        self.watched = tuple(sorted(self.counts))
        waits = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            for queue in queues:
                self.counts[queue] -= 1
                if not self.counts[queue]:
                    del self.counts[queue]
                    if queue in self.events and not self.events[queue].is_set():
                        del self.events[queue]
            self.watched = tuple(sorted(self.counts))


def _queued_in(state: SchedulerState, queues: tuple[str, ...]) -> bool:
    return any(len(state.table.ready.get(name) or ()) for name in queues)


@requires("work")
async def claim(request: web.Request) -> web.Response:
    body = only(
        object_body(await read_json(request)),
        {"request_id", "worker", "queues", "max", "lease_ms", "wait_ms", "acks"},
    )
    request_id = take_request_id(body, request)
    wait_ms = parse_or_400(
        lambda: parse.integer(body.pop("wait_ms", 0), "wait_ms", low=0, high=WAIT_MS_MAX)
    )
    svc = services(request)
    body["node"] = svc.config.node_id
    command = parse_or_400(lambda: ClaimJobs.from_wire({**body, "request_id": request_id}))
    deadline = time.monotonic() + wait_ms / 1000
    machine = svc.node.machine
    acks: list[Any] = []
    claimed: list[list[int]] = []
    for round_number in range(CLAIM_ROUNDS_MAX):
        round_id = f"{request_id}/{round_number}" if round_number else request_id
        with machine.lock:
            replayed = round_id in machine.state.requests.results
        if (round_number or not command.acks) and not replayed:
            await _wait_for_work(svc.claims, machine, command.queues, deadline, request)
        if _gone(request):
            # The worker hung up: leasing it jobs now would strand them for a whole lease.
            # Its acks still count (they report finished work), so those alone go through.
            if round_number or not command.acks:
                break
            command = ClaimJobs(
                command.request_id,
                command.worker,
                command.queues,
                0,
                command.lease_ms,
                command.acks,
                command.node,
            )
        if round_number:
            command = ClaimJobs(
                round_id,
                command.worker,
                command.queues,
                command.max,
                command.lease_ms,
                (),
                command.node,
            )
        started = time.monotonic()
        value = await commit(request, command)
        svc.stats.claim_latency.observe(time.monotonic() - started)
        if round_number == 0:
            acks = value["acks"]
        claimed = value["jobs"]
        if claimed or command.max == 0 or time.monotonic() >= deadline:
            break
    with machine.lock:
        table = machine.state.table
        jobs = [
            claimed_job_view(table.jobs[job_id], token)
            for job_id, token in claimed
            if _still_leased(table.jobs.get(job_id), token)
        ]
    return json_response(
        {"jobs": jobs, "acks": [{"id": job_id, "outcome": outcome} for job_id, outcome in acks]}
    )


def _still_leased(job: Job | FrozenJob | None, token: int) -> bool:
    """A replayed claim's job is handed out only while the claim's token holds its lease."""
    # A finished (frozen) job holds no lease: checked first, so its record is not decoded.
    return isinstance(job, Job) and job.status == RUNNING and job.token == token


def _gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def _wait_for_work(
    waiters: ClaimWaiters,
    machine: Any,
    queues: tuple[str, ...],
    deadline: float,
    request: web.Request,
) -> None:
    while not _gone(request):
        with machine.lock:
            if _queued_in(machine.state, queues):
                return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        await waiters.wait(queues, min(remaining, 1.0))


def routes() -> list[web.RouteDef]:
    return [web.post("/v1/claims", claim)]
