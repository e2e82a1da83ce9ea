"""The job table and every index over it, kept true by one set of transitions.

Owns: `jobs` (id order; finished jobs frozen, see `scheduler.frozen`), the ready queues (a
heap per queue, ordered by priority, then due time, then id), the heaps of delayed jobs and of
leases, the finished-job FIFO for retention, the idempotency-key table, the counts per status
and of running jobs per queue, and the concurrency keys' slots. Every status change goes
through `set_status`, so an index cannot drift from the records; a job that changes after it
finished goes through `live` first.

Concurrency keys (a job's `concurrency: {key, max}`): a queued job with a key is either in its
queue's ready heap ("first in line": it counts against the key) or `held` in its key's heap,
out of every queue, so it blocks nothing behind it. A key's running jobs plus its jobs in ready
heaps stay below the max of the job let in last: a job is let in (`_release`, after every change
that lowers those counts) only while `running + ready < its max`, so a claim meets a keyed head
with room (jobs of one key giving different maxes are checked again at claim time). The split
between ready and held is state: snapshots carry the held ids, and restore puts every job back
where it was.

Heaps hold (key, id) pairs and are cleaned lazily: an entry whose job has moved on is skipped
when it reaches the top. Their order is a total order ending in the job id, so which job is
picked never depends on a heap's internal layout; snapshots carry jobs, not heaps, and restore
rebuilds the indexes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator

from raftcron.scheduler import jobs as j
from raftcron.scheduler.fairness import FairQueue
from raftcron.scheduler.finished import FinishedJobs
from raftcron.scheduler.frozen import FrozenJob, freezer, readable
from raftcron.scheduler.jobs import Job
from raftcron.scheduler.leases import LeaseEnds
from raftcron.scheduler.lines import ReadyQueue
from raftcron.scheduler.ratekeys import RateKeys
from raftcron.scheduler.sizes import frozen_job_bytes, key_bytes, live_job_bytes


class JobTable:
    def __init__(self) -> None:
        self.jobs: dict[int, Job | FrozenJob] = {}
        self.finished_now: list[Job] = []  # final since the last `freeze_finished`
        self.ready: dict[str, ReadyQueue | FairQueue] = {}
        self.delayed: list[tuple[int, int]] = []  # (run_at_ms, id) of scheduled jobs
        self.leases = LeaseEnds()  # (lease_until_ms, id) of running jobs (scheduler/leases.py)
        self.finished = FinishedJobs(self.finished_entry_valid)  # retention's order
        # key -> (job id, created_ms, kept long). Client keys live the dedupe window; a
        # schedule's fire keys live the job retention period, so no time fires twice.
        self.keys: dict[str, tuple[int, int, bool]] = {}
        self.key_order: deque[tuple[int, str]] = deque()  # (created_ms, key) of client keys
        self.fire_key_order: deque[tuple[int, str]] = deque()  # (created_ms, key) of fire keys
        self.count_by_status: dict[str, int] = dict.fromkeys(j.STATUSES, 0)
        # Every status but `succeeded` (the bulk of a retained store) is indexed for listing.
        self.by_status: dict[str, dict[int, None]] = {s: {} for s in j.STATUSES if s != j.SUCCEEDED}
        self.running_by_queue: dict[str, int] = {}  # a queue's concurrency_max counts these
        self.key_running: dict[str, int] = {}  # concurrency key -> running jobs holding it
        self.key_ready: dict[str, int] = {}  # concurrency key -> its jobs in ready heaps
        self.held: dict[str, ReadyQueue] = {}  # concurrency key -> queued jobs waiting for it
        self.held_by_queue: dict[str, int] = {}  # queue -> its jobs in `held` (for views)
        # Keyed rate limits (scheduler/ratekeys.py): jobs held for a key's window, its starts.
        self.rates = RateKeys()
        self.now_ms = 0  # the state's time, as the state last set it (rate keys' windows)
        # A job was ever given a concurrency key: its record has fields a previous release
        # cannot read, so snapshots are written in the newer format from then on.
        self.keyed_seen = False
        # Finished jobs are frozen in the compact record format (scheduler/frozen.py) once
        # the cluster is finalized: the previous release reads only the first one.
        self.compact_records = False
        # The memory model (scheduler/sizes.py): every job's bytes as counted now (a live job
        # keeps its count in `counted`; a frozen one is counted from its packed record), the
        # finished jobs' share (what eviction can free), per queue, and the keys'.
        self.bytes = 0
        self.finished_bytes = 0
        self.bytes_by_queue: dict[str, int] = {}
        self.key_bytes = 0

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[Job | FrozenJob]:
        return iter(self.jobs.values())

    def get(self, job_id: int) -> Job | FrozenJob | None:
        return self.jobs.get(job_id)


    def has_dependents(self, job: Job | FrozenJob) -> bool:
        """Whether a job that depends on `job` is still in the table."""
        return any(self.get(child) is not None for child in readable(job).children or ())
    def live(self, job_id: int) -> Job | None:
        """The job to change: a frozen one is decoded and put back in its place (the dict
        keeps its position), to be frozen again when the command ends if it is still final."""
        job = self.jobs.get(job_id)
        if isinstance(job, FrozenJob):
            frozen_bytes = frozen_job_bytes(job)
            job = self.jobs[job_id] = job.thawed()
            job.counted = live_job_bytes(job)
            self._recount(job.queue, job.counted - frozen_bytes, final=True)
            self.finished_now.append(job)
        return job

    def freeze_finished(self) -> None:
        """Freeze the jobs that are final at the end of a command (called by `apply`)."""
        if not self.finished_now:
            return
        jobs = self.jobs
        delta = 0
        queue: str | None = None
        freeze_one = freezer(compact=self.compact_records)
        for job in self.finished_now:
            if job.final and jobs.get(job.id) is job:
                frozen = jobs[job.id] = freeze_one(job)
                if job.queue != queue and queue is not None:
                    self._recount(queue, delta, final=True)  # a batch is mostly one queue
                    delta = 0
                queue = job.queue
                delta += frozen_job_bytes(frozen) - job.counted
        if queue is not None:
            self._recount(queue, delta, final=True)
        self.finished_now.clear()

    def _recount(self, queue: str, delta: int, *, final: bool) -> None:
        self.bytes += delta
        if final:
            self.finished_bytes += delta
        by_queue = self.bytes_by_queue
        left = by_queue.get(queue, 0) + delta
        if left:
            by_queue[queue] = left
        else:
            del by_queue[queue]

    def finished_entry_valid(self, status: str, finished_ms: int, job_id: int) -> bool:
        """Whether a retention entry still stands for its job (scheduler/finished.py)."""
        job = self.jobs.get(job_id)
        return job is not None and job.status == status and job.finished_ms == finished_ms

    # -- adding and removing -------------------------------------------------------------

    def add(self, job: Job, status: str) -> None:
        """Insert a new job in `status` (its fields, run_at_ms included, already set)."""
        self.jobs[job.id] = job
        job.status = status
        self.count_by_status[status] += 1
        job.counted = live_job_bytes(job)
        self._recount(job.queue, job.counted, final=False)
        self._index(job)
        key = job.concurrency_key
        if key is not None:
            self.keyed_seen = True
            if key in self.held:
                self._release(key)

    def remove(self, job: Job | FrozenJob) -> int:
        """Forget a finished job (retention); its key entry expires on its own schedule. What
        it was counted for (its bytes in the memory model)."""
        assert job.final, f"removing job {job.id} in status {job.status}"
        # Every finished job comes this way once (eviction): its fields read once, as locals.
        if isinstance(job, FrozenJob):
            job_id, status, queue = job._id, job._status, job._queue
            counted = frozen_job_bytes(job)
        else:
            job_id, status, queue, counted = job.id, job.status, job.queue, job.counted
        del self.jobs[job_id]
        self.count_by_status[status] -= 1
        index = self.by_status.get(status)
        if index is not None:
            del index[job_id]
        self.finished.discount(status, queue)
        self._recount(queue, -counted, final=True)
        return counted

    # -- status moves --------------------------------------------------------------------

    def set_status(self, job: Job, status: str) -> None:
        self._unindex(job)
        self.count_by_status[job.status] -= 1
        was_final = job.status in j.FINAL
        job.status = status
        self.count_by_status[status] += 1
        # Counted again: what changed a live job's size (an attempt, a result, an error, a
        # payload) comes with a status change (scheduler/sizes.py). Inline: every job passes
        # here two or three times.
        before = job.counted
        after = job.counted = live_job_bytes(job)
        final = status in j.FINAL
        if was_final or final:
            self.finished_bytes += (after if final else 0) - (before if was_final else 0)
        if after != before:
            self.bytes += after - before
            by_queue = self.bytes_by_queue
            by_queue[job.queue] = by_queue.get(job.queue, 0) + after - before
        self._index(job)
        if status in j.FINAL:
            self.finished_now.append(job)
        key = job.concurrency_key
        if key is not None and key in self.held:  # only held jobs wait for a release
            self._release(key)
        if job.rate is not None and self.rates.waiting(job.rate.key):
            self.release_rate(job.rate.key)

    def recount(self, job: Job) -> None:
        """Count a live job again after a change that kept its status (a progress report)."""
        before = job.counted
        after = job.counted = live_job_bytes(job)
        if after != before:
            self._recount(job.queue, after - before, final=job.final)

    def _index(self, job: Job | FrozenJob) -> None:
        status = job.status
        index = self.by_status.get(status)
        if index is not None:
            index[job.id] = None
        if status in j.FINAL:
            assert job.finished_ms is not None
            self.finished.add(status, job.queue, job.finished_ms, job.id)
            return
        assert isinstance(job, Job)  # only final jobs are ever frozen
        if status == j.QUEUED:
            if job.rate is not None and not self.rates.admits(job, self.now_ms):
                self.rates.hold(job, self.now_ms, self.jobs)  # out of line until its window opens
                return
            self._line_up(job)
        elif status == j.SCHEDULED:
            heapq.heappush(self.delayed, (job.run_at_ms, job.id))
        elif status == j.RUNNING:
            assert job.lease_until_ms is not None
            self.leases.add(job.lease_until_ms, job.id, job.lease_ms)
            # The two counts a claim trusts, kept inline: this runs for every job claimed.
            running = self.running_by_queue
            running[job.queue] = running.get(job.queue, 0) + 1
            key = job.concurrency_key
            if key is not None:
                self.key_running[key] = self.key_running.get(key, 0) + 1

    def _line_up(self, job: Job) -> None:
        """A queued job goes in its queue's line, or is held for its concurrency key."""
        key = job.concurrency_key
        if key is None:  # _push_ready's plain case, inline: every job comes this way
            queue = self.ready.get(job.queue)
            if queue is None or (job.fairness is not None and type(queue) is ReadyQueue):
                queue = self._new_line(job)
            queue.push(job)
            if job.rate is not None:
                self.rates.entered_line(job)
        elif key not in self.held and (
            self.key_running.get(key, 0) + self.key_ready.get(key, 0) < job.concurrency_max
        ):
            # What holding it and `_release` would do at once: nobody waits, there is room.
            self._push_ready(job)
        else:
            self._push_held(job)  # `_release` lets it in line when there is room

    def _unindex(self, job: Job) -> None:
        index = self.by_status.get(job.status)
        if index is not None:
            del index[job.id]
        key = job.concurrency_key
        if job.status in j.FINAL:  # a retry: its retention entry goes stale
            self.finished.discount(job.status, job.queue)
        elif job.status == j.QUEUED:
            if self._leave_line(job):
                if key is not None:
                    _drop(self.key_ready, key)
                if job.rate is not None:
                    self.rates.left_line(job)
            elif job.rate is not None and self.rates.unhold(job):
                pass  # it was held for its rate key's window
            else:
                assert key is not None, f"queued job {job.id} is in no ready queue"
                held = self.held[key]
                del held.members[job.id]
                _add(self.held_by_queue, job.queue, -1)
                if not held.members:
                    del self.held[key]
        elif job.status == j.RUNNING:
            _drop(self.running_by_queue, job.queue)
            if key is not None:
                _drop(self.key_running, key)
        # delayed, leases and finished entries are skipped lazily when they surface.

    # -- concurrency keys ----------------------------------------------------------------

    def _new_line(self, job: Job) -> ReadyQueue | FairQueue:
        """The ready line for `job`'s queue: a plain one, or fair turns from the first job
        with a fairness key (scheduler/fairness.py), the jobs in line moved over by id."""
        old = self.ready.get(job.queue)
        if job.fairness is None and old is None:
            line: ReadyQueue | FairQueue = ReadyQueue()
        else:
            line = FairQueue()
            for job_id in sorted(old.members if old is not None else ()):
                line.push(self.jobs[job_id])  # type: ignore[arg-type]
        self.ready[job.queue] = line
        return line

    def _leave_line(self, job: Job) -> bool:
        """Take a job out of its queue's line; False: it was not in it."""
        line = self.ready.get(job.queue)
        return line is not None and line.remove(job) is not None

    def _push_ready(self, job: Job) -> None:
        queue = self.ready.get(job.queue)
        if queue is None or (job.fairness is not None and type(queue) is ReadyQueue):
            queue = self._new_line(job)
        queue.push(job)
        key = job.concurrency_key
        if key is not None:
            self.key_ready[key] = self.key_ready.get(key, 0) + 1
        if job.rate is not None:
            self.rates.entered_line(job)

    def _push_held(self, job: Job) -> None:
        assert job.concurrency_key is not None
        held = self.held.get(job.concurrency_key)
        if held is None:
            held = self.held[job.concurrency_key] = ReadyQueue()
        held.push(job)
        _add(self.held_by_queue, job.queue, 1)

    def _release(self, key: str) -> None:
        """Let held jobs of `key` into their queues, best first, while the key has room."""
        held = self.held.get(key)
        while held is not None:
            head = held.peek()
            if head is None:
                del self.held[key]
                return
            job = self.jobs[head[2]]
            assert isinstance(job, Job) and job.status == j.QUEUED
            if self.key_running.get(key, 0) + self.key_ready.get(key, 0) >= job.concurrency_max:
                return
            held.pop()
            del held.members[job.id]
            _add(self.held_by_queue, job.queue, -1)
            self._push_ready(job)
            if not held.members:
                del self.held[key]
                return

    def key_has_room(self, job: Job) -> bool:
        """Whether one more running job with `job`'s concurrency key stays within its max."""
        key = job.concurrency_key
        return key is None or self.key_running.get(key, 0) < job.concurrency_max

    def hold_back(self, job: Job) -> None:
        """A ready job (popped off its heap by a claim) whose key is full: held for a slot."""
        assert job.concurrency_key is not None
        self._leave_line(job)
        _add(self.key_ready, job.concurrency_key, -1)
        if job.rate is not None:
            self.rates.left_line(job)
        self._push_held(job)
        self._release(job.concurrency_key)
        if job.rate is not None and self.rates.waiting(job.rate.key):
            self.release_rate(job.rate.key)  # it left its rate key's room to a held job

    def hold_back_rate(self, job: Job) -> None:
        """A ready job (popped off its heap by a claim) whose rate key has no start left in
        its window: held for the key's window, out of line."""
        self._leave_line(job)
        key = job.concurrency_key
        if key is not None:
            _add(self.key_ready, key, -1)
        self.rates.left_line(job)
        self.rates.hold(job, self.now_ms, self.jobs)
        if key is not None and key in self.held:
            self._release(key)
        assert job.rate is not None
        self.release_rate(job.rate.key)  # a head of a looser limit may have room now

    def release_rate(self, key: str) -> None:
        """Let the jobs held for a rate key's window in line while it has room."""
        for _ in range(len(self.jobs)):  # bounded: each turn takes a job off the held line
            job = self.rates.release_one(key, self.now_ms, self.jobs)
            if job is None:
                return
            self._line_up(job)

    def release_due_rates(self) -> None:
        """At a Tick: the rate keys whose windows opened let their held jobs in line."""
        if not self.rates.keys:
            return
        for key in self.rates.due(self.now_ms):
            self.release_rate(key)
        self.rates.forget(self.now_ms)

    def held_ids(self) -> list[int]:
        """Ids of the held jobs, in id order: what a snapshot records of the split."""
        return sorted(job_id for held in self.held.values() for job_id in held.members)

    def recount_restored(self, active: list[Job], frozen_by_queue: dict[str, int]) -> None:
        """The memory model's counts after a restore: the live jobs are counted here, the
        frozen ones' bytes per queue are given (summed by the restore's hot loop)."""
        by_queue = dict(frozen_by_queue)
        self.finished_bytes = sum(frozen_by_queue.values())
        total = self.finished_bytes
        for job in active:
            size = job.counted = live_job_bytes(job)
            total += size
            by_queue[job.queue] = by_queue.get(job.queue, 0) + size
        self.bytes = total
        self.bytes_by_queue = {queue: size for queue, size in by_queue.items() if size}

    def place_restored(self, job: Job, *, held: bool, rate_held: bool = False) -> None:
        """Index a job read from a snapshot where it was: held (for its concurrency key or
        its rate key's window) or in line, never re-decided."""
        if job.status == j.QUEUED and (job.concurrency_key is not None or job.rate is not None):
            index = self.by_status[j.QUEUED]
            index[job.id] = None
            if rate_held:
                self.rates.hold_restored(job)
            elif held:
                self._push_held(job)
            else:
                self._push_ready(job)
            return
        self._index(job)

    # -- time-ordered pops (used by Tick) ------------------------------------------------

    def pop_due_delayed(self, now_ms: int) -> list[Job]:
        """Scheduled jobs whose run_at_ms has come, in (run_at_ms, id) order."""
        heap = self.delayed
        due: dict[int, Job] = {}
        while heap and heap[0][0] <= now_ms:
            run_at_ms, job_id = heapq.heappop(heap)
            job = self.jobs.get(job_id)
            if isinstance(job, Job) and job.status == j.SCHEDULED and job.run_at_ms == run_at_ms:
                due[job_id] = job
        return sorted(due.values(), key=lambda job: (job.run_at_ms, job.id))

    def pop_expired_leases(self, now_ms: int) -> list[Job]:
        """Running jobs whose lease ended at or before now_ms, in (lease_until_ms, id) order.

        A heartbeat does not add a new entry: an entry that surfaces for a lease that has been
        extended is filed again with the new end, so `leases` holds about one entry per running
        job. The result is sorted by the jobs' current lease ends, not by heap entries, so the
        order is the same on a node restored from a snapshot.
        """
        leases = self.leases
        expired: dict[int, Job] = {}
        for _, job_id in leases.take_due(now_ms):
            job = self.jobs.get(job_id)
            if not isinstance(job, Job) or job.status != j.RUNNING or job.lease_until_ms is None:
                continue
            if job.lease_until_ms > now_ms:
                leases.add(job.lease_until_ms, job_id, job.lease_ms)
                continue
            expired[job_id] = job
        return sorted(expired.values(), key=lambda job: (job.lease_until_ms or 0, job.id))

    def oldest_finished(self, cutoff_ms: int) -> Job | FrozenJob | None:
        """The finished job retention takes first (oldest, by (finished_ms, id)) if it
        finished at or before cutoff_ms."""
        oldest = self.finished.oldest(FINAL_ORDER)
        if oldest is None or oldest[0] > cutoff_ms:
            return None
        return self.jobs[oldest[1]]

    # -- idempotency keys ------------------------------------------------------------------

    def job_for_key(self, key: str) -> Job | FrozenJob | None:
        entry = self.keys.get(key)
        return None if entry is None else self.jobs.get(entry[0])

    def key_holder(self, key: str) -> int | None:
        """The id of the job a remembered key names (which may be gone since), or None."""
        entry = self.keys.get(key)
        return None if entry is None else entry[0]

    def remembers_key(self, key: str) -> bool:
        """True while the key is remembered, even if its job was removed by retention."""
        return key in self.keys

    def remember_key(self, key: str, job_id: int, now_ms: int, *, long: bool = False) -> None:
        if key not in self.keys:
            self.key_bytes += key_bytes(key)
        self.keys[key] = (job_id, now_ms, long)
        (self.fire_key_order if long else self.key_order).append((now_ms, key))

    def expire_keys(self, cutoff_ms: int, long_cutoff_ms: int) -> int:
        """Forget client keys created at or before cutoff_ms, fire keys at or before
        long_cutoff_ms."""
        expired = 0
        for order, cutoff in ((self.key_order, cutoff_ms), (self.fire_key_order, long_cutoff_ms)):
            while order and order[0][0] <= cutoff:
                created_ms, key = order.popleft()
                entry = self.keys.get(key)
                if entry is not None and entry[1] == created_ms:
                    del self.keys[key]
                    self.key_bytes -= key_bytes(key)
                    expired += 1
        return expired

    # -- claiming --------------------------------------------------------------------------

    def best_ready(self, queues: Iterable[str]) -> str | None:
        """The queue among `queues` whose ready head goes first (priority, due time, id)."""
        best: str | None = None
        best_head: tuple[int, int, int] | None = None
        for name in queues:
            queue = self.ready.get(name)
            if queue is None:
                continue
            head = queue.peek()
            if head is not None and (best_head is None or head < best_head):
                best, best_head = name, head
        return best


FINAL_ORDER = tuple(sorted(j.FINAL))


def _drop(counts: dict[str, int], name: str) -> None:
    """One less (`_add(counts, name, -1)`, the common case spelled out: it runs for every job
    leaving a queue's line or finishing)."""
    value = counts[name] - 1
    if value:
        counts[name] = value
    else:
        del counts[name]


def _add(counts: dict[str, int], name: str, by: int) -> None:
    """Move a count; a count that reaches zero is dropped (keys come and go by the million)."""
    value = counts.get(name, 0) + by
    if value:
        counts[name] = value
    else:
        del counts[name]
