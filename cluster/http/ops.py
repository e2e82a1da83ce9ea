"""Operational routes: cluster status, health, readiness, metrics, events, the API document."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from raftcron.cluster.consensus.replica import AUDIT_PREFIX, RaftNode
from raftcron.cluster.http import bounds
from raftcron.cluster.http.common import (
    CALLER,
    PEER_ROLE,
    HttpError,
    commit,
    json_response,
    query_flag,
    query_int,
    requires,
    services,
)
from raftcron.cluster.http.members import membership_view
from raftcron.cluster.ops import metrics
from raftcron.scheduler import views
from raftcron.scheduler.commands import Barrier
from raftcron.scheduler.gate import RELEASE_LEVEL


def _version() -> str:
    try:
        return importlib.metadata.version("raftcron")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout without installing
        return "unknown"


VERSION = _version()


def _status(node: RaftNode) -> dict[str, Any]:
    # getStatus() walks PySyncObj's dicts without a lock; a concurrent change makes it raise.
    for _ in range(5):
        try:
            return node.status()
        except RuntimeError:
            continue
    return {}


def cluster_view(request: web.Request) -> dict[str, Any]:
    svc = services(request)
    node, config = svc.node, svc.config
    status = _status(node)
    clock = svc.stats.clock_view()
    offsets = {} if clock is None else clock.offsets_ms
    members = []
    membership = membership_view(node)  # the members now, not the config file's
    for peer in membership["members"]:
        me = peer["node_id"] == config.node_id
        connected = (
            None if me else status.get(f"partner_node_status_server_{peer['raft_address']}") == 2
        )
        members.append(
            {
                "node_id": peer["node_id"],
                "raft_address": peer["raft_address"],
                "http_address": peer["http_address"],
                "self": me,
                "reachable": True if me else connected,
                "match_index": None if me else status.get(
                    f"match_idx_server_{peer['raft_address']}"),
                "clock_offset_ms": offsets.get(peer["node_id"]),
                "state": peer["state"],
            }
        )
    summary = node.machine.read(views.summary)
    role = metrics.RAFT_ROLES.get(status.get("state", 0), "follower")
    return {
        "node": config.node_id,
        "cluster_name": config.cluster_name,
        "role": role,
        "leader": node.leader_id(),
        "term": node.term,
        "commit_index": node.commit_index,
        "applied_index": node.applied_index,
        "ready": bool(node.sync.isReady()),
        "has_quorum": bool(status.get("has_quorum", False)),
        "members": members,
        "membership_change": membership["change"],
        "state": summary,
        "version": VERSION,
        "release_level": RELEASE_LEVEL,
        "storage": node.storage.summary(time.time()),
        "clock": None
        if clock is None
        else {
            "skew_ms": clock.skew_ms,
            "skewed": clock.skewed,
            "max_skew_ms": clock.max_skew_ms,
            "majority_ms": clock.quorum_clock_ms,
        },
    }


@requires("status")
async def get_cluster(request: web.Request) -> web.Response:
    view = cluster_view(request)
    archive = services(request).node.archive
    # Off the event loop: the archive's figures are read from its file.
    view["archive"] = None if archive is None else await asyncio.to_thread(archive.summary)
    if query_flag(request, "members"):
        caller = request.get(CALLER)
        if caller is not None and caller.role == PEER_ROLE:
            raise HttpError(403, "forbidden", "role 'peer' may not ask the members (read)")
        await _ask_members(request, view)
    return json_response(view)


async def _ask_members(request: web.Request, view: dict[str, Any]) -> None:
    """Each member's own role, term and indexes, asked server-side (a browser cannot: CORS).

    A member that does not answer within a second is marked unreachable; nothing waits longer.
    """
    dialer = services(request).dialer
    if dialer is None:  # an app built without one (tests): no member can be asked
        raise HttpError(503, "unavailable", "this node cannot ask its members")

    async def ask(session: aiohttp.ClientSession, member: dict[str, Any]) -> None:
        own: dict[str, Any] | None
        if member["self"]:
            own = view
        else:
            url = dialer.url(member["http_address"], "/v1/cluster")
            try:
                async with session.get(url, ssl=dialer.ssl) as answer:
                    own = await answer.json() if answer.status == 200 else None
            except (aiohttp.ClientError, TimeoutError, ValueError):
                own = None
        member["reachable"] = own is not None
        for key in ("role", "term", "commit_index", "applied_index"):
            member[key] = None if own is None else own.get(key)

    timeout = aiohttp.ClientTimeout(total=1.0)
    async with aiohttp.ClientSession(timeout=timeout, headers=dialer.headers) as session:
        await asyncio.gather(*(ask(session, member) for member in view["members"]))


@requires("manage")
async def start_audit(request: web.Request) -> web.Response:
    """Put an audit checkpoint in the log: every replica digests its state at that entry.

    Compare `GET /v1/cluster/audits/{id}` across nodes: equal digests mean equal states at the
    same log position. The digest is O(state) on each node's Raft thread: for tests and audits.
    """
    audit_id = AUDIT_PREFIX + uuid.uuid4().hex
    await commit(request, Barrier(audit_id))
    return json_response(_audit_view(request, audit_id), status=201)


@requires("manage")
async def compact(request: web.Request) -> web.Response:
    """Write a full dump now (a forked child serializes it) and trim the journal behind it."""
    node = services(request).node
    node.sync.forceLogCompaction()
    return json_response({"node": node.config.node_id, "compaction": "started"}, status=202)


@requires("audit")
async def get_audit_trail(request: web.Request) -> web.Response:
    """This node's audit trail, newest first (cluster/http/trail.py says why per node)."""
    svc = services(request)
    limit = query_int(request, "limit", default=100, low=1, high=bounds.PAGE_MAX)
    before_seq = query_int(request, "before_seq", default=None, low=1, high=bounds.CURSOR_MAX)
    entries = [] if svc.trail is None else svc.trail.newest(limit or 100, before_seq)
    return json_response({"node": svc.config.node_id, "entries": entries})


