"""What every route shares: the node's services, JSON in and out, errors, auth and roles.

Errors always have the shape `{"error": {"code", "message", "field"?}}`. Status codes: 400 bad
input (the field named), 401/403 auth, 404, 409 conflict or stale token, 413 too large, 503 no
leader or commit timeout (with Retry-After: the request may be retried, with the same
request_id if it was a write), 507 the state is full (`state_full`, with the budget's figures
in the body and Retry-After: finishing work makes room; DESIGN.md §9.1).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from raftcron.cluster.clients.peerhttp import PeerDialer, peer_token
from raftcron.cluster.config import NodeConfig
from raftcron.cluster.consensus.proposer import ProposalFailed, Proposer, TooLarge
from raftcron.cluster.consensus.replica import RaftNode
from raftcron.cluster.http import bounds
from raftcron.cluster.http.bounds import BODY_BYTES_MAX, BODY_READ_S
from raftcron.cluster.ops.activity import ActivityRing
from raftcron.cluster.telemetry import tracing
from raftcron.scheduler import parse
from raftcron.scheduler.commands import Barrier, Command, Tick
from raftcron.scheduler.errors import Invalid, Ok, Rejected, Result

# An aiohttp route's handler (a task's handler is cluster.worker.tasks.Handler).
RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# role -> what it may do. "read" = every GET; the rest are named per route. "status" is the
# cluster view (GET /v1/cluster), the one thing nodes ask each other over HTTP: the "peer"
# role is the nodes' own credential (cluster/clients/peerhttp.py's peer_token, from the cluster
# password), never a user's token, and may do nothing else but copy archived rows ("archive": a
# member filling its archive from a peer, cluster/archive/fill.py) and ask the leader for its time
# ("stamp": a follower's claim on a rate-window queue, cluster/http/stamps.py).
PEER_ROLE = "peer"
ROLE_GRANTS: dict[str, frozenset[str]] = {
    "admin": frozenset({"read", "status", "submit", "work", "manage", "audit", "archive",
                        "stamp"}),
    "submit": frozenset({"read", "status", "submit"}),
    "worker": frozenset({"read", "status", "work"}),
    "read": frozenset({"read", "status"}),
    PEER_ROLE: frozenset({"status", "archive", "stamp"}),
}


@dataclass(frozen=True)
class Caller:
    """Who made a request: the token's name and role (None, None when auth is off)."""

    name: str | None
    role: str | None


CALLER: web.RequestKey[Caller] = web.RequestKey("caller", Caller)


@dataclass
class Services:
    config: NodeConfig
    node: RaftNode
    proposer: Proposer
    claims: Any  # cluster.consensus.waiters.ClaimWaiters
    stats: Any  # cluster.ops.metrics.NodeStats
    trail: Any = None  # cluster.http.trail.AuditTrail (None: nothing is recorded)
    dialer: PeerDialer | None = None  # how this node asks its peers (None: it never does)
    activity: ActivityRing | None = None  # the dashboard charts' samples (None: none kept)
    # The leader's Tick to stamp a command with (cluster/clock/ticker.py `Ticker.stamp`).
    stamp: Callable[[], Tick | None] | None = None
    # On a follower, the leader's Tick for the same purpose (cluster/http/stamps.py); None:
    # a follower's claims go unstamped.
    leader_stamp: Callable[[], Awaitable[Tick | None]] | None = None
    # Set when the node stops: a request that waits for something else answers at once.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)


SERVICES: web.AppKey[Services] = web.AppKey("services", Services)


def leader_url(svc: Services) -> str | None:
    """The leader's API URL as this node knows it (None: no leader known)."""
    leader = svc.node.leader_id()
    if leader is None:
        return None
    scheme = "https" if svc.config.api.tls else "http"
    for member in svc.config.members:
        if member.node_id == leader:
            return f"{scheme}://{member.http_address}"
    return None


def services(request: web.Request) -> Services:
    return request.app[SERVICES]


