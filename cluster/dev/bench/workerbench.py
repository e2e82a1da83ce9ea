"""The worker runtime's own CPU per job, with no cluster and no HTTP.

    python -m raftcron.cluster.dev.bench.workerbench [--jobs N] [--concurrency N] [--json]

A `Worker` whose client is in-process: every claim is answered at once with as many no-op jobs
as the worker asked for, every ack taken, until `--jobs` have run. What is measured is the
process's CPU time per job (best of 3 runs), so the figure is the runtime's share of a
worker's cost in `raftcron bench` (which adds the HTTP client and JSON): claiming, making each
job's execution and context, running a handler that returns at once, and acking.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any
from unittest import mock

from raftcron.cluster.worker import JobContext, TaskRegistry, runtime

RUNS = 3


class InProcessClient:
    """The few calls a worker makes of its client, answered from memory."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.next_id = 1
        self.acked = 0
        self.worker: runtime.Worker | None = None
        self.now_ms = int(time.time() * 1000)

    async def claim(self, worker: str, queues: Sequence[str], *, max: int, lease_ms: int,
                    wait_ms: int = 0, acks: Sequence[dict[str, Any]] = (),
                    request_id: str | None = None, deadline_s: float | None = None,
                    ) -> dict[str, Any]:
        self.acked += len(acks)
        if self.acked >= self.jobs and self.worker is not None:
            self.worker.stop()
        claimed: list[dict[str, Any]] = []
        while len(claimed) < max and self.next_id <= self.jobs:
            job_id, self.next_id = self.next_id, self.next_id + 1
            claimed.append({
                "id": job_id, "key": None, "task": "noop", "queue": "default",
                "payload": {"n": job_id}, "attempt": 1, "token": job_id,
                "lease_until_ms": self.now_ms + lease_ms, "lease_ms": lease_ms,
                "timeout_ms": None, "schedule": None, "fire_time_ms": None,
            })
        if not claimed:
            await asyncio.sleep(0.001)  # all handed out: the last acks are on their way
        return {"jobs": claimed, "acks": [{"id": ack["id"], "outcome": "ok"} for ack in acks]}

    async def close(self) -> None:
        return None


async def _noop(ctx: JobContext) -> None:
    return None


def run_once(jobs: int, concurrency: int) -> tuple[float, dict[str, int]]:
    """CPU seconds for `jobs` no-op jobs, and the worker's counts."""
    tasks = TaskRegistry()
    tasks.add("noop", _noop)
    client = InProcessClient(jobs)

    def make_client(*args: Any, **kwargs: Any) -> InProcessClient:
        return client

    async def main() -> tuple[float, dict[str, int]]:
        worker = runtime.Worker(["http://127.0.0.1:1"], tasks=tasks, concurrency=concurrency,
                                name="workerbench")
        client.worker = worker
        started = time.process_time()
        await asyncio.wait_for(worker.serve(), timeout=max(60.0, jobs / 1_000))
        return time.process_time() - started, dict(worker.counts)

    with mock.patch.object(runtime, "AsyncClient", make_client):
        return asyncio.run(main())


def measure(jobs: int, concurrency: int, runs: int = RUNS) -> dict[str, Any]:
    logger = logging.getLogger("raftcron.worker")
    level = logger.level
    logger.setLevel(logging.WARNING)  # a started and a stopped line per run, not the figures
    try:
        results = [run_once(jobs, concurrency) for _ in range(runs)]
    finally:
        logger.setLevel(level)
    best = min(cpu_s for cpu_s, _ in results)
    return {
        "worker_runtime_us_per_job": round(best / jobs * 1e6, 2),
        "worker_runtime_jobs": jobs,
        "worker_runtime_concurrency": concurrency,
        "worker_runtime_counts": results[-1][1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50_000, help="no-op jobs per run")
    parser.add_argument("--concurrency", type=int, default=64, help="the worker's slots")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args(argv)
    if options.jobs < 1 or options.concurrency < 1:
        parser.error("--jobs and --concurrency must be at least 1")
    figures = measure(options.jobs, options.concurrency)
    if options.json:
        print(json.dumps(figures))
    else:
        print(f"worker runtime: {figures['worker_runtime_us_per_job']} us of CPU per no-op job "
              f"(best of {RUNS} runs of {options.jobs:,}, {options.concurrency} slots, "
              f"no HTTP), counts {figures['worker_runtime_counts']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
