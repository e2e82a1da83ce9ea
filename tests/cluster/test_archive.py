"""The archive on a real cluster (DESIGN.md §9.2): a job that retention evicts is still found
by id on every member, as it was when it finished, with `"archived": true`; across a restart
from a snapshot that covers the eviction, and after a `kill -9` of a member that had just
applied it."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import ClusterKeeper

from raftcron.cluster.dev.localcluster import LocalCluster, LocalNode

pytestmark = pytest.mark.processes


def drain(cluster: LocalCluster, queue: str) -> None:
    acks: list[dict[str, Any]] = []
    for round_number in range(100):
        status, answer, _ = cluster.call("POST", "/v1/claims", {
            "worker": "archiver", "queues": [queue], "max": 50, "lease_ms": 30_000,
            "request_id": f"drain-{queue}-{round_number}", "acks": acks})
        assert status == 200, answer
        acks = [{"id": job["id"], "token": job["token"], "outcome": "succeeded",
                 "result": {"done": job["payload"]["customer"]}} for job in answer["jobs"]]
        if not acks:
            return
    raise AssertionError(f"{queue} not drained in 100 rounds")


def job_on(cluster: LocalCluster, node: LocalNode, job_id: int) -> dict[str, Any] | None:
    status, body, _ = cluster.request(node, "GET", f"/v1/jobs/{job_id}")
    if status == 404:
        return None
    assert status == 200, body
    return dict(body)


def submit(cluster: LocalCluster, queue: str, count: int) -> list[int]:
    status, created, _ = cluster.call("POST", "/v1/jobs/batch", {"jobs": [
        {"task": "invoice", "queue": queue, "payload": {"customer": {"id": n}}}
        for n in range(count)]})
    assert status == 201, created
    return [job["id"] for job in created["jobs"]]


def test_an_evicted_job_is_found_archived_on_every_member_and_after_restarts(
        cluster_factory: ClusterKeeper) -> None:
    cluster = cluster_factory.open()
    status, body, _ = cluster.call("PUT", "/v1/settings/retention",
                                   {"succeeded": {"max_count": 5}}, token=cluster.admin_token)
    assert status == 200, body
    ids = submit(cluster, "billing", 12)
    drain(cluster, "billing")
    first = cluster.nodes[0]
    finished = {job_id: job_on(cluster, first, job_id) for job_id in ids}

    def archived_everywhere(job_ids: list[int]) -> bool:
        return all((job_on(cluster, node, job_id) or {}).get("archived") is True
                   for node in cluster.nodes for job_id in job_ids)

    evicted = ids[:7]  # the newest 5 stay
    cluster.wait_for(lambda: archived_everywhere(evicted) or None, 15,
                     "the 7 evicted jobs archived on every member")
    for node in cluster.nodes:
        for job_id in evicted:
            view = job_on(cluster, node, job_id)
            assert view is not None
            live = finished[job_id]
            assert live is not None and live["status"] == "succeeded"
            # What the job was when it left the state: status, payload, result, history.
            assert {**view, "archived": None} == {**live, "archived": None}, (node, job_id)
        for job_id in ids[7:]:
            view = job_on(cluster, node, job_id)
            assert view is not None and "archived" not in view

    # A snapshot covers the evictions, the log before it goes: restarted from it, a member
    # still finds them (the snapshot waited for the archive to make them durable).
    for node in cluster.nodes:
        status, _, _ = cluster.request(node, "POST", "/v1/cluster/compact",
                                       token=cluster.admin_token)
        assert status in (200, 202)
    cluster.restart(first)  # SIGKILL
    cluster.wait_ready(30)
    for job_id in evicted:
        view = job_on(cluster, first, job_id)
        assert view is not None and view["archived"] is True and view["payload"] == {
            "customer": {"id": ids.index(job_id)}}

    # Evictions applied just before a kill -9: replayed from the log, written again.
    more = submit(cluster, "billing", 5)
    drain(cluster, "billing")
    victim = cluster.nodes[1]
    cluster.wait_for(lambda: archived_everywhere(ids[7:]) or None, 15,
                     "the next 5 evicted jobs archived on every member")
    cluster.restart(victim)
    cluster.wait_ready(30)
    for job_id in ids:
        view = job_on(cluster, victim, job_id)
        assert view is not None and view["archived"] is True
    for job_id in more:
        view = job_on(cluster, victim, job_id)
        assert view is not None and "archived" not in view
