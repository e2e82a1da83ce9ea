"""Draining a queue as a worker does, over the API: claim, then complete what was claimed
with the next claim (one round trip each); bounded in rounds. And waiting, bounded, until what
left the state is in every member's archive."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

ROUNDS_MAX = 200


def drain(cluster: LocalCluster, queue: str, limit: int = 1_000,
          result: Callable[[dict[str, Any]], Any] | None = None) -> int:
    """Claim and complete what `queue` holds (at most `limit` jobs); how many were completed.
    `result`: what each job reports, from its claimed view (none when not given)."""
    done = 0
    acks: list[dict[str, Any]] = []
    for round_number in range(ROUNDS_MAX):
        body = {"worker": "w", "queues": [queue], "max": 50, "lease_ms": 30_000,
                "request_id": f"drain-{queue}-{round_number}-{time.monotonic_ns()}",
                "acks": acks}
        status, answer, _ = cluster.call("POST", "/v1/claims", body)
        assert status == 200, answer
        done += len(acks)
        acks = [{"id": job["id"], "token": job["token"], "outcome": "succeeded",
                 **({} if result is None else {"result": result(job)})}
                for job in answer["jobs"]]
        if not acks or done >= limit:
            return done
    raise AssertionError(f"{queue} not drained in {ROUNDS_MAX} rounds")


def job_on(cluster: LocalCluster, node: LocalNode, job_id: int) -> dict[str, Any] | None:
    status, body, _ = cluster.request(node, "GET", f"/v1/jobs/{job_id}")
    if status == 404:
        return None
    assert status == 200, body
    return dict(body)


def wait_archived(cluster: LocalCluster, job_ids: list[int], what: str) -> None:
    """Until every member answers each of `job_ids` from its archive (bounded)."""
    cluster.wait_for(lambda: all(
        (job_on(cluster, node, job_id) or {}).get("archived") is True
        for node in cluster.nodes for job_id in job_ids) or None,
        15, f"{what} archived on every member")


def keep_succeeded(cluster: LocalCluster, max_count: int) -> None:
    """Retention keeps at most `max_count` succeeded jobs: the rest leave for the archive."""
    status, body, _ = cluster.call("PUT", "/v1/settings/retention",
                                   {"succeeded": {"max_count": max_count}},
                                   token=cluster.admin_token)
    assert status == 200, body