class HttpError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}
        self.details = details or {}  # more fields of the error body (state_full's figures)

    def response(self) -> web.Response:
        error: dict[str, Any] = {"code": self.code, "message": self.message, **self.details}
        if self.field is not None:
            error["field"] = self.field
        return json_response({"error": error}, status=self.status, headers=self.headers)


def json_response(
    body: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS),
        status=status,
        content_type="application/json",
        charset="utf-8",
        headers=headers,
    )


async def read_json(request: web.Request) -> Any:
    if request.content_length is not None and request.content_length > BODY_BYTES_MAX:
        raise HttpError(413, "too_large", f"request body over {BODY_BYTES_MAX} bytes")
    try:
        async with asyncio.timeout(BODY_READ_S):  # a body trickled in forever holds a slot
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise HttpError(413, "too_large", f"request body over {BODY_BYTES_MAX} bytes") from None
    except TimeoutError:
        raise HttpError(408, "timeout", f"request body not received within {BODY_READ_S} s",
                       "body") from None
    if not raw:
        raise HttpError(400, "invalid", "a JSON body is required", "body")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise HttpError(400, "invalid", f"body is not JSON: {error}", "body") from None
    except RecursionError:
        raise HttpError(400, "invalid", "body is nested too deeply", "body") from None


def object_body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise HttpError(400, "invalid", "body must be a JSON object", "body")
    return body


def take_request_id(body: dict[str, Any], request: web.Request) -> str:
    """The client's request_id (body or X-Request-Id), else a fresh one for our own retries."""
    value = body.pop("request_id", None)
    if value is None:
        value = request.headers.get("X-Request-Id")
    if value is None:
        return uuid.uuid4().hex
    text: str = parse_or_400(
        lambda: parse.text(value, "request_id", chars_max=bounds.REQUEST_ID_CHARS_MAX)
    )
    if not text.isprintable():
        raise HttpError(400, "invalid", "must hold printable characters only", "request_id")
    return text


