"""Membership routes (DESIGN.md §8.4): `GET /v1/cluster/members`, `POST /v1/cluster/members`,
`DELETE /v1/cluster/members/{node_id}`.

A change begins with a `BeginMemberChange` through the log (cluster/membership/book.py): a
second one while another is in progress is refused on every replica alike (409
`membership_change_in_progress`). The request then waits, up to `?wait_s=` (default 30 s, at
most `bounds.MEMBER_WAIT_S_MAX`), for the leader to drive the change to its end
(cluster/consensus/memberdriver.py): 201 (added) or 200 (removed) once its configuration entry is
committed; 409 `membership_change_aborted` when it was cancelled (a node that did not catch up
in time); 202 with the change still in progress when the wait ran out. DELETE of a node whose
addition is still catching up cancels that addition.

What it must not do: change who votes itself (only the leader's driver proposes configuration
entries), or answer a change as done before its entry is committed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from raftcron.cluster.consensus.proposer import ProposalFailed, TooLarge
from raftcron.cluster.consensus.replica import RaftNode
from raftcron.cluster.http import bounds
from raftcron.cluster.http.common import (
    HttpError,
    json_response,
    object_body,
    only,
    query_int,
    read_json,
    requires,
    services,
)
from raftcron.cluster.membership import book as member_book
from raftcron.cluster.membership import raftconfig
from raftcron.cluster.membership.book import Ended, Member, MemberCommand
from raftcron.scheduler.errors import Invalid, Ok, Rejected

POLL_S = 0.05
PROPOSE_DEADLINE_S = 15.0


def membership_view(node: RaftNode) -> dict[str, Any]:
    """The members, the change in progress and the last ones ended, as this node knows them."""
    book = node.machine.members
    voters = set(raftconfig.voters(node.sync))
    me = node.config.node_id
    members = [{**m.to_wire(), "self": m.node_id == me, "state": "voter"} for m in node.members()]
    change = book.change
    change_view = None
    if change is not None:
        address = change.member.raft_address
        in_force = (address in voters) == (change.action == "add")
        if change.action == "add":
            phase = "joining" if in_force else "catching_up"
            if not in_force:
                members.append({**change.member.to_wire(), "self": change.member.node_id == me,
                                "state": "catching_up"})
            else:
                members.append({**change.member.to_wire(), "self": change.member.node_id == me,
                                "state": "voter"})
        else:
            phase = "removed" if in_force else "removing"
            for member in members:
                if member["node_id"] == change.member.node_id:
                    member["state"] = "leaving"
        if change.cancel_reason:
            phase = "cancelling"
        change_view = {**change.to_wire(), "phase": phase,
                       "match_index": raftconfig.match_index(node.sync, address)
                       if node.is_leader() else None}
    members.sort(key=lambda m: m["node_id"])
    return {
        "node": me,
        "member": node.is_member(),
        "members": members,
        "change": change_view,
        "recent": [ended.to_wire() for ended in reversed(book.history)],
        "voters": sorted(node.raft_ids.get(a, a) for a in voters),
    }


@requires("status")
async def get_members(request: web.Request) -> web.Response:
    node = _member_node(request)
    return json_response(membership_view(node))


def _member_node(request: web.Request) -> RaftNode:
    """This node, if it is in the configuration; else 503 (a client moves on to another): a
    joining node does not know the cluster yet, a removed one no more."""
    node = services(request).node
    if not node.is_voter():
        raise HttpError(503, "not_a_member", f"{node.config.node_id} is not a member of the "
                        "cluster (joining, or removed): ask a member", headers={"Retry-After": "1"})
    return node


@requires("manage")
async def add_member(request: web.Request) -> web.Response:
    body = only(object_body(await read_json(request)),
                {"node_id", "raft_address", "http_address"})
    try:
        member = Member.from_wire(body, "body")
    except Invalid as error:
        field = error.field.removeprefix("body.")
        raise HttpError(400, "invalid", f"{field}: {error.message}", field) from None
    wait_s = _wait_s(request)
    node = _member_node(request)
    if not raftconfig.listens(node.sync):
        raise HttpError(409, "cannot_grow", f"{node.config.node_id} was started without peers, "
                        "so it binds no Raft port and no node could reach it: a cluster that "
                        "grows starts with peers (back up, restore into a new cluster)")
    begin = member_book.BeginMemberChange("add", member, node.members())
    result = await _commit(request, begin)
    if isinstance(result, Rejected):
        if result.code == "member_exists" and member in node.members():
            return json_response({"member": member.to_wire(), "change": None,
                                  "members": membership_view(node)})  # a retried request
        raise _refused(result)
    return await _answer(request, result.value["change"], wait_s, done_status=201,
                         failed=f"{member.node_id} was not added",
                         body={"member": member.to_wire()})


@requires("manage")
async def remove_member(request: web.Request) -> web.Response:
    node_id = request.match_info["node_id"]
    wait_s = _wait_s(request)
    node = _member_node(request)
    book = node.machine.members
    change = book.change
    if change is not None and change.action == "add" and change.member.node_id == node_id:
        # Still being added: cancel that (its entry is then never appended).
        cancel = member_book.CancelMemberChange(change.change_id, "cancelled (DELETE)")
        await _commit(request, cancel)
        ended = await _until_ended(request, change.change_id, wait_s)
        if ended is None:
            return json_response({"change": change.to_wire(), "members": membership_view(node)},
                                 status=202)
        if ended.outcome == "done":
            raise HttpError(409, "member_added", f"{node_id} was added before the cancel took "
                            "effect; DELETE it again to remove it")
        return json_response({"cancelled": True, "change": ended.to_wire(),
                              "members": membership_view(node)})
    known = {m.node_id: m for m in node.members()}
    if node_id not in known:
        last = next((e for e in reversed(book.history) if e.change.member.node_id == node_id),
                    None)
        if last is not None and last.change.action == "remove" and last.outcome == "done":
            return json_response({"change": last.to_wire(), "members": membership_view(node)})
        raise HttpError(404, "not_found", f"{node_id} is not a member", "node_id")
    begin = member_book.BeginMemberChange("remove", known[node_id], node.members())
    result = await _commit(request, begin)
    if isinstance(result, Rejected):
        raise _refused(result)
    return await _answer(request, result.value["change"], wait_s, done_status=200,
                         failed=f"{node_id} was not removed")


async def _answer(request: web.Request, started: dict[str, Any], wait_s: int, *,
                  done_status: int, failed: str,
                  body: dict[str, Any] | None = None) -> web.Response:
    """The answer to a change that began: once it ended (done, or 409 aborted naming why), or
    202 with the change still going on when the wait ran out."""
    node = services(request).node
    ended = await _until_ended(request, started["change_id"], wait_s)
    if ended is None:
        return json_response({"change": started, "members": membership_view(node)}, status=202)
    if ended.outcome != "done":
        raise HttpError(409, "membership_change_aborted", f"{failed}: {ended.reason}")
    return json_response({**(body or {}), "change": ended.to_wire(),
                          "members": membership_view(node)}, status=done_status)


def _wait_s(request: web.Request) -> int:
    wait = query_int(request, "wait_s", default=bounds.MEMBER_WAIT_S_DEFAULT, low=0,
                     high=bounds.MEMBER_WAIT_S_MAX)
    return bounds.MEMBER_WAIT_S_DEFAULT if wait is None else wait


async def _commit(request: web.Request, command: MemberCommand) -> Ok | Rejected:
    """Through the log, retried until a deadline: each command is idempotent by content (a
    repeated Begin answers the change it started, a repeated Cancel the cancelled change)."""
    proposer = services(request).proposer
    frame = member_book.encode(command)
    deadline = time.monotonic() + PROPOSE_DEADLINE_S
    delay_s = 0.05
    while True:
        try:
            return await proposer.propose_frame(frame)
        except TooLarge as error:
            raise HttpError(413, "too_large", str(error)) from None
        except ProposalFailed as error:
            if error.reason == "not_member" or time.monotonic() + delay_s >= deadline:
                raise HttpError(503, "unavailable", f"{error}; the change may have begun: "
                                "GET /v1/cluster/members says", headers={"Retry-After": "1"}
                                ) from None
        await asyncio.sleep(delay_s)
        delay_s = min(2 * delay_s, 0.5)


async def _until_ended(request: web.Request, change_id: int, wait_s: float) -> Ended | None:
    """The change once it ended here; None when the wait ran out, the node stops, or it left
    the configuration (a node removing itself hears no more of the log: ask a member)."""
    svc = services(request)
    node = svc.node
    deadline = time.monotonic() + wait_s
    while True:
        ended = node.machine.members.ended(change_id)
        if ended is not None or time.monotonic() >= deadline or svc.stopping.is_set() or \
                not node.is_voter():
            return ended
        await asyncio.sleep(POLL_S)


def _refused(result: Rejected) -> HttpError:
    status = member_book.STATUS_BY_CODE.get(result.code, 409)
    return HttpError(status, result.code, result.message, result.field)


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/cluster/members", get_members),
        web.post("/v1/cluster/members", add_member),
        web.delete("/v1/cluster/members/{node_id}", remove_member),
    ]
