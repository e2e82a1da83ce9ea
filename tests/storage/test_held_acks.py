"""A follower's held acks (cluster/storage/hooks.py): released in order once their entries are
durable, a success that a later released one covers left out, and nothing else dropped."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raftcron.cluster.storage import hooks

LEADER, OTHER = object(), object()


def ack(next_idx: int, *, success: bool = True, reset: bool = False,
        node: object = LEADER) -> dict[str, Any]:
    return {"node": node, "reset": reset, "nextNodeIdx": next_idx, "success": success}


def release(held: list[dict[str, Any]], durable: int,
            monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(hooks, "library_send", lambda _self, **message: sent.append(message))
    node = SimpleNamespace(_raftcron_held_acks=held)
    hooks._release_acks(node, SimpleNamespace(log=SimpleNamespace(durable_through=durable)))
    return sent


def test_a_run_of_durable_successes_goes_out_as_its_last(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = [ack(11), ack(12), ack(14), ack(17)]
    assert release(held, 15, monkeypatch) == [ack(14)]
    assert held == [ack(17)]  # its entries are not durable yet: still held, in order


def test_failures_resets_and_another_node_break_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    held = [ack(5), ack(6), ack(4, success=False, reset=True), ack(7), ack(8, node=OTHER),
            ack(9), ack(3, success=False), ack(10)]
    assert release(held, 10, monkeypatch) == [
        ack(6), ack(4, success=False, reset=True), ack(7), ack(8, node=OTHER), ack(9),
        ack(3, success=False), ack(10)]
    assert held == []


def test_nothing_durable_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    held = [ack(8), ack(9)]
    assert release(held, 6, monkeypatch) == []
    assert held == [ack(8), ack(9)]
