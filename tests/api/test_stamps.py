"""The leader's time for a follower's claim (cluster/http/stamps.py), on an in-process server:
the leader's route answers its Tick or 503; a follower's `LeaderStamps` takes only a Tick that
names the leader it asked, sends the peer credential, and after a failure (a refusal, a
timeout, a wrong answer) claims unstamped for a second without asking, so a cut between the
members does not add a timeout to every claim."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from routeapps import errors_as_answers

from raftcron.cluster.clients.peerhttp import PeerDialer
from raftcron.cluster.http import stamps
from raftcron.cluster.http.common import SERVICES, RouteHandler
from raftcron.scheduler.commands import Tick

PEER = {"Authorization": "Bearer peer-credential"}


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def serve(handler: RouteHandler,
          test: Callable[[stamps.LeaderStamps, Clock, list[web.Request]], Awaitable[None]],
          *, stamp: Callable[[], Tick | None] | None = None, leads: bool = True,
          knows_leader: bool = True) -> None:
    """Run `test(follower, its clock, requests seen)` against a server answering the stamp
    route with `handler`, over a node whose ticker's stamp is `stamp`; the follower asks it as
    the leader "n1" (or knows no leader) with the peer credential."""
    seen: list[web.Request] = []

    async def recording(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        return await handler(request)

    async def main() -> None:
        app = web.Application(middlewares=[errors_as_answers])
        node = SimpleNamespace(is_leader=lambda: leads)
        app[SERVICES] = SimpleNamespace(stamp=stamp, node=node)  # type: ignore[misc]
        app.router.add_post(stamps.PATH, recording)
        server = TestServer(app)
        await server.start_server()
        address = f"{server.host}:{server.port}"
        clock = Clock()
        follower = stamps.LeaderStamps(
            PeerDialer("http", None, PEER),
            (lambda: ("n1", address)) if knows_leader else (lambda: None), clock=clock)
        try:
            await test(follower, clock, seen)
        finally:
            await follower.close()
            await server.close()

    asyncio.run(main())


async def refused_once(follower: stamps.LeaderStamps, clock: Clock, seen: list[Any]) -> None:
    assert await follower.ask() is None
    assert follower.outcomes == {"failed": 1} and len(seen) == 1


def test_the_leader_answers_its_tick_and_a_node_without_one_refuses() -> None:
    async def stamped(follower: stamps.LeaderStamps, clock: Clock, seen: list[Any]) -> None:
        assert await follower.ask() == Tick(1_700_000_000_123, "n1")
        assert follower.outcomes == {"stamped": 1}
        assert seen[-1].headers["Authorization"] == PEER["Authorization"]

    serve(stamps.post_stamp, stamped, stamp=lambda: Tick(1_700_000_000_123, "n1"))
    serve(stamps.post_stamp, refused_once, stamp=lambda: None)  # a leader not yet ticking: 503
    # A node that no longer leads answers 421 and builds no Tick from its own clock.
    serve(stamps.post_stamp, refused_once, stamp=lambda: Tick(5, "n1"), leads=False)


@pytest.mark.parametrize("answer", [
    {"now_ms": 5, "leader": "n3"},  # another leader than the one asked: not its time
    {"now_ms": 5},  # no leader named: the state would apply it whoever leads
    {"now_ms": -1, "leader": "n1"},
    ["not", "an", "object"],
])
def test_a_follower_takes_only_a_tick_naming_the_leader_it_asked(answer: Any) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(answer)

    serve(handler, refused_once)


def test_after_a_failure_a_follower_claims_unstamped_for_a_second_without_asking(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stamps, "ASK_TIMEOUT_S", 0.05)
    state: dict[str, asyncio.Event] = {}  # made inside the server's loop

    async def handler(request: web.Request) -> web.StreamResponse:
        if not state["answering"].is_set():
            await state["answering"].wait()  # a leader that does not answer in time
        return web.json_response({"now_ms": 7, "leader": "n1"})

    async def test(follower: stamps.LeaderStamps, clock: Clock, seen: list[Any]) -> None:
        state["answering"] = asyncio.Event()
        assert await follower.ask() is None  # timed out
        state["answering"].set()
        clock.now_s += stamps.QUIET_AFTER_FAILURE_S - 0.01
        assert await follower.ask() is None  # quiet: not asked
        assert follower.outcomes == {"failed": 1, "skipped": 1} and len(seen) == 1
        clock.now_s += 0.02
        assert await follower.ask() == Tick(7, "n1")
        assert follower.outcomes == {"failed": 1, "skipped": 1, "stamped": 1}

    serve(handler, test)


def test_a_follower_that_knows_no_leader_does_not_ask() -> None:
    async def test(follower: stamps.LeaderStamps, clock: Clock, seen: list[Any]) -> None:
        assert await follower.ask() is None
        assert follower.outcomes == {"skipped": 1} and not seen

    serve(stamps.post_stamp, test, stamp=lambda: Tick(1, "n1"), knows_leader=False)
