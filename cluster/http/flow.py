"""Routes of flow control (DESIGN.md §8.5): queues with their limits, and bulk actions on jobs.

`GET /v1/queues` and `GET /v1/queues/{name}` read; `PUT /v1/queues/{name}`, `POST
/v1/queues/{name}/pause` and `/resume` set limits (admin, audited); `POST /v1/jobs/bulk`
cancels, retries or deletes the jobs matching a filter (admin, audited), one bounded command
per request: the answer's `more` and `next_cursor` say how to go on. A dry run is a consistent
read (a Barrier first, so it sees every write acknowledged before it) and proposes nothing.
Every field is parsed by the core's own commands (`scheduler/flowcommands.py`).

`"action": "purge"` removes finished jobs for good, live or archived (scheduler/purging.py):
its filter is a search's (`GET /v1/jobs`'s names, payload fields included), one page of the
search per request, newest first (`cursor` 0 starts from the newest, `next_cursor` goes on);
this node picks the ids and proposes them, so it must hold its whole archive (503 while it
fills it from a peer: another member answers).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftcron.cluster.http import bounds
from raftcron.cluster.http.common import (
    HttpError,
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
from raftcron.cluster.http.jobsearch import check_search, search_page
from raftcron.scheduler import flowviews, parse
from raftcron.scheduler.commands import Barrier
from raftcron.scheduler.flowcommands import BulkJobs, PauseQueue, PutQueue, ResumeQueue, queue_name
from raftcron.scheduler.flowspecs import QueueSpec
from raftcron.scheduler.jobs import FINAL
from raftcron.scheduler.purging import PURGE_IDS_MAX, PurgeJobs
from raftcron.scheduler.search import JobFilter


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
    if body.get("action") == "purge":
        return await _purge(request, body, request_id, dry_run=dry_run)
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


async def _purge(request: web.Request, body: dict[str, Any], request_id: str, *,
                 dry_run: bool) -> web.Response:
    query = parse_or_400(lambda: JobFilter.from_object(body.get("filter", {})))
    if query == JobFilter():
        raise HttpError(400, "invalid", "a purge names what to purge: give at least one filter",
                        "filter")
    max_jobs = parse_or_400(lambda: parse.integer(body.get("max", PURGE_IDS_MAX), "max", low=1,
                                                  high=PURGE_IDS_MAX))
    cursor = parse_or_400(lambda: parse.integer(body.get("cursor", 0), "cursor", low=0,
                                                high=bounds.CURSOR_MAX))
    node = services(request).node
    check_search(node, query, node.archive, "filter")
    if node.archive is not None and not node.archive.whole:
        raise HttpError(503, "unavailable", "this node is still filling its archive from a peer "
                        "and would miss archived jobs; send the purge to another member")
    seen = node.machine.read(lambda state: state.requests.get(request_id))
    if seen is not None and seen[0] == PurgeJobs.TAG:  # a retry: this page is done already
        return json_response({"matched": seen[2]["purged"] + seen[2]["skipped"],
                              "changed": seen[2]["purged"], "more": True,
                              "next_cursor": cursor, "action": "purge", "dry_run": dry_run})
    await commit(request, Barrier(request_id))  # the search sees every acknowledged write
    jobs, next_cursor = await search_page(node, query, cursor=cursor or None, limit=max_jobs)
    finished = tuple(job["id"] for job in jobs if job["status"] in FINAL)
    changed = 0
    if finished and not dry_run:
        changed = (await commit(request, PurgeJobs(request_id, finished)))["purged"]
    return json_response({"matched": len(finished), "changed": changed,
                          "more": next_cursor is not None, "next_cursor": next_cursor or 0,
                          "action": "purge", "dry_run": dry_run})


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/queues", list_queues),
        web.get("/v1/queues/{name}", get_queue),
        web.put("/v1/queues/{name}", put_queue),
        web.post("/v1/queues/{name}/pause", named_control(PauseQueue, _name, _view)),
        web.post("/v1/queues/{name}/resume", named_control(ResumeQueue, _name, _view)),
        web.post("/v1/jobs/bulk", bulk),
    ]

