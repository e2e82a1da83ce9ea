"""Keyed rate limits (DESIGN.md §9.4): a job's `rate: {key, max, per_ms}` starts at most `max`
jobs of that key in any window of `per_ms` ms of state time, whatever their queue ("10 calls a
minute per customer").

Enforced like a concurrency key (scheduler/store.py): a queued job whose key has no room is
held out of every queue's line, in its key's line, so it holds up no other job and a claim
never walks past it. A key has room for a job while its starts in the job's window plus its
jobs already in line stay below the job's max (`admits`); a claim checks the starts again
(`can_start`: jobs of one key giving different limits, or let in line by their concurrency key
after waiting), records the start (`started`), and a head without room goes back to its key's
line. Room comes back with time, as starts leave the window: each key with held jobs has a
wake time (when its oldest start in the window leaves it), and the Tick that reaches it lets
the key's held jobs in line while there is room (`due`, `release`); a job of the key leaving
a line without starting (cancelled) makes room at once.

A key's starts are a start log as a window queue keeps (scheduler/queues.py
`record_starts`): runs of (time, count), a start counted at the end of its slice of per_ms /
KEY_RUNS_MAX ms (later, never earlier), so a key takes at most 33 runs. A key whose starts all
left its window and that holds no job is forgotten at the Tick its last start leaves (`forget`),
so the keys kept are those used within their window: each counted in the memory model.

Everything here is replicated state, decided from state time: snapshots carry each key's log,
its held jobs (by id) and its wake time, and restore puts them back as they were.
"""

from __future__ import annotations

import heapq
from array import array
from typing import Any

from raftcron.scheduler.jobs import Job
from raftcron.scheduler.lines import ReadyQueue
from raftcron.scheduler.startlog import record_starts

KEY_RUNS_MAX = 32  # slices of a window a key's start log tells apart
KEY_RATE_BYTES = 300  # a key's entry in the memory model, besides its text and its runs
RUN_BYTES = 16


class KeyRate:
    """One key: its recent starts (time, count, ...), its held jobs, its jobs in line, and
    the window its starts were counted in last (for forgetting it)."""

    __slots__ = ("held", "in_line", "log", "per_ms", "wake_ms")

    def __init__(self, per_ms: int) -> None:
        self.log = array("q")
        self.per_ms = per_ms
        self.held: ReadyQueue | None = None
        self.in_line = 0
        self.wake_ms: int | None = None

    def in_window(self, now_ms: int, per_ms: int) -> int:
        since, log = now_ms - per_ms, self.log
        return sum(log[i + 1] for i in range(0, len(log), 2) if log[i] > since)

    def opens_ms(self, now_ms: int, per_ms: int) -> int | None:
        """When the oldest start in the window leaves it (None: no start in it)."""
        since, log = now_ms - per_ms, self.log
        for i in range(0, len(log), 2):
            if log[i] > since:
                return log[i] + per_ms
        return None


