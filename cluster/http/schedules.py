"""Routes of schedules: create or replace, read, list, delete, pause, resume, trigger,
backfill, and preview (the next fire times with their local time and DST notes)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftcron.cluster.clock.ticker import wall_ms
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
    query_int,
    read_json,
    requires,
    services,
    take_request_id,
)
from raftcron.scheduler import limits, views
from raftcron.scheduler.calendar import At
from raftcron.scheduler.commands import (
    BackfillSchedule,
    DeleteSchedule,
    PauseSchedule,
    PutSchedule,
    ResumeSchedule,
    TriggerSchedule,
    schedule_name,
)
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.views import preview


def _name(request: web.Request) -> str:
    raw = request.match_info["name"]
    return str(parse_or_400(lambda: schedule_name(raw)))


def _view(request: web.Request, name: str) -> dict[str, Any]:
    machine = services(request).node.machine
    view = machine.read(lambda state: views.find_schedule(state, name))
    if view is None:
        raise HttpError(404, "not_found", f"no schedule {name!r}", "name")
    return view


@requires("manage")
async def put_schedule(request: web.Request) -> web.Response:
    name = _name(request)
    body = object_body(await read_json(request))
    request_id = take_request_id(body, request)
    spec = parse_or_400(lambda: ScheduleSpec.parse(body))
    past_ms = wall_ms() - bounds.AT_PAST_GRACE_MS
    if isinstance(spec.recurrence, At) and spec.recurrence.at_ms < past_ms:
        raise HttpError(
            400, "invalid", f"at: {spec.text!r} is in the past; it would never fire", "at"
        )
    value = await commit(request, PutSchedule(request_id, name, spec))
    return json_response(_view(request, name), status=201 if value["created"] else 200)


async def get_schedule(request: web.Request) -> web.Response:
    name = _name(request)
    await maybe_consistent(request)
    return json_response(_view(request, name))


async def list_schedules(request: web.Request) -> web.Response:
    await maybe_consistent(request)
    node = services(request).node
    found = node.machine.read(views.all_schedules)
    return json_response(
        {"schedules": found, "node": node.config.node_id, "applied_index": node.applied_index}
    )


@requires("manage")
async def delete_schedule(request: web.Request) -> web.Response:
    name = _name(request)
    request_id = take_request_id({}, request)
    await commit(
        request,
        parse_or_400(lambda: DeleteSchedule.from_wire({"name": name, "request_id": request_id})),
    )
    return json_response({"name": name, "deleted": True})


@requires("manage")
async def trigger(request: web.Request) -> web.Response:
    name = _name(request)
    body = object_body(await read_json(request)) if request.can_read_body else {}
    request_id = take_request_id(only(body, {"request_id", "force"}), request)
    command = parse_or_400(
        lambda: TriggerSchedule.from_wire({**body, "name": name, "request_id": request_id})
    )
    value = await commit(request, command)
    job = None
    if value["job_id"] is not None:
        machine = services(request).node.machine
        job = machine.read(lambda state: views.find_job(state, value["job_id"], history=False))
    return json_response(
        {"name": name, "buffered": value["buffered"], "job": job}, status=201 if job else 202
    )


@requires("manage")
async def backfill(request: web.Request) -> web.Response:
    name = _name(request)
    body = object_body(await read_json(request))
    request_id = take_request_id(body, request)
    only(body, {"from_ms", "to_ms"})
    command = parse_or_400(
        lambda: BackfillSchedule.from_wire({**body, "name": name, "request_id": request_id})
    )
    value = await commit(request, command)
    machine = services(request).node.machine
    jobs = machine.read(lambda state: views.fired_jobs(state, value["fires"]))
    return json_response({"name": name, "jobs": jobs})


def _preview_params(request: web.Request) -> tuple[int, int]:
    count = query_int(request, "count", default=10, low=1, high=bounds.PREVIEW_COUNT_MAX)
    from_ms = query_int(request, "from_ms", default=None, low=0, high=limits.TIME_MS_MAX)
    return count or 10, from_ms if from_ms is not None else wall_ms()


async def preview_saved(request: web.Request) -> web.Response:
    name = _name(request)
    count, from_ms = _preview_params(request)
    machine = services(request).node.machine
    spec = machine.read(lambda state: views.schedule_spec(state, name))
    if spec is None:
        raise HttpError(404, "not_found", f"no schedule {name!r}", "name")
    return json_response({"name": name, "fires": preview(spec, from_ms=from_ms, count=count)})


async def preview_spec(request: web.Request) -> web.Response:
    body = object_body(await read_json(request))
    body.pop("request_id", None)
    spec = parse_or_400(lambda: ScheduleSpec.parse(body))
    count, from_ms = _preview_params(request)
    return json_response({"fires": preview(spec, from_ms=from_ms, count=count)})


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/schedules", list_schedules),
        web.post("/v1/schedules/preview", preview_spec),
        web.put("/v1/schedules/{name}", put_schedule),
        web.get("/v1/schedules/{name}", get_schedule),
        web.delete("/v1/schedules/{name}", delete_schedule),
        web.post("/v1/schedules/{name}/pause", named_control(PauseSchedule, _name, _view)),
        web.post("/v1/schedules/{name}/resume", named_control(ResumeSchedule, _name, _view)),
        web.post("/v1/schedules/{name}/trigger", trigger),
        web.post("/v1/schedules/{name}/backfill", backfill),
        web.get("/v1/schedules/{name}/preview", preview_saved),
    ]
