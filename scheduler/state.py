"""The replicated state machine: `SchedulerState.apply(command) -> Ok | Rejected`.

Every node applies the same commands in the same order and must reach byte-identical
snapshots, so this module has no clock (time is `self.now_ms`, moved only by `Tick`), no
randomness, no iteration over sets, and no floats in time. Each handler validates first and
mutates after: a rejected command changes nothing. Unexpected exceptions are bugs and propagate:
the shell stops the node rather than let replicas diverge.

Layout: `apply` is one `match`; the job moves (claim, finish, retry, cancel, cascade) are the
`_`-methods below; the firing of schedules is in `scheduler.firing`, which works on this state.
"""

from __future__ import annotations

from typing import Any

from raftcron.scheduler import (
    archiving,
    bulk,
    claiming,
    events,
    firing,
    gate,
    leadership,
    limits,
    purging,
    queues,
    requests,
    retention,
    sizes,
    uniqueness,
    upstream,
    workflows,
)
from raftcron.scheduler import jobs as j
from raftcron.scheduler.archiving import ArchiveLedger
from raftcron.scheduler.commands import (
    Ack,
    Barrier,
    BeginLeadership,
    CancelJob,
    ClaimJobs,
    Command,
    CompleteJob,
    FailJob,
    Heartbeat,
    RetryJob,
    SubmitJobs,
    SubmitWorkflow,
    Tick,
    command_fingerprint,
)
from raftcron.scheduler.errors import Invalid, Ok, Rejected, Result
from raftcron.scheduler.events import EventLog
from raftcron.scheduler.flowcommands import BulkJobs, PauseQueue, PutQueue, ResumeQueue
from raftcron.scheduler.frozen import FrozenJob
from raftcron.scheduler.gate import Finalize, PutSettings
from raftcron.scheduler.jobs import Job, Workflow
from raftcron.scheduler.notifications import (
    AckNotification,
    DeleteNotification,
    Notifications,
    PutNotification,
)
from raftcron.scheduler.purging import PurgeJobs
from raftcron.scheduler.requests import RequestLog
from raftcron.scheduler.schedules import Schedule
from raftcron.scheduler.settings import Settings
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.store import JobTable
from raftcron.scheduler.upstream import Sheltered


