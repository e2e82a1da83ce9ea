"""Routes of notifications (webhooks): create or replace, read, list, delete.

Admin only, every one of them (the `manage` grant, so each call is in the audit trail): a
notification's url may carry a receiver's token in its query, and its events say what goes
wrong in the cluster. The secret is never answered back, on any route; it is replicated
state (in every member's snapshots and in backups). Delivery is `cluster/ops/notifier.py`'s.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftcron.cluster.http.common import (
    HttpError,
    commit,
    json_response,
    maybe_consistent,
    object_body,
    parse_or_400,
    read_json,
    requires,
    services,
    take_request_id,
)
from raftcron.scheduler import notifications
from raftcron.scheduler.notifications import (
    DeleteNotification,
    PutNotification,
    notification_name,
)


def _name(request: web.Request) -> str:
    raw = request.match_info["name"]
    return str(parse_or_400(lambda: notification_name(raw)))


def _view(request: web.Request, name: str) -> dict[str, Any]:
    machine = services(request).node.machine
    found = machine.read(
        lambda state: notifications.view(state.notifications, name, state.now_ms)
    )
    if found is None:
        raise HttpError(404, "not_found", f"no notification {name!r}", "name")
    return found


@requires("manage")
async def put_notification(request: web.Request) -> web.Response:
    name = _name(request)
    body = object_body(await read_json(request))
    request_id = take_request_id(body, request)
    command = parse_or_400(
        lambda: PutNotification.from_wire({"name": name, "request_id": request_id, "spec": body})
    )
    value = await commit(request, command)
    return json_response(_view(request, name), status=201 if value["created"] else 200)


@requires("manage")
async def get_notification(request: web.Request) -> web.Response:
    name = _name(request)
    await maybe_consistent(request)
    return json_response(_view(request, name))


@requires("manage")
async def list_notifications(request: web.Request) -> web.Response:
    await maybe_consistent(request)
    node = services(request).node
    found = node.machine.read(
        lambda state: notifications.view_all(state.notifications, state.now_ms)
    )
    return json_response(
        {"notifications": found, "node": node.config.node_id,
         "applied_index": node.applied_index}
    )


@requires("manage")
async def delete_notification(request: web.Request) -> web.Response:
    name = _name(request)
    request_id = take_request_id({}, request)
    await commit(
        request,
        parse_or_400(
            lambda: DeleteNotification.from_wire({"name": name, "request_id": request_id})
        ),
    )
    return json_response({"name": name, "deleted": True})


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/notifications", list_notifications),
        web.put("/v1/notifications/{name}", put_notification),
        web.get("/v1/notifications/{name}", get_notification),
        web.delete("/v1/notifications/{name}", delete_notification),
    ]
