"""What idle long-polling claims cost the node:
`python -m raftcron.cluster.dev.bench.longpoll [WAITERS]`.

One node (loopback, a temporary folder). WAITERS claims long-poll queue `idle` (each re-sent
when it returns), while jobs are submitted to queue `busy` and claimed there, so entries keep
applying with queued jobs in another queue. Prints the node process's CPU (user + system, from
/proc) over the measured seconds, as a share of one core. Every process it starts is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import aiohttp

from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster

MEASURE_S = 10.0
SUBMITS_PER_S = 100


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(url: str, waiters: int, pid: int) -> dict[str, float]:
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=waiters + 10)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def wait_idle() -> None:
            body = {"worker": "idle", "queues": ["idle"], "max": 1, "wait_ms": 30_000}
            while not stop.is_set():
                async with session.post(f"{url}/v1/claims", json=body) as answer:
                    await answer.read()

        async def busy() -> None:
            while not stop.is_set():
                async with session.post(f"{url}/v1/jobs", json={"task": "t", "queue": "busy"}):
                    pass
                claim = {"worker": "busy", "queues": ["busy"], "max": 1}
                async with session.post(f"{url}/v1/claims", json=claim) as answer:
                    jobs = (await answer.json())["jobs"]
                for job in jobs:
                    done = {"token": job["token"]}
                    async with session.post(f"{url}/v1/jobs/{job['id']}/complete", json=done):
                        pass
                await asyncio.sleep(1 / SUBMITS_PER_S)

        tasks = [asyncio.create_task(wait_idle()) for _ in range(waiters)]
        tasks.append(asyncio.create_task(busy()))
        await asyncio.sleep(3.0)  # every waiter is in
        before, started = cpu_s(pid), time.monotonic()
        await asyncio.sleep(MEASURE_S)
        used_s, elapsed_s = cpu_s(pid) - before, time.monotonic() - started
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"waiters": waiters, "node_cpu_share_of_a_core": round(used_s / elapsed_s, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raftcron.cluster.dev.bench.longpoll")
    parser.add_argument("waiters", type=int, nargs="?", default=500)
    args = parser.parse_args(argv)
    if not 0 <= args.waiters <= 5_000:
        parser.error("waiters must be from 0 to 5000")
    with tempfile.TemporaryDirectory() as folder, \
            LocalCluster(Path(folder), nodes=1, raft=FAST_RAFT) as cluster:
        cluster.start()
        node = cluster.wait_ready()
        assert node.pid is not None
        figures = asyncio.run(load(node.url, args.waiters, node.pid))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
