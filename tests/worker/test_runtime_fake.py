"""The worker runtime against an in-process fake of the worker routes: round trips, acks,
abandonment and request ids, checked request by request (no cluster, no fixed sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from raftcron.cluster.worker import JobContext, PermanentError, TaskRegistry, Worker
from raftcron.cluster.worker.acks import AckBuffer, success_ack

from .fakeapi import FakeApi

Scenario = Callable[[FakeApi, Worker], Awaitable[None]]


def run_scenario(
    scenario: Scenario,
    tasks: TaskRegistry,
    *,
    ports: int = 1,
    timeout_s: float = 20.0,
    **options: Any,
) -> FakeApi:
    """Start a fake API and a worker, run the scenario, stop (drain) the worker, check it
    stopped; the fake, for the test's assertions."""

    async def main() -> FakeApi:
        fake = FakeApi()
        urls = await fake.start(ports)
        options.setdefault("lease_ms", 900)
        options.setdefault("wait_ms", 300)
        worker = Worker(urls, tasks=tasks, name="fake-worker", **options)
        serving = asyncio.create_task(worker.serve())
        try:
            async with asyncio.timeout(timeout_s):
                await scenario(fake, worker)
                worker.stop()
                await serving
        finally:
            worker.stop(drain=False)
            if not serving.done():
                serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            await fake.stop()
        return fake

    return asyncio.run(main())


def test_the_ack_of_a_finished_job_rides_on_the_next_claim() -> None:
    tasks = TaskRegistry()
    tasks.add("double", lambda ctx: {"value": 2 * ctx.payload["value"]})

    async def scenario(fake: FakeApi, worker: Worker) -> None:
        job = fake.add_job("double", {"value": 21})
        await fake.wait_until(lambda: job.status == "succeeded")

    # One slot and a long ack delay: the only way the ack can travel is inside the next claim.
    fake = run_scenario(scenario, tasks, concurrency=1, ack_delay_ms=60_000)
    claims = fake.calls("/v1/claims")
    carrying = [c for c in claims if c.body.get("acks")]
    assert carrying and carrying[0].body["max"] == 1  # a real claim, not an ack-only call
    assert carrying[0].body["acks"] == [
        {"id": 1, "token": 1, "outcome": "succeeded", "result": {"value": 42}}
    ]
    assert fake.calls("/v1/jobs/1/complete") == []


def test_an_ack_is_sent_on_its_own_while_a_long_poll_is_in_flight() -> None:
    tasks = TaskRegistry()
    tasks.add("quick", lambda ctx: "done")

    async def scenario(fake: FakeApi, worker: Worker) -> None:
        job = fake.add_job("quick")
        await fake.wait_until(lambda: job.status == "succeeded", timeout_s=1.0)

    # Two slots: after claiming the one job the worker long-polls (2 s) for more, so the ack
    # cannot wait for the next claim: it goes alone, as a claim of max 0, within moments.
    fake = run_scenario(scenario, tasks, concurrency=2, wait_ms=2_000)
    ack_only = [c for c in fake.calls("/v1/claims") if c.body["max"] == 0 and c.body["acks"]]
    assert ack_only and ack_only[0].body["acks"][0]["id"] == 1


def test_a_job_whose_heartbeat_is_refused_is_stopped_and_never_reported() -> None:
    tasks = TaskRegistry()
    seen: dict[str, Any] = {}

    @tasks.task("wait-forever")
    async def wait_forever(ctx: JobContext) -> str:
        seen["ctx"] = ctx
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        return "never"

    async def scenario(fake: FakeApi, worker: Worker) -> None:
        job = fake.add_job("wait-forever")
        await fake.wait_until(lambda: job.status == "running" and "ctx" in seen)
        fake.revoked[job.id] = "job_cancelled"
        await fake.wait_until(lambda: bool(fake.calls("/v1/jobs/1/heartbeat")))
        await fake.wait_until(lambda: worker.counts.get("abandoned", 0) == 1)

    fake = run_scenario(scenario, tasks, concurrency=1)
    assert seen["cancelled"] is True
    assert seen["ctx"].cancelled and seen["ctx"].stop_reason == "job_cancelled"
    assert fake.acks_sent() == []
    assert fake.calls("/v1/jobs/1/complete") == fake.calls("/v1/jobs/1/fail") == []


def test_a_claim_retried_after_a_503_keeps_its_request_id_and_moves_to_another_node() -> None:
    tasks = TaskRegistry()
    tasks.add("quick", lambda ctx: None)

    async def scenario(fake: FakeApi, worker: Worker) -> None:
        fake.unavailable_next = 1
        job = fake.add_job("quick")
        await fake.wait_until(lambda: job.status == "succeeded")

    fake = run_scenario(scenario, tasks, ports=2, concurrency=1)
    first, retried, *later = fake.calls("/v1/claims")
    assert first.request_id and first.request_id == retried.request_id
    assert first.port != retried.port
    ids = [c.request_id for c in later]
    assert len(set(ids)) == len(ids) and first.request_id not in ids


