"""`Worker`: claims jobs from the cluster, runs them `concurrency` at a time, acks them, drains.

The loop (DESIGN.md sections 3-5):
- one long-polling `POST /v1/claims` at a time, for as many jobs as there are free slots,
  carrying the acks of the jobs that finished since the last one: ack and claim in one round
  trip. While every slot is busy nothing is claimed; an ack that no claim picks up within
  `ack_delay_ms` (all slots busy, or a long poll in flight) is sent on its own (a claim of
  `max: 0`), so a finished job is never held back long;
- every call goes through `AsyncClient`, which fails over between the nodes and retries with
  the same `request_id`, so a claim retried on another node returns the same jobs and tokens;
- each job is an `Execution` (heartbeats, timeout, abandonment on a lost lease);
- `stop(drain=True)` (SIGTERM, SIGINT) stops claiming, lets running jobs finish for up to
  `drain_timeout_ms`, then stops the rest (failed as retryable: "worker stopped"), sends
  every pending ack and returns. A second signal stops at once.

It must not decide anything about a job the cluster decides (retries, backoff, dead letter).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from raftcron.cluster.clients import tls
from raftcron.cluster.clients.asyncclient import AsyncClient
from raftcron.cluster.clients.clientparts import (
    ApiError,
    Unavailable,
    new_request_id,
    normalize_urls,
)
from raftcron.cluster.telemetry import tracing
from raftcron.cluster.worker.acks import AckBuffer, AckWire, failure_ack
from raftcron.cluster.worker.execution import WORKER_STOPPING, Execution, eager
from raftcron.cluster.worker.httptask import HTTP_TASK, HostAllowList, http_task
from raftcron.cluster.worker.shell import SHELL_TASK, shell_task
from raftcron.cluster.worker.tasks import Handler, TaskRegistry
from raftcron.scheduler import limits, parse
from raftcron.scheduler.errors import Invalid

log = logging.getLogger("raftcron.worker")

RETRY_S_FIRST = 0.1
RETRY_S_MAX = 5.0
FINAL_FLUSH_S = 15.0
STOP_GRACE_S = 5.0  # after stopping the jobs left at the end of a drain, wait this long
CLAIM_GATHER_S = 0.005  # after a slot frees, how long to wait for more before claiming


def default_worker_name() -> str:
    host = re.sub(r"[^A-Za-z0-9_.:\-]", "-", socket.gethostname()) or "worker"
    return f"{host.strip('-.') or 'worker'}-{os.getpid()}"[:128]


class Worker:
    def __init__(
        self,
        connect: str | Sequence[str],
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 4,
        name: str | None = None,
        lease_ms: int = 30_000,
        wait_ms: int = 5_000,
        drain_timeout_ms: int = 30_000,
        timeout_ms: int | None = None,
        token: str | None = None,
        tasks: TaskRegistry | None = None,
        shell: bool = False,
        shell_env: Sequence[str] = (),
        http_hosts: Sequence[str] | None = None,
        ack_delay_ms: int = 20,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not queues:
            raise ValueError("at least one queue is required")
        self.urls = normalize_urls(connect)
        self.queues = [_name(queue, "queue") for queue in queues]
        self.concurrency = concurrency
        self.name = _name(name or default_worker_name(), "worker name")
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        self.drain_timeout_ms = drain_timeout_ms
        self.timeout_ms = timeout_ms
        self.token = token
        self.ack_delay_ms = ack_delay_ms
        self.tls_files = (ca_file, cert_file, key_file)
        tls.client_context(*self.tls_files)  # bad files: a ValueError now, not at first claim
        self.tasks = TaskRegistry()
        if tasks is not None:
            self.tasks.update(tasks)
        if shell_env and not shell:
            raise ValueError("shell_env (--shell-env) is given but the shell task is not allowed")
        # Off unless asked: whoever may submit to these queues would run commands here.
        if shell and SHELL_TASK not in self.tasks:
            self.tasks.add(SHELL_TASK, shell_task(shell_env))
        # Off unless asked, for the hosts named: a submitter would make this worker call URLs
        # from inside its network (cluster/worker/httptask.py).
        self.http_allowed = None if http_hosts is None else HostAllowList(http_hosts)
        if self.http_allowed is not None and HTTP_TASK not in self.tasks:
            self.tasks.add(HTTP_TASK, http_task(self.http_allowed))
        self.running: dict[tuple[int, int], Execution] = {}
        self.counts: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Event | None = None
        self._stop_now: asyncio.Event | None = None
        self._slot_freed: asyncio.Event | None = None
        self._pending_stop: str | None = None  # a stop() that came before serve() started

    def task(
        self, name: str | None = None, *, timeout_ms: int | None = None
    ) -> Callable[[Handler], Handler]:
        """Register a handler on this worker: `@worker.task("send-report")`."""
        return self.tasks.task(name, timeout_ms=timeout_ms)

    # -- starting and stopping -------------------------------------------------------------

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (drain; a second one stops at once). Exit code 0."""
        asyncio.run(self.serve(handle_signals=True))
        return 0

    def stop(self, *, drain: bool = True) -> None:
        """Stop claiming and drain (or stop at once). Safe from any thread and any time."""
        mode = "drain" if drain else "now"
        loop = self._loop
        if loop is None or loop.is_closed():
            self._pending_stop = mode if self._pending_stop != "now" else "now"
            return
        try:
            if _in_loop(loop):
                self._request_stop(mode)
            else:
                loop.call_soon_threadsafe(self._request_stop, mode)
        except RuntimeError:  # the loop closed meanwhile: nothing left to stop
            pass

    def _request_stop(self, mode: str) -> None:
        assert self._draining is not None and self._stop_now is not None
        if mode == "now" or self._draining.is_set():
            if not self._stop_now.is_set():
                log.warning("stopping now", extra={"action": "worker_stop_now"})
            self._stop_now.set()
            for execution in self.running.values():
                execution.stop(WORKER_STOPPING)
        if not self._draining.is_set():
            log.info(
                "draining: no new claims; waiting for %d running jobs",
                len(self.running),
                extra={"action": "drain_started", "running": len(self.running)},
            )
        self._draining.set()
        self._wake()

    def _on_signal(self, signum: int) -> None:
        log.info(f"got {signal.Signals(signum).name}", extra={"action": "signal"})
        self._request_stop("drain")

    async def serve(self, *, handle_signals: bool = False) -> None:
        """Run until `stop()`; every job started was reported, abandoned or stopped."""
        # Traces on when OTEL_EXPORTER_OTLP_ENDPOINT is set (and the process has not turned
        # them on itself); TracingUnavailable before anything starts when the extra is missing.
        traced_here = not tracing.enabled() and tracing.start_from_environment(
            "raftcron-worker", self.name)
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._draining, self._stop_now = asyncio.Event(), asyncio.Event()
        self._slot_freed = asyncio.Event()
        if handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self._on_signal, signum)
        if self._pending_stop is not None:
            self._request_stop(self._pending_stop)
        self.acks = AckBuffer()
        ca_file, cert_file, key_file = self.tls_files
        self.client = AsyncClient(
            self.urls, token=self.token, ca_file=ca_file, cert_file=cert_file, key_file=key_file
        )
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="raftcron-job"
        )
        log.info(
            "worker %s: queues %s, concurrency %d, tasks %s, nodes %s",
            self.name,
            ",".join(self.queues),
            self.concurrency,
            ",".join(self.tasks.names()),
            ",".join(self.urls),
            extra={"action": "worker_started", "worker": self.name, "pid": os.getpid()},
        )
        if SHELL_TASK in self.tasks:
            log.warning(
                "the shell task is on: whoever may submit to queues %s runs commands here",
                ",".join(self.queues),
                extra={"action": "shell_allowed", "worker": self.name},
            )
        if self.http_allowed is not None:
            log.warning(
                "the http task is on: whoever may submit to queues %s makes this worker call %s",
                ",".join(self.queues),
                self.http_allowed,
                extra={"action": "http_task_allowed", "worker": self.name},
            )
        flusher = asyncio.create_task(self._flush_acks())
        try:
            await self._claim_loop()
            await self._drain()
        finally:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
            await self._final_flush()
            await self.client.close()
            self.executor.shutdown(wait=False, cancel_futures=True)
            if handle_signals:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
            log.info(
                "worker stopped",
                extra={"action": "worker_stopped", "worker": self.name, **self.counts},
            )
            if traced_here:
                await asyncio.to_thread(tracing.shutdown)  # sends the spans still batched

    # -- claiming ----------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        assert self._draining is not None
        retry_s = RETRY_S_FIRST
        while not self._draining.is_set():
            free = self.concurrency - len(self.running)
            if free <= 0:
                await self._wait_for_slot()
                continue
            acks = self.acks.take()
            sent = time.monotonic()
            try:
                with tracing.span("claim", kind="client", root=True) as span:
                    answer = await self.client.claim(
                        self.name,
                        self.queues,
                        max=free,
                        lease_ms=self.lease_ms,
                        wait_ms=self.wait_ms,
                        acks=acks,
                        request_id=new_request_id(),
                    )
                    if span is not None:
                        span.set_attributes({"raftcron.jobs": len(answer.get("jobs") or ()),
                                             "raftcron.acks": len(acks)})
            except (Unavailable, ApiError) as error:
                await self._claim_failed(error, acks)
                await self._sleep_unless_draining(retry_s)
                retry_s = min(2 * retry_s, RETRY_S_MAX)
                continue
            retry_s = RETRY_S_FIRST
            self._note_ack_outcomes(answer.get("acks") or [])
            for claimed in answer.get("jobs") or []:
                self._start(claimed, sent)

    async def _claim_failed(self, error: Exception, acks: list[AckWire]) -> None:
        log.warning(
            f"claim failed: {error}",
            extra={"action": "claim_failed", "status": getattr(error, "status", None)},
        )
        if isinstance(error, ApiError) and acks and error.status in (400, 413):
            await self._send_one_by_one(acks)  # one bad ack must not hold back the others
        else:
            self.acks.put_back(acks)

    def _start(self, claimed: dict[str, Any], claim_sent: float) -> None:
        execution = Execution(
            claimed,
            task=self.tasks.get(str(claimed.get("task"))),
            client=self.client,
            worker=self.name,
            lease_ms=self.lease_ms,
            acks=self.acks,
            executor=self.executor,
            default_timeout_ms=self.timeout_ms,
            known_tasks=self.tasks.names,
            claim_sent=claim_sent,
        )
        # Keyed by (job, token): an abandoned attempt whose thread still runs may share its
        # job id with a new attempt this worker claimed.
        self.running[execution.key] = execution
        self._count("claimed")
        # Eagerly: a job that needs no waiting runs to its ack here, with no task of its own,
        # and is done with here too (a callback would wait for a turn of the loop).
        future = eager(execution.run(), asyncio.get_running_loop())
        if future.done():
            self._finished(execution, future)
            return
        future.add_done_callback(lambda done: self._finished(execution, done))
        assert self._stop_now is not None
        if self._stop_now.is_set():
            execution.stop(WORKER_STOPPING)

    def _finished(self, execution: Execution, done: asyncio.Future[None]) -> None:
        self.running.pop(execution.key, None)
        self._count(execution.outcome or "abandoned")
        if not done.cancelled() and done.exception() is not None:
            log.error(
                f"job {execution.job_id}: the runtime failed: {done.exception()!r}",
                exc_info=done.exception(),
                extra={"action": "runtime_error", "job": execution.job_id},
            )
        self._wake()

    def _wake(self) -> None:
        if self._slot_freed is not None:
            self._slot_freed.set()

    async def _wait_for_slot(self) -> None:
        """Until slots are free: at least half of them, or any after CLAIM_GATHER_S.

        Claiming the moment one slot frees would send a claim (and an ack) per job; short jobs
        finish in bunches, and one round trip can carry the whole bunch.
        """
        assert self._slot_freed is not None
        self._slot_freed.clear()
        if self.concurrency - len(self.running) > 0:
            return
        await self._slot_freed.wait()
        deadline = time.monotonic() + CLAIM_GATHER_S
        while self.concurrency - len(self.running) < max(1, self.concurrency // 2):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._slot_freed.wait(), remaining)

    async def _sleep_unless_draining(self, seconds: float) -> None:
        assert self._draining is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._draining.wait(), seconds)

    # -- acks ---------------------------------------------------------------------------------

    async def _flush_acks(self) -> None:
        """Send acks that no claim picked up within ack_delay_ms (all slots busy, long poll)."""
        retry_s = RETRY_S_FIRST
        while True:
            await self.acks.wait()
            await asyncio.sleep(self.ack_delay_ms / 1000)
            if await self._send_acks(self.acks.take()):
                retry_s = RETRY_S_FIRST
            else:
                await asyncio.sleep(retry_s)
                retry_s = min(2 * retry_s, RETRY_S_MAX)

    async def _send_acks(self, acks: list[AckWire], *, deadline_s: float | None = None) -> bool:
        """Send acks alone (a claim of max 0). False if they went back into the buffer."""
        if not acks:
            return True
        try:
            answer = await self.client.claim(
                self.name,
                self.queues,
                max=0,
                lease_ms=self.lease_ms,
                acks=acks,
                request_id=new_request_id(),
                deadline_s=deadline_s,
            )
        except (Unavailable, ApiError) as error:
            await self._claim_failed(error, acks)
            return isinstance(error, ApiError) and error.status in (400, 413)
        except asyncio.CancelledError:
            self.acks.put_back(acks)  # maybe applied, maybe not: a resend is answered safely
            raise
        self._note_ack_outcomes(answer.get("acks") or [])
        return True

    async def _send_one_by_one(self, acks: list[AckWire]) -> None:
        """The fallback when a batch was refused: each ack through complete/fail."""
        for index, ack in enumerate(acks):
            try:
                if ack["outcome"] == "succeeded":
                    try:
                        await self.client.complete(ack["id"], ack["token"], ack.get("result"))
                    except ApiError as error:
                        if error.status not in (400, 413):
                            raise
                        refused = f"the result was refused: {error.message}"
                        failed = failure_ack(ack["id"], ack["token"], refused, retryable=False)
                        await self.client.fail(ack["id"], ack["token"], failed["error"])
                else:
                    await self.client.fail(
                        ack["id"],
                        ack["token"],
                        ack.get("error", ""),
                        retryable=ack.get("retryable", True),
                    )
            except ApiError as error:
                self._note_ack_outcomes([{"id": ack["id"], "outcome": error.code}])
            except Unavailable:
                self.acks.put_back(acks[index:])
                return

    def _note_ack_outcomes(self, outcomes: list[dict[str, Any]]) -> None:
        for outcome in outcomes:
            if outcome.get("outcome") != "ok":
                self._count("ack_refused")
                log.warning(
                    f"job {outcome.get('id')}: ack refused ({outcome.get('outcome')})",
                    extra={
                        "action": "ack_refused",
                        "job": outcome.get("id"),
                        "code": outcome.get("outcome"),
                    },
                )

    async def _final_flush(self) -> None:
        for _ in range(100):
            if not len(self.acks):
                return
            if not await self._send_acks(self.acks.take(), deadline_s=FINAL_FLUSH_S):
                break
        if len(self.acks):
            log.error(
                f"{len(self.acks)} acks could not be sent: those jobs will run again",
                extra={"action": "acks_lost", "count": len(self.acks)},
            )

    # -- draining -----------------------------------------------------------------------------

    async def _drain(self) -> None:
        assert self._stop_now is not None
        if self.running:
            idle = asyncio.ensure_future(self._until_idle())
            stop_now = asyncio.ensure_future(self._stop_now.wait())
            await asyncio.wait(
                {idle, stop_now},
                timeout=self.drain_timeout_ms / 1000,
                return_when=asyncio.FIRST_COMPLETED,
            )
            stop_now.cancel()
            if self.running:
                log.warning(
                    f"stopping {len(self.running)} jobs still running",
                    extra={
                        "action": "drain_timeout",
                        "jobs": sorted(job for job, _ in self.running),
                    },
                )
                for execution in list(self.running.values()):
                    execution.stop(WORKER_STOPPING)
                await asyncio.wait({idle}, timeout=STOP_GRACE_S)
            idle.cancel()
        log.info("drained", extra={"action": "drained", "left_running": len(self.running)})

    async def _until_idle(self) -> None:
        """Until no job is running (woken by the end of each job)."""
        assert self._slot_freed is not None
        while self.running:
            self._slot_freed.clear()
            await self._slot_freed.wait()

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1


def _name(value: str, what: str) -> str:
    try:
        return str(parse.name(value, what, chars_max=limits.NAME_CHARS_MAX))
    except Invalid as error:
        raise ValueError(f"{what}: {error.message}") from None


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
