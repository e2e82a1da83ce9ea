"""The scale measure: many schedules and a million retained jobs on a local cluster.

Builds the state through the API (schedules one PUT each; jobs in batches of 1,000, then
claimed and acknowledged 1,000 at a time, so they are retained as succeeded), then reads:
RSS of every node, the full dump's size and how long its (forked) writer took after a forced
compaction, restart-to-ready of a follower killed with SIGKILL (before any compaction, and
after one on every node), and the core's Tick cost with
that many schedules (measured in-process, as the leader applies it).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from raftcron.cluster.dev.bench.stats import ProgressLine
from raftcron.cluster.dev.bench.target import BenchTarget
from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def measure(target: BenchTarget, *, schedules: int, jobs: int) -> dict[str, Any]:
    cluster = target.cluster
    if cluster is None:
        return {"scale_note": "the scale measure needs a cluster started by the bench"}
    await _put_schedules(target, schedules)
    await _retain_jobs(target, jobs)
    figures: dict[str, Any] = {"scale_schedules": schedules, "scale_jobs": jobs}
    figures["rss_mb_per_node"] = rss_per_node(cluster)
    # First with the whole build still in the journal (no compaction has run yet: PySyncObj
    # compacts at most every raft.compaction_min_time_s), the worst a restart can meet ...
    figures |= {f"{k}_journal": v for k, v in (await restart_to_ready(target)).items()}
    # ... then as a node usually restarts: from its last dump and a short journal.
    leader = cluster.leader()
    figures |= await snapshot(target, leader)  # the leader's dump is the one reported
    for node in cluster.nodes:
        if node is not leader:
            await snapshot(target, node)
    figures |= await restart_to_ready(target)
    figures["rss_mb_per_node_after_compaction"] = rss_per_node(cluster)
    from raftcron.cluster.dev.corebench import tick_cost_ms

    figures |= {
        f"core_{k}": round(v, 3) for k, v in tick_cost_ms(schedules, min(1_000, schedules)).items()
    }
    return figures


async def _put_schedules(target: BenchTarget, count: int) -> None:
    progress = ProgressLine("scale schedules", count, quiet=target.quiet)
    sem = asyncio.Semaphore(32)
    done = 0

    async def put(index: int) -> None:
        nonlocal done
        # Daily crons at spread minutes: they exist and are indexed, but rarely fire.
        spec = {
            "cron": f"{index % 60} {index % 24} * * *",
            "job": {"task": "noop", "queue": "scale-fires"},
        }
        async with sem:
            status, body = await target.call("PUT", f"/v1/schedules/scale-{index}", spec)
        if status not in (200, 201):
            raise RuntimeError(f"schedule put answered {status}: {body}")
        done += 1
        progress.update(done)

    await asyncio.gather(*(put(i) for i in range(count)))
    progress.done(f"{count:,} schedules")


async def _retain_jobs(target: BenchTarget, count: int) -> None:
    progress = ProgressLine("scale jobs", count, quiet=target.quiet)
    queue = "scale-retained"
    batch = {"jobs": [{"task": "noop", "queue": queue, "payload": {"n": 1}}] * 1_000}
    url = await target.leader_url()
    acks: list[dict[str, Any]] = []
    done = 0
    for _ in range(count // 1_000):
        status, body = await target.call("POST", "/v1/jobs/batch", batch, url=url)
        if status != 201:
            raise RuntimeError(f"batch submit answered {status}: {str(body)[:200]}")
        claim = {
            "worker": "bench-scale",
            "queues": [queue],
            "max": 1_000,
            "wait_ms": 0,
            "acks": acks,
        }
        status, body = await target.call("POST", "/v1/claims", claim, url=url)
        if status != 200:
            raise RuntimeError(f"claim answered {status}: {str(body)[:200]}")
        acks = [
            {"id": job["id"], "token": job["token"], "outcome": "succeeded"} for job in body["jobs"]
        ]
        done += len(acks)
        progress.update(done)
    if acks:
        await target.call(
            "POST",
            "/v1/claims",
            {"worker": "bench-scale", "queues": [queue], "max": 0, "acks": acks},
            url=url,
        )
    progress.done(f"{count:,} jobs retained (succeeded)")


def rss_per_node(cluster: LocalCluster) -> list[float]:
    return [round(rss_mb(node.pid), 1) for node in cluster.nodes if node.pid]


async def snapshot(target: BenchTarget, node: LocalNode) -> dict[str, Any]:
    """Force a compaction on a node; the dump's size and the time until it was written."""
    dump = node.data_dir / "snapshot"  # made current by the node once written and synced
    before = dump.stat().st_mtime if dump.exists() else 0.0
    started = time.monotonic()
    status, body = await target.call("POST", "/v1/cluster/compact", {}, url=node.url)
    if status != 202:
        return {"snapshot_note": f"compact answered {status}: {body}"}
    for _ in range(3_000):
        if dump.exists() and dump.stat().st_mtime > before:
            break
        await asyncio.sleep(0.1)
    return {
        "snapshot_bytes": dump.stat().st_size if dump.exists() else None,
        "snapshot_s": round(time.monotonic() - started, 2),
    }


async def restart_to_ready(target: BenchTarget) -> dict[str, Any]:
    cluster = target.cluster
    assert cluster is not None
    leader = cluster.leader()
    follower = next(node for node in cluster.nodes if node is not leader)
    status, view = await target.call("GET", "/v1/cluster", url=leader.url)
    commit_index = view["commit_index"]
    cluster.kill(follower)
    started = time.monotonic()
    cluster.start_node(follower)
    for _ in range(6_000):
        try:
            status, body = await target.call("GET", "/readyz", url=follower.url, attempts=1)
        except Exception:
            status, body = 0, {}
        if status == 200 and body.get("applied_index", 0) >= commit_index:
            break
        await asyncio.sleep(0.05)
    elapsed = time.monotonic() - started
    return {
        "restart_to_ready_s": round(elapsed, 2),
        "rss_mb_after_restart": round(rss_mb(follower.pid), 1) if follower.pid else None,
    }