def test_handler_errors_become_failures_retryable_unless_permanent() -> None:
    tasks = TaskRegistry()

    @tasks.task("flaky")
    def flaky(ctx: JobContext) -> None:
        raise ValueError("the disk is full")

    @tasks.task("hopeless")
    def hopeless(ctx: JobContext) -> None:
        raise PermanentError("no such customer")

    async def scenario(fake: FakeApi, worker: Worker) -> None:
        jobs = [fake.add_job("flaky"), fake.add_job("hopeless"), fake.add_job("unknown")]
        await fake.wait_until(lambda: all(job.status == "failed" for job in jobs))

    fake = run_scenario(scenario, tasks, concurrency=3)
    acks = {ack["id"]: ack for ack in fake.acks_sent()}
    assert acks[1]["error"].startswith("ValueError: the disk is full")
    assert acks[1]["retryable"] is True
    assert acks[2]["error"] == "no such customer"
    assert acks[2]["retryable"] is False
    assert "no handler for task 'unknown'" in acks[3]["error"] and acks[3]["retryable"]


def test_a_result_over_64_kib_fails_the_job_for_good_with_a_clear_error() -> None:
    tasks = TaskRegistry()
    tasks.add("huge", lambda ctx: "x" * 70_000)
    tasks.add("not-json", lambda ctx: {1: object()})

    async def scenario(fake: FakeApi, worker: Worker) -> None:
        jobs = [fake.add_job("huge"), fake.add_job("not-json")]
        await fake.wait_until(lambda: all(job.status == "failed" for job in jobs))

    fake = run_scenario(scenario, tasks, concurrency=2)
    acks = {ack["id"]: ack for ack in fake.acks_sent()}
    assert "more than the limit of 65536" in acks[1]["error"]
    assert "is not a JSON value" in acks[2]["error"]
    assert acks[1]["retryable"] is False and acks[2]["retryable"] is False


@pytest.mark.parametrize("handler_kind", ["thread", "coroutine"])
def test_a_job_over_its_timeout_is_stopped_and_failed(handler_kind: str) -> None:
    tasks = TaskRegistry()
    stopped: list[bool] = []

    if handler_kind == "thread":

        @tasks.task("stuck", timeout_ms=200)
        def stuck(ctx: JobContext) -> None:
            stopped.append(ctx.wait_cancelled(30))

    else:

        @tasks.task("stuck", timeout_ms=200)
        async def stuck_async(ctx: JobContext) -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                stopped.append(True)
                raise

    async def scenario(fake: FakeApi, worker: Worker) -> None:
        job = fake.add_job("stuck")
        await fake.wait_until(lambda: job.status == "failed")
        await fake.wait_until(lambda: worker.running == {})

    fake = run_scenario(scenario, tasks, concurrency=1)
    [ack] = fake.acks_sent()
    assert ack["error"] == "timed out after 200 ms" and ack["retryable"] is True
    assert stopped == [True]


def test_handlers_can_heartbeat_themselves_with_a_longer_lease() -> None:
    tasks = TaskRegistry()
    answers: list[bool] = []

    @tasks.task("threaded")
    def threaded(ctx: JobContext) -> None:
        answers.append(ctx.heartbeat(lease_ms=5_000))

    @tasks.task("coroutine")
    async def coroutine(ctx: JobContext) -> None:
        answers.append(await ctx.aheartbeat(lease_ms=6_000))

    async def scenario(fake: FakeApi, worker: Worker) -> None:
        jobs = [fake.add_job("threaded"), fake.add_job("coroutine")]
        await fake.wait_until(lambda: all(job.status == "succeeded" for job in jobs))

    fake = run_scenario(scenario, tasks, concurrency=2)
    assert answers == [True, True]
    leases = sorted(r.body.get("lease_ms") or 0 for r in fake.requests if "heartbeat" in r.path)
    assert leases[-2:] == [5_000, 6_000]


def test_a_second_stop_ends_the_drain_at_once_and_fails_the_running_job() -> None:
    tasks = TaskRegistry()

    @tasks.task("stubborn")
    def stubborn(ctx: JobContext) -> str:
        return "stopped" if ctx.wait_cancelled(30) else "finished"

    async def scenario(fake: FakeApi, worker: Worker) -> None:
        job = fake.add_job("stubborn")
        await fake.wait_until(lambda: job.status == "running" and bool(worker.running))
        worker.stop()
        worker.stop()  # a second SIGTERM/SIGINT: do not wait for the drain timeout
        await fake.wait_until(lambda: job.status == "failed", timeout_s=5)

    fake = run_scenario(scenario, tasks, concurrency=1, drain_timeout_ms=60_000)
    [ack] = fake.acks_sent()
    assert ack["error"] == "worker fake-worker stopped before the job finished"
    assert ack["retryable"] is True


def test_acks_are_sent_in_batches_that_fit_one_command() -> None:
    buffer = AckBuffer(batch_bytes_max=150_000)
    for job_id in range(1, 6):
        buffer.add(success_ack(job_id, job_id, "r" * 60_000))
    batches = []
    while len(buffer):
        batches.append([ack["id"] for ack in buffer.take()])
    assert batches == [[1, 2], [3, 4], [5]]
    buffer.add(success_ack(9, 9, "r" * 60_000))
    buffer.put_back([success_ack(8, 8, None)])
    assert [ack["id"] for ack in buffer.take()] == [8, 9]
