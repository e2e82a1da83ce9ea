"""The leader's time for a claim made through a follower (DESIGN.md §9.4).

A claim on a queue with a rate window is applied with a Tick of the leader's time in the same
log entry, so its starts are stamped with when they happen rather than with the last Tick's
time (up to a tick interval earlier). The leader builds that Tick itself (`Ticker.stamp`); a
follower cannot, as only the leader's clock moves the state's time. So a follower asks the
leader: `POST /v1/cluster/stamp` (the nodes' own "peer" credential) answers the Tick the
leader would put before a claim of its own, and the follower proposes that Tick and the claim
as one entry.

Why this keeps replicated time honest: the Tick names the leader, and the state applies a Tick
only from the leader of the last committed BeginLeadership (scheduler/commands.py `Tick`), so a
stamp from a deposed leader moves nothing. A stamp that reaches the log late only carries an
earlier time, never a later one than the leader decided: time stays within what the majority's
clocks allowed (cluster/clock/ticker.py `decide`).

A follower that cannot get a stamp (no leader known, the leader too slow, an older release
without this route) claims unstamped, as before, and does not ask again for a second, so a cut
between the members does not add a timeout to every claim.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from raftcron.cluster.clients.peerhttp import PeerDialer
from raftcron.cluster.http.common import HttpError, json_response, requires, services
from raftcron.scheduler.commands import Tick
from raftcron.scheduler.errors import Invalid

log = logging.getLogger("raftcron.stamps")
PATH = "/v1/cluster/stamp"
ASK_TIMEOUT_S = 0.5  # a healthy leader answers in milliseconds; past this, claim unstamped
QUIET_AFTER_FAILURE_S = 1.0  # after a failed ask, claims go unstamped this long


@requires("stamp")
async def post_stamp(request: web.Request) -> web.Response:
    svc = services(request)
    if not svc.node.is_leader():  # the wrong node to ask, not a failing one
        raise HttpError(421, "not_leader", "this node does not lead: ask the leader "
                        "(X-Raftcron-Leader names it)")
    tick = None if svc.stamp is None else svc.stamp()
    if tick is None:
        raise HttpError(503, "unavailable", "this node leads, but not yet a committed term "
                        "with an agreed time", headers={"Retry-After": "1"})
    return json_response(tick.to_wire())


class LeaderStamps:
    """A follower's way to the leader's stamp: one kept connection pool, a short timeout, and a
    quiet second after a failure."""

    def __init__(self, dialer: PeerDialer, leader: Callable[[], tuple[str, str] | None],
                 *, outcomes: dict[str, int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._dialer = dialer
        self._leader = leader  # (node id, HTTP address) of the leader this node knows
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._quiet_until = 0.0
        # Claims by outcome (raftcron_claim_stamps_total): "stamped"; "failed", asked and no
        # Tick came back; "skipped", not asked (no leader known, or the quiet second).
        self.outcomes = {} if outcomes is None else outcomes

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    async def ask(self) -> Tick | None:
        """The leader's Tick, or None (claim unstamped)."""
        leader = self._leader()
        if leader is None or self._clock() < self._quiet_until:
            self._count("skipped")
            return None
        node_id, address = leader
        try:
            tick = await self._ask(address)
        except (aiohttp.ClientError, TimeoutError, ValueError, Invalid) as error:
            tick = None
            log.debug("no stamp from %s: %s", node_id, error)
        if tick is None or tick.leader != node_id:
            # No answer, a refusal, or an answer for another leader than the one asked.
            self._count("failed")
            self._quiet_until = self._clock() + QUIET_AFTER_FAILURE_S
            return None
        self._count("stamped")
        return tick

    async def _ask(self, address: str) -> Tick | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT_S),
                headers=self._dialer.headers,
            )
        url = self._dialer.url(address, PATH)
        async with self._session.post(url, ssl=self._dialer.ssl) as answer:
            if answer.status != 200:
                return None
            body = await answer.json()
        if not isinstance(body, dict):
            return None
        return Tick.from_wire(body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def routes() -> list[web.RouteDef]:
    return [web.post(PATH, post_stamp)]
