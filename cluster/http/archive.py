"""`GET /v1/cluster/archive/rows`: this member's archived rows by archive number, for a peer
filling its archive (cluster/archive/fill.py; DESIGN.md §9.2).

The answer covers [from_seq, to_seq) only as far as this member can vouch for: `to_seq` in the
answer is where it stops (before a gap of its own, past what it has written, or after 2,000
rows / 4 MB), so a peer never takes a missing row for one that retention dropped.
"""

from __future__ import annotations

from aiohttp import web

from raftcron.cluster.http import bounds
from raftcron.cluster.http.common import HttpError, json_response, query_int, requires, services


@requires("archive")
async def get_rows(request: web.Request) -> web.Response:
    archive = services(request).node.archive
    if archive is None:
        raise HttpError(404, "not_found", "this node keeps no archive ([storage] archive = "
                        "false)")
    lo = query_int(request, "from_seq", default=None, low=1, high=bounds.CURSOR_MAX)
    hi = query_int(request, "to_seq", default=None, low=1, high=bounds.CURSOR_MAX)
    if lo is None:
        raise HttpError(400, "invalid", "from_seq is required", "from_seq")
    if hi is None or hi < lo:
        raise HttpError(400, "invalid", "to_seq is required, at least from_seq", "to_seq")
    rows, to = await archive.rows_by_seq(lo, hi)
    return json_response({"rows": [row.to_wire() for row in rows], "to_seq": to,
                          "node": services(request).config.node_id})


def routes() -> list[web.RouteDef]:
    return [web.get("/v1/cluster/archive/rows", get_rows)]
