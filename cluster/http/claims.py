"""`POST /v1/claims`: a worker acks finished jobs and claims new ones in one round trip,
long-polling up to `wait_ms` when nothing is queued.

The wait happens before proposing: the handler waits until this node's state shows queued jobs
in one of the requested queues (`cluster.consensus.waiters.ClaimWaiters` is woken from the Raft
thread when an applied entry leaves jobs queued), then proposes ONE claim. A wait that ends with
no queued job, for a claim with no acks to send, proposes nothing and answers no jobs: idle
workers' polls write nothing to the log. When the claim comes back
empty (another worker was faster) and time remains, it waits and proposes again under
`<request_id>/<n>`, so a worker that re-sends a lost request with the same request_id replays
the same commands and gets the same jobs and tokens back. A replay does not wait before a round
this node already applied (it is answered from the request-id table at once: waiting would
strand the jobs that round leased until their lease ended), and it hands back only the jobs
still leased under the token it claimed them with (a lease that ended and went to another
worker is not handed out).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from aiohttp import web

from raftcron.cluster.consensus.proposer import ProposalFailed
from raftcron.cluster.consensus.replica import StateMachine
from raftcron.cluster.consensus.waiters import ClaimWaiters
from raftcron.cluster.http import bounds, traces
from raftcron.cluster.http.common import (
    Services,
    commit,
    json_response,
    object_body,
    only,
    parse_or_400,
    read_json,
    rejected,
    requires,
    services,
    take_request_id,
)
from raftcron.scheduler import flowviews, parse, upstream, views
from raftcron.scheduler.commands import ClaimJobs
from raftcron.scheduler.errors import Rejected


@requires("work")
async def claim(request: web.Request) -> web.Response:
    with traces.server_span(request, "claim") as span:
        response = await _claim(request)
        if span is not None:
            span.set_attributes({"raftcron.jobs": response[0], "raftcron.acks": response[1]})
        return response[2]


async def _claim(request: web.Request) -> tuple[int, int, web.Response]:
    """(jobs claimed, acks, the answer)."""
    body = only(
        object_body(await read_json(request)),
        {"request_id", "worker", "queues", "max", "lease_ms", "wait_ms", "acks"},
    )
    request_id = take_request_id(body, request)
    wait_ms = parse_or_400(
        lambda: parse.integer(
            body.pop("wait_ms", 0), "wait_ms", low=0, high=bounds.CLAIM_WAIT_MS_MAX
        )
    )
    svc = services(request)
    body["node"] = svc.config.node_id
    command = parse_or_400(lambda: ClaimJobs.from_wire({**body, "request_id": request_id}))
    deadline = time.monotonic() + wait_ms / 1000
    machine = svc.node.machine
    acks: list[Any] = []
    claimed: list[list[int]] = []
    queues = command.queues
    for round_number in range(bounds.CLAIM_ROUNDS_MAX):
        round_id = f"{request_id}/{round_number}" if round_number else request_id
        replayed = machine.read(lambda state: views.answered(state, round_id))  # noqa: B023
        if (round_number or not command.acks) and not replayed:
            found = await _wait_for_work(svc.claims, machine, queues, deadline, request)
            if wait_ms and not found and not _gone(request) and not svc.claims.closed:
                # Waited out with nothing to lease and nothing to ack: a claim would lease
                # nothing, so none is written (an idle worker's polls cost the log nothing,
                # and take no place in the request table).
                break
        if _gone(request) or svc.claims.closed:
            # The worker hung up, or this node is stopping: leasing it jobs now would strand
            # them for a whole lease. Its acks still count (they report finished work), so
            # those alone go through.
            if round_number or not command.acks:
                break
            command = dataclasses.replace(command, max=0)
        if round_number:  # a later round claims under its own id and acks nothing again
            command = dataclasses.replace(command, request_id=round_id, acks=())
        started = time.monotonic()
        spans = traces.ack_spans(request, ((ack.job_id, ack.outcome) for ack in command.acks))
        try:
            value = await _commit_claim(request, svc, command)
        except BaseException as error:
            traces.acked(spans, (), error)
            raise
        svc.stats.claim_latency.observe(time.monotonic() - started)
        if round_number == 0:
            acks = value["acks"]
            traces.acked(spans, acks)
        claimed = value["jobs"]
        if claimed or command.max == 0 or time.monotonic() >= deadline:
            break
    # With each workflow job, its parents' results, up to a cap (scheduler/upstream.py).
    jobs = machine.read(lambda state: upstream.attach(state, views.claimed_jobs(state, claimed)))
    return len(jobs), len(acks), json_response(
        {"jobs": jobs, "acks": [{"id": job_id, "outcome": outcome} for job_id, outcome in acks]}
    )


async def _commit_claim(request: web.Request, svc: Services, command: ClaimJobs) -> Any:
    """`commit`; a claim counted by a rate window goes with a Tick of the leader's time in the
    same log entry (DESIGN.md §9.4), so its starts are stamped with the time they happen, not
    the last Tick's (up to a tick interval earlier), which is what a metered API on the other
    side counts. The leader builds the Tick; a follower asks the leader for it
    (cluster/http/stamps.py). A stamped proposal that fails goes the plain way, whose retries
    under the same request id answer what the first one did if it committed."""
    # The state first (one read): most claims name no window queue and need no clock.
    windowed = (svc.stamp is not None or svc.leader_stamp is not None) and svc.node.machine.read(
        lambda state: flowviews.names_a_window_queue(state, command.queues)
    )
    tick = None
    if windowed and svc.stamp is not None:
        tick = svc.stamp()
    if windowed and tick is None and svc.leader_stamp is not None and not svc.node.is_leader():
        tick = await svc.leader_stamp()
    if tick is not None:
        try:
            _, result = await svc.proposer.propose_together([tick, command])
        except ProposalFailed:
            pass
        else:
            if isinstance(result, Rejected):
                raise rejected(result)
            return result.value
    return await commit(request, command)


def _gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def _wait_for_work(
    waiters: ClaimWaiters,
    machine: StateMachine,
    queues: tuple[str, ...],
    deadline: float,
    request: web.Request,
) -> bool:
    """Whether this node's state shows work in `queues`; False once the deadline came first,
    the worker hung up or the node stops."""
    while not _gone(request) and not waiters.closed:
        if machine.read(lambda state: views.queues_with_work(state, queues)):
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        await waiters.wait(queues, min(remaining, 1.0))
    return False


def routes() -> list[web.RouteDef]:
    return [web.post("/v1/claims", claim)]
