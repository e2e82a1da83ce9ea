"""The aiohttp application: routes, and the middleware every request passes through.

The middleware authenticates (bearer token -> role -> grant the route needs), turns every
failure into the API's error shape (never an HTML page, never a stack trace), counts stale
writes, records admin actions in the audit trail (cluster/http/trail.py), and stamps each
answer with the node that served it, its applied index and the leader's URL as this node knows
it (clients then send to the leader itself: a request a follower forwards costs the cluster
more than one the leader takes, in CPU and in latency).
"""

from __future__ import annotations

import logging

from aiohttp import web

from raftcron.cluster.consensus.replica import StateUnavailable
from raftcron.cluster.http import (
    activity,
    archive,
    backup,
    claims,
    dashboard,
    flow,
    jobs,
    members,
    notifications,
    ops,
    schedules,
    settings,
    stamps,
)
from raftcron.cluster.http.bounds import BODY_BYTES_MAX
from raftcron.cluster.http.common import (
    CALLER,
    SERVICES,
    HttpError,
    RouteHandler,
    Services,
    check_token,
    leader_url,
    unavailable,
)
from raftcron.cluster.http.trail import AUDITED_ACTIONS

log = logging.getLogger("raftcron.http")
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/"})


@web.middleware
async def api_middleware(request: web.Request, handler: RouteHandler) -> web.StreamResponse:
    svc = request.app[SERVICES]
    try:
        if request.path not in OPEN_PATHS and not request.path.startswith("/ui/"):
            check_token(svc.config, request, getattr(handler, "grant", "read"))
        response = await handler(request)
    except HttpError as error:
        response = error.response()
        if error.code in ("stale_token", "job_cancelled"):
            svc.stats.stale_writes_rejected += 1
    except StateUnavailable:  # for the moment a snapshot install replaces the state
        response = unavailable(f"node {svc.config.node_id} is installing a snapshot of the "
                               "state; retry").response()
    except web.HTTPRequestEntityTooLarge:
        response = HttpError(
            413, "too_large", f"request body over {BODY_BYTES_MAX} bytes"
        ).response()
    except web.HTTPException as http_error:
        code = {404: "not_found", 405: "method_not_allowed"}.get(http_error.status, "http_error")
        message = (
            http_error.reason
            if http_error.status != 404
            else f"no route {request.method} {request.path}"
        )
        # RFC 9110: a 405 says which methods the route has.
        allow = {k: v for k, v in http_error.headers.items() if k.lower() == "allow"}
        response = HttpError(http_error.status, code, message, headers=allow).response()
    except Exception:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        response = HttpError(
            500, "internal", "internal error; the node log has the details"
        ).response()
    if svc.trail is not None and (
        getattr(handler, "grant", None) in AUDITED_ACTIONS or getattr(handler, "audited", False)
    ):
        caller = request.get(CALLER)
        svc.trail.record(
            name=None if caller is None else caller.name,
            role=None if caller is None else caller.role,
            remote=request.remote,
            method=request.method,
            path=request.path_qs,
            status=response.status,
            request_id=request.headers.get("X-Request-Id"),
        )
    response.headers["X-Raftcron-Node"] = svc.config.node_id
    if (leader := leader_url(svc)) is not None:
        response.headers["X-Raftcron-Leader"] = leader
    response.headers["X-Raftcron-Applied-Index"] = str(svc.node.applied_index)
    key = f"{request.method} {response.status}"
    svc.stats.http_requests[key] = svc.stats.http_requests.get(key, 0) + 1
    return response


def build_app(svc: Services) -> web.Application:
    app = web.Application(middlewares=[api_middleware], client_max_size=BODY_BYTES_MAX)
    app[SERVICES] = svc
    app.add_routes(
        jobs.routes() + schedules.routes() + claims.routes() + ops.routes() + backup.routes()
        + flow.routes() + dashboard.routes() + notifications.routes() + members.routes()
        + settings.routes() + archive.routes() + activity.routes() + stamps.routes()
    )
    return app
