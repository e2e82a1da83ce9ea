"""The budget scenario's own load (CHAOS.md wave 3, "State budget under faults"): a flood of
large jobs that keeps the replicated state at its budget, and the evidence the no-lost-job
checker needs once finished jobs are evicted (DESIGN.md §9.1).

What it owns, on one asyncio loop in a thread of its own (`Flood`; it outlives the client's
load, for the drain needs its consumer and its observer):
- the submitter: a job of FLOOD_PAYLOAD_BYTES every FLOOD_EVERY_S, one in three into
  FLOOD_QUEUE (consumed), the others into IDLE_QUEUE (claimed by no one), each recorded as
  the client's submits are (`submit` events with `flood` set; a 507 is op "fail" with its
  status: definite);
- the consumer: claims FLOOD_QUEUE and completes what it claimed with its next claim, so
  finished large jobs are there to evict; every ack answered "ok" is a `final` event (source
  "ack"); acks whose answer never came are settled by reading their jobs (source "read");
- the operator: when the flood has been refused for FULL_HOLD_S, it cancels the oldest
  CANCEL_BATCH idle jobs (what the docs tell a full cluster's operator to do: cancel work),
  so the state swings between full (refusals) and merely at its budget (evictions); each
  cancel answered is a `final` event (source "cancel"); when submitting stops it cancels every
  idle job left, so the drain can end;
- the observer: every OBSERVE_EVERY_S a consistent read of every job of the client's queue
  (GET /v1/jobs, all statuses, every page): each job seen in a final status is a `final`
  event (source "observer"), once. The flood's queues are left to the consumer and the
  operator: reading 60 KB payloads twice a second would load the nodes more than the faults.
  Every USAGE_EVERY_S it records the state against its budget (`usage`: GET /v1/settings),
  which shows when the budget was reached and when the state was full.

It must not judge (chaos/tier2/checkers/jobs.py does), and no wait is unbounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from raftcron.chaos.tier2.checkers import FINAL
from raftcron.chaos.tier2.clientload import LoopThread
from raftcron.chaos.tier2.history import History
from raftcron.chaos.tier2.workload import QUEUE
from raftcron.cluster.clients.asyncclient import AsyncClient
from raftcron.cluster.clients.clientparts import ApiError, RaftcronError, new_request_id

FLOOD_QUEUE = "chaos-flood"
IDLE_QUEUE = "chaos-idle"
FLOOD_TASK = "chaos.flood"
FLOOD_PAYLOAD_BYTES = 60_000
FLOOD_EVERY_S = 0.2
FLOOD_LEASE_MS = 10_000
CONSUMER_RETRY_S = 60.0
FULL_HOLD_S = 3.0  # refused this long, the operator makes room
CANCEL_BATCH = 25  # idle jobs it cancels then (1.5 MB of payloads)
OBSERVE_EVERY_S = 0.5
USAGE_EVERY_S = 2.0


class Flood(LoopThread):
    """The flood, its consumer, its operator and the observer, on one loop in a thread."""

    THREAD_NAME = "chaos-flood"
    LOOPS = "flood loop"

    def __init__(self, urls: list[str], history: History) -> None:
        super().__init__()
        self.urls = urls
        self.history = history
        self.idle: list[int] = []  # acknowledged idle jobs not yet cancelled, oldest first
        self.seen_final: set[int] = set()
        self.refused_since: float | None = None
        self.counter = 0

    # -- the harness's side ---------------------------------------------------------------

    def stop_submitting(self, timeout_s: float = 60.0) -> None:
        """Stop the flood and cancel every idle job left (bounded): then every acknowledged
        flood job can end, and the drain can wait for them."""
        self.submitting.clear()
        if self.thread is None or not self.thread.is_alive():
            return
        done = asyncio.run_coroutine_threadsafe(self._cancel_all_idle(), self.loop)
        with contextlib.suppress(Exception):
            done.result(timeout_s)
        if self.idle:
            self.history.record("note", text=f"flood: {len(self.idle)} idle jobs not cancelled")

    async def _main(self) -> None:
        from raftcron.chaos.tier2.nemesis import ADMIN, SUBMIT, WORKER

        self.stopping = asyncio.Event()
        self.lock = asyncio.Lock()  # one submit or cancel batch at a time
        self.submitter = AsyncClient(self.urls, token=SUBMIT, request_timeout_s=3,
                                     retry_deadline_s=10)
        # A claim is retried under its request id through an outage, so the answer to its
        # acks comes from the cluster's request table rather than be lost: an ack whose job
        # was evicted before a read could settle it leaves no evidence that it ended.
        self.consumer = AsyncClient(self.urls, token=WORKER, request_timeout_s=3,
                                    retry_deadline_s=CONSUMER_RETRY_S)
        self.reader = AsyncClient(self.urls, token=ADMIN, request_timeout_s=3,
                                  retry_deadline_s=CONSUMER_RETRY_S)
        self.operator = AsyncClient(self.urls, token=SUBMIT, request_timeout_s=3,
                                    retry_deadline_s=CONSUMER_RETRY_S)  # cancels: the same
        tasks = [asyncio.create_task(self._guard(c)) for c in
                 (self._submit_loop(), self._consume_loop(), self._observe_loop())]
        await self.stopping.wait()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for client in (self.submitter, self.consumer, self.reader, self.operator):
            await client.close()

    def _final(self, job_id: int, status: str, source: str) -> None:
        if job_id not in self.seen_final:
            self.seen_final.add(job_id)
            self.history.record("final", job_id=job_id, status=status, source=source)

    # -- the submitter and the operator ---------------------------------------------------

    async def _submit_loop(self) -> None:
        while not self._stopped():
            started = time.monotonic()
            async with self.lock:  # submitting is read under it: see _cancel_all_idle
                if self.submitting.is_set():
                    self.counter += 1
                    queue = FLOOD_QUEUE if self.counter % 3 == 0 else IDLE_QUEUE
                    refused = await self._submit_one(f"f-{self.counter}", queue)
                    now = time.monotonic()
                    if not refused:
                        self.refused_since = None
                    elif self.refused_since is None:
                        self.refused_since = now
                    elif now - self.refused_since >= FULL_HOLD_S:
                        await self._cancel_idle(CANCEL_BATCH)
                        self.refused_since = None
            await self._pause(max(0.0, FLOOD_EVERY_S - (time.monotonic() - started)))

    async def _cancel_all_idle(self) -> None:
        """Once submitting stopped: after the submit in flight (the lock), no idle job can be
        acknowledged any more; cancel them all, a few rounds while some cannot be yet."""
        async with self.lock:
            for _ in range(20):
                await self._cancel_idle(len(self.idle))
                if not self.idle:
                    return
                await self._pause(1.0)

    async def _submit_one(self, key: str, queue: str) -> bool:
        """Submit one flood job; whether the cluster refused it for space."""
        self.history.record("submit", op="invoke", key=key, retry=False, flood=True, queue=queue)
        payload = {"n": self.counter, "blob": "x" * FLOOD_PAYLOAD_BYTES}
        try:
            job = await self.submitter.submit(FLOOD_TASK, payload, key=key, queue=queue,
                                              max_attempts=10)
        except ApiError as error:  # StateFull (507) among them: nothing was created
            self.history.record("submit", op="fail", key=key, retry=False, flood=True,
                                status=error.status, error=error.code)
            return error.code == "state_full"
        except (RaftcronError, OSError, TimeoutError) as error:
            self.history.record("submit", op="info", key=key, retry=False, flood=True,
                                error=repr(error)[:200])
            return False
        job_id = int(job["id"])
        self.history.record("submit", op="ok", key=key, retry=False, flood=True, job_id=job_id,
                            created=bool(job.get("created", True)))
        if queue == IDLE_QUEUE:
            self.idle.append(job_id)
        return False

    async def _cancel_idle(self, count: int) -> None:
        """Cancel the oldest `count` idle jobs; one that cannot be cancelled now stays listed."""
        batch, self.idle = self.idle[:count], self.idle[count:]
        kept = []
        for job_id in batch:
            self.history.record("flood", op="cancel", job_id=job_id)
            try:
                answer = await self.operator.cancel(job_id, reason="chaos: make room")
            except ApiError as error:
                if error.code == "conflict":  # final already (a cancel whose answer was lost)
                    self._final(job_id, "final", "cancel")
                elif error.status != 404:
                    kept.append(job_id)
                continue
            except (RaftcronError, OSError, TimeoutError):
                kept.append(job_id)
                continue
            self._final(job_id, str(answer.get("status") or "cancelled"), "cancel")
        self.idle = kept + self.idle

    # -- the consumer ---------------------------------------------------------------------

    async def _consume_loop(self) -> None:
        acks: list[dict[str, Any]] = []
        unsettled: list[dict[str, Any]] = []
        while not self._stopped():
            try:
                answer = await self.consumer.claim(
                    "flood", [FLOOD_QUEUE], max=4, lease_ms=FLOOD_LEASE_MS, wait_ms=1_000,
                    acks=acks, request_id=new_request_id(),
                )
            except (RaftcronError, OSError, TimeoutError) as error:
                self.history.record("flood", op="claim_failed", error=repr(error)[:200],
                                    acks=[ack["id"] for ack in acks])
                unsettled += acks  # applied or not: a read will say
                acks = []
                await self._pause(0.5)
                acks = await self._settle(unsettled)
                continue
            for ack, outcome in zip(acks, answer.get("acks") or [], strict=False):
                if outcome.get("outcome") == "ok":
                    self._final(int(ack["id"]), "succeeded", "ack")
                else:
                    self.history.record("flood", op="ack_refused", job_id=ack["id"],
                                        token=ack["token"], code=outcome.get("outcome"))
            if answer.get("jobs"):
                self.history.record("flood", op="claimed",
                                    jobs=[[job["id"], job["token"]] for job in answer["jobs"]])
            acks = [{"id": job["id"], "token": job["token"], "outcome": "succeeded",
                     "result": {"flood": True}} for job in answer.get("jobs") or []]
            if unsettled:
                acks += await self._settle(unsettled)

    async def _settle(self, unsettled: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Acks whose answer was lost: a job now final is recorded, one still leased under the
        ack's token is acked again; the rest (gone, leased again) are dropped. Empties the
        list; what is returned goes with the next claim."""
        again = []
        pending, unsettled[:] = list(unsettled), []
        for ack in pending:
            try:
                job = await self.reader.job(int(ack["id"]), consistent=True)
            except ApiError as error:  # 404: evicted before anyone saw it final
                self.history.record("flood", op="settle", job_id=ack["id"], status=error.status)
                continue
            except (RaftcronError, OSError, TimeoutError):
                unsettled.append(ack)
                continue
            if job.get("status") in FINAL:
                self._final(int(ack["id"]), str(job["status"]), "read")
            elif job.get("status") == "running" and job.get("token") == ack["token"]:
                again.append(ack)
        return again

    # -- the observer ---------------------------------------------------------------------

    async def _observe_loop(self) -> None:
        usage_at = 0.0
        while not self._stopped():
            started = time.monotonic()
            if started - usage_at >= USAGE_EVERY_S:
                usage_at = started
                with contextlib.suppress(RaftcronError, OSError, TimeoutError):
                    usage = (await self.reader.request("GET", "/v1/settings"))["usage"]
                    self.history.record(
                        "usage", state_bytes=usage["state_bytes"],
                        budget_bytes=usage["budget_bytes"], evicted=usage["evicted"],
                        fires_refused=usage["fires_refused"], kept=usage["kept"])
            with contextlib.suppress(RaftcronError, OSError, TimeoutError):
                cursor: int | None = None
                for _ in range(100):
                    page = await self.reader.jobs(queue=QUEUE, limit=1_000, cursor=cursor,
                                                  consistent=True)
                    for job in page.get("jobs") or []:
                        if job.get("status") in FINAL:
                            self._final(int(job["id"]), str(job["status"]), "observer")
                    cursor = page.get("next_cursor")
                    if not cursor:
                        break
            await self._pause(max(0.05, OBSERVE_EVERY_S - (time.monotonic() - started)))
