"""A line of queued jobs: a heap for their order (priority, due time, id), a dict for who is in
it. A queue's ready jobs stand in one, and so do the jobs held for a concurrency key
(scheduler/store.py) or a rate key (scheduler/ratekeys.py).
"""

from __future__ import annotations

import heapq

from raftcron.scheduler.jobs import Job


class ReadyQueue:
    """The queued jobs of one queue: a heap for order, a dict for membership and depth.

    `members` maps a job id to its current heap entry; an entry that is not its job's current
    one (the job left and came back with another due time) is stale and skipped, so the order
    of claims depends only on the jobs, never on the heap's history.
    """

    __slots__ = ("heap", "members")

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, int]] = []  # (-priority, run_at_ms, id)
        self.members: dict[int, tuple[int, int, int]] = {}

    def __len__(self) -> int:
        return len(self.members)

    def push(self, job: Job) -> None:
        entry = (-job.priority, job.run_at_ms, job.id)
        self.members[job.id] = entry
        heapq.heappush(self.heap, entry)
        if len(self.heap) > 64 and len(self.heap) > 4 * len(self.members):
            self.heap = list(self.members.values())
            heapq.heapify(self.heap)

    def peek(self) -> tuple[int, int, int] | None:
        heap, members = self.heap, self.members
        while heap and members.get(heap[0][2]) != heap[0]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def remove(self, job: Job) -> tuple[int, int, int] | None:
        """Take a job out of the line (its heap entry goes stale); None: it was not in it."""
        return self.members.pop(job.id, None)

    def pop(self) -> int:
        """Take the head (after `peek`) off the heap; the caller's `set_status` drops membership."""
        return heapq.heappop(self.heap)[2]

    def give_back(self) -> None:
        """A popped job was held back: a plain line has no turns to restore (a fair one does,
        scheduler/fairness.py)."""
