"""A write that met "no leader" is retried as soon as a leader is known, not after a backoff.

Driven on a virtual clock (the proposer's sleep and monotonic replaced), so the test measures
nothing about the machine: it checks when the retry is made relative to when the leader
appeared. With a doubling backoff (0.05, 0.1, 0.2, 0.4 s) a leader elected at 0.36 s was only
tried at 0.75 s.
"""

import asyncio
import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from raftcron.cluster.consensus import proposer as proposing
from raftcron.scheduler.commands import Barrier
from raftcron.scheduler.errors import Ok

ELECTED_AT_S = 0.36


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    """The proposer's monotonic clock and asyncio's sleep, virtual for the test's length."""
    virtual = VirtualClock()
    monkeypatch.setattr(proposing.time, "monotonic", virtual.monotonic)
    monkeypatch.setattr(proposing.asyncio, "sleep", virtual.sleep)
    return virtual


def submit_with(node: Any, propose: Any, request_id: str) -> Any:
    """`Proposer.submit` of a Barrier, each attempt made by `propose`."""

    async def run() -> Any:
        proposer = proposing.Proposer(
            node, asyncio.get_running_loop(), commit_timeout_s=5.0, batch_commands_max=16
        )
        proposer.propose = propose  # type: ignore[method-assign]
        return await proposer.submit(Barrier(request_id))

    return asyncio.run(run())


@pytest.mark.parametrize("reason", ["missing_leader", "leader_changed", "not_leader"])
def test_a_leaderless_failure_is_retried_once_a_leader_is_known(clock, reason):
    node: Any = SimpleNamespace(leader_id=lambda: "n2" if clock.now >= ELECTED_AT_S else None)
    attempts: list[float] = []

    async def propose(command: Any) -> Any:
        attempts.append(clock.now)
        if clock.now < ELECTED_AT_S:
            error = proposing.Indeterminate if reason == "leader_changed" else proposing.NotApplied
            raise error(f"not applied: {reason}", reason=reason)
        return Ok({})

    assert submit_with(node, propose, "retry-1") == Ok({})
    assert attempts[-1] >= ELECTED_AT_S
    assert attempts[-1] - ELECTED_AT_S <= 2 * proposing.LEADER_POLL_S, attempts


def test_other_failures_still_back_off(clock):
    node: Any = SimpleNamespace(leader_id=lambda: "n2")
    attempts: list[float] = []

    async def propose(command: Any) -> Any:
        attempts.append(clock.now)
        if len(attempts) < 4:
            raise proposing.NotApplied("not applied: queue_full", reason="queue_full")
        return Ok({})

    assert submit_with(node, propose, "retry-2") == Ok({})
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(attempts)]
    assert gaps == [0.05, 0.1, 0.2]  # a full queue is not helped by retrying sooner


def test_a_failure_after_the_caller_gave_up_is_not_logged_as_never_retrieved(caplog):
    """An entry that failed after its caller's commit timeout left a future whose exception
    nobody read: asyncio logged "Future exception was never retrieved" at error level."""
    import gc

    from pysyncobj import FAIL_REASON

    callbacks: list[Any] = []
    machine = SimpleNamespace(apply=lambda payload, callback: callbacks.append(callback),
                              expect=lambda *_: None, forget=lambda _frames: None)
    node: Any = SimpleNamespace(machine=machine, leader_id=lambda: "n1")

    async def run() -> None:
        proposer = proposing.Proposer(
            node, asyncio.get_running_loop(), commit_timeout_s=0.05, batch_commands_max=16
        )
        with pytest.raises(proposing.Indeterminate):
            await proposer.propose(Barrier("late-1"))
        assert callbacks, "the entry was handed to the node"
        callbacks[0](None, FAIL_REASON.DISCARDED)
        for _ in range(100):  # the failure reaches the loop via call_soon_threadsafe
            await asyncio.sleep(0)
            if proposer.failures.get("discarded"):
                break
        assert proposer.failures.get("discarded") == 1

    with caplog.at_level("ERROR", logger="asyncio"):
        asyncio.run(run())
        callbacks.clear()
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_what_a_leader_proposed_is_sent_again_at_once_when_it_stops_leading():
    """A leader that stalls (a slow disk) is replaced; what it proposed was answered only once
    its index was applied, which took past the commit timeout: a client waited 5 s. Now
    losing leadership answers it "leader changed", and `submit` sends it again at once with
    the same request id (the state machine answers a repeat with the first result)."""
    import threading
    import time

    from pysyncobj import FAIL_REASON

    callbacks: list[Any] = []
    machine = SimpleNamespace(apply=lambda payload, callback: callbacks.append(callback),
                              expect=lambda *_: None, forget=lambda _frames: None)
    node: Any = SimpleNamespace(machine=machine, leader_id=lambda: "n2")

    async def run() -> tuple[Any, float]:
        proposer = proposing.Proposer(
            node, asyncio.get_running_loop(), commit_timeout_s=5.0, batch_commands_max=16
        )
        started = time.monotonic()
        task = asyncio.create_task(proposer.submit(Barrier("stalled-1"), deadline_s=10.0))
        for _ in range(100):
            await asyncio.sleep(0)
            if callbacks:
                break
        assert len(callbacks) == 1, "the entry was handed to the node"
        lost = threading.Thread(target=proposer.leadership_lost)  # as the Raft thread does
        lost.start()
        lost.join()
        for _ in range(200):
            await asyncio.sleep(0.005)
            if len(callbacks) == 2:
                break
        assert len(callbacks) == 2, "sent again after the leadership was lost"
        callbacks[0](None, FAIL_REASON.DISCARDED)  # the old entry's late answer: ignored
        callbacks[1]([Ok({"again": True})], FAIL_REASON.SUCCESS)
        return await task, time.monotonic() - started

    result, took_s = asyncio.run(run())
    assert result == Ok({"again": True})
    assert took_s < 1.0, took_s


def test_a_stopping_proposer_answers_a_waiting_write_now_and_proposes_nothing_more():
    """The HTTP server's stop waits for requests in flight: a write waiting for its commit is
    told at once that its outcome is unknown, and one that comes later is refused."""
    applied: list[Any] = []
    node: Any = SimpleNamespace(
        is_voter=lambda: True, leader_id=lambda: "n1",
        machine=SimpleNamespace(expect=lambda *_: None, forget=lambda *_: None,
                                apply=lambda entry, callback: applied.append(entry)))

    async def run() -> tuple[Any, Any, float]:
        loop = asyncio.get_running_loop()
        proposer = proposing.Proposer(node, loop, commit_timeout_s=30.0, batch_commands_max=16)
        waiting = loop.create_task(proposer.submit(Barrier("waits")))
        for _ in range(1_000):  # until proposed: then it waits for a commit that never comes
            if applied:
                break
            await asyncio.sleep(0)
        assert applied
        started = loop.time()
        proposer.stop()
        with pytest.raises(proposing.Indeterminate) as first:
            await waiting
        took = loop.time() - started
        with pytest.raises(proposing.NotApplied) as later:
            await proposer.submit(Barrier("later"))
        return first.value, later.value, took

    first, later, took = asyncio.run(run())
    assert first.reason == "stopping" and later.reason == "stopping"
    assert took < 1.0
    assert len(applied) == 1  # the later write was never proposed
