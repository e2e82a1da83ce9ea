"""The bench's worker processes: real `raftcron worker`s running the no-op task.

What it owns: the worker's command line, starting W of them in their own process groups
(their logs on the bench's stderr, or each in a file of a folder), waiting until each waits on
a claim, stopping them, and counting what their log files warned of. Every process it starts
is stopped by `stop_workers` (SIGTERM, then SIGKILL after a bound), by its process group id
only; callers call it in a `finally`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from raftcron.cluster.dev.bench.scrape import sample
from raftcron.cluster.dev.bench.target import BenchTarget

REPO = str(Path(__file__).resolve().parents[3])
STOP_S = 30.0  # a worker's own drain of its running no-op jobs takes far less


def start_workers(
    target: BenchTarget,
    *,
    queues: list[str],
    workers: int,
    concurrency: int,
    log_dir: Path | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start `workers` worker processes on `queues`, each with `concurrency` slots; their logs
    go to `log_dir`/worker-<n>.log when given."""
    command = [
        sys.executable,
        "-m",
        "raftcron.cluster.commandline",
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
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    try:
        for index in range(workers):
            log = None if log_dir is None else (log_dir / f"worker-{index + 1}.log").open("ab")
            try:
                processes.append(
                    subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                     stderr=log, start_new_session=True)
                )
            finally:
                if log is not None:
                    log.close()  # the child holds its own descriptor
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
    target: BenchTarget, workers: int, processes: list[subprocess.Popen[bytes]], deadline: float
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


def logged_actions(log_dir: Path) -> dict[str, int]:
    """How many warnings and errors the workers' log files hold, by `level action`."""
    counts: dict[str, int] = {}
    for path in sorted(log_dir.glob("worker-*.log")):
        with path.open(errors="replace") as lines:
            for line in lines:
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict) and record.get("level") in ("warning", "error"):
                        key = f"{record['level']} {record.get('action', '-')}"
                        counts[key] = counts.get(key, 0) + 1
    return counts
