"""Routes of flow control (DESIGN.md §8.5): queues with their limits, and bulk actions on jobs.

`GET /v1/queues` and `GET /v1/queues/{name}` read; `PUT /v1/queues/{name}`, `POST
/v1/queues/{name}/pause` and `/resume` set limits (admin, audited); `POST /v1/jobs/bulk`
cancels, retries or deletes the jobs matching a filter (admin, audited), one bounded command
per request: the answer's `more` and `next_cursor` say how to go on. A dry run is a consistent
read (a Barrier first, so it sees every write acknowledged before it) and proposes nothing.
Every field is parsed by the core's own commands (`scheduler/flowcommands.py`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftcron.cluster.http.common import (
    commit,
    json_response,
    maybe_consistent,
    named_control,
    object_body,
    only,
    parse_or_400,
    read_json,
    requires,
    services,
    take_request_id,
)
from raftcron.scheduler import flowviews, parse
from raftcron.scheduler.commands import Barrier
from raftcron.scheduler.flowcommands import BulkJobs, PauseQueue, PutQueue, ResumeQueue, queue_name
from raftcron.scheduler.flowspecs import QueueSpec


def _name(request: web.Request) -> str:
    raw = request.match_info["name"]
    return str(parse_or_400(lambda: queue_name(raw)))


def _view(request: web.Request, name: str) -> dict[str, Any]:
    machine = services(request).node.machine
    view: dict[str, Any] = machine.read(lambda state: flowviews.queue_view(state, name))
    return view


async def list_queues(request: web.Request) -> web.Response:
    await maybe_consistent(request)
    node = services(request).node
    found = node.machine.read(flowviews.all_queues)
    return json_response(
        {"queues": found, "node": node.config.node_id, "applied_index": node.applied_index}
    )


async def get_queue(request: web.Request) -> web.Response:
    name = _name(request)
    await maybe_consistent(request)
    return json_response(_view(request, name))


@requires("manage")
async def put_queue(request: web.Request) -> web.Response:
    name = _name(request)
    body = object_body(await read_json(request))
    request_id = take_request_id(body, request)
    spec = parse_or_400(lambda: QueueSpec.parse(body))
    await commit(request, PutQueue(request_id, name, spec))
    return json_response(_view(request, name))


BULK_FIELDS = {"action", "filter", "max", "cursor", "dry_run"}


@requires("manage")
async def bulk(request: web.Request) -> web.Response:
    body = only(object_body(await read_json(request)), BULK_FIELDS | {"request_id"})
    request_id = take_request_id(body, request)
    dry_run = parse_or_400(lambda: parse.boolean(body.pop("dry_run", False), "dry_run"))
    command = parse_or_400(lambda: BulkJobs.from_wire({**body, "request_id": request_id}))
    if dry_run:
        await commit(request, Barrier(request_id))
        machine = services(request).node.machine
        answer = machine.read(
            lambda state: flowviews.bulk_dry_run(
                state, command.action, command.filter, cursor=command.cursor,
                max_jobs=command.max,
            )
        )
    else:
        answer = await commit(request, command)
    return json_response({**answer, "action": command.action, "dry_run": dry_run})


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/queues", list_queues),
        web.get("/v1/queues/{name}", get_queue),
        web.put("/v1/queues/{name}", put_queue),
        web.post("/v1/queues/{name}/pause", named_control(PauseQueue, _name, _view)),
        web.post("/v1/queues/{name}/resume", named_control(ResumeQueue, _name, _view)),
        web.post("/v1/jobs/bulk", bulk),
    ]

