"""The benchmark's measures, each an async function of a `BenchTarget` returning plain figures.

Load is generated in this process with aiohttp (one connection pool, many coroutines), except
one-job-per-request submits, which use a lean client (cluster/dev/bench/lean.py) so the load
generator takes as little as it can of the cores the cluster runs on; the drain uses real
`raftcron worker` processes (cluster/dev/bench/workers.py), because the workers are part of
what is measured.
Every loop is bounded by a count and a deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

import aiohttp

from raftcron.cluster.dev.bench.lean import LeanConnection
from raftcron.cluster.dev.bench.scrape import sample
from raftcron.cluster.dev.bench.stats import ProgressLine, percentile
from raftcron.cluster.dev.bench.target import BenchTarget, retrying
from raftcron.cluster.dev.bench.workers import exited, start_workers, stop_workers, until_waiting


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- submit -------------------------------------------------------------------------------


async def submit_single(target: BenchTarget, *, jobs: int, concurrency: int) -> dict[str, Any]:
    """One job per request from `concurrency` clients, each on its own kept-alive connection
    (the lean client: see cluster/dev/bench/lean.py), spread over every node as users would be."""
    queue = _unique("bench-single")
    progress = ProgressLine("submit single", jobs, quiet=target.quiet)
    done = 0
    counter = itertools.count()
    body = {"task": "noop", "queue": queue}

    async def client(index: int) -> None:
        nonlocal done
        connections = [LeanConnection(url, target.token) for url in target.urls]
        turn = index

        async def post(attempt: int) -> tuple[int, Any]:
            nonlocal turn
            if attempt:
                turn += 1  # that node answered 503 or refused: the next one, from now on
            try:
                return await connections[turn % len(connections)].post("/v1/jobs", body)
            except (OSError, asyncio.IncompleteReadError, ValueError) as error:
                return 0, str(error)

        try:
            while next(counter) < jobs:
                status, answer = await retrying(post)
                if status != 201:
                    raise RuntimeError(f"submit answered {status}: {answer}")
                done += 1
                progress.update(done)
        finally:
            for connection in connections:
                connection.close()

    started = time.monotonic()
    await asyncio.gather(*(client(index) for index in range(concurrency)))
    elapsed = time.monotonic() - started
    rate = jobs / elapsed
    progress.done(f"{jobs:,} jobs, {concurrency} clients: {rate:,.0f} jobs/s")
    if (queued := await _cancel_queue(target, queue)) != jobs:  # every 201 is a real job
        raise RuntimeError(f"{jobs} submits answered 201 but {queued} jobs were queued")
    return {"submit_single_jobs_per_s": round(rate)}


async def submit_batched(
    target: BenchTarget, *, jobs: int, batch: int, concurrency: int, queue: str | None = None
) -> dict[str, Any]:
    queue = queue or _unique("bench-batch")
    progress = ProgressLine("submit batched", jobs, quiet=target.quiet)
    batches = jobs // batch
    done = 0
    counter = itertools.count()

    async def client() -> None:
        nonlocal done
        while next(counter) < batches:
            body = {"jobs": [{"task": "noop", "queue": queue}] * batch}
            status, answer = await target.call("POST", "/v1/jobs/batch", body)
            if status != 201:
                raise RuntimeError(f"batch submit answered {status}: {str(answer)[:300]}")
            done += batch
            progress.update(done)

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    rate = batches * batch / elapsed
    progress.done(f"{batches * batch:,} jobs in batches of {batch}: {rate:,.0f} jobs/s")
    return {"submit_batched_jobs_per_s": round(rate), "queue": queue}


async def _cancel_queue(target: BenchTarget, queue: str) -> int:
    """Leave no queued bench jobs behind for the next measure (a drain would count them);
    return how many were cancelled."""
    cancelled = 0
    for _ in range(1_000):
        status, page = await target.call("GET", f"/v1/jobs?queue={queue}&status=queued&limit=1000")
        if status != 200 or not page["jobs"]:
            break
        answers = await asyncio.gather(
            *(target.call("POST", f"/v1/jobs/{job['id']}/cancel", {}) for job in page["jobs"])
        )
        cancelled += sum(answer_status == 200 for answer_status, _ in answers)
    return cancelled


# -- drain --------------------------------------------------------------------------------


async def drain(
    target: BenchTarget,
    *,
    jobs: int,
    workers: int,
    concurrency: int,
    ready: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """Time W worker processes draining `jobs` no-op jobs: those `ready` in a queue, or new ones.

    Two figures: from the workers' start (their start-up included) to the last success, and
    from the moment every worker waits on a claim (the queue paused until then, then resumed)
    to the last success, which is how the PostgreSQL baseline times its drain (its workers
    connect before its clock starts)."""
    if ready is not None:
        queue, jobs = ready
    else:
        queue = _unique("bench-drain")
        await submit_batched(target, jobs=jobs, batch=1_000, concurrency=4, queue=queue)
    status, answer = await target.call("POST", f"/v1/queues/{queue}/pause", {})
    if status != 200:
        raise RuntimeError(f"pausing the drain's queue answered {status}: {answer}")
    progress = ProgressLine("drain", jobs, quiet=target.quiet)
    started = time.monotonic()
    processes = start_workers(target, queues=[queue], workers=workers, concurrency=concurrency)
    try:
        await until_waiting(target, workers, processes, started + 60)
        resumed = time.monotonic()
        status, answer = await target.call("POST", f"/v1/queues/{queue}/resume", {})
        if status != 200:
            raise RuntimeError(f"resuming the drain's queue answered {status}: {answer}")
        succeeded = 0
        deadline = started + max(120.0, jobs / 200)
        while succeeded < jobs and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            succeeded = await _succeeded(target, queue)
            progress.update(succeeded)
            if exited(processes):
                raise RuntimeError("a bench worker exited early")
        ended = time.monotonic()
    finally:
        stop_workers(processes)
    if succeeded < jobs:
        raise RuntimeError(f"drain: only {succeeded} of {jobs} jobs succeeded in time")
    rate, ready_rate = jobs / (ended - started), jobs / (ended - resumed)
    progress.done(
        f"{jobs:,} no-op jobs, {workers} workers x {concurrency}: {rate:,.0f} jobs/s "
        f"including worker start-up, {ready_rate:,.0f} jobs/s from ready workers"
    )
    return {
        "drain_jobs_per_s": round(rate),
        "drain_ready_jobs_per_s": round(ready_rate),
        "drain_jobs": jobs,
        "drain_workers": workers,
        "drain_slots": concurrency,
    }


async def _succeeded(target: BenchTarget, queue: str) -> int:
    """Jobs of a queue that succeeded, from /metrics (cheap at any size, unlike listing)."""
    code, text = await _metrics(target)
    if code != 200:
        return 0
    return int(sample(text, "raftcron_jobs_succeeded_total", f'queue="{queue}"'))


async def _metrics(target: BenchTarget) -> tuple[int, str]:
    for _ in range(len(target.urls)):
        try:
            async with target.session.get(target.next_url() + "/metrics") as answer:
                return answer.status, await answer.text()
        except (aiohttp.ClientError, TimeoutError):
            continue
    return 0, ""


# -- claim latency --------------------------------------------------------------------------


async def claim_latency(target: BenchTarget, *, rounds: int) -> dict[str, Any]:
    """Idle cluster: one job queued, then one claim round trip timed, `rounds` times."""
    queue = _unique("bench-claim")
    url = await target.leader_url()
    progress = ProgressLine("claim", rounds, quiet=target.quiet)
    samples = []
    token_job: list[tuple[int, int]] = []
    for index in range(rounds):
        await target.call("POST", "/v1/jobs", {"task": "noop", "queue": queue}, url=url)
        body = {
            "worker": "bench",
            "queues": [queue],
            "max": 1,
            "wait_ms": 0,
            "acks": [{"id": j, "token": t, "outcome": "succeeded"} for j, t in token_job],
        }
        started = time.perf_counter()
        status, answer = await target.call("POST", "/v1/claims", body, url=url)
        samples.append((time.perf_counter() - started) * 1000)
        if status != 200 or not answer["jobs"]:
            raise RuntimeError(f"claim answered {status}: {answer}")
        token_job = [(job["id"], job["token"]) for job in answer["jobs"]]
        progress.update(index + 1)
        await asyncio.sleep(0.01)  # idle: no pipelining between rounds
    figures = {
        "claim_p50_ms": round(percentile(samples, 0.5), 2),
        "claim_p99_ms": round(percentile(samples, 0.99), 2),
        "claim_max_ms": round(max(samples), 2),
    }
    progress.done(
        f"{rounds} claims on the leader: p50 {figures['claim_p50_ms']} ms, "
        f"p99 {figures['claim_p99_ms']} ms, max {figures['claim_max_ms']} ms"
    )
    return figures


# -- fire lateness --------------------------------------------------------------------------


async def fire_lateness(target: BenchTarget, *, schedules: int, seconds: int) -> dict[str, Any]:
    """`schedules` schedules every 1 s for `seconds`: lateness = job created - fire time."""
    prefix = _unique("bench-fire")
    progress = ProgressLine("fire lateness", schedules, quiet=target.quiet)
    queue = f"{prefix}-q"
    for index in range(schedules):
        spec = {"every": "1s", "job": {"task": "noop", "queue": queue}, "retain": 100}
        status, answer = await target.call("PUT", f"/v1/schedules/{prefix}-{index}", spec)
        if status not in (200, 201):
            raise RuntimeError(f"schedule put answered {status}: {answer}")
        progress.update(index + 1, "creating schedules")
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        await asyncio.sleep(1)
        progress.update(schedules, f"{time.monotonic() - started:.0f}/{seconds} s")
    lateness: list[float] = []
    for index in range(schedules):
        status, page = await target.call("GET", f"/v1/jobs?schedule={prefix}-{index}&limit=1000")
        lateness += [job["created_ms"] - job["fire_time_ms"] for job in page["jobs"]]
        await target.call("DELETE", f"/v1/schedules/{prefix}-{index}")
    await _cancel_queue(target, queue)
    if not lateness:
        raise RuntimeError("no fires were seen")
    figures = {
        "fire_lateness_p50_ms": percentile(lateness, 0.5),
        "fire_lateness_p99_ms": percentile(lateness, 0.99),
        "fire_lateness_max_ms": max(lateness),
        "fires_seen": len(lateness),
    }
    progress.done(
        f"{len(lateness):,} fires of {schedules} 1-second schedules over {seconds} s: p50 "
        f"{figures['fire_lateness_p50_ms']} ms, p99 {figures['fire_lateness_p99_ms']} ms"
    )
    return figures


# -- failover -------------------------------------------------------------------------------


LED_S = 3.0  # how long a killed leader has led: more than raft.connection_timeout_s (2 s)


async def failover(target: BenchTarget, *, kills: int) -> dict[str, Any]:
    """SIGKILL the leader; time until a write commits again; restart it; K times.

    Each leader killed has led for `LED_S` first, as one in production has: a kill right
    after the last restart measured a cluster whose links between followers were fresh, and
    missed that PySyncObj drops a link idle for its connection timeout only when the first
    vote request is sent on it (0.5-1.1 s per failover then; cluster/consensus/leaderloss.py)."""
    cluster = target.cluster
    if cluster is None:
        return {"failover_s": None, "failover_note": "needs a cluster started by the bench"}
    progress = ProgressLine("failover", kills, quiet=target.quiet)
    times = []
    for round_number in range(kills):
        await asyncio.sleep(LED_S)
        leader = cluster.leader(timeout_s=30)
        others = [f"http://{node.http_address}" for node in cluster.nodes if node is not leader]
        cluster.kill(leader)
        killed_at = time.monotonic()
        committed = False
        while time.monotonic() - killed_at < 30 and not committed:
            for url in others:
                try:
                    async with target.session.post(
                        url + "/v1/jobs",
                        json={"task": "noop", "queue": "bench-failover"},
                        timeout=aiohttp.ClientTimeout(total=2),
                    ) as answer:
                        committed = answer.status == 201
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if committed:
                    break
            if not committed:
                await asyncio.sleep(0.01)
        elapsed = time.monotonic() - killed_at
        times.append(elapsed)
        cluster.start_node(leader)
        cluster.wait_ready(timeout_s=60)
        progress.update(round_number + 1, f"last {elapsed:.2f} s")
    figures = {
        "failover_s": round(max(times), 3),
        "failover_mean_s": round(sum(times) / len(times), 3),
        "failover_min_s": round(min(times), 3),
        "failover_kills": kills,
    }
    progress.done(
        f"{kills} leader kills: worst {figures['failover_s']} s, "
        f"mean {figures['failover_mean_s']} s"
    )
    return figures