class SchedulerState:
    def __init__(self) -> None:
        self.now_ms = 0
        self.fence = 0  # the last fencing token handed out; strictly increasing
        self.next_job_id = 1
        self.next_workflow_id = 1
        self.table = JobTable()
        self.schedules: dict[str, Schedule] = {}
        self.schedule_heap: list[tuple[int, str]] = []  # (next_fire_ms, name), cleaned lazily
        self.pending_schedules: dict[str, None] = {}  # start (cursor = now) at the next Tick
        self.workflows: dict[int, Workflow] = {}
        # The workflow of each job that has one (its workflow_id, read without decoding a
        # finished job's record: removing a million finished jobs must not decode them).
        self.workflow_of: dict[int, int] = {}
        # Finished jobs of running workflows set aside by eviction (scheduler/upstream.py).
        self.sheltered = Sheltered()
        self.requests = RequestLog()
        self.events = EventLog()
        self.counters: dict[str, dict[str, int]] = {}  # name -> label (queue, ...) -> count
        self.leader: tuple[str, int] | None = None  # (node, term) of the last BeginLeadership
        self.notifications = Notifications()  # webhooks and their outbox
        self.queues: dict[str, queues.QueueControl] = {}  # the queues with limits (queues.py)
        # The upgrade gate (scheduler/gate.py): below LEVEL_BOUNDED, retention is the 7-day
        # constant and nothing is refused for space, as in the previous release; `settings`
        # (retention, budget) take effect from the Finalize that raises it.
        self.level = gate.LEVEL_BEFORE
        self.settings = Settings()
        # Fire keys created at or before this are forgotten (the highest cutoff retention
        # used since finalizing): how far back a backfill may reach.
        self.keys_forgotten_ms = 0
        self.retention_pending = False  # the last Tick left eviction work for the next one
        self.schedules_bytes = self.workflows_bytes = 0  # the memory model's counts of them
        self.archive_ledger = ArchiveLedger()  # archive retention (scheduler/archiving.py)
        # Not replicated: a list the shell sets gets every job that leaves (`remove_job`), to
        # take after each entry and archive (cluster/archive); None keeps none.
        self.leaving: list[tuple[int, Job | FrozenJob]] | None = None

    @property
    def finalized(self) -> bool:
        """Whether this release's bounded-state behaviour is on (scheduler/gate.py)."""
        return self.level >= gate.LEVEL_BOUNDED

    def state_bytes(self) -> int:
        """The state's size in the memory model (scheduler/sizes.py), what the budget bounds."""
        table = self.table
        return (table.bytes + table.key_bytes + table.rates.bytes + self.schedules_bytes
                + self.workflows_bytes + self.requests.bytes_counted
                + self.archive_ledger.tombstone_bytes
                + sizes.EVENT_BYTES * (len(self.events) + len(self.notifications.outbox)))

    @property
    def clock_started(self) -> bool:
        """Whether a Tick was applied: before it, every request is refused not_ready."""
        return self.now_ms != 0

    def next_due_ms(self) -> int | None:
        """The earliest state time at which a Tick has work to do (a schedule's fire, a delayed
        job or retry becoming due, a lease running out), or None: the leader's ticker sleeps
        until then. The heaps may hold stale entries, so this may be early, never late."""
        if self.retention_pending:
            return self.now_ms  # eviction left for the next Tick: at once
        heads = [heap[0][0] for heap in (self.schedule_heap, self.table.delayed) if heap]
        lease_end = self.table.leases.first_ms()
        if lease_end is not None:
            heads.append(lease_end)
        # A full rate window (a queue's, a key's) with jobs waiting: the Tick as it opens.
        heads += queues.windows_opening(self.queues, self.table.ready, self.now_ms)
        heads += self.table.rates.wakes()
        return min(heads) if heads else None

    # -- the one entry point -----------------------------------------------------------------

    def apply(self, command: Command, fingerprint: int | None = None) -> Result:
        """Apply one command. `fingerprint`: its `command_fingerprint`, when the caller has
        it already (`codec.decode_request`); computed here when needed otherwise."""
        if not self.clock_started and not isinstance(command, Tick | BeginLeadership | Barrier):
            # A state that never ticked has no time: a request remembered "at 0" would be
            # forgotten by the first Tick, and a lease granted from 0 would end at once.
            return Rejected("not_ready", "the cluster's clock has not started yet; retry shortly")
        request_id = requests.dedupe_id(command, finalized=self.finalized)
        if request_id is not None:
            seen = self.requests.get(request_id)
            if seen is not None:
                tag, seen_fingerprint, value = seen
                if fingerprint is None:
                    fingerprint = command_fingerprint(command)
                if tag != command.TAG or seen_fingerprint != fingerprint:
                    return Rejected(
                        "request_id_reused",
                        f"request_id {request_id!r} was already used for a different request",
                        "request_id",
                    )
                return requests.answer(value)
            if self.requests.full():
                return Rejected(
                    "busy", "too many recent requests to remember another; retry in a few seconds"
                )
        try:
            result = self._dispatch(command)
        except Invalid as error:
            # Handlers validate before they mutate, so an Invalid here has changed nothing.
            return Rejected.from_invalid(error)
        finally:
            self.table.freeze_finished()
        if request_id is not None and isinstance(result, Rejected) and \
                requests.remembered(result) and \
                self.requests.refusal_bytes >= limits.REFUSALS_BYTES_MAX:
            return Rejected("busy", "too many requests refused for space lately to remember "
                                    "another; retry in a few seconds")
        if request_id is not None and requests.remembered(result):
            if fingerprint is None:
                fingerprint = command_fingerprint(command)
            self.requests.remember(request_id, command.TAG, fingerprint,
                                   requests.value_of(result), self.now_ms)
        if self.finalized and isinstance(result, Ok) and not isinstance(command, Tick):
            # What the command added (its answer in the request table included), evicted
            # back under the budget; a Tick evicts for itself. A lowered budget can leave
            # more than one entry's work: the next Ticks do the rest, at once.
            self.retention_pending |= retention.settle(self)
        return result

    def _dispatch(self, command: Command) -> Result:
        if not self.finalized and (refused := gate.refused_before_finalize(command)):
            return refused
        match command:
            case Tick():
                recorded = self.leader[0] if self.leader is not None else None
                if command.leader is not None and recorded not in (None, command.leader):
                    return Ok({"ignored": f"{command.leader} is not the leader"})
                return self._tick(command.now_ms)
            case ClaimJobs():
                return claiming.claim(self, command)
            case SubmitJobs():
                return self._submit_jobs(command)
            case Heartbeat():
                return self._heartbeat(command)
            case CompleteJob():
                return self.ack(
                    Ack(command.job_id, command.token, "succeeded", result=command.result)
                )
            case FailJob():
                ack = Ack(
                    command.job_id,
                    command.token,
                    "failed",
                    error=command.error,
                    retryable=command.retryable,
                )
                return self.ack(ack)
            case SubmitWorkflow():
                return workflows.submit(self, command.workflow, command.request_id)
            case CancelJob():
                return self._cancel(command)
            case RetryJob():
                return self.retry_job(command.job_id)
            case BeginLeadership():
                return leadership.begin(self, command)
            case Barrier():
                return Ok({})
            case PutNotification() | DeleteNotification() | AckNotification():
                return self.notifications.apply(command, self.now_ms)
            case PutQueue():
                return queues.put(self.queues, command.name, command.spec, self.now_ms,
                                  finalized=self.finalized)
            case PauseQueue() | ResumeQueue():
                paused = isinstance(command, PauseQueue)
                return queues.set_paused(self.queues, command.name, paused, self.now_ms)
            case BulkJobs():
                return bulk.apply(self, command)
            case Finalize() | PutSettings():
                return gate.apply(self, command)
            case PurgeJobs():
                return purging.apply(self, command)
            case _:
                return firing.apply_schedule_command(self, command)

    # -- helpers shared with scheduler.firing ---------------------------------------------------

    def count(self, name: str, label: str, by: int = 1) -> None:
        bucket = self.counters.get(name)
        if bucket is None:
            bucket = self.counters[name] = {}
        bucket[label] = bucket.get(label, 0) + by

    def emit(self, kind: str, *, at_ms: int | None = None, **fields: Any) -> None:
        at_ms = self.now_ms if at_ms is None else at_ms
        self.events.add(at_ms, kind, fields)
        if self.notifications.by_name:  # none: nothing recorded (an old log replays the same)
            self.notifications.on_event(self.events.last_seq, at_ms, kind, fields, self.table.get)

    def job(self, job_id: int) -> Job | FrozenJob:
        job = self.table.get(job_id)
        if job is None:
            raise Invalid("job_id", f"no job {job_id}", code="not_found")
        return job

    # -- submitting --------------------------------------------------------------------------

    def _submit_jobs(self, command: SubmitJobs) -> Result:
        for index, spec in enumerate(command.jobs):
            for parent_id in spec.depends_on:
                if self.table.get(parent_id) is None:
                    return Rejected(
                        "invalid",
                        f"jobs[{index}].depends_on: no job {parent_id} "
                        "(unknown, or removed by retention)",
                        f"jobs[{index}].depends_on",
                    )
        refused = uniqueness.check_periods(self, command.jobs)
        if refused is None and self.finalized:
            refused = retention.check_submit(self, command)
        if refused is not None:
            return refused
        out: list[list[Any]] = []
        notes: dict[str, list[Any]] = {}  # what `unique` and `debounce` did, by job index
        for index, spec in enumerate(command.jobs):
            if spec.unique is not None or spec.debounce_ms is not None:
                out.append(uniqueness.submit(self, spec, index, notes))
                continue
            holder = None if spec.key is None else self.table.key_holder(spec.key)
            if holder is not None and (self.finalized or holder in self.table.jobs):
                # First wins while the key is remembered, whatever became of its job: once
                # finalized a job may be evicted long before its key's window ends.
                out.append([holder, False])
                continue
            job = self.create_job(spec, key=spec.key)
            out.append([job.id, True])
        return Ok({"jobs": out, **notes})

    def create_job(
        self,
        spec: JobSpec,
        *,
        key: str | None,
        schedule: str | None = None,
        fire_time_ms: int | None = None,
        run_at_ms: int | None = None,
        workflow: Workflow | None = None,
        node_name: str | None = None,
        blocked_on: int = 0,
    ) -> Job:
        """Create a job from a validated spec; its parents (depends_on) must exist."""
        job = Job(self.next_job_id, spec.task, self.now_ms)
        self.next_job_id += 1
        job.key = key
        job.queue = spec.queue
        job.payload = spec.packed_payload()
        job.priority = spec.priority
        job.max_attempts = job.attempt_limit = spec.max_attempts
        job.backoff = spec.backoff
        job.timeout_ms = spec.timeout_ms
        job.schedule = schedule
        job.fire_time_ms = fire_time_ms
        if spec.concurrency is not None:
            job.concurrency_key, job.concurrency_max = spec.concurrency.key, spec.concurrency.max
        job.rate, job.fairness, job.traceparent = spec.rate, spec.fairness, spec.traceparent
        if run_at_ms is None:
            # A debounced job waits out its quiet period (a spec gives no delay_ms with it).
            delay_ms = spec.delay_ms or spec.debounce_ms or 0
            run_at_ms = spec.run_at_ms if spec.run_at_ms is not None else self.now_ms + delay_ms
        job.run_at_ms = run_at_ms
        if workflow is not None:
            job.workflow_id = workflow.id
            self.workflow_of[job.id] = workflow.id
            job.workflow_node = node_name
            workflow.remaining += 1
            workflow.unfinished += 1
        doomed = False
        job.waiting_on = blocked_on
        if spec.depends_on:
            job.depends_on = spec.depends_on
            for parent_id in spec.depends_on:
                parent = self.table.live(parent_id)
                assert parent is not None  # checked by the caller
                parent.add_child(job.id)
                if parent.status != j.SUCCEEDED:
                    job.waiting_on += 1
                    doomed = doomed or parent.status in (j.FAILED, j.CANCELLED)
        if job.waiting_on:
            self.table.add(job, j.BLOCKED)
        else:
            self.table.add(job, self._runnable_status(job))
        if key is not None:
            # Fire keys, and unique keys whose period is past the key window, live as long
            # as the job retention.
            unique = spec.unique
            long = schedule is not None or (
                unique is not None and unique.period_ms > limits.KEY_WINDOW_MS_DEFAULT
            )
            self.table.remember_key(key, job.id, self.now_ms, long=long)
        if schedule is not None and schedule in self.schedules:
            self.schedules[schedule].active[job.id] = None
        self.count("submitted", job.queue)
        if doomed:
            self.cancel_job(job, j.UPSTREAM_FAILED)
        return job

    def _runnable_status(self, job: Job) -> str:
        return j.QUEUED if job.run_at_ms <= self.now_ms else j.SCHEDULED

    def create_workflow(
        self,
        spec: WorkflowSpec,
        *,
        key: str | None,
        schedule: str | None = None,
        fire_time_ms: int | None = None,
        run_at_ms: int | None = None,
    ) -> Workflow:
        return workflows.create(self, spec, key=key, schedule=schedule,
                                fire_time_ms=fire_time_ms, run_at_ms=run_at_ms)

    # -- claiming and the worker's answers ---------------------------------------------------

    def _leased(self, job_id: int, token: int) -> Job | Rejected:
        """The job if `token` holds its lease now, else why not (stale or cancelled)."""
        job = self.table.get(job_id)
        if job is None:
            return Rejected("not_found", f"no job {job_id}", "job_id")
        if token != job.token:
            return Rejected(
                "stale_token",
                f"token {token} is stale for job {job_id} (current token {job.token})",
                "token",
            )
        if job.status == j.CANCELLED:
            return Rejected(
                "job_cancelled", f"job {job_id} was cancelled ({job.cancel_reason})", "job_id"
            )
        if job.status != j.RUNNING:
            return Rejected(
                "stale_token",
                f"token {token} no longer holds a lease: job {job_id} is {job.status}",
                "token",
            )
        assert isinstance(job, Job)  # running: never frozen
        return job

    def _heartbeat(self, command: Heartbeat) -> Result:
        job = self._leased(command.job_id, command.token)
        if isinstance(job, Rejected):
            return job
        if command.lease_ms is not None:
            job.lease_ms = command.lease_ms
        assert job.lease_ms is not None and job.lease_until_ms is not None
        # The heap entry stays; pop_expired_leases re-files it when it surfaces early.
        job.lease_until_ms = max(job.lease_until_ms, self.now_ms + job.lease_ms)
        if command.progress is not None and self.finalized:  # before: ignored, progress.py
            job.progress = command.progress.packed(self.now_ms, job.attempts)
            self.table.recount(job)
        return Ok({"lease_until_ms": job.lease_until_ms})

    def ack(self, ack: Ack) -> Result:
        job = self._leased(ack.job_id, ack.token)
        if isinstance(job, Rejected):
            return job
        if ack.outcome == "succeeded":
            job.end_attempt(self.now_ms, j.OUTCOME_SUCCEEDED)
            job.result = j.pack(ack.result)
            job.error = None
            self.finish(job, j.SUCCEEDED)
            return Ok({"status": job.status})
        job.end_attempt(self.now_ms, j.OUTCOME_FAILED, ack.error)
        self._attempt_failed(job, ack.error, retryable=ack.retryable)
        return Ok({"status": job.status, "run_at_ms": job.run_at_ms})

    def _attempt_failed(self, job: Job, error: str, *, retryable: bool) -> None:
        """After a failed or expired attempt: back off and retry, or dead-letter."""
        job.error = error
        job.lease_until_ms = None
        if retryable and job.attempts < job.attempt_limit:
            job.run_at_ms = self.now_ms + j.backoff_delay_ms(job.backoff, job.id, job.attempts)
            self.table.set_status(job, self._runnable_status(job))
            self.count("retried", job.queue)
            return
        self.finish(job, j.FAILED)
        self.emit(events.DEAD_LETTERED, job=job.id, attempts=job.attempts, error=error)

    def expire_lease(self, job: Job) -> None:
        error = f"lease expired (worker {job.worker}, token {job.token})"
        job.end_attempt(self.now_ms, j.OUTCOME_LEASE_EXPIRED, error)
        self.emit(events.LEASE_EXPIRED, job=job.id, token=job.token, worker=job.worker)
        self.count("lease_expired", job.queue)
        self._attempt_failed(job, error, retryable=True)

    # -- finishing, cancelling, retrying ------------------------------------------------------

    def finish(self, job: Job, status: str, *, reason: str | None = None) -> None:
        """Move a job to a final status and carry the consequences to its children."""
        job.finished_ms = self.now_ms
        job.lease_until_ms = None
        if status == j.CANCELLED:
            job.cancel_reason = reason
        self.table.set_status(job, status)
        self.count(status, job.queue)
        if job.workflow_id is not None:
            upstream.job_moved(self, job.workflow_id, -1)
        self._on_final(job)

    def _on_final(self, job: Job) -> None:
        if job.schedule is not None:
            firing.job_finished(self, job)
        if not job.children:
            return
        if job.status == j.SUCCEEDED:
            for child_id in job.children:
                child = self.table.get(child_id)
                if isinstance(child, Job) and child.status == j.BLOCKED:
                    child.waiting_on -= 1
                    if child.waiting_on == 0:
                        child.run_at_ms = max(child.run_at_ms, self.now_ms)
                        self.table.set_status(child, self._runnable_status(child))
        else:
            for child_id in job.children:
                child = self.table.get(child_id)
                if isinstance(child, Job) and not child.final:
                    # Recursion depth is bounded by the DAG depth (<= WORKFLOW_JOBS_MAX).
                    self.cancel_job(child, j.UPSTREAM_FAILED)

    def cancel_job(self, job: Job, reason: str) -> None:
        if job.status == j.RUNNING:
            job.end_attempt(self.now_ms, j.OUTCOME_CANCELLED, reason)
        if reason == j.UPSTREAM_FAILED:
            job.error = "a job it depends on failed or was cancelled"
        self.finish(job, j.CANCELLED, reason=reason)

    def _cancel(self, command: CancelJob) -> Result:
        job = self.job(command.job_id)
        if isinstance(job, FrozenJob) or job.final:
            return Rejected("conflict", f"job {job.id} is already {job.status}", "job_id")
        before = self.table.count_by_status[j.CANCELLED]
        self.cancel_job(job, command.reason or "cancelled by request")
        cascaded = self.table.count_by_status[j.CANCELLED] - before - 1
        return Ok({"status": job.status, "cancelled_descendants": cascaded})

    def retry_job(self, job_id: int) -> Result:
        job = self.job(job_id)
        if job.status not in (j.FAILED, j.CANCELLED):
            return Rejected(
                "not_retryable",
                f"job {job.id} is {job.status}; only failed or cancelled jobs can be retried",
                "job_id",
            )
        for parent_id in job.depends_on:
            parent = self.table.get(parent_id)
            if parent is not None and parent.status in (j.FAILED, j.CANCELLED):
                return Rejected(
                    "not_retryable",
                    f"job {job.id} depends on job {parent_id}, which is {parent.status}; "
                    "retry that first",
                    "job_id",
                )
        if self.finalized:
            refused = retention.check_room(self, sizes.JOB_BYTES, keep=job.id)
            if refused is not None:
                return refused
        self._revive(job, manual=True)
        return Ok({"status": self.job(job_id).status})

    def _revive(self, frozen: Job | FrozenJob, *, manual: bool) -> None:
        """Bring a failed or cancelled job back; its upstream_failed descendants come back too."""
        job = self.table.live(frozen.id)
        assert job is not None
        if manual:
            job.attempt_limit = job.attempts + job.max_attempts
        job.finished_ms = None
        job.cancel_reason = None
        job.error = None
        job.result = None
        parents = [self.table.get(p) for p in job.depends_on]
        job.waiting_on = sum(1 for p in parents if p is not None and p.status != j.SUCCEEDED)
        if job.waiting_on:
            self.table.set_status(job, j.BLOCKED)
        else:
            job.run_at_ms = max(job.run_at_ms, self.now_ms)
            self.table.set_status(job, self._runnable_status(job))
        self.count("revived", job.queue)
        if job.workflow_id is not None:
            upstream.job_moved(self, job.workflow_id, 1)
        if job.schedule is not None and job.schedule in self.schedules:
            self.schedules[job.schedule].active[job.id] = None
        for child_id in job.children or ():
            child = self.table.get(child_id)
            if (
                child is not None
                and child.status == j.CANCELLED
                and child.cancel_reason == j.UPSTREAM_FAILED
            ):
                others = [self.table.get(p) for p in child.depends_on]
                if not any(p is not None and p.status in (j.FAILED, j.CANCELLED) for p in others):
                    self._revive(child, manual=False)

    # -- time ---------------------------------------------------------------------------------

    def _tick(self, now_ms: int) -> Result:
        self.now_ms = self.table.now_ms = max(self.now_ms, now_ms)
        now_ms = self.now_ms
        self.table.release_due_rates()  # rate keys' windows that opened: before any claim
        released = 0
        for job in self.table.pop_due_delayed(now_ms):
            self.table.set_status(job, j.QUEUED)
            released += 1
        expired = 0
        for job in self.table.pop_expired_leases(now_ms):
            self.expire_lease(job)
            expired += 1
        fire_times_ms = firing.fire_due(self)
        removed = retention.collect_garbage(self)
        return Ok({"now_ms": now_ms, "released": released, "expired": expired,
                   "fired": len(fire_times_ms), "fire_times_ms": fire_times_ms,
                   "removed": removed})

    def remove_job(self, job: Job | FrozenJob, *, archived: bool = True) -> None:
        """`job` leaves the state: to the archive, unless purged (scheduler/purging.py)."""
        counted = self.table.remove(job)
        if archived:
            archiving.leave(self, job, counted)
        workflow_id = self.workflow_of.pop(job.id, None)
        if workflow_id is not None:
            workflow = self.workflows.get(workflow_id)
            if workflow is not None:
                workflow.remaining -= 1
                if workflow.remaining == 0:
                    del self.workflows[workflow.id]
                    self.workflows_bytes -= workflows.record_bytes(len(workflow.job_ids))
