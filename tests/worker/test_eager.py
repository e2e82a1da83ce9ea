"""`eager`: a coroutine's first step runs in the caller's task; one that finishes there needs
no task, one that awaits goes on in a task of its own and behaves as any task would."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftcron.cluster.worker.execution import eager


def run(test: Any) -> Any:
    return asyncio.run(asyncio.wait_for(test(), 10))


def test_a_coroutine_that_finishes_in_its_first_step_is_done_with_no_task() -> None:
    async def returns_at_once() -> int:
        return 42

    async def test() -> None:
        before = len(asyncio.all_tasks())
        future = eager(returns_at_once(), asyncio.get_running_loop())
        assert future.done() and future.result() == 42
        assert len(asyncio.all_tasks()) == before

    run(test)


def test_a_failure_or_a_cancellation_in_the_first_step_is_the_future_s() -> None:
    async def fails() -> None:
        raise ValueError("bad payload")

    async def cancels_itself() -> None:
        raise asyncio.CancelledError

    async def test() -> None:
        loop = asyncio.get_running_loop()
        failed = eager(fails(), loop)
        assert isinstance(failed.exception(), ValueError)
        assert eager(cancels_itself(), loop).cancelled()

    run(test)


def test_a_coroutine_that_awaits_goes_on_in_its_own_task_with_the_values_it_awaits() -> None:
    steps: list[str] = []

    async def waits_twice(first: asyncio.Future[str], second: asyncio.Future[str]) -> str:
        steps.append("started")
        got = await first
        steps.append(got)
        await asyncio.sleep(0)  # a bare yield, as asyncio.sleep(0) gives the task
        got += await second
        return got

    async def test() -> None:
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        future = eager(waits_twice(first, second), loop)
        assert steps == ["started"] and not future.done()
        first.set_result("a")
        loop.call_later(0.01, second.set_result, "b")
        assert await future == "ab"
        assert steps == ["started", "a"]

    run(test)


def test_a_suspended_coroutine_can_be_cancelled_and_sees_the_cancellation() -> None:
    seen: list[str] = []

    async def cleans_up() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("finally")

    async def test() -> None:
        future = eager(cleans_up(), asyncio.get_running_loop())
        await asyncio.sleep(0)
        future.cancel()
        with pytest.raises(asyncio.CancelledError):
            await future
        assert seen == ["cancelled", "finally"]

    run(test)


def test_a_suspended_coroutine_s_failure_and_timeout_reach_the_caller() -> None:
    async def fails_later() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("later")

    async def hangs() -> None:
        await asyncio.sleep(60)

    async def test() -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(KeyError):
            await eager(fails_later(), loop)
        hanging = eager(hangs(), loop)
        done, _ = await asyncio.wait({hanging}, timeout=0.02)
        assert not done
        hanging.cancel()
        await asyncio.gather(hanging, return_exceptions=True)
        assert hanging.cancelled()

    run(test)