async def get_audit(request: web.Request) -> web.Response:
    return json_response(_audit_view(request, request.match_info["id"]))


def _audit_view(request: web.Request, audit_id: str) -> dict[str, Any]:
    svc = services(request)
    found = svc.node.machine.audit(audit_id)
    if found is None:
        raise HttpError(
            404, "not_found", f"audit {audit_id!r} is not applied on this node (yet)", "id"
        )
    return {"id": audit_id, "node": svc.config.node_id, "index": found[0], "digest": found[1]}


async def healthz(request: web.Request) -> web.Response:
    # wall_ms: the peers read this node's clock here (cluster/clock/clockpoll.py); open, as the
    # Date header of every answer already is.
    return json_response(
        {
            "ok": True,
            "node": services(request).config.node_id,
            "wall_ms": time.time_ns() // 1_000_000,
            # What the upgrade gate asks (cluster/http/settings.py): the behaviour this
            # release can turn on (scheduler/gate.py).
            "release_level": RELEASE_LEVEL,
        }
    )


async def readyz(request: web.Request) -> web.Response:
    node = services(request).node
    leader = node.leader_id()
    storage_problem = node.storage.problem
    # Until the first Tick every write is refused not_ready: so is readiness. One attribute,
    # read without the apply lock: a health check must not wait out a long apply.
    clock_started = node.machine.clock_started
    member = node.is_voter()
    ready = (
        member
        and leader is not None
        and bool(node.sync.isReady())
        and storage_problem is None
        and clock_started
    )
    body = {
        "ready": ready,
        "node": node.config.node_id,
        "leader": leader,
        "applied_index": node.applied_index,
        "storage": "ok" if storage_problem is None else storage_problem,
        "clock": "started" if clock_started else "not started",
        "member": member,
    }
    return json_response(body, status=200 if ready else 503)


async def get_metrics(request: web.Request) -> web.Response:
    svc = services(request)
    node = svc.node
    role = _status(node).get("state", 0)
    # Read before the apply lock is taken, off the event loop: the archive is on disk.
    archive = None if node.archive is None else await asyncio.to_thread(node.archive.summary)
    text = node.machine.read(
        lambda state: metrics.render(
            state,
            node_id=svc.config.node_id,
            role=role,
            term=node.term,
            commit_index=node.commit_index,
            applied_index=node.applied_index,
            stats=svc.stats,
            proposer=svc.proposer,
            storage=node.storage,
            archive=archive,
            claims_waiting=svc.claims.waiting,
        )
    )
    return web.Response(
        text=text,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


async def get_events(request: web.Request) -> web.Response:
    cursor = query_int(request, "cursor", default=0, low=0, high=bounds.CURSOR_MAX) or 0
    limit = query_int(request, "limit", default=100, low=1, high=bounds.PAGE_MAX) or 100
    tail = query_int(request, "tail", default=None, low=1, high=bounds.PAGE_MAX)
    page = services(request).node.machine.read(
        lambda state: views.events_page(state, cursor=cursor, limit=limit, tail=tail)
    )
    return json_response(page)


_OPENAPI = Path(__file__).with_name("openapi.json")


async def openapi(request: web.Request) -> web.Response:
    return web.Response(text=_OPENAPI.read_text(), content_type="application/json")


def openapi_document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(_OPENAPI.read_text())
    return loaded


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/cluster", get_cluster),
        web.post("/v1/cluster/audits", start_audit),
        web.get("/v1/cluster/audits/{id}", get_audit),
        web.get("/v1/audit", get_audit_trail),
        web.post("/v1/cluster/compact", compact),
        web.get("/v1/events", get_events),
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        web.get("/metrics", get_metrics),
        web.get("/openapi.json", openapi),
    ]
