"""A stand-in for the cluster's worker routes, in process, for fast runtime and client tests.

It keeps just enough state to answer like the cluster: queued jobs, leases with a strictly
increasing token, acks checked against the current token, heartbeats that answer 409 for a
job the test revoked, and 503s on demand. It records every request (path, request id, body)
so a test can check what the worker sent. It can listen on several ports at once, so a test
can give a worker "several nodes" that share one state.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Recorded:
    path: str
    request_id: str | None
    body: Any
    port: int
    authorization: str | None = None


@dataclass
class FakeJob:
    id: int
    task: str
    payload: Any = None
    token: int = 0
    status: str = "queued"
    acks: list[dict[str, Any]] = field(default_factory=list)


class FakeApi:
    def __init__(self) -> None:
        self.jobs: dict[int, FakeJob] = {}
        self.fence = 0
        self.revoked: dict[int, str] = {}  # job id -> the 409 code its heartbeats get
        self.refuse_progress = False  # answer a heartbeat's `progress` as an older node does
        self.unavailable_next = 0  # answer this many next requests with 503
        self.leader: str | None = None  # X-Raftcron-Leader on every answer, when set
        self.requests: list[Recorded] = []
        self.changed = asyncio.Event()
        self.runners: list[web.AppRunner] = []
        self.urls: list[str] = []

    # -- the test's side ---------------------------------------------------------------------

    def add_job(self, task: str, payload: Any = None) -> FakeJob:
        job = FakeJob(len(self.jobs) + 1, task, payload)
        self.jobs[job.id] = job
        self._wake()
        return job

    def calls(self, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.path == path]

    def acks_sent(self) -> list[dict[str, Any]]:
        return [ack for r in self.calls("/v1/claims") for ack in r.body.get("acks") or []]

    async def wait_until(self, condition: Any, timeout_s: float = 10.0) -> None:
        """Until `condition()` is true, woken by every request; TimeoutError after timeout_s."""
        async with asyncio.timeout(timeout_s):
            while not condition():
                event = self.changed
                await event.wait()

    async def start(self, ports: int = 1) -> list[str]:
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/claims", self.claim),
                web.post("/v1/jobs/{id}/heartbeat", self.heartbeat),
                web.post("/v1/jobs/{id}/complete", self.complete),
                web.post("/v1/jobs/{id}/fail", self.fail),
                web.post("/v1/jobs", self.submit),
            ]
        )
        app.on_response_prepare.append(self._name_the_leader)
        for _ in range(ports):
            runner = web.AppRunner(app, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            self.runners.append(runner)
            self.urls.append(f"http://127.0.0.1:{port}")
        return self.urls

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()

    # -- the routes --------------------------------------------------------------------------

    async def _name_the_leader(self, request: web.Request, response: web.StreamResponse) -> None:
        if self.leader is not None:
            response.headers["X-Raftcron-Leader"] = self.leader

    def _wake(self) -> None:
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    async def _record(self, request: web.Request) -> tuple[Any, web.Response | None]:
        body = await request.json() if request.can_read_body else None
        request_id = request.headers.get("X-Request-Id")
        if isinstance(body, dict):
            request_id = body.get("request_id", request_id)
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        authorization = request.headers.get("Authorization")
        self.requests.append(Recorded(request.path, request_id, body, port, authorization))
        self._wake()
        if self.unavailable_next > 0:
            self.unavailable_next -= 1
            error = {"code": "unavailable", "message": "no leader (fake)"}
            return body, web.json_response({"error": error}, status=503)
        return body, None

    def _apply_ack(self, ack: dict[str, Any]) -> str:
        job = self.jobs.get(ack["id"])
        if job is None:
            return "not_found"
        if job.id in self.revoked:
            return self.revoked[job.id]
        if ack["token"] != job.token or job.status != "running":
            return "stale_token"
        job.acks.append(ack)
        job.status = ack["outcome"]
        return "ok"

    async def claim(self, request: web.Request) -> web.Response:
        body, refused = await self._record(request)
        if refused is not None:
            return refused
        outcomes = [{"id": a["id"], "outcome": self._apply_ack(a)} for a in body.get("acks", [])]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + body.get("wait_ms", 0) / 1000
        claimed: list[dict[str, Any]] = []
        while body["max"] > 0:
            for job in self.jobs.values():
                if job.status == "queued" and len(claimed) < body["max"]:
                    self.fence += 1
                    job.token, job.status = self.fence, "running"
                    claimed.append(self._view(job, body["lease_ms"]))
            if claimed or loop.time() >= deadline:
                break
            event = self.changed
            try:
                await asyncio.wait_for(event.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                break
        return web.json_response({"jobs": claimed, "acks": outcomes})

    def _view(self, job: FakeJob, lease_ms: int) -> dict[str, Any]:
        return {
            "id": job.id,
            "key": f"key-{job.id}",
            "task": job.task,
            "queue": "default",
            "payload": job.payload,
            "attempt": 1,
            "token": job.token,
            "lease_until_ms": None,
            "lease_ms": lease_ms,
            "timeout_ms": None,
            "schedule": None,
            "fire_time_ms": None,
        }

    async def heartbeat(self, request: web.Request) -> web.Response:
        body, refused = await self._record(request)
        if refused is not None:
            return refused
        job_id = int(request.match_info["id"])
        if self.refuse_progress and "progress" in body:
            error = {"code": "invalid", "message": "unknown field (known: lease_ms, request_id, "
                     "token)", "field": "progress"}
            return web.json_response({"error": error}, status=400)
        if job_id in self.revoked:
            error = {"code": self.revoked[job_id], "message": "revoked by the test"}
            return web.json_response({"error": error}, status=409)
        return web.json_response({"id": job_id, "lease_until_ms": 0})

    async def complete(self, request: web.Request) -> web.Response:
        _body, refused = await self._record(request)
        return refused or web.json_response({"id": int(request.match_info["id"])})

    async def fail(self, request: web.Request) -> web.Response:
        _body, refused = await self._record(request)
        return refused or web.json_response({"id": int(request.match_info["id"])})

    async def submit(self, request: web.Request) -> web.Response:
        body, refused = await self._record(request)
        if refused is not None:
            return refused
        job = self.add_job(body["task"], body.get("payload"))
        return web.json_response({"id": job.id, "created": True}, status=201)
