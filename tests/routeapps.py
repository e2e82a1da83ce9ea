"""What in-process route tests share: an aiohttp app answering as a node does with the routes
under test, without the node's whole middleware."""

from __future__ import annotations

from aiohttp import web

from raftcron.cluster.http.common import HttpError, RouteHandler


@web.middleware
async def errors_as_answers(request: web.Request, handler: RouteHandler) -> web.StreamResponse:
    """What the node's middleware does with an HttpError (the rest of it is not needed here)."""
    try:
        return await handler(request)
    except HttpError as error:
        return error.response()
