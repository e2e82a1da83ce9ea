"""Node behaviour the worker depends on, pinned by tests written when it was wrong."""

from __future__ import annotations

import json
import socket
import time

from raftcron.cluster.clients.client import Client
from raftcron.cluster.dev.localcluster import LocalCluster

from .conftest import StartWorker, request_table_bytes

GHOST_LEASE_MS = 3_000


def test_a_long_poll_of_a_worker_that_died_claims_nothing(
    cluster: LocalCluster, client: Client, queue: str, start_worker: StartWorker
) -> None:
    node = cluster.nodes[0]
    # A job the ghost holds, so that its claim's ack shows when the claim has started waiting.
    held_queue = f"{queue}-held"[:100]
    held = client.submit("echo", {}, queue=held_queue)
    [job] = client.request(
        "POST",
        "/v1/claims",
        {"worker": "holder", "queues": [held_queue], "max": 1, "lease_ms": 60_000},
        write=True,
    )["jobs"]
    assert job["id"] == held["id"]

    body = json.dumps(
        {
            "worker": "ghost",
            "queues": [queue],
            "max": 1,
            "lease_ms": GHOST_LEASE_MS,
            "wait_ms": 20_000,
            "acks": [{"id": job["id"], "token": job["token"], "outcome": "succeeded"}],
        }
    ).encode()
    host, port = node.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as ghost:
        ghost.sendall(
            b"POST /v1/claims HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # Round 0 (the ack) is committed at once; the claim then waits for work.
        client.wait(held["id"], timeout_s=10)
    # The ghost hung up (the worker died). A job arrives, and a live worker is there for it.
    late = client.submit("echo", {}, queue=queue)
    start_worker(queue, "w-live")
    done = client.wait(late["id"], timeout_s=30)
    assert [a["worker"] for a in done["history"]] == ["w-live"], done["history"]


def test_a_long_poll_that_waits_out_its_time_with_nothing_queued_writes_nothing(
    client: Client, queue: str
) -> None:
    """An idle worker's poll: nothing to lease, nothing to ack, so nothing is proposed (it took
    a log entry, a sync on every member and a request-table entry each time)."""

    before = request_table_bytes(client)
    for n in range(3):
        started = time.monotonic()
        answer = client.request("POST", "/v1/claims", {
            "worker": "idle", "queues": [queue], "max": 4, "wait_ms": 300,
            "request_id": f"{queue}-idle-{n}"}, write=True)
        assert answer == {"jobs": [], "acks": []}
        assert time.monotonic() - started >= 0.3  # it waited its time out
    assert request_table_bytes(client) == before
    # A poll that finds a job still claims it, under its request id.
    job = client.submit("echo", {}, queue=queue)
    [claimed] = client.request("POST", "/v1/claims", {
        "worker": "busy", "queues": [queue], "max": 4, "wait_ms": 300,
        "request_id": f"{queue}-busy"}, write=True)["jobs"]
    assert claimed["id"] == job["id"] and request_table_bytes(client) > before
