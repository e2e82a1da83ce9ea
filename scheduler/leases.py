"""The lease ends of running jobs, soonest first, for the Tick that expires them.

A claim leases its jobs until now + lease_ms, and the state's time never goes back, so the
entries of one lease length arrive in the order of their ends: each length gets a FIFO
(`lines`), appended to and taken from its front in O(1). The heap of every entry this
replaced cost O(log n) a job at each pop (a follower at 4,000 jobs/s held ~120,000 entries of a
30 s lease: 3% of its CPU in `pop_expired_leases`). An entry that would not keep its line in
order (a lease re-filed after a heartbeat extended it, the indexes rebuilt by a restore, a
claim's lease length beyond the first `LINES_MAX`) goes to one heap instead.

Entries are (lease_until_ms, job id) and are cleaned lazily, as before: one whose job has
finished or moved on is dropped when it is taken (`JobTable.pop_expired_leases`), which sorts
what it expires by the jobs' current (lease_until_ms, id), so the order never depends on this
structure's shape.
"""

from __future__ import annotations

import heapq
from collections import deque

LeaseEntry = tuple[int, int]  # (lease_until_ms, job id)
LINES_MAX = 8  # lease lengths with a FIFO of their own; further ones share the heap


class LeaseEnds:
    __slots__ = ("heap", "lines")

    def __init__(self) -> None:
        self.lines: dict[int, deque[LeaseEntry]] = {}  # lease_ms -> entries in order of their end
        self.heap: list[LeaseEntry] = []  # entries that would not keep a line in order

    def __len__(self) -> int:
        return len(self.heap) + sum(len(line) for line in self.lines.values())

    def __bool__(self) -> bool:
        return bool(self.heap) or bool(self.lines)

    def add(self, lease_until_ms: int, job_id: int, lease_ms: int | None) -> None:
        entry = (lease_until_ms, job_id)
        line = self.lines.get(lease_ms) if lease_ms is not None else None
        if line is None and lease_ms is not None and len(self.lines) < LINES_MAX:
            line = self.lines[lease_ms] = deque()
        if line is not None and (not line or line[-1][0] <= lease_until_ms):
            line.append(entry)
        else:
            heapq.heappush(self.heap, entry)

    def first_ms(self) -> int | None:
        """The soonest end held (perhaps of a stale entry: early, never late)."""
        ends = [line[0][0] for line in self.lines.values()]
        if self.heap:
            ends.append(self.heap[0][0])
        return min(ends) if ends else None

    def take_due(self, now_ms: int) -> list[LeaseEntry]:
        """Every entry ending at or before now_ms, taken out (in no particular order)."""
        due: list[LeaseEntry] = []
        for lease_ms, line in list(self.lines.items()):
            while line and line[0][0] <= now_ms:
                due.append(line.popleft())
            if not line:
                del self.lines[lease_ms]  # a length no longer used frees its place
        heap = self.heap
        while heap and heap[0][0] <= now_ms:
            due.append(heapq.heappop(heap))
        return due
