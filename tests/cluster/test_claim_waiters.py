"""cluster/consensus/waiters.py's ClaimWaiters: a job queued in one queue wakes only that queue's
long-polling claims (S9 of the wave-2 audit: every waiter woke for any queue's job)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

from raftcron.cluster.consensus.waiters import ClaimWaiters


def state_with_ready(**ready: int) -> Any:
    """A state with jobs in line in these queues, and no queue limits (queues.py)."""
    return SimpleNamespace(queues={}, now_ms=0, table=SimpleNamespace(
        ready={queue: list(range(count)) for queue, count in ready.items()}))


def test_a_job_in_one_queue_wakes_only_the_claims_waiting_on_that_queue() -> None:
    async def scenario() -> tuple[bool, bool, int]:
        waiters = ClaimWaiters(asyncio.get_running_loop())
        idle = asyncio.create_task(waiters.wait(("idle",), 5.0))
        busy = asyncio.create_task(waiters.wait(("busy", "other"), 5.0))
        await asyncio.sleep(0)  # both are waiting
        assert waiters.watched == ("busy", "idle", "other") and waiters.waiting == 3
        # The Raft thread applies an entry that leaves a job queued in "busy".
        raft = threading.Thread(target=waiters.on_applied, args=(state_with_ready(busy=1),))
        raft.start()
        raft.join()
        await asyncio.wait_for(busy, 2.0)
        await asyncio.sleep(0.05)
        idle_woken = idle.done()
        idle.cancel()
        await asyncio.gather(idle, return_exceptions=True)
        return busy.done(), idle_woken, waiters.waiting

    busy_woken, idle_woken, left = asyncio.run(scenario())
    assert busy_woken and not idle_woken
    assert left == 0


def test_no_waiter_no_wake_and_an_unwatched_queue_costs_nothing() -> None:
    async def scenario() -> bool:
        waiters = ClaimWaiters(asyncio.get_running_loop())
        waiters.on_applied(state_with_ready(busy=3))
        return bool(waiters.due)

    assert asyncio.run(scenario()) is False


def test_closing_wakes_every_waiting_claim_and_no_claim_waits_after() -> None:
    async def scenario() -> None:
        waiters = ClaimWaiters(asyncio.get_running_loop())
        waiting = [asyncio.create_task(waiters.wait((queue,), 30.0)) for queue in ("a", "b")]
        await asyncio.sleep(0)
        assert waiters.waiting == 2
        waiters.close()
        await asyncio.wait_for(asyncio.gather(*waiting), 2.0)
        assert waiters.waiting == 0
        await asyncio.wait_for(waiters.wait(("a",), 30.0), 0.5)  # returns at once

    asyncio.run(scenario())
