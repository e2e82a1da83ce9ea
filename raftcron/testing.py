"""Run your own handlers in your own tests, with no cluster: `raftcron.testing.Inline`.

    from raftcron import PermanentError, task
    from raftcron.testing import Inline

    @task("send-report")
    def send_report(ctx):
        ...

    def test_send_report():
        inline = Inline()                    # your @task handlers (the default registry)
        job_id = inline.submit("send-report", {"to": "ops"}, max_attempts=3)
        inline.drain()                       # run what is due, retries included
        assert inline.job(job_id)["status"] == "succeeded"

`submit_workflow` submits a DAG, whose jobs read their parents' results as
`ctx.upstream["<parent name>"]`, as on a cluster.

What runs is the real thing, in one process: the cluster's core (every command encoded and
applied as a replica applies it, so the job's states, attempts, backoff, dead letters,
idempotency keys and schedules behave as in production) and the worker's own execution of a
job (the `JobContext` a handler gets, heartbeats, timeouts, `PermanentError`, `LeaseLost`,
result checks, `ctx.progress`: each `Run` lists the attempt's reports, and `job(id)["progress"]`
shows the last one). Only the network, Raft and the wall clock are left out: the cluster's time
stands still until `advance` moves it (`drain` moves it to each retry's backoff by itself), so
a test decides when schedules fire and is never slowed by a real backoff.

`Inline` is not thread-safe and runs one job at a time; plain handlers run in a worker thread,
as the worker runs them, so `ctx.heartbeat()` works the same way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from raftcron.cluster.clients.clientparts import ApiError
from raftcron.cluster.worker.acks import AckBuffer
from raftcron.cluster.worker.execution import Execution
from raftcron.cluster.worker.tasks import Task, TaskRegistry, default_registry
from raftcron.scheduler import codec, flowviews, upstream, views
from raftcron.scheduler import queues as corequeues
from raftcron.scheduler.commands import (
    Ack,
    CancelJob,
    ClaimJobs,
    Command,
    Heartbeat,
    PutSchedule,
    SubmitJobs,
    SubmitWorkflow,
    Tick,
)
from raftcron.scheduler.errors import Invalid, Ok, Rejected
from raftcron.scheduler.flowcommands import PutQueue
from raftcron.scheduler.flowspecs import QueueSpec
from raftcron.scheduler.gate import Finalize
from raftcron.scheduler.progress import ProgressReport
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.state import SchedulerState

START_MS = 1_893_456_000_000  # 2030-01-01T00:00:00Z: where an Inline's clock starts by default
ADVANCE_TICKS_MAX = 1_000_000  # a day of an every-second schedule is 86,400


class InlineError(Exception):
    """The core refused a command (`code` as the API's error codes: `invalid`, `not_found`...)."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{code}: {message}" + (f" ({field})" if field else ""))
        self.code = code
        self.message = message
        self.field = field


@dataclass(frozen=True)
class Run:
    """One attempt `drain` ran: the job, its attempt number and how it ended (`succeeded`,
    `failed` (with `error`), or `abandoned` when the handler lost its lease)."""

    job_id: int
    task: str
    attempt: int
    outcome: str
    error: str | None = None
    # Every `ctx.progress` report of the attempt, in order ({"value", "message"?, "data"?}),
    # also those a worker would coalesce away; the job view shows the last one sent.
    progress: tuple[dict[str, Any], ...] = ()


class Inline:
    def __init__(
        self,
        tasks: TaskRegistry | Iterable[TaskRegistry] | None = None,
        *,
        now_ms: int = START_MS,
        worker: str = "inline",
        lease_ms: int = 30_000,
    ) -> None:
        """`tasks`: the registries whose handlers run (default: the one `@task` fills), looked
        up when a job runs, so handlers registered after this still count."""
        self.registries = (
            [default_registry]
            if tasks is None
            else [tasks]
            if isinstance(tasks, TaskRegistry)
            else list(tasks)
        )
        self.state = SchedulerState()
        self.worker = worker
        self.lease_ms = lease_ms
        self.runs: list[Run] = []  # every attempt drain ran, oldest first
        self._ids = itertools.count(1)
        self._apply(Tick(now_ms))
        # As a new cluster of this release starts: finalized (scheduler/gate.py), the Tick
        # after it taking the retention settings' first step.
        self._apply(Finalize(None))
        self._apply(Tick(now_ms))

    # -- what a client does ------------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        """The cluster's time (Unix ms): moved only by `advance` and `drain`."""
        return self.state.now_ms

    def submit(self, task: str, payload: Any = None, **fields: Any) -> int:
        """Submit a job as `POST /v1/jobs` does (the same fields: queue, key, max_attempts,
        backoff, delay_ms, run_at_ms, timeout_ms...); its id."""
        body = {"task": task, **fields}
        if payload is not None:
            body["payload"] = payload
        spec = _parsed(lambda: JobSpec.parse(body))
        value = self._ok(SubmitJobs(self._request_id(), (spec,)))
        return int(value["jobs"][0][0])

    def submit_workflow(self, jobs: Iterable[dict[str, Any]], *, key: str | None = None
                        ) -> dict[str, int]:
        """Submit a DAG as `POST /v1/workflows` does (each job has a `name` and optional
        `after`, its parents' names); its job ids by name. A job's handler reads its parents'
        results as `ctx.upstream[name]`."""
        body: dict[str, Any] = {"jobs": list(jobs)}
        if key is not None:
            body["key"] = key
        spec = _parsed(lambda: WorkflowSpec.parse(body))
        value = self._ok(SubmitWorkflow(self._request_id(), spec))
        return {name: int(job_id) for name, job_id in value["jobs"]}

    def put_schedule(self, name: str, **fields: Any) -> dict[str, Any]:
        """Create or replace a schedule as `PUT /v1/schedules/{name}` does (cron or every, job,
        misfire...). It starts at the next `advance`."""
        spec = _parsed(lambda: ScheduleSpec.parse(fields))
        return self._ok(PutSchedule(self._request_id(), name, spec))

    def put_queue(self, name: str, **limits: Any) -> dict[str, Any]:
        """Set a queue's limits as `PUT /v1/queues/{name}` does (paused, concurrency_max,
        rate_limit); the queue's view, as `GET /v1/queues/{name}` answers it."""
        spec = _parsed(lambda: QueueSpec.parse(limits))
        self._ok(PutQueue(self._request_id(), name, spec))
        return flowviews.queue_view(self.state, name)

    def cancel(self, job_id: int, reason: str | None = None) -> dict[str, Any]:
        """Cancel a job as `POST /v1/jobs/{id}/cancel` does (its descendants too)."""
        return self._ok(CancelJob(self._request_id(), job_id, reason))

    def advance(self, ms: int = 0, *, to_ms: int | None = None) -> None:
        """Let `ms` of the cluster's time pass (or until `to_ms`) as a leader lets it: a Tick at
        each time something is due on the way (a schedule's fire, a delayed job or a retry
        becoming due, a lease running out), then one at the end. So `advance(180_000)` fires
        an every-minute schedule three times, as three minutes of a running cluster do."""
        target = self.now_ms + ms if to_ms is None else to_ms
        if target < self.now_ms:
            raise ValueError(f"time only moves forward: {target} is before {self.now_ms}")
        for _ in range(ADVANCE_TICKS_MAX):
            due_ms = self._next_due_ms()
            if due_ms is None or due_ms > target:
                self._apply(Tick(target))
                return
            self._apply(Tick(max(due_ms, self.now_ms)))
        raise InlineError(
            "too_many_ticks",
            f"advancing to {target} took over {ADVANCE_TICKS_MAX} Ticks (advance in smaller steps)",
        )

    def _next_due_ms(self) -> int | None:
        due_ms = self.state.next_due_ms()
        if self.state.pending_schedules:  # a schedule put since the last Tick starts at the next
            due_ms = min(self.now_ms + 1, due_ms or self.now_ms + 1)
        return due_ms

    def job(self, job_id: int) -> dict[str, Any]:
        """The job as `GET /v1/jobs/{id}` shows it: status, attempts, result, error, history."""
        record = self.state.table.get(job_id)
        if record is None:
            raise InlineError("not_found", f"no job {job_id}")
        return views.job_view(record)

    def jobs(self, *, task: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
        """Every job (oldest first), optionally of one task and status."""
        found = []
        for record in self.state.table:
            view = views.job_view(record, history=False)
            if (task is None or view["task"] == task) and (
                status is None or view["status"] == status
            ):
                found.append(view)
        return found

    # -- what a worker does ------------------------------------------------------------------

    def drain(
        self, *, queues: Iterable[str] | None = None, retries: bool = True, max_runs: int = 1_000
    ) -> list[Run]:
        """Run every job that is due, one at a time, until none is; with `retries`, also move
        the time to each job waiting for its backoff (or its `run_at`) and run it. The
        attempts it ran, oldest first (also added to `runs`). Stops after `max_runs`
        attempts with an error, as a handler that always fails into a long retry would
        otherwise run for a long time."""
        return asyncio.run(self.adrain(queues=queues, retries=retries, max_runs=max_runs))

    async def adrain(
        self, *, queues: Iterable[str] | None = None, retries: bool = True, max_runs: int = 1_000
    ) -> list[Run]:
        """`drain` from a coroutine (a test already running an event loop)."""
        wanted = None if queues is None else tuple(queues)
        ran: list[Run] = []
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="inline") as pool:
            for _ in range(max_runs + 1):
                claimed = self._claim_one(wanted)
                if claimed is None and retries and self._advance_to_waiting(wanted):
                    claimed = self._claim_one(wanted)
                if claimed is None:
                    self.runs += ran
                    return ran
                if len(ran) == max_runs:
                    break
                ran.append(await self._run(claimed, pool))
        self.runs += ran
        raise InlineError(
            "too_many_runs",
            f"drain ran {max_runs} attempts and jobs are still due "
            "(raise max_runs, or look for a job that always fails)",
        )

    # -- inside ------------------------------------------------------------------------------

    def _claim_one(self, queues: tuple[str, ...] | None) -> dict[str, Any] | None:
        names = queues if queues is not None else tuple(sorted(self.state.table.ready))
        ready = [name for name in names if self.state.table.ready.get(name)]
        if not ready:
            return None
        value = self._ok(ClaimJobs(self._request_id(), self.worker, tuple(ready), 1, self.lease_ms))
        if not value["jobs"]:
            return None
        [claimed] = upstream.attach(self.state, views.claimed_jobs(self.state, value["jobs"]))
        return claimed

    def _advance_to_waiting(self, queues: tuple[str, ...] | None) -> bool:
        """Move the time to the earliest job waiting for its time (a backoff, a run_at, a
        rate limit's window: a queue's or a key's) in the queues asked for; False when no
        such job waits."""
        table = self.state.table
        waiting = (
            [
                due_ms
                for due_ms, job_id in table.delayed
                if queues is None or table.jobs[job_id].queue in queues
            ]
            if table.delayed
            else []
        )
        asked = {n: line for n, line in table.ready.items() if queues is None or n in queues}
        waiting += corequeues.windows_opening(self.state.queues, asked, self.now_ms)
        if any(queues is None or name in queues for name in table.rates.held_by_queue):
            waiting += table.rates.wakes()
        if not waiting:
            return False
        self.advance(to_ms=max(self.now_ms, min(waiting)))
        return True

    async def _run(self, claimed: dict[str, Any], pool: concurrent.futures.Executor) -> Run:
        acks = AckBuffer()
        execution = Execution(
            claimed,
            task=self._task(claimed["task"]),
            client=_CoreClient(self),
            worker=self.worker,
            lease_ms=self.lease_ms,
            acks=acks,
            executor=pool,
            default_timeout_ms=None,
            known_tasks=self._task_names,
            record_progress=True,
        )
        await execution.run()
        sent = acks.take()
        if sent:
            parsed = tuple(Ack.parse(ack) for ack in sent)
            queues = (claimed["queue"],)  # an ack-only claim, as a worker's flusher sends
            self._ok(ClaimJobs(self._request_id(), self.worker, queues, 0, self.lease_ms, parsed))
        error = sent[0].get("error") if sent else None
        return Run(
            claimed["id"],
            claimed["task"],
            claimed["attempt"],
            execution.outcome or "abandoned",
            error,
            tuple(execution.progress.reported or ()) if execution.progress is not None else (),
        )

    def _task(self, name: str) -> Task | None:
        for registry in self.registries:
            found = registry.get(name)
            if found is not None:
                return found
        return None

    def _task_names(self) -> list[str]:
        return sorted({name for registry in self.registries for name in registry.names()})

    def _apply(self, command: Command) -> Ok | Rejected:
        # Through the codec, as a replica applies it: a field the core would refuse from the
        # wire is refused here too, named as the API names it.
        command = _parsed(lambda: codec.decode(codec.encode(command)))
        result = self.state.apply(command)
        assert isinstance(result, Ok | Rejected)
        return result

    def _ok(self, command: Command) -> dict[str, Any]:
        result = self._apply(command)
        if isinstance(result, Rejected):
            raise InlineError(result.code, result.message, result.field)
        value: dict[str, Any] = result.value
        return value

    def _request_id(self) -> str:
        return f"inline-{next(self._ids)}"


class _CoreClient:
    """The calls a running job makes to the cluster (a heartbeat, a parent's result read on
    demand), answered by the core."""

    def __init__(self, inline: Inline) -> None:
        self.inline = inline

    async def heartbeat(
        self,
        job_id: int,
        token: int,
        *,
        lease_ms: int | None = None,
        progress: dict[str, Any] | None = None,
        deadline_s: float | None = None,
    ) -> dict[str, Any]:
        report = (None if progress is None
                  else _parsed(lambda: ProgressReport.parse(progress, "progress")))
        command = Heartbeat(self.inline._request_id(), job_id, token, lease_ms, report)
        result = self.inline._apply(command)
        if isinstance(result, Rejected):
            raise ApiError(result.http_status, result.code, result.message, result.field)
        value: dict[str, Any] = result.value
        return value

    async def job(self, job_id: int, *, consistent: bool = False) -> dict[str, Any]:
        return self.inline.job(job_id)


def _parsed(build: Any) -> Any:
    try:
        return build()
    except Invalid as error:
        raise InlineError("invalid", error.message, error.field) from None
