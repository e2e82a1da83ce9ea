"""One claimed job, from the claim to its ack: run the handler, heartbeat, time out, abandon.

The rules it keeps:
- heartbeat every third of the lease; a heartbeat answered 409 (`stale_token`,
  `job_cancelled`) or 404 means the lease is gone: the job is abandoned. `ctx.cancelled` turns
  True, a coroutine handler is cancelled, a shell process is killed, and NOTHING is reported
  for it (another worker may hold the job now; fencing would refuse us anyway);
- a job runs at most its `timeout_ms` (the job's, else the task's, else the worker's); then it
  is stopped and failed (retryable) with a clear error;
- before reporting, if our own clock says the lease may have run out (a paused process, a long
  stall), one heartbeat confirms the lease first;
- the handler's progress reports ride on heartbeats of their own (cluster/worker/progress.py);
  a report still waiting when the handler returns is sent before the outcome;
- a plain handler runs in a thread, which cannot be stopped: its slot stays busy until the
  thread returns, even after the job was reported or abandoned, so `concurrency` stays true.

It produces at most one ack per job, into the worker's `AckBuffer`; sending it is the runtime's
job. Never raises: every outcome is an ack, a log line, or both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Protocol

from raftcron.cluster.clients.clientparts import ApiError, Unavailable
from raftcron.cluster.telemetry import tracing
from raftcron.cluster.worker.acks import AckBuffer, failure_ack, success_ack
from raftcron.cluster.worker.acks import exception_text as describe
from raftcron.cluster.worker.context import JobContext
from raftcron.cluster.worker.progress import ProgressReporter, Report
from raftcron.cluster.worker.tasks import LeaseLost, PermanentError, Task
from raftcron.cluster.worker.upstream import ResultReader, Upstream

log = logging.getLogger("raftcron.worker")

# Reasons a job stops early. The first three mean the lease is gone: report nothing.
LEASE_LOST = "lease_lost"
JOB_CANCELLED = "job_cancelled"
JOB_GONE = "job_gone"
TIMED_OUT = "timed_out"
WORKER_STOPPING = "worker_stopping"
ABANDONED = frozenset({LEASE_LOST, JOB_CANCELLED, JOB_GONE})
CANCEL_GRACE_S = 10.0  # a cancelled coroutine (a shell killing its process) gets this long
HEARTBEAT_ATTEMPT_S_MIN = 1.0
_REPORTER_LOCK = threading.Lock()  # a job's reporter is made once, by whichever thread reports


class HeartbeatClient(Protocol):
    """The one call a running job makes to the cluster (`AsyncClient.heartbeat`; in
    `raftcron.testing`, the in-process core's)."""

    async def heartbeat(
        self,
        job_id: int,
        token: int,
        *,
        lease_ms: int | None = None,
        progress: Report | None = None,
        deadline_s: float | None = None,
    ) -> dict[str, Any]: ...


class WorkerClient(HeartbeatClient, ResultReader, Protocol):
    """The worker's calls while a job runs: heartbeats, and reading a parent's result that
    did not come with the claim (`ctx.upstream`)."""


class Execution:
    def __init__(
        self,
        claimed: dict[str, Any],
        *,
        task: Task | None,
        client: WorkerClient,
        worker: str,
        lease_ms: int,
        acks: AckBuffer,
        executor: concurrent.futures.Executor,
        default_timeout_ms: int | None,
        known_tasks: Callable[[], list[str]],
        claim_sent: float | None = None,
        record_progress: bool = False,
    ) -> None:
        self.task = task
        self.client = client
        self.acks = acks
        self.executor = executor
        self.known_tasks = known_tasks
        self.loop = asyncio.get_running_loop()
        self.ctx = JobContext(
            claimed,
            worker=worker,
            lease_ms=lease_ms,
            loop=self.loop,
            heartbeat=self._beat,
            claim_sent=claim_sent,
            report=self._report,
        )
        if "upstream" in claimed:  # a workflow job with parents (scheduler/upstream.py)
            self.ctx.upstream = Upstream(claimed["upstream"], reader=client, loop=self.loop)
        task_timeout = task.timeout_ms if task is not None else None
        self.timeout_ms: int | None = self.ctx.timeout_ms or task_timeout or default_timeout_ms
        self.outcome: str | None = None  # succeeded | failed | abandoned, once decided
        self.work: asyncio.Future[Any] | None = None
        self.finished_before_stop = False
        self._first_beat: asyncio.TimerHandle | None = None
        self._beating: list[asyncio.Task[None]] = []
        # Made at the job's first progress report: most jobs make none.
        self.progress: ProgressReporter | None = None
        self.record_progress = record_progress  # keep every report (raftcron.testing)
        # The attempt's span (None when traces are off), in the submitter's trace if the job
        # carries one (its traceparent), else a trace of its own.
        self.span = tracing.start_span(
            "run", kind="consumer", traceparent=claimed.get("traceparent"), root=True,
            attributes={"raftcron.job_id": self.ctx.job_id, "raftcron.task": self.ctx.task,
                        "raftcron.queue": self.ctx.queue or "",
                        "raftcron.attempt": self.ctx.attempt},
        ) if tracing.enabled() else None

    @property
    def job_id(self) -> int:
        return self.ctx.job_id

    @property
    def key(self) -> tuple[int, int]:
        """(job id, token): one attempt."""
        return self.ctx.job_id, self.ctx.token

    def stop(self, reason: str) -> None:
        """Ask the job to stop (the worker is stopping). A handler that returns after this
        has not finished its work (it noticed `ctx.cancelled`): its attempt fails."""
        if self.work is not None and self.work.done() and not self.ctx.cancelled:
            self.finished_before_stop = True
        self.ctx.stop(reason)

    # -- the whole life of the job -----------------------------------------------------------

    async def run(self) -> None:
        ctx = self.ctx
        _log("job_started", ctx, f"job {ctx.job_id} ({ctx.task}) attempt {ctx.attempt} started")
        leftover: asyncio.Future[Any] | None = None
        try:
            ack, leftover = await self._work()
            if ack is not None and self.progress is not None:
                await self.progress.finish()  # the last report lands before the outcome
                if ctx.stop_reason in ABANDONED:
                    ack = None
        except BaseException as error:  # the runtime's own failure (logged by the worker)
            tracing.end(self.span, {"raftcron.outcome": "abandoned"}, error=error)
            raise
        finally:
            if self._first_beat is not None:
                self._first_beat.cancel()
            for task in self._beating:
                task.cancel()
            if self._beating:
                await asyncio.gather(*self._beating, return_exceptions=True)
            if self.progress is not None:
                await self.progress.abandon()  # nothing left after `finish`
        if ack is not None and not await self._still_leased():
            ack = None
        if self.span is not None:
            tracing.end(self.span, {"raftcron.outcome": "abandoned" if ack is None
                                    else ack["outcome"]},
                        error=None if ack is None or "error" not in ack else ack["error"])
        if ack is None:
            self.outcome = "abandoned"
            _log(
                "job_abandoned",
                ctx,
                f"job {ctx.job_id} abandoned ({ctx.stop_reason}): nothing reported",
                reason=ctx.stop_reason,
            )
        else:
            self.outcome = ack["outcome"]
            self.acks.add(ack)
            _log(
                f"job_{ack['outcome']}",
                ctx,
                f"job {ctx.job_id} {ack['outcome']}"
                + (f": {_first_line(ack['error'])}" if "error" in ack else ""),
                duration_ms=int((time.monotonic() - ctx.started_monotonic) * 1000),
            )
        if leftover is not None and not leftover.done():
            # The slot stays busy while the handler still runs (a thread cannot be stopped).
            await asyncio.wait({leftover}, timeout=None if self.task_is_sync else CANCEL_GRACE_S)

    @property
    def task_is_sync(self) -> bool:
        return self.task is not None and not self.task.is_async

    async def _work(self) -> tuple[dict[str, Any] | None, asyncio.Future[Any] | None]:
        """The ack to send (None: abandoned), and the handler if it is still running."""
        ctx = self.ctx
        if self.task is None:
            known = ", ".join(self.known_tasks()) or "none"
            return failure_ack(
                ctx.job_id,
                ctx.token,
                f"no handler for task {ctx.task!r} on worker {ctx.worker} (it has: {known})",
            ), None
        if self.task.is_async and ctx.upstream.missing:
            # Read now what the claim left out: inside a coroutine, a read would block the loop.
            await ctx.upstream.prefetch(max(HEARTBEAT_ATTEMPT_S_MIN, ctx.lease_ms / 3000))
        work = self.work = self._start_handler(self.task)
        if not work.done():  # a coroutine that finished in its first step needs no waiting
            # The heartbeat loop starts only when a third of the lease has passed: most jobs
            # are done long before, and a task per job would cost more than the job.
            self._first_beat = self.loop.call_later(
                ctx.lease_ms / 3000,
                lambda: self._beating.append(self.loop.create_task(self._heartbeats())),
            )
            timeout_s = None if self.timeout_ms is None else self.timeout_ms / 1000
            await asyncio.wait(
                {work, ctx.stopped_future}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        if ctx.stop_reason in ABANDONED:
            work.cancel()
            return None, work
        if work.done() and (not ctx.cancelled or self.finished_before_stop):
            return self._ack_from(work), None
        if not ctx.cancelled:
            ctx.stop(TIMED_OUT)
        work.cancel()
        message = (
            f"timed out after {self.timeout_ms} ms"
            if ctx.stop_reason == TIMED_OUT
            else f"worker {ctx.worker} stopped before the job finished"
        )
        return failure_ack(ctx.job_id, ctx.token, message), work

    def _start_handler(self, task: Task) -> asyncio.Future[Any]:
        # With traces on, the handler runs in a context whose current span is the run span, so
        # its own spans are children of it (and the tasks it starts copy that context).
        within = tracing.context_of(self.span)
        if task.is_async:
            if within is not None:
                return within.run(eager, task.handler(self.ctx), self.loop)
            return eager(task.handler(self.ctx), self.loop)
        if within is not None:
            return self.loop.run_in_executor(self.executor, within.run, task.handler, self.ctx)
        return self.loop.run_in_executor(self.executor, task.handler, self.ctx)

    def _ack_from(self, work: asyncio.Future[Any]) -> dict[str, Any] | None:
        ctx = self.ctx
        if work.cancelled():
            return failure_ack(ctx.job_id, ctx.token, "the handler was cancelled")
        error = work.exception()
        if error is None:
            return success_ack(ctx.job_id, ctx.token, work.result())
        if self.span is not None:
            self.span.record_exception(error)
        if isinstance(error, LeaseLost):
            ctx.stop(LEASE_LOST)
            return None
        retryable = not isinstance(error, PermanentError)
        return failure_ack(ctx.job_id, ctx.token, describe(error), retryable=retryable)

    # -- the lease ---------------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        """From a third of the lease on: a heartbeat, then one every third of the lease."""
        ctx = self.ctx
        while not ctx.cancelled:
            await self._beat(None)
            await asyncio.sleep(ctx.lease_ms / 3000)

    def _report(self, report: Report) -> bool:
        """`ctx.progress`'s report, from any thread, to the job's reporter."""
        reporter = self.progress
        if reporter is None:
            with _REPORTER_LOCK:
                if self.progress is None:
                    self.progress = ProgressReporter(
                        self._send_progress, self.loop, record=self.record_progress)
                reporter = self.progress
        return reporter.report(report)

    async def _send_progress(self, report: Report) -> bool:
        return await self._beat(None, report)

    async def _beat(self, lease_ms: int | None, progress: Report | None = None) -> bool:
        """One heartbeat: False when the lease is known to be lost (the job is then stopped);
        True when it was extended, or when no node answered (we cannot know: keep going)."""
        ctx = self.ctx
        sent = time.monotonic()
        budget_s = max(HEARTBEAT_ATTEMPT_S_MIN, ctx.lease_ms / 3000)
        options: dict[str, Any] = {} if progress is None else {"progress": progress}
        try:
            await self.client.heartbeat(
                ctx.job_id, ctx.token, lease_ms=lease_ms, deadline_s=budget_s, **options
            )
        except ApiError as error:
            if progress is not None and error.status == 400 and error.field == "progress":
                # A member of the previous release (a rolling upgrade) does not know the
                # field: the job runs on, its progress unrecorded.
                _log("progress_refused", ctx, f"progress not recorded: {error}", logging.WARNING)
                if self.progress is not None:
                    self.progress.close()
                return True
            if error.status not in (404, 409):
                _log("heartbeat_error", ctx, f"heartbeat refused: {error}", logging.WARNING)
                return True
            reason = {404: JOB_GONE}.get(error.status) or (
                JOB_CANCELLED if error.code == "job_cancelled" else LEASE_LOST
            )
            _log("lease_lost", ctx, f"job {ctx.job_id}: {error}", logging.WARNING, code=error.code)
            ctx.stop(reason)
            return False
        except Unavailable as error:
            _log("heartbeat_unanswered", ctx, str(error), logging.WARNING)
            return True
        if lease_ms is not None:
            ctx.lease_ms = lease_ms
        ctx.lease_deadline = sent + ctx.lease_ms / 1000
        return True

    async def _still_leased(self) -> bool:
        """Before reporting: confirm the lease if our clock says it may have run out."""
        if time.monotonic() < self.ctx.lease_deadline:
            return True
        return await self._beat(None)


def eager(coroutine: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop
          ) -> asyncio.Future[Any]:
    """Run a coroutine's first step now, in the caller's task (as Python 3.12's eager tasks
    do). One that finishes there (most short jobs) costs a finished future instead of a task
    and its scheduling; one that awaits goes on in a task of its own from where it stopped,
    so it can be cancelled and timed out as any task."""
    future: asyncio.Future[Any]
    try:
        yielded = coroutine.send(None)
    except StopIteration as done:
        future = loop.create_future()
        future.set_result(done.value)
        return future
    except asyncio.CancelledError:
        future = loop.create_future()
        future.cancel()
        return future
    except Exception as error:  # the handler's own failure: its job's outcome
        future = loop.create_future()
        future.set_exception(error)
        return future
    return asyncio.ensure_future(_Resumed(coroutine, yielded).run())


class _Resumed:
    """A coroutine that already took its first step, as an awaitable: hands the task what
    that step yielded (the future it waits on, with its blocking mark still set), then passes
    every value and exception through."""

    def __init__(self, coroutine: Coroutine[Any, Any, Any], yielded: Any) -> None:
        self.coroutine = coroutine
        self.yielded = yielded

    async def run(self) -> Any:
        return await self

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine, yielded = self.coroutine, self.yielded
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as error:  # thrown in by the task (CancelledError)
                try:
                    yielded = coroutine.throw(error)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    yielded = coroutine.send(sent)
                except StopIteration as done:
                    return done.value


def _first_line(text: str) -> str:
    return text.partition("\n")[0]


def _log(
    action: str, ctx: JobContext, message: str, level: int = logging.INFO, **fields: Any
) -> None:
    if not log.isEnabledFor(level):
        return
    extra = {
        "action": action,
        "job": ctx.job_id,
        "token": ctx.token,
        "attempt": ctx.attempt,
        "task": ctx.task,
        "worker": ctx.worker,
        **fields,
    }
    log.log(level, message, extra=extra)
