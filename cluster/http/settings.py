"""The cluster's settings and its upgrade gate (DESIGN.md §9.0, §9.1).

`GET /v1/settings` shows every setting, whether they are in effect, and the state against its
budget. `PUT /v1/settings/{retention,budget,archive,search_attributes}` (admin, audited) replace
one section; they are never refused for space (a full cluster must be unblockable) and are refused
`not_finalized` before the gate opens. `POST /v1/cluster/finalize` (admin, audited) opens it:
every member is asked for its release (`GET /healthz`, `release_level`) and only when each one
answers with this release's level is one `Finalize` proposed, carrying this node's configured
settings (`[settings]`), which seed the cluster's once. A member that does not answer, or runs
an older release, is named in a 409 and nothing is proposed: a node that does not know the
command would answer "unknown tag" and its state would differ from the others'.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from raftcron.cluster.clients.peerhttp import PeerDialer
from raftcron.cluster.http.common import (
    HttpError,
    commit,
    json_response,
    maybe_consistent,
    object_body,
    only,
    parse_or_400,
    read_json,
    requires,
    services,
    take_request_id,
)
from raftcron.cluster.http.members import membership_view
from raftcron.scheduler import views
from raftcron.scheduler.gate import RELEASE_LEVEL, Finalize, PutSettings
from raftcron.scheduler.settings import SECTIONS, parse_section

ASK_TIMEOUT_S = 2.0


async def get_settings(request: web.Request) -> web.Response:
    await maybe_consistent(request)
    node = services(request).node
    view = node.machine.read(views.settings_view)
    return json_response({**view, "node": node.config.node_id,
                          "applied_index": node.applied_index})


@requires("manage")
async def put_settings(request: web.Request) -> web.Response:
    section = request.match_info["section"]
    if section not in SECTIONS:
        raise HttpError(404, "not_found",
                        f"no settings section {section!r} (sections: {', '.join(SECTIONS)})")
    body = await read_json(request)
    if isinstance(body, dict):
        request_id = take_request_id(body, request)
    else:
        request_id = take_request_id({}, request)
    value = parse_or_400(lambda: parse_section(section, body))
    await commit(request, PutSettings(request_id, section, value))
    return await get_settings(request)


async def members_releases(
    dialer: PeerDialer, members: list[dict[str, Any]], me: str
) -> dict[str, int | None]:
    """Each member's release level as its `/healthz` says (this node's own without asking);
    None for a member that did not answer in time or names no level (an older release)."""

    async def ask(session: aiohttp.ClientSession, member: dict[str, Any]) -> int | None:
        if member["node_id"] == me:
            return RELEASE_LEVEL
        try:
            url = dialer.url(member["http_address"], "/healthz")
            async with session.get(url, ssl=dialer.ssl) as answer:
                body = await answer.json() if answer.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        level = body.get("release_level") if isinstance(body, dict) else None
        return level if isinstance(level, int) and not isinstance(level, bool) else None

    timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        levels = await asyncio.gather(*(ask(session, m) for m in members))
    return {m["node_id"]: level for m, level in zip(members, levels, strict=True)}


@requires("manage")
async def finalize(request: web.Request) -> web.Response:
    svc = services(request)
    body = object_body(await read_json(request)) if request.can_read_body else {}
    request_id = take_request_id(only(body, {"request_id"}), request)
    if svc.node.machine.read(lambda state: state.finalized):
        # Nothing would change: answered without asking the members (one may be down).
        answer = await commit(request, Finalize(request_id, RELEASE_LEVEL, svc.config.settings))
        view = svc.node.machine.read(views.settings_view)
        return json_response({**answer, "members": [], "settings": view})
    if svc.dialer is None:
        raise HttpError(503, "unavailable", "this node cannot ask its members")
    members = membership_view(svc.node)["members"]
    releases = await members_releases(svc.dialer, members, svc.config.node_id)
    behind = {node: level for node, level in releases.items()
              if level is None or level < RELEASE_LEVEL}
    if behind:
        named = ", ".join(f"{node} ({_why(level)})" for node, level in sorted(behind.items()))
        raise HttpError(409, "members_not_ready",
                        f"every member must run this release (release level {RELEASE_LEVEL}) "
                        f"before the cluster is finalized; not yet: {named}",
                        details={"members": [{"node_id": n, "release_level": releases[n]}
                                             for n in sorted(releases)]})
    answer = await commit(request, Finalize(request_id, RELEASE_LEVEL, svc.config.settings))
    view = svc.node.machine.read(views.settings_view)
    return json_response({**answer, "members": [{"node_id": n, "release_level": releases[n]}
                                                for n in sorted(releases)],
                          "settings": view})


def _why(level: int | None) -> str:
    if level is None:
        return "did not answer, or runs a release before the gate"
    return f"release level {level}"


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/settings", get_settings),
        web.put("/v1/settings/{section}", put_settings),
        web.post("/v1/cluster/finalize", finalize),
    ]
