"""A leader hands leadership over (cluster/storage/hooks.py `_hand_over`): while it is being
removed, as asked (info); when its disk stalls, which nobody asked for, as a warning, so the
log at its default level says why a leader changed (a soak at 7,000 jobs/s saw one change of
leader with no fault injected, and its nodes logged at warning)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from raftcron.cluster.storage import hooks


def leader() -> Any:
    states: list[int] = []
    return SimpleNamespace(
        _isLeader=lambda: not states,
        _SyncObj__setState=states.append,
        _SyncObj__raftLeader="self",
        _SyncObj__raftElectionDeadline=0.0,
        conf=SimpleNamespace(raftMaxTimeout=1.0),
    )


def test_a_stalling_disks_hand_over_is_a_warning_and_a_removals_is_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=hooks.log.name)
    removed = leader()
    hooks._hand_over(removed)
    stalled = leader()
    hooks._hand_over(stalled, "this node's disk stalls", level=logging.WARNING)
    said = [(r.levelno, r.getMessage()) for r in caplog.records
            if getattr(r, "action", None) == "leader_hand_over"]
    assert said == [
        (logging.INFO, "standing down: this node is being removed from the cluster"),
        (logging.WARNING, "standing down: this node's disk stalls"),
    ]
    assert removed._SyncObj__raftLeader is None and stalled._SyncObj__raftLeader is None
    assert not removed._isLeader() and not stalled._isLeader()