class RateKeys:
    def __init__(self) -> None:
        self.keys: dict[str, KeyRate] = {}
        self.wakeups: list[tuple[int, str]] = []  # (wake_ms, key); stale entries skipped
        self.expiries: list[tuple[int, str]] = []  # (when its last start leaves, key)
        self.held_by_queue: dict[str, int] = {}  # queue -> its jobs held for a key's rate
        self.bytes = 0  # the memory model's count of the keys' entries

    def _key(self, job: Job) -> KeyRate:
        rate = job.rate
        assert rate is not None
        entry = self.keys.get(rate.key)
        if entry is None:
            entry = self.keys[rate.key] = KeyRate(rate.per_ms)
            self.bytes += KEY_RATE_BYTES + len(rate.key)
        return entry

    # -- lines ---------------------------------------------------------------------------

    def admits(self, job: Job, now_ms: int) -> bool:
        """Whether a queued job may go in line now: nobody of its key waits, and there is room
        for it beside the key's starts in its window and its jobs in line."""
        rate = job.rate
        assert rate is not None
        entry = self.keys.get(rate.key)
        if entry is None:
            return True
        return entry.held is None and (
            entry.in_window(now_ms, rate.per_ms) + entry.in_line < rate.max
        )

    def entered_line(self, job: Job) -> None:
        self._key(job).in_line += 1

    def left_line(self, job: Job) -> None:
        assert job.rate is not None
        entry = self.keys[job.rate.key]
        entry.in_line -= 1
        self._drop_if_empty(job.rate.key, entry)

    def hold(self, job: Job, now_ms: int, jobs: dict[int, Any]) -> None:
        """Hold a queued job for its key's window (out of every line)."""
        assert job.rate is not None
        entry = self._key(job)
        if entry.held is None:
            entry.held = ReadyQueue()
        entry.held.push(job)
        self.held_by_queue[job.queue] = self.held_by_queue.get(job.queue, 0) + 1
        self._set_wake(job.rate.key, entry, now_ms, jobs)

    def unhold(self, job: Job) -> bool:
        """Take a job out of its key's held line (it left `queued`); False: it was not held."""
        assert job.rate is not None
        entry = self.keys.get(job.rate.key)
        if entry is None or entry.held is None or entry.held.members.pop(job.id, None) is None:
            return False
        self._count_held(job.queue, -1)
        if not entry.held.members:
            entry.held = None
            entry.wake_ms = None
            self._drop_if_empty(job.rate.key, entry)
        return True

    def _drop_if_empty(self, key: str, entry: KeyRate) -> None:
        """A key with no start, no job held and none in line is forgotten at once (one with
        starts, at the Tick the last of them leaves its window: `forget`)."""
        if not entry.log and entry.held is None and entry.in_line == 0:
            del self.keys[key]
            self.bytes -= KEY_RATE_BYTES + len(key)

    def waiting(self, key: str) -> bool:
        entry = self.keys.get(key)
        return entry is not None and entry.held is not None

    def release_one(self, key: str, now_ms: int, jobs: dict[int, Any]) -> Job | None:
        """The best held job of `key` if it may go in line now, taken off its held line (the
        caller lines it up: in line, it takes the key's room; held for its concurrency key,
        not); None when there is none or no room, the wake time then set for those held."""
        entry = self.keys.get(key)
        if entry is None or entry.held is None:
            return None
        held = entry.held
        head = held.peek()
        assert head is not None, "an empty held line is dropped"
        job: Job = jobs[head[2]]
        rate = job.rate
        assert rate is not None
        if entry.in_window(now_ms, rate.per_ms) + entry.in_line >= rate.max:
            self._set_wake(key, entry, now_ms, jobs)
            return None
        held.pop()
        del held.members[job.id]
        self._count_held(job.queue, -1)
        if not held.members:
            entry.held = None
            entry.wake_ms = None
            self._drop_if_empty(key, entry)  # kept again if the job goes in line
        return job

    def _set_wake(self, key: str, entry: KeyRate, now_ms: int, jobs: dict[int, Any]) -> None:
        """When the held head of `key` may find room: the oldest start in its window leaves
        it. None while the key's room is taken by jobs in line alone (one leaving releases)."""
        assert entry.held is not None
        head = entry.held.peek()
        assert head is not None
        wake = entry.opens_ms(now_ms, jobs[head[2]].rate.per_ms)
        if wake != entry.wake_ms:
            entry.wake_ms = wake
            if wake is not None:
                heapq.heappush(self.wakeups, (wake, key))

    def due(self, now_ms: int) -> list[str]:
        """Keys whose wake time has come, in (time, key) order."""
        keys: list[str] = []
        heap = self.wakeups
        while heap and heap[0][0] <= now_ms:
            wake, key = heapq.heappop(heap)
            entry = self.keys.get(key)
            if entry is not None and entry.wake_ms == wake and key not in keys:
                entry.wake_ms = None
                keys.append(key)
        return keys

    def wakes(self) -> list[int]:
        """[the next wake time], or [] when no key waits for one."""
        wake = self.next_wake_ms()
        return [] if wake is None else [wake]

    def next_wake_ms(self) -> int | None:
        heap = self.wakeups
        while heap:
            wake, key = heap[0]
            entry = self.keys.get(key)
            if entry is not None and entry.wake_ms == wake:
                return wake
            heapq.heappop(heap)  # stale: nothing in the state depends on the heap's layout
        return None

    # -- starts --------------------------------------------------------------------------

    def can_start(self, job: Job, now_ms: int) -> bool:
        rate = job.rate
        assert rate is not None
        entry = self.keys.get(rate.key)
        return entry is None or entry.in_window(now_ms, rate.per_ms) < rate.max

    def started(self, job: Job, now_ms: int) -> None:
        rate = job.rate
        assert rate is not None
        entry = self._key(job)
        empty = not entry.log
        before = len(entry.log)
        record_starts(entry.log, now_ms, 1, rate.per_ms, KEY_RUNS_MAX)
        self.bytes += (len(entry.log) - before) // 2 * RUN_BYTES
        entry.per_ms = rate.per_ms
        if empty:
            heapq.heappush(self.expiries, (entry.log[-2] + rate.per_ms, rate.key))

    def forget(self, now_ms: int) -> None:
        """Forget the keys whose starts all left their window and that hold no job; drop the
        runs that left the window of the others."""
        heap = self.expiries
        while heap and heap[0][0] <= now_ms:
            _, key = heapq.heappop(heap)
            entry = self.keys.get(key)
            if entry is None:
                continue
            log, before = entry.log, len(entry.log)
            drop = 0
            while drop < len(log) and log[drop] <= now_ms - entry.per_ms:
                drop += 2
            del log[:drop]
            self.bytes -= (before - len(log)) // 2 * RUN_BYTES
            if log:
                heapq.heappush(heap, (log[-2] + entry.per_ms, key))
            elif entry.held is None and entry.in_line == 0:
                del self.keys[key]
                self.bytes -= KEY_RATE_BYTES + len(key)
            # A key with jobs but no starts is forgotten once its jobs are (the next start
            # schedules this again).

    def _count_held(self, queue: str, by: int) -> None:
        left = self.held_by_queue.get(queue, 0) + by
        if left:
            self.held_by_queue[queue] = left
        else:
            del self.held_by_queue[queue]

    # -- snapshots ----------------------------------------------------------------------

    def held_ids(self) -> list[int]:
        return sorted(i for e in self.keys.values() if e.held is not None for i in e.held.members)

    def to_list(self) -> list[Any]:
        """[key, per_ms, wake_ms, flat log] of every key with starts or a wake time, by key."""
        return [[key, e.per_ms, e.wake_ms, e.log.tolist()]
                for key, e in sorted(self.keys.items()) if e.log or e.wake_ms is not None]

    def restore_windows(self, items: list[Any]) -> None:
        for key, per_ms, wake_ms, flat in items:
            entry = self.keys.get(key)
            if entry is None:
                entry = self.keys[key] = KeyRate(per_ms)
                self.bytes += KEY_RATE_BYTES + len(key)
            entry.per_ms = per_ms
            entry.log = array("q", flat)
            self.bytes += len(flat) // 2 * RUN_BYTES
            entry.wake_ms = wake_ms
            if wake_ms is not None:
                self.wakeups.append((wake_ms, key))
            if flat:
                self.expiries.append((flat[-2] + per_ms, key))
        heapq.heapify(self.wakeups)
        heapq.heapify(self.expiries)

    def hold_restored(self, job: Job) -> None:
        """A held job read from a snapshot: back in its key's line; its wake time is the
        snapshot's (`restore_windows`), never decided again."""
        entry = self._key(job)
        if entry.held is None:
            entry.held = ReadyQueue()
        entry.held.push(job)
        self.held_by_queue[job.queue] = self.held_by_queue.get(job.queue, 0) + 1
