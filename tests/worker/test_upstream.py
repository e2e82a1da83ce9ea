"""`ctx.upstream` in the worker (cluster/worker/upstream.py), against a fake client: results
that came with the claim are read as they are, the rest on demand (once, consistent), from a
plain handler's thread when it reads them and before a coroutine handler starts."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import pytest

from raftcron.cluster.clients.clientparts import Unavailable
from raftcron.cluster.worker import JobContext, TaskRegistry, UpstreamUnavailable
from raftcron.cluster.worker.acks import AckBuffer
from raftcron.cluster.worker.execution import Execution


class FakeClient:
    """Heartbeats succeed; `job` answers from `results` (an exception in it is raised)."""

    def __init__(self, results: dict[int, Any]) -> None:
        self.results = results
        self.reads: list[tuple[int, bool]] = []
        self.events: list[str] = []

    async def heartbeat(self, job_id: int, token: int, *, lease_ms: int | None = None,
                        deadline_s: float | None = None) -> dict[str, Any]:
        return {"id": job_id, "lease_until_ms": 0}

    async def job(self, job_id: int, *, consistent: bool = False) -> dict[str, Any]:
        self.reads.append((job_id, consistent))
        self.events.append(f"read {job_id}")
        await asyncio.sleep(0)  # answered later, as over the network
        found = self.results[job_id]
        if isinstance(found, Exception):
            raise found
        return {"id": job_id, "status": "succeeded", "result": found}


CLAIMED = {
    "id": 10, "key": None, "task": "child", "queue": "q", "payload": None, "attempt": 1,
    "token": 7, "lease_until_ms": 0, "lease_ms": 30_000, "timeout_ms": None,
    "schedule": None, "fire_time_ms": None,
    "upstream": {
        "extract": {"job_id": 1, "delivered": True, "result": {"rows": 3}},
        "big": {"job_id": 2, "delivered": False},
    },
}


def run_job(handler: Any, client: FakeClient, claimed: dict[str, Any] = CLAIMED
            ) -> dict[str, Any]:
    """Run one job through the worker's own Execution; its ack."""
    tasks = TaskRegistry()
    tasks.add("child", handler)

    async def main() -> dict[str, Any]:
        acks = AckBuffer()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            execution = Execution(
                dict(claimed), task=tasks.get("child"), client=client, worker="w",
                lease_ms=30_000, acks=acks, executor=pool, default_timeout_ms=10_000,
                known_tasks=tasks.names)
            await execution.run()
        [ack] = acks.take()
        return ack

    return asyncio.run(main())


def test_a_plain_handler_reads_a_delivered_result_and_fetches_the_rest_once_on_demand():
    client = FakeClient({2: "x" * 100})

    def child(ctx: JobContext) -> dict[str, Any]:
        first = ctx.upstream["extract"]
        assert client.reads == []  # delivered with the claim: nothing read
        big = ctx.upstream["big"]
        again = ctx.upstream["big"]
        return {"extract": first, "big": len(big) + len(again), "names": sorted(ctx.upstream)}

    ack = run_job(child, client)
    assert ack["outcome"] == "succeeded", ack
    assert ack["result"] == {"extract": {"rows": 3}, "big": 200, "names": ["big", "extract"]}
    assert client.reads == [(2, True)]  # once, and consistent


def test_a_plain_handler_that_never_reads_a_parent_costs_no_request():
    client = FakeClient({2: "never"})

    def child(ctx: JobContext) -> Any:
        assert "big" in ctx.upstream and "load" not in ctx.upstream  # names: nothing read
        return ctx.upstream["extract"]

    ack = run_job(child, client)
    assert ack["result"] == {"rows": 3} and client.reads == []


def test_a_coroutine_handler_gets_every_result_read_before_it_starts():
    client = FakeClient({2: [1, 2, 3]})

    async def child(ctx: JobContext) -> Any:
        client.events.append("handler started")
        return ctx.upstream["big"]

    ack = run_job(child, client)
    assert ack["result"] == [1, 2, 3]
    assert client.events == ["read 2", "handler started"]


def test_a_name_that_is_not_a_parent_raises_key_error_naming_the_parents():
    def child(ctx: JobContext) -> Any:
        with pytest.raises(KeyError) as missing:
            ctx.upstream["load"]
        return str(missing.value)

    ack = run_job(child, FakeClient({}))
    assert "'load' is not a parent of this job" in ack["result"]
    assert "its parents are extract, big" in ack["result"]


def test_a_job_outside_a_workflow_sees_an_empty_upstream():
    claimed = {k: v for k, v in CLAIMED.items() if k != "upstream"}

    def child(ctx: JobContext) -> Any:
        with pytest.raises(KeyError, match="it has none"):
            ctx.upstream["extract"]
        return {"length": len(ctx.upstream), "as_dict": dict(ctx.upstream)}

    ack = run_job(child, FakeClient({}), claimed)
    assert ack["result"] == {"length": 0, "as_dict": {}}


@pytest.mark.parametrize("kind", ["plain", "coroutine"])
def test_a_result_that_cannot_be_read_fails_the_attempt_naming_the_parent(kind):
    client = FakeClient({2: Unavailable("GET /v1/jobs/2: no node answered in time")})

    def plain(ctx: JobContext) -> Any:
        return ctx.upstream["big"]

    async def coroutine(ctx: JobContext) -> Any:
        assert ctx.upstream["extract"] == {"rows": 3}  # what came with the claim still reads
        return ctx.upstream["big"]

    ack = run_job(plain if kind == "plain" else coroutine, client)
    assert ack["outcome"] == "failed" and ack.get("retryable", True)
    assert "UpstreamUnavailable" in ack["error"]
    assert "parent 'big' (job 2) could not be read" in ack["error"]
    assert "no node answered" in ack["error"]


def test_a_handler_may_catch_an_unreadable_parent():
    client = FakeClient({2: Unavailable("down")})

    def child(ctx: JobContext) -> Any:
        try:
            return ctx.upstream["big"]
        except UpstreamUnavailable:
            return "fallback"

    assert run_job(child, client)["result"] == "fallback"


def test_upstream_is_read_only():
    def child(ctx: JobContext) -> Any:
        with pytest.raises(TypeError):
            ctx.upstream["extract"] = 1  # type: ignore[index]
        return "ok"

    assert run_job(child, FakeClient({}))["result"] == "ok"
