"""`GET /v1/activity`: this node's recent activity, the samples the dashboard's charts draw
(cluster/ops/activity.py says what a sample holds and how it is measured).

`since_ms` (wall clock, Unix ms) answers only the samples taken after it, so a page polling
every second asks for what is new; `started_ms` changes when the node restarts (its ring starts
again), which tells the page to drop what it drew. A node that keeps no ring (none was given
to its services) answers no samples.
"""

from __future__ import annotations

from aiohttp import web

from raftcron.cluster.http import bounds
from raftcron.cluster.http.common import json_response, query_int, services
from raftcron.cluster.ops import activity


async def get_activity(request: web.Request) -> web.Response:
    since_ms = query_int(request, "since_ms", default=0, low=0, high=bounds.CURSOR_MAX) or 0
    svc = services(request)
    ring = svc.activity
    return json_response({
        "node": svc.config.node_id,
        "sample_ms": round(activity.SAMPLE_S * 1000),
        "kept_ms": activity.KEPT_S * 1000,
        "queues_per_sample_max": activity.QUEUES_PER_SAMPLE_MAX,
        "started_ms": None if ring is None else ring.started_ms,
        "samples": [] if ring is None else ring.since(since_ms),
    })


def routes() -> list[web.RouteDef]:
    return [web.get("/v1/activity", get_activity)]
