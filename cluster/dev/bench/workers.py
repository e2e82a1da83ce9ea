"""The bench's worker processes: real `raftcron worker`s running the no-op task.

What it owns: the worker's command line, starting W of them in their own process groups,
waiting until each waits on a claim, and stopping them. Every process it starts is stopped by
`stop_workers` (SIGTERM, then SIGKILL after a bound), by its process group id only; callers
call it in a `finally`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from raftcron.cluster.dev.bench.scrape import sample

if TYPE_CHECKING:
    from raftcron.cluster.dev.bench.measures import Target

REPO = str(Path(__file__).resolve().parents[3])
STOP_S = 30.0  # a worker's own drain of its running no-op jobs takes far less


def start_workers(
    target: Target, *, queues: list[str], workers: int, concurrency: int
) -> list[subprocess.Popen[bytes]]:
    """Start `workers` worker processes on `queues`, each with `concurrency` slots."""
    command = [
        sys.executable,
        "-m",
        "raftcron.cluster.cli",
        "worker",
        "--connect",
        ",".join(target.urls),
        "--queues",
        ",".join(queues),
        "--concurrency",
        str(concurrency),
        "--import",
        "raftcron.cluster.dev.bench.tasks",
        "--no-shell",
        "--wait-ms",
        "1000",
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "PYTHONPATH": REPO}
    if target.token:
        env["RAFTCRON_API_TOKEN"] = target.token
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(workers):
            processes.append(
                subprocess.Popen(
                    command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, start_new_session=True
                )
            )
    except BaseException:
        stop_workers(processes)
        raise
    return processes


def stop_workers(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each worker's process group, then wait; SIGKILL the ones still there."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_S
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(STOP_S)


def exited(processes: list[subprocess.Popen[bytes]]) -> bool:
    return any(process.poll() is not None for process in processes)


async def until_waiting(
    target: Target, workers: int, processes: list[subprocess.Popen[bytes]], deadline: float
) -> None:
    """Until the cluster's nodes hold `workers` long-polling claims (each worker started and
    connected), bounded by `deadline`."""
    while time.monotonic() < deadline:
        if exited(processes):
            raise RuntimeError("a bench worker exited early")
        waiting = 0
        for url in target.urls:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with target.session.get(url + "/metrics") as answer:
                    waiting += int(sample(await answer.text(), "raftcron_claims_waiting"))
        if waiting >= workers:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the {workers} bench workers were not all waiting on a claim in time")
