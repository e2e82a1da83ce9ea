"""`JobContext`: what a handler knows about the job it runs, and its two ways to talk back.

A handler reads the job (`job_id`, `key`, `attempt`, `token`, `payload`, `schedule`,
`fire_time_ms`, ...), may heartbeat on its own (`ctx.heartbeat()` in a plain function,
`await ctx.aheartbeat()` in a coroutine; the runtime heartbeats at a third of the lease anyway),
may report how far it got (`ctx.progress(0.4, "rows 400/1000")`, or `await ctx.aprogress(...)`:
sent as heartbeats, at most one a second, the newest winning; cluster/worker/progress.py),
and should check `ctx.cancelled` in long loops: it turns True when the lease is lost (stale
token, job cancelled, expired) or the job timed out, and from then on nothing the handler does
is reported. Coroutine handlers are also cancelled; threads cannot be, so they must look.

Pass `key` and `token` to side effects (DESIGN.md section 3): an external system can then
deduplicate by key and refuse a stale token.

A workflow job reads its parents' results as `ctx.upstream["<parent name>"]`
(cluster/worker/upstream.py); other jobs see an empty mapping.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from raftcron.cluster.worker.progress import Report, checked_report
from raftcron.cluster.worker.upstream import NO_UPSTREAM, Upstream

HEARTBEAT_WAIT_S_MAX = 30.0
# Guards the making of a context's Event against `stop` on the loop's thread (rare: only
# handler threads that wait, and stops).
_STOPPED_LOCK = threading.Lock()


class JobContext:
    def __init__(
        self,
        claimed: dict[str, Any],
        *,
        worker: str,
        lease_ms: int,
        loop: asyncio.AbstractEventLoop,
        heartbeat: Callable[[int | None], Awaitable[bool]],
        claim_sent: float | None = None,
        report: Callable[[Report], bool] | None = None,
    ) -> None:
        self.job_id: int = int(claimed["id"])
        self.key: str | None = claimed.get("key")
        self.task: str = str(claimed["task"])
        self.queue: str | None = claimed.get("queue")
        self.payload: Any = claimed.get("payload")
        self.attempt: int = int(claimed.get("attempt") or 1)
        self.token: int = int(claimed["token"])
        self.schedule: str | None = claimed.get("schedule")
        self.fire_time_ms: int | None = claimed.get("fire_time_ms")
        self.timeout_ms: int | None = claimed.get("timeout_ms")
        self.lease_ms: int = int(claimed.get("lease_ms") or lease_ms)
        self.lease_until_ms: int | None = claimed.get("lease_until_ms")
        self.worker = worker
        self.upstream: Upstream = NO_UPSTREAM  # a workflow job's: set by its Execution
        self.started_monotonic = time.monotonic()
        # Our own conservative idea of when the lease ends: it started no earlier than the
        # claim that obtained it was sent (`claim_sent`, a time.monotonic() value), so
        # `sent + lease` can only be early, never late.
        sent = self.started_monotonic if claim_sent is None else claim_sent
        self.lease_deadline = sent + self.lease_ms / 1000
        self.stop_reason: str | None = None
        # Made only when a handler thread waits on it (`wait_cancelled`): a worker runs
        # thousands of short jobs a second, and most never wait.
        self._stopped: threading.Event | None = None
        # A bare future (not an Event waited on by a task), made when first waited on: a
        # worker runs thousands of short jobs a second, most of them done before anything
        # waits, and every object it does not make is time for the jobs.
        self._stopped_future: asyncio.Future[None] | None = None
        self._loop = loop
        self._heartbeat = heartbeat
        self._report = report

    def __repr__(self) -> str:
        return f"JobContext(job_id={self.job_id}, task={self.task!r}, attempt={self.attempt})"

    @property
    def cancelled(self) -> bool:
        """True once the job must stop: lease lost, job cancelled, timed out, worker stopping."""
        return self.stop_reason is not None

    def wait_cancelled(self, timeout_s: float | None = None) -> bool:
        """Block a handler thread until `cancelled` (or the timeout); `cancelled` then."""
        with _STOPPED_LOCK:
            if self._stopped is None:
                self._stopped = threading.Event()
                if self.stop_reason is not None:
                    self._stopped.set()
            stopped = self._stopped
        return stopped.wait(timeout_s)

    @property
    def stopped_future(self) -> asyncio.Future[None]:
        """Done once the job is stopped (on the event loop's thread, as `stop`)."""
        future = self._stopped_future
        if future is None:
            future = self._stopped_future = self._loop.create_future()
            if self.stop_reason is not None:
                future.set_result(None)
        return future

    async def until_cancelled(self) -> None:
        await asyncio.shield(self.stopped_future)

    def heartbeat(self, lease_ms: int | None = None) -> bool:
        """From a plain (threaded) handler: extend the lease now, optionally to a new length.
        False when the lease is lost (then `cancelled` is True too)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError("in a coroutine handler, use `await ctx.aheartbeat()`")
        future = asyncio.run_coroutine_threadsafe(self._call(lease_ms), self._loop)
        return future.result(HEARTBEAT_WAIT_S_MAX)

    async def aheartbeat(self, lease_ms: int | None = None) -> bool:
        """From a coroutine handler: extend the lease now. False when it is lost."""
        return await self._call(lease_ms)

    def progress(self, value: Any, message: str | None = None, data: Any = None) -> bool:
        """Report how far the job got: `value` a fraction in [0, 1] or `{"done": int, "total":
        int}`, `message` a short text (<= 200 characters), `data` a small JSON value (<= 1 KiB).
        The job view shows the newest report. It never waits for the network (a heartbeat
        carries it, at most one a second per job), so any handler may call it; TypeError or
        ValueError naming the argument for a report the cluster would refuse. False when the
        report will not be sent (the job is stopped)."""
        report = checked_report(value, message, data)
        if self.cancelled or self._report is None:
            return False
        return self._report(report)

    async def aprogress(self, value: Any, message: str | None = None, data: Any = None) -> bool:
        """`progress` from a coroutine handler (the pair of `aheartbeat`)."""
        return self.progress(value, message, data)

    async def _call(self, lease_ms: int | None) -> bool:
        if self.cancelled:
            return False
        return await self._heartbeat(lease_ms)

    def stop(self, reason: str) -> None:
        """Mark the job stopped (on the event loop's thread); the first reason sticks."""
        if self.stop_reason is None:
            self.stop_reason = reason
        with _STOPPED_LOCK:
            if self._stopped is not None:
                self._stopped.set()
        future = self._stopped_future
        if future is not None and not future.done():
            future.set_result(None)
