"""`GET /readyz` says ready only when a write could be accepted: a leader is known, this node
has caught up, it is a member, its storage writes, and the cluster's clock has started (before
the first Tick every write is refused 503 not_ready, so a node that said ready then sent
clients and harnesses into refusals)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from raftcron.cluster.consensus.replica import StateMachine
from raftcron.cluster.http.common import SERVICES
from raftcron.cluster.http.ops import readyz
from raftcron.scheduler.commands import Tick
from raftcron.scheduler.state import SchedulerState


def fake_node(state: SchedulerState, *, leader: str | None = "n1",
              write_error: str | None = None, voter: bool = True) -> Any:
    machine = StateMachine()
    machine.state = state
    return SimpleNamespace(
        leader_id=lambda: leader,
        sync=SimpleNamespace(isReady=lambda: True),
        storage=SimpleNamespace(problem=write_error),
        applied_index=7,
        config=SimpleNamespace(node_id="n1"),
        machine=machine,
        is_voter=lambda: voter,
    )


def ask(node: Any) -> tuple[int, dict[str, Any]]:
    app = web.Application()
    app[SERVICES] = SimpleNamespace(node=node)
    response = asyncio.run(readyz(make_mocked_request("GET", "/readyz", app=app)))
    assert isinstance(response, web.Response) and response.text is not None
    return response.status, json.loads(response.text)


def test_a_node_is_not_ready_before_the_cluster_s_clock_started() -> None:
    state = SchedulerState()
    status, body = ask(fake_node(state))
    assert (status, body["ready"], body["clock"]) == (503, False, "not started")
    state.apply(Tick(1_800_000_000_000))
    status, body = ask(fake_node(state))
    assert (status, body["ready"], body["clock"]) == (200, True, "started")


@pytest.mark.parametrize(("leader", "write_error"), [(None, None), ("n1", "disk full")])
def test_no_leader_or_a_storage_that_cannot_write_is_not_ready(
        leader: str | None, write_error: str | None) -> None:
    state = SchedulerState()
    state.apply(Tick(1_800_000_000_000))
    status, body = ask(fake_node(state, leader=leader, write_error=write_error))
    assert (status, body["ready"]) == (503, False)


def test_a_node_that_is_not_in_the_configuration_is_not_ready() -> None:
    """A joining node before it is added, a removed one after (DESIGN.md §8.4)."""
    state = SchedulerState()
    state.apply(Tick(1_800_000_000_000))
    status, body = ask(fake_node(state, voter=False))
    assert (status, body["ready"], body["member"]) == (503, False, False)