def only(body: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """Refuse fields a route does not know: a typo must not be silently ignored."""
    unknown = sorted(set(body) - known)
    if unknown:
        names = ", ".join(sorted(known))
        raise HttpError(400, "invalid", f"unknown field (known: {names})", unknown[0])
    return body


def invalid(error: Invalid) -> HttpError:
    status = 413 if error.code == "too_large" else 400
    return HttpError(status, error.code, f"{error.field}: {error.message}", error.field)


# Retry-After by status: 503 (no leader, busy) soon; 507 (the state is full) after a while,
# as finishing work and eviction make room (clients do not retry 507 by themselves).
RETRY_AFTER_S = {503: "1", 507: "5"}


def rejected(result: Rejected) -> HttpError:
    retry_s = RETRY_AFTER_S.get(result.http_status)
    retry = None if retry_s is None else {"Retry-After": retry_s}
    return HttpError(result.http_status, result.code, result.message, result.field,
                     headers=retry, details=result.details)


def parse_or_400(parser: Callable[[], Any]) -> Any:
    try:
        return parser()
    except Invalid as error:
        raise invalid(error) from None


async def commit(request: web.Request, command: Command) -> dict[str, Any]:
    """Propose a command through Raft; the Ok value, or the matching HttpError."""
    result = await commit_result(request, command)
    if isinstance(result, Rejected):
        raise rejected(result)
    assert isinstance(result, Ok)
    return result.value


async def commit_result(request: web.Request, command: Command) -> Result:
    svc = services(request)
    try:
        with tracing.span("commit") as span:  # the Raft proposal, within the request's span
            result = await svc.proposer.submit(command)
            if span is not None:
                span.set_attributes({"raftcron.command": type(command).__name__,
                                     "raftcron.rejected": getattr(result, "code", "")})
        if isinstance(result, Rejected) and result.code == "state_full":
            refusals = svc.stats.refusals
            refusals[result.code] = refusals.get(result.code, 0) + 1
        return result
    except TooLarge as error:
        raise HttpError(413, "too_large", str(error)) from None
    except ProposalFailed as error:
        raise unavailable(str(error), indeterminate=error.indeterminate) from None


def unavailable(message: str, *, indeterminate: bool = False) -> HttpError:
    hint = " (it may still be applied: retry with the same request_id)" if indeterminate else ""
    return HttpError(503, "unavailable", message + hint, headers={"Retry-After": "1"})


async def maybe_consistent(request: web.Request) -> None:
    """`?consistent=1`: a no-op through the log first, so the read sees every earlier write."""
    if request.query.get("consistent") in ("1", "true"):
        await commit(request, Barrier(uuid.uuid4().hex))


def query_int(
    request: web.Request, name: str, *, default: int | None, low: int, high: int
) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HttpError(400, "invalid", f"must be an integer, not {raw!r}", name) from None
    if not low <= value <= high:
        raise HttpError(400, "invalid", f"must be between {low} and {high}", name)
    return value


def query_flag(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "")
    if raw not in ("", "0", "1", "true", "false"):
        raise HttpError(400, "invalid", f"must be 0, 1, true or false, not {raw!r}", name)
    return raw in ("1", "true")


def path_int(request: web.Request, name: str) -> int:
    raw = request.match_info[name]
    digits_ok = raw.isascii() and raw.isdigit() and len(raw) <= bounds.PATH_ID_DIGITS_MAX
    if not digits_ok or int(raw) < 1:
        raise HttpError(400, "invalid", f"{name} must be a positive integer, not {raw!r}", name)
    return int(raw)


def named_control(
    command_type: Any,
    name_of: Callable[[web.Request], str],
    view_of: Callable[[web.Request, str], dict[str, Any]],
) -> RouteHandler:
    """`POST .../{name}/<verb>` of an admin control (pause, resume a schedule or a queue): an
    optional body of request_id only, the command parsed by its own `from_wire`, the named
    thing's view as the answer."""

    @requires("manage")
    async def handler(request: web.Request) -> web.Response:
        name = name_of(request)
        body = object_body(await read_json(request)) if request.can_read_body else {}
        request_id = take_request_id(only(body, {"request_id"}), request)
        command = parse_or_400(
            lambda: command_type.from_wire({"name": name, "request_id": request_id})
        )
        await commit(request, command)
        return json_response(view_of(request, name))

    return handler


def requires(grant: str, *, audited: bool = False) -> Callable[[RouteHandler], RouteHandler]:
    """Mark a route with the grant its token needs (routes without a mark need "read");
    ``audited``: recorded in the audit trail although its grant is not an admin one."""

    def mark(handler: RouteHandler) -> RouteHandler:
        handler.grant = grant  # type: ignore[attr-defined]
        handler.audited = audited  # type: ignore[attr-defined]
        return handler

    return mark


# -- authentication ------------------------------------------------------------------------


def check_token(config: NodeConfig, request: web.Request, grant: str) -> Caller:
    caller = identify(config, request)
    request[CALLER] = caller
    authorize(caller, grant)
    return caller


def identify(config: NodeConfig, request: web.Request) -> Caller:
    """Who the bearer token says the caller is; 401 without a known token (auth on)."""
    if not config.tokens:
        return Caller(None, None)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise HttpError(
            401,
            "unauthorized",
            "an 'Authorization: Bearer <token>' header is required",
            headers={"WWW-Authenticate": "Bearer"},
        )
    given = token.strip().encode()
    caller = None
    for known, known_role in config.tokens.items():
        if secrets.compare_digest(known.encode(), given):
            caller = Caller(config.token_names.get(known), known_role)
    peer = peer_token(config.cluster_password)
    if peer is not None and secrets.compare_digest(peer.encode(), given):
        caller = Caller(PEER_ROLE, PEER_ROLE)
    if caller is None:
        raise HttpError(
            401,
            "unauthorized",
            "the token is not known to this node",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return caller


def authorize(caller: Caller, grant: str) -> None:
    """403 unless the caller's role has the grant (no role: auth is off, all may)."""
    if caller.role is not None and grant not in ROLE_GRANTS[caller.role]:
        raise HttpError(
            403, "forbidden",
            f"role {caller.role!r} may not {grant} (needs a token with that grant)"
        )
