"""Notifications on a real 3-node cluster: a receiver on loopback is stopped mid-way and
started again, the leader is killed once, and still every event the receiver should get
arrives at least once, every signature verifies, and a repeat carries the same delivery id
(and the same bytes) as the first post."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
import threading
import uuid
from typing import Any

import pytest
from aiohttp import web

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

pytestmark = pytest.mark.processes  # starts nodes: make integration

SECRET = "receiver-secret-0123456789"


class Receiver:
    """An aiohttp server on 127.0.0.1 in a thread of the test, on a port that stays its own
    across stop() and start(); it records every POST it answered 200 to."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner: web.AppRunner | None = None
        self.holding = False
        self.released = asyncio.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        with self.lock:
            self.posts.append((dict(request.headers), body))
        if self.holding:  # got it, but the answer waits: a sender killed now never hears it
            await self.released.wait()
        return web.Response(text="ok")

    def hold(self) -> None:
        self.holding = True
        self.released = asyncio.Event()

    def release(self) -> None:
        self.holding = False
        self.loop.call_soon_threadsafe(self.released.set)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def _stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def start(self) -> None:
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def received(self) -> list[tuple[dict[str, str], bytes]]:
        with self.lock:
            return list(self.posts)


@pytest.fixture
def receiver() -> Any:
    found = Receiver()
    found.start()
    try:
        yield found
    finally:
        found.close()


def dead_letter(cluster: LocalCluster, queue: str) -> int:
    """A job that fails for good, through the API (no worker process needed)."""
    rid = uuid.uuid4().hex
    status, job, _ = cluster.call("POST", "/v1/jobs", {"task": "t", "queue": queue,
                                                       "max_attempts": 1, "request_id": rid})
    assert status == 201, job
    status, claimed, _ = cluster.call("POST", "/v1/claims", {
        "worker": "w", "queues": [queue], "max": 1, "wait_ms": 0, "request_id": rid + "-c"})
    assert status == 200 and [j["id"] for j in claimed["jobs"]] == [job["id"]], claimed
    token = claimed["jobs"][0]["token"]
    status, failed, _ = cluster.call("POST", f"/v1/jobs/{job['id']}/fail", {
        "token": token, "error": "no luck", "retryable": False, "request_id": rid + "-f"})
    assert status == 200 and failed["status"] == "failed", failed
    return int(job["id"])


def dead_letters_in(posts: list[tuple[dict[str, str], bytes]]) -> list[int]:
    """The job of every dead-letter post, repeats included."""
    events = [json.loads(body) for _, body in posts]
    return [event["data"]["job"] for event in events if event["event"] == "dead_letter"]


def failed_posts(cluster: LocalCluster, node: LocalNode) -> int:
    _, metrics, _ = cluster.request(node, "GET", "/metrics")
    return sum(int(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("raftcron_notification_posts_total") and "failed" in line)


def test_a_receiver_stopped_and_a_leader_killed_still_get_every_event_at_least_once(
    cluster: LocalCluster, receiver: Receiver
) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    status, created, _ = cluster.call("PUT", "/v1/notifications/ops", {
        "url": receiver.url, "events": ["dead_letter", "leader_changed"], "secret": SECRET,
        "request_id": "put-ops"})
    assert status == 201 and "secret" not in created, created

    def seen() -> set[int]:
        return set(dead_letters_in(receiver.received()))

    first = {dead_letter(cluster, queue) for _ in range(3)}
    cluster.wait_for(lambda: first <= seen(), 20, "the first dead letters")

    # The receiver gets a post but holds its answer; the leader that sent it is killed.
    receiver.hold()
    held = dead_letter(cluster, queue)
    cluster.wait_for(lambda: held in seen(), 20, "the held post")
    old_leader = cluster.leader()
    cluster.kill(old_leader)
    new_leader = cluster.leader(timeout_s=20)
    new_term = cluster.request(new_leader, "GET", "/v1/cluster")[1]["term"]
    # The new leader resumes at the replicated cursor: the held event is posted again.
    cluster.wait_for(lambda: dead_letters_in(receiver.received()).count(held) >= 2, 20,
                     "the held event posted again by the new leader")
    receiver.release()

    # The receiver goes down: the cluster keeps going, the events wait and are retried.
    receiver.stop()
    while_down = {dead_letter(cluster, queue) for _ in range(3)}
    cluster.wait_for(lambda: failed_posts(cluster, new_leader) >= 1, 20, "a failed post")
    receiver.start()

    expected = first | {held} | while_down

    def everything_arrived() -> bool:
        terms = {json.loads(body)["data"]["term"] for _, body in receiver.received()
                 if json.loads(body)["event"] == "leader_changed"}
        return expected <= seen() and new_term in terms

    cluster.wait_for(everything_arrived, 60, "every event at the restarted receiver")
    cluster.start_node(old_leader)

    by_id: dict[str, bytes] = {}
    for headers, body in receiver.received():
        signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["X-Raftcron-Signature"], signature)
        event = json.loads(body)
        delivery = headers["X-Raftcron-Delivery"]
        assert delivery == event["delivery"] == f"ops/{event['seq']}"
        assert headers["X-Raftcron-Event"] == event["event"]
        assert by_id.setdefault(delivery, body) == body  # a repeat is the same post
    assert len(receiver.received()) > len(by_id)  # the held one, at least, came twice
    assert sorted(dead_letters_in([({}, body) for body in by_id.values()])) == sorted(expected)

    def acknowledged() -> dict[str, Any] | None:
        status, shown, _ = cluster.call("GET", "/v1/notifications/ops?consistent=1")
        assert status == 200, shown
        return shown if shown["pending"] == 0 else None

    shown = cluster.wait_for(acknowledged, 20, "every delivery acknowledged")
    assert (shown["delivered"], shown["lost"]) == (len(by_id), 0)
    assert "secret" not in shown
    cluster.wait_ready(timeout_s=30)
    # The old leader, back: its metrics show the replicated figures like every member's.
    status, metrics, _ = cluster.request(old_leader, "GET", "/metrics")
    assert status == 200
    assert f'raftcron_notification_delivered_total{{notification="ops"}} {len(by_id)}' in metrics
