"""The bench's handle on a cluster: its nodes' URLs, one HTTP session, the leader a node named.

What it owns: sending one request to the cluster the way raftcron's own client does (to the
leader a node named, else round the nodes; 503s and refused connections move on, a bounded
number of times), with orjson both ways. The measures, the workers and the soak share it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from raftcron.cluster.clients.asyncclient import LEADER_HEADER
from raftcron.cluster.dev.localcluster import LocalCluster

JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass
class BenchTarget:
    urls: list[str]
    token: str | None = None
    cluster: LocalCluster | None = None  # set when the bench started the cluster itself
    quiet: bool = False
    session: aiohttp.ClientSession = field(init=False)
    _turn: itertools.cycle[str] = field(init=False)
    _leader: str | None = field(init=False, default=None)  # once a node named the leader

    async def open(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        connector = aiohttp.TCPConnector(limit=256)
        self.session = aiohttp.ClientSession(
            headers=headers, connector=connector, timeout=aiohttp.ClientTimeout(total=30)
        )
        self._turn = itertools.cycle(self.urls)

    async def close(self) -> None:
        await self.session.close()

    def next_url(self) -> str:
        # As raftcron's own client does: to the leader a node named, else round the nodes.
        return self._leader if self._leader is not None else next(self._turn)

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        url: str | None = None,
        attempts: int = 20,
    ) -> tuple[int, Any]:
        """One request; 503s and refused connections move on to the next node (bounded)."""

        async def once(attempt: int) -> tuple[int, Any]:
            base = url if url is not None and attempt == 0 else self.next_url()
            try:
                # orjson both ways: the load generator shares the cluster's cores, and the
                # stdlib's json of a 1,000-job batch and its answer cost it 8 us per job.
                data = None if body is None else orjson.dumps(body)
                async with self.session.request(method, base + path, data=data,
                                                headers=JSON_HEADERS) as answer:
                    leader = (answer.headers.get(LEADER_HEADER) or "").rstrip("/")
                    self._leader = leader if leader in self.urls else None
                    return answer.status, orjson.loads(await answer.read())
            except (aiohttp.ClientError, TimeoutError) as error:
                if self._leader == base:
                    self._leader = None
                return 0, str(error)

        return await retrying(once, attempts)

    async def leader_url(self) -> str:
        for _ in range(200):
            for url in self.urls:
                try:
                    async with self.session.get(url + "/v1/cluster") as answer:
                        view = await answer.json()
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    continue
                if view.get("role") == "leader":
                    return url
            await asyncio.sleep(0.05)
        raise RuntimeError("no leader found")


async def retrying(
    once: Callable[[int], Awaitable[tuple[int, Any]]], attempts: int = 20
) -> tuple[int, Any]:
    """`once(attempt)` until it answers other than 503 or 0 (no connection), with a short
    growing pause between attempts; the last answer if none did."""
    last: tuple[int, Any] = (0, None)
    for attempt in range(attempts):
        last = await once(attempt)
        if last[0] not in (0, 503):
            return last
        await asyncio.sleep(min(0.02 * (attempt + 1), 0.3))
    return last
