"""The parts a worker makes for every job, made less of: a context's stop future only when
something waits on it, a task's kind found out once, a plain success's ack and its size with
no encoding. Each still says what it said before."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from raftcron.cluster.worker import JobContext, TaskRegistry
from raftcron.cluster.worker.acks import PLAIN_ACK_BYTES_MAX, AckBuffer, success_ack
from raftcron.cluster.worker.execution import WORKER_STOPPING

CLAIMED = {"id": 7, "task": "noop", "token": 3, "lease_ms": 30_000}


async def _beat(lease_ms: int | None) -> bool:
    return True


def context(loop: asyncio.AbstractEventLoop) -> JobContext:
    return JobContext(dict(CLAIMED), worker="w", lease_ms=30_000, loop=loop, heartbeat=_beat)


def test_the_stop_future_is_done_whether_it_was_asked_for_before_or_after_the_stop() -> None:
    async def test() -> None:
        loop = asyncio.get_running_loop()
        waited_first = context(loop)
        future = waited_first.stopped_future
        assert not future.done()
        waited_first.stop(WORKER_STOPPING)
        assert future.done() and waited_first.stopped_future is future

        stopped_first = context(loop)
        stopped_first.stop(WORKER_STOPPING)
        assert stopped_first.stopped_future.done()
        await asyncio.wait_for(stopped_first.until_cancelled(), 5)

        never_stopped = context(loop)
        assert not never_stopped.stopped_future.done()

    asyncio.run(test())


def test_a_task_knows_once_whether_its_handler_is_a_coroutine_function() -> None:
    tasks = TaskRegistry()

    async def coroutine_handler(ctx: Any) -> None:
        return None

    tasks.add("a", coroutine_handler)
    tasks.add("s", lambda ctx: None)
    assert tasks.get("a").is_async and not tasks.get("s").is_async  # type: ignore[union-attr]


def test_a_success_without_a_result_is_the_plain_ack_and_one_with_a_result_is_checked() -> None:
    assert success_ack(7, 3, None) == {"id": 7, "token": 3, "outcome": "succeeded"}
    assert success_ack(7, 3, {"rows": 2}) == {
        "id": 7, "token": 3, "outcome": "succeeded", "result": {"rows": 2}}
    refused = success_ack(7, 3, {1, 2})  # a set is not JSON: the job fails, alone
    assert refused["outcome"] == "failed" and "result was refused" in refused["error"]


@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
def test_a_plain_ack_is_counted_at_no_less_than_its_bytes(job_id: int, token: int) -> None:
    ack = success_ack(job_id, token, None)
    assert len(orjson.dumps(ack)) <= PLAIN_ACK_BYTES_MAX


def test_a_batch_of_plain_acks_is_still_cut_by_its_bytes() -> None:
    async def test() -> None:
        buffer = AckBuffer(batch_bytes_max=10 * PLAIN_ACK_BYTES_MAX)
        for job_id in range(25):
            buffer.add(success_ack(job_id, job_id, None))
        assert [len(buffer.take()) for _ in range(3)] == [10, 10, 5]

    asyncio.run(test())
