"""A worker outlives the node it talks to, and the client covers the whole API against a real
cluster: batches, workflows, schedules (whose shell jobs see their schedule and fire time),
cancel, retry and cluster status."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster.clients.client import ApiError, Client
from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster

from .conftest import StartWorker, eventually, markers


@pytest.fixture
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster of this test alone: it kills one of the nodes."""
    with LocalCluster(tmp_path_factory.mktemp("own-cluster"), raft=FAST_RAFT) as local:
        local.start()
        local.wait_ready(30)
        yield local


def test_killing_the_node_a_worker_talks_to_does_not_stop_the_worker(
    own_cluster: LocalCluster, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    leader = own_cluster.leader()
    others = [node.url for node in own_cluster.nodes if node is not leader]
    # The worker talks to the leader first; the test's client to the others.
    worker = start_worker(queue, "w-failover", urls=[leader.url, *others], lease_ms=3000)
    with Client(others, retry_deadline_s=30) as client:
        job = client.submit(
            "block", {"dir": str(tmp_path), "release": str(tmp_path / "release")}, queue=queue
        )
        eventually(lambda: markers(tmp_path, job["id"], "started"))
        own_cluster.kill(leader)
        own_cluster.wait_ready()
        # A new leader extends every lease once; after that only a heartbeat that reached it
        # through another node can extend the lease again.
        lease_until_ms = client.job(job["id"], consistent=True)["lease_until_ms"]
        eventually(
            lambda: (client.job(job["id"])["lease_until_ms"] or 0) > lease_until_ms,
            what="a heartbeat to extend the lease after the kill",
        )
        (tmp_path / "release").touch()

        done = client.wait(job["id"], timeout_s=30)
        assert done["status"] == "succeeded", done
        assert done["result"]["worker"] == "w-failover" and done["attempts"] == 1
        after = client.submit("echo", {"after": "the kill"}, queue=queue)
        done_after = client.wait(after["id"], timeout_s=30)
        assert done_after["status"] == "succeeded"
        assert done_after["result"]["worker"] == "w-failover"
    assert worker.process.poll() is None
    assert worker.events("node_failover"), worker.log_tail()


def test_the_client_covers_batches_workflows_schedules_and_status(
    client: Client, queue: str, start_worker: StartWorker
) -> None:
    start_worker(queue, "w-client")
    status = client.cluster()
    assert status["leader"] and len(status["members"]) == 3

    first = client.submit("echo", {"n": 1}, queue=queue, key=f"{queue}-once")
    again = client.submit("echo", {"n": 2}, queue=queue, key=f"{queue}-once")
    assert first["created"] is True and again["created"] is False and again["id"] == first["id"]

    batch = client.submit_batch(
        [{"task": "echo", "payload": {"i": i}, "queue": queue} for i in range(3)]
    )
    for job in batch:
        assert client.wait(job["id"], timeout_s=30)["status"] == "succeeded"

    flow = client.submit_workflow(
        [
            {"name": "extract", "task": "echo", "queue": queue},
            {"name": "load", "task": "echo", "queue": queue, "after": ["extract"]},
        ]
    )
    ids = {job["name"]: job["id"] for job in flow["jobs"]}
    extract = client.wait(ids["extract"], timeout_s=30)
    load = client.wait(ids["load"], timeout_s=30)
    assert extract["status"] == load["status"] == "succeeded"
    assert load["history"][0]["start_ms"] >= extract["history"][0]["end_ms"]
    with pytest.raises(ApiError) as cycle:
        client.submit_workflow(
            [
                {"name": "a", "task": "echo", "queue": queue, "after": ["b"]},
                {"name": "b", "task": "echo", "queue": queue, "after": ["a"]},
            ]
        )
    assert cycle.value.status == 400

    later = client.submit("echo", {}, queue=queue, delay_ms=3_600_000)
    assert client.cancel(later["id"], reason="not needed")["status"] == "cancelled"
    assert client.retry(later["id"])["status"] in ("queued", "scheduled")
    client.cancel(later["id"])

    name = f"{queue}-every"[:100]
    script = 'echo "$RAFTCRON_SCHEDULE@$RAFTCRON_FIRE_TIME_MS $RAFTCRON_JOB_KEY"'
    spec = {
        "every": "1s",
        "job": {"task": "shell", "queue": queue, "payload": {"argv": ["sh", "-c", script]}},
    }
    created = client.put_schedule(name, spec)
    assert created["name"] == name
    assert len(client.preview_schedule(name, count=3)) == 3
    assert name in [s["name"] for s in client.schedules()]

    def a_fired_job_succeeded() -> dict[str, Any] | None:
        jobs: list[dict[str, Any]] = client.jobs(schedule=name, status="succeeded")["jobs"]
        return jobs[0] if jobs else None

    fired = eventually(a_fired_job_succeeded, 30, "a fire of the schedule to run")
    assert fired is not None
    key = f"{name}@{fired['fire_time_ms']}"
    assert fired["key"] == key
    assert fired["result"]["stdout"] == f"{key} {key}\n"

    assert client.pause_schedule(name)["paused"] is True
    assert client.trigger_schedule(name, force=True)["job"] is not None
    now_ms = int(time.time() * 1000)
    backfilled = client.backfill_schedule(name, now_ms - 3_000, now_ms - 1_000)
    assert 1 <= len(backfilled) <= 3
    client.delete_schedule(name)
    with pytest.raises(ApiError) as gone:
        client.schedule(name)
    assert gone.value.status == 404
