"""Reading the other members' wall clocks, for cluster/clock/clocks.py's ClockBook.

Every `[clock] poll_ms` this node asks each other member's `GET /healthz` (the members now:
cluster/membership/directory.py, and the clock majority follows them; open, no token: it says
only that the node is up and what its clock reads; over HTTPS, with this node's certificate
when the cluster asks for one: cluster/clients/peerhttp.py) and records the peer's `wall_ms` at the
midpoint of the round trip, measured on this node's monotonic clock. A peer that does not answer
within a second is simply not sampled; its old sample ages out (cluster/clock/clocks.py,
SAMPLE_FRESH_S). Nothing here decides anything: the ticker reads the book.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import aiohttp

from raftcron.cluster.clients.peerhttp import PeerDialer
from raftcron.cluster.clock.clocks import ClockBook
from raftcron.cluster.config import NodeConfig

log = logging.getLogger("raftcron.clock")
ANSWER_TIMEOUT_S = 1.0


class Reachable(Protocol):
    @property
    def node_id(self) -> str: ...
    @property
    def http_address(self) -> str: ...


class ClockPoller:
    def __init__(self, config: NodeConfig, book: ClockBook, dialer: PeerDialer,
                 members: Callable[[], Sequence[Reachable]] | None = None) -> None:
        self.config = config
        self.book = book
        self._dialer = dialer
        # Every member (this node included); by default the config file's.
        self.members = members or (lambda: config.members)
        # Each peer's release level as its last answer said (None: an answer without one, a
        # release before the upgrade gate); what a new cluster's first leader reads before it
        # finalizes the cluster (cluster/clock/ticker.py).
        self.releases: dict[str, int | None] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.config.peers:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="clock-poller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=ANSWER_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                members = self.members()
                self.book.set_members([member.node_id for member in members])
                await asyncio.gather(*(self._ask(session, peer.node_id, peer.http_address)
                                       for peer in members
                                       if peer.node_id != self.config.node_id))
                await asyncio.sleep(self.config.clock.poll_ms / 1000)

    async def _ask(self, session: aiohttp.ClientSession, node_id: str, address: str) -> None:
        sent_s = time.monotonic()
        try:
            url = self._dialer.url(address, "/healthz")
            async with session.get(url, ssl=self._dialer.ssl) as answer:
                body = await answer.json() if answer.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.debug("clock of %s not read: %s", node_id, error)
            return
        received_s = time.monotonic()
        wall_ms = body.get("wall_ms") if isinstance(body, dict) else None
        if body is None or body.get("node") != node_id or isinstance(wall_ms, bool) or \
                not isinstance(wall_ms, int):
            log.debug("clock of %s not read: unexpected answer %r", node_id, body)
            return
        self.book.observe(node_id, peer_wall_ms=wall_ms, sent_mono_s=sent_s,
                          received_mono_s=received_s)
        level = body.get("release_level")
        self.releases[node_id] = (
            level if isinstance(level, int) and not isinstance(level, bool) else None)
