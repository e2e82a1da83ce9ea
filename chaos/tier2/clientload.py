"""The harness's own traffic: the submitter, the diamond workflows, the stale actor, the monitor.

What it owns: `ClientLoad`, on one asyncio thread (`LoopThread`, which flood.py's load shares):
the submitter (idempotency keys, some retried with the same key), the diamond workflows
A -> {B, C} -> D (some with A failing for good), the stale actor (completes and heartbeats with
tokens it knows are old) and the monitor (each node's role and term), all recorded in the
history. The schedules, the sink and the workers it runs beside are workload.py's.

It must not judge the results (checkers do) and never sleeps without a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

from raftcron.chaos.tier2.history import History
from raftcron.chaos.tier2.workload import JOB_DEFAULTS, TASK, read_sink
from raftcron.cluster.clients.asyncclient import AsyncClient
from raftcron.cluster.clients.clientparts import ApiError, RaftcronError, Unavailable

STATE_TIME_EVERY_S = 2.0  # how often the monitor records a node's state time when not ahead


class LoopThread:
    """An asyncio loop in a thread of its own, for the harness's loads: `start` runs `_main`
    there, `stop` sets `stopping` (which `_main` creates and waits on) and joins (bounded).
    Its loops run under `_guard` and end on `_stopped`; `_pause` sleeps until stopped."""

    THREAD_NAME = "chaos-load"
    LOOPS = "client loop"  # what a crash note calls this load's loops
    history: History

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread: threading.Thread | None = None
        self.submitting = threading.Event()
        self.stopping: asyncio.Event | None = None

    def start(self) -> None:
        self.submitting.set()
        self.thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread is None:
            return
        if self.stopping is not None:
            self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(timeout=30)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())
        self.loop.close()

    async def _main(self) -> None:
        raise NotImplementedError

    async def _guard(self, coroutine: Any) -> None:
        try:
            await coroutine
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a harness bug must show, not silently stop the load
            self.history.record("note", text=f"{self.LOOPS} crashed: {error!r}")
            raise

    def _stopped(self) -> bool:
        # Loops end on this flag, not only on cancellation: aiohttp can turn a cancellation
        # into a timeout that the client's retry loop then swallows.
        return self.stopping is not None and self.stopping.is_set()

    async def _pause(self, seconds: float) -> None:
        assert self.stopping is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)


class ClientLoad(LoopThread):
    """The harness's own traffic, on one asyncio loop in a thread."""

    THREAD_NAME = "chaos-client"

    def __init__(
        self, nodes: dict[str, str], history: History, sink: Path, seed: int,
        *, submit_every_s: float = 0.3, workflow_every_s: float = 4.0,
    ) -> None:
        self.nodes = nodes  # url -> node id
        self.urls = list(nodes)
        self.history = history
        self.sink = sink
        self.rng = random.Random(seed)
        self.submit_every_s = submit_every_s
        self.workflow_every_s = workflow_every_s
        super().__init__()
        self.acked: dict[str, int] = {}  # key -> job id
        self.tasks: list[asyncio.Task[None]] = []
        self.counter = 0

    def stop_submitting(self) -> None:
        self.submitting.clear()

    async def _main(self) -> None:
        from raftcron.chaos.tier2.nemesis import ADMIN, SUBMIT, WORKER

        self.stopping = asyncio.Event()
        self.submitter = AsyncClient(self.urls, token=SUBMIT, request_timeout_s=3,
                                     retry_deadline_s=10)
        self.worker_client = AsyncClient(self.urls, token=WORKER, request_timeout_s=3,
                                         retry_deadline_s=5)
        self.reader = AsyncClient(self.urls, token=ADMIN, request_timeout_s=2,
                                  retry_deadline_s=4)
        self.session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN}"})
        loops = [self._submit_loop(), self._workflow_loop(), self._stale_loop(),
                 self._monitor_loop()]
        self.tasks = [asyncio.create_task(self._guard(c)) for c in loops]
        await self.stopping.wait()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for client in (self.submitter, self.worker_client, self.reader):
            await client.close()
        await self.session.close()

    # -- submits --------------------------------------------------------------------------

    async def _submit_loop(self) -> None:
        while not self._stopped():
            await self._pause(self.submit_every_s * self.rng.uniform(0.5, 1.5))
            if not self.submitting.is_set():
                continue
            if self.acked and self.rng.random() < 0.1:
                key = self.rng.choice(sorted(self.acked))
                retry = True
            else:
                self.counter += 1
                key, retry = f"k-{self.counter}", False
            payload: dict[str, Any] = {"ms": self.rng.randint(50, 900)}
            if self.rng.random() < 0.15:
                payload["fail_attempts"] = 1  # one retryable failure: a second token
            await self.submit_one(key, payload, retry)

    async def submit_one(self, key: str, payload: dict[str, Any], retry: bool) -> None:
        self.history.record("submit", op="invoke", key=key, retry=retry)
        try:
            job = await self.submitter.submit(TASK, payload, key=key, **JOB_DEFAULTS)
        except Unavailable as error:
            self.history.record("submit", op="info", key=key, retry=retry, error=str(error)[:200])
            return
        except ApiError as error:
            self.history.record(
                "submit", op="fail", key=key, retry=retry, status=error.status, error=error.code
            )
            return
        except (RaftcronError, aiohttp.ClientError, OSError) as error:
            self.history.record("submit", op="info", key=key, retry=retry, error=repr(error)[:200])
            return
        self.acked.setdefault(key, int(job["id"]))
        self.history.record(
            "submit", op="ok", key=key, retry=retry, job_id=int(job["id"]),
            created=bool(job.get("created", True)),
        )

    # -- workflows ------------------------------------------------------------------------

    async def _workflow_loop(self) -> None:
        number = 0
        while not self._stopped():
            await self._pause(self.workflow_every_s * self.rng.uniform(0.7, 1.3))
            if not self.submitting.is_set():
                continue
            number += 1
            fails = self.rng.random() < 0.2
            key = f"wf-{number}"

            def node(name: str, after: list[str], payload: dict[str, Any]) -> dict[str, Any]:
                body = {"name": name, "task": TASK, "payload": payload, **JOB_DEFAULTS}
                if after:
                    body["after"] = after
                return body

            body = {
                "key": key,
                "jobs": [
                    node("A", [], {"ms": 200, **({"fail": "permanent"} if fails else {})}),
                    node("B", ["A"], {"ms": 300}),
                    node("C", ["A"], {"ms": 100, "fail_attempts": 1}),
                    node("D", ["B", "C"], {"ms": 100}),
                ],
            }
            self.history.record("workflow", op="invoke", key=key, fails=fails)
            try:
                answer = await self.submitter.request(
                    "POST", "/v1/workflows", body, write=True
                )
            except ApiError as error:  # a 507 state_full among them: definite, nothing made
                self.history.record("workflow", op="fail", key=key, fails=fails,
                                    status=error.status, code=error.code,
                                    error=repr(error)[:200])
                continue
            except (Unavailable, aiohttp.ClientError, OSError, RaftcronError) as error:
                self.history.record("workflow", op="info", key=key, fails=fails,
                                    error=repr(error)[:200])
                continue
            jobs = {item["name"]: int(item["id"]) for item in answer["jobs"]}
            self.history.record(
                "workflow", op="ok", key=key, fails=fails, jobs=jobs,
                workflow_id=answer.get("workflow_id"),
                edges={"B": ["A"], "C": ["A"], "D": ["B", "C"]},
            )

    # -- the stale actor ------------------------------------------------------------------

    async def _stale_loop(self) -> None:
        tried: set[tuple[int, int, str]] = set()
        while not self._stopped():
            await self._pause(self.rng.uniform(0.5, 1.5))
            rows = await asyncio.to_thread(read_sink, self.sink)
            tokens: dict[int, set[int]] = {}
            for row in rows:
                tokens.setdefault(row["job_id"], set()).add(row["token"])
            candidates = sorted(
                (job_id, min(found)) for job_id, found in tokens.items() if len(found) > 1
            )
            if not candidates:
                continue
            job_id, token = self.rng.choice(candidates[-50:])
            action = self.rng.choice(["complete", "heartbeat"])
            if (job_id, token, action) in tried:
                continue
            tried.add((job_id, token, action))
            await self.stale_write(job_id, token, action, max(tokens[job_id]))

    async def stale_write(self, job_id: int, token: int, action: str, newest: int) -> None:
        """Send `action` for job_id with `token`, known older than `newest` (seen by the sink)."""
        fields = {"job_id": job_id, "token": token, "newest_token": newest, "action": action}
        self.history.record("stale", op="invoke", **fields)
        path = f"/v1/jobs/{job_id}/{action}"
        body: dict[str, Any] = {"token": token}
        if action == "complete":
            body["result"] = {"stale": True}
        try:
            await self.worker_client.request("POST", path, body, write=True)
        except ApiError as error:
            self.history.record("stale", op="fail", status=error.status, code=error.code,
                                **fields)
            return
        except (Unavailable, RaftcronError, aiohttp.ClientError, OSError) as error:
            self.history.record("stale", op="info", error=repr(error)[:200], **fields)
            return
        self.history.record("stale", op="ok", **fields)

    # -- the monitor ----------------------------------------------------------------------

    async def _monitor_loop(self) -> None:
        seen: dict[str, tuple[Any, ...]] = {}
        state_time_at: dict[str, float] = {}
        while not self._stopped():
            started = time.monotonic()
            views = await asyncio.gather(*(self._view(url) for url in self.urls))
            for url, view in zip(self.urls, views, strict=True):
                self._state_time(url, view, state_time_at)
                if view is None:
                    shape: tuple[Any, ...] = ("unreachable",)
                    fields: dict[str, Any] = {"role": "unreachable"}
                else:
                    shape = (view.get("role"), view.get("term"), view.get("has_quorum"),
                             view.get("leader"))
                    fields = {
                        "role": view.get("role"), "term": view.get("term"),
                        "has_quorum": view.get("has_quorum"), "leader": view.get("leader"),
                        "commit_index": view.get("commit_index"),
                        "now_ms": (view.get("state") or {}).get("now_ms"),
                    }
                node = self.nodes[url]
                if seen.get(url) != shape:
                    seen[url] = shape
                    self.history.record("sample", url=url, node=node, **fields)
            await self._pause(max(0.05, 0.25 - (time.monotonic() - started)))

    def _state_time(self, url: str, view: dict[str, Any] | None,
                    recorded_at: dict[str, float]) -> None:
        """Record a node's state time (its applied Ticks') against this harness's clock: every
        reading ahead of it, and one every STATE_TIME_EVERY_S otherwise (checkers/statetime.py
        judges them). The view was read before `t` is taken: a reading is never made to look
        further ahead than it was."""
        now_ms = (view or {}).get("state", {}).get("now_ms")
        if not isinstance(now_ms, int) or now_ms <= 0:
            return
        mono_s = time.monotonic()
        ahead = now_ms > time.time() * 1000
        if ahead or mono_s - recorded_at.get(url, 0.0) >= STATE_TIME_EVERY_S:
            recorded_at[url] = mono_s
            self.history.record("state_time", node=self.nodes[url], now_ms=now_ms)

    async def _view(self, url: str) -> dict[str, Any] | None:
        try:
            async with self.session.get(
                url + "/v1/cluster", timeout=aiohttp.ClientTimeout(total=0.7)
            ) as response:
                if response.status != 200:
                    return None
                answer = await response.json()
                return answer if isinstance(answer, dict) else None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None
