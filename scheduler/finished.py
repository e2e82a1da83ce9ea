"""Finished jobs in the order retention evicts them: oldest first, per outcome and per queue.

Owns one FIFO of `(finished_ms, id)` per (status, queue), kept in that canonical order (finish
times only grow, so an entry goes at the end, or just before the entries of the same
millisecond with higher ids), and the count of finished jobs per (status, queue). A job that
leaves its final status (a retry) or the table (eviction, a delete, a schedule's `retain`)
leaves a stale entry behind, dropped when it reaches the front: an entry is valid while its job
is in the table with that status and finish time.

"The oldest finished job of these statuses, outside these queues" is a k-way merge: each FIFO's
front is filed in a heap per status (`filed` names the front filed for each FIFO, so an older
filing is recognised and dropped; a heap holding many is rebuilt). Everything is ordered by
`(finished_ms, id)`, never by arrival, so a replica restored from a snapshot (which sorts what
it reads) evicts exactly the jobs a replica that never stopped evicts.
"""

from __future__ import annotations

import bisect
import heapq
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from raftcron.scheduler import jobs as j

Place = tuple[int, int]  # (finished_ms, job id)
FILINGS_SLACK = 64  # stale filings a heap may hold beyond twice the FIFOs before a rebuild
Fifo = tuple[str, str]  # (status, queue)


class FinishedJobs:
    def __init__(self, is_valid: Callable[[str, int, int], bool]) -> None:
        # is_valid(status, finished_ms, job_id): the job is in the table, in that status and
        # finished at that time (JobTable.finished_entry_valid). Held weakly: the table owns
        # this object, and a strong reference back made the two a cycle, which only the cyclic
        # GC frees; the shell freezes a restored state out of the GC's reach (gc.freeze), so a
        # follower leaked its whole job table at every snapshot it installed.
        self._valid = weakref.WeakMethod(is_valid)
        self.fifos: dict[Fifo, deque[Place]] = {}
        self.counts: dict[Fifo, int] = {}
        self._heaps: dict[str, list[tuple[int, int, str]]] = {s: [] for s in sorted(j.FINAL)}
        self._filed: dict[Fifo, Place] = {}

    def __len__(self) -> int:
        return sum(self.counts.values())

    # -- keeping count ---------------------------------------------------------------------

    def add(self, status: str, queue: str, finished_ms: int, job_id: int) -> None:
        where = (status, queue)
        place = (finished_ms, job_id)
        fifo = self.fifos.get(where)
        if fifo is None:
            fifo = self.fifos[where] = deque((place,))
            self._file(where, place)
        elif fifo[-1] < place:  # the common case: the newest finish
            fifo.append(place)
        else:  # the same millisecond as places with higher ids: walk back to its place
            index = len(fifo) - 1
            while index > 0 and fifo[index - 1] > place:
                index -= 1
            fifo.insert(index, place)
            if index == 0:
                self._file(where, place)
        counts = self.counts
        counts[where] = counts.get(where, 0) + 1

    def discount(self, status: str, queue: str) -> None:
        """A job of (status, queue) left that status or the table; its entry is now stale."""
        where = (status, queue)
        left = self.counts[where] - 1
        if left:
            self.counts[where] = left
        else:
            del self.counts[where]

    def count(self, status: str, queue: str) -> int:
        return self.counts.get((status, queue), 0)

    def total(self, status: str) -> int:
        """Finished jobs of a status, every queue (a sum over queues: once per Tick)."""
        return sum(count for (kept, _), count in self.counts.items() if kept == status)

    def restored(self, fifos: dict[Fifo, list[Place]]) -> None:
        """Fill an empty index from a snapshot: each (status, queue)'s places in (finished_ms,
        id) order."""
        for where, places in fifos.items():
            fifo = self.fifos[where] = deque(places)
            self.counts[where] = len(fifo)
            self._file(where, fifo[0])

    # -- the oldest ------------------------------------------------------------------------

    def front(self, status: str, queue: str) -> Place | None:
        """The oldest valid entry of one FIFO (stale ones in front of it are dropped)."""
        where = (status, queue)
        fifo = self.fifos.get(where)
        if fifo is None:
            return None
        valid = self._valid()
        assert valid is not None  # the table that owns this object is alive while it is used
        while fifo:
            entry = fifo[0]
            if valid(status, entry[0], entry[1]):
                if self._filed.get(where) != entry:
                    self._file(where, entry)
                return entry
            fifo.popleft()
        del self.fifos[where]
        self._filed.pop(where, None)
        return None

    def only_fifo(
        self, statuses: Iterable[str], skip: Mapping[str, object] | None = None
    ) -> Fifo | None:
        """The one FIFO of these statuses (outside `skip`) when there is exactly one: most
        clusters have one busy queue, and then the oldest is its front, no merge needed."""
        wanted = tuple(statuses)
        found: Fifo | None = None
        for where in self.fifos:
            if where[0] in wanted and not (skip and where[1] in skip):
                if found is not None:
                    return None
                found = where
        return found

    def oldest(
        self, statuses: Iterable[str], skip: Mapping[str, object] | None = None
    ) -> tuple[int, int, str, str] | None:
        """(finished_ms, id, status, queue) of the oldest valid entry of `statuses`, leaving
        out the queues in `skip`; None if there is none."""
        best: tuple[int, int, str, str] | None = None
        for status in statuses:
            found = self._oldest_of(status, skip)
            if found is not None and (best is None or found[:2] < best[:2]):
                best = (*found, status)
        return None if best is None else (best[0], best[1], best[3], best[2])

    def _oldest_of(
        self, status: str, skip: Mapping[str, object] | None
    ) -> tuple[int, int, str] | None:
        heap = self._heaps[status]
        set_aside: list[tuple[int, int, str]] = []
        found = None
        while heap:
            finished_ms, job_id, queue = heap[0]
            where = (status, queue)
            if self._filed.get(where) != (finished_ms, job_id):
                heapq.heappop(heap)  # a front filed earlier, since replaced
                continue
            if self.front(status, queue) != (finished_ms, job_id):
                continue  # its front was stale: front() filed the next one (or none)
            if skip and queue in skip:
                set_aside.append(heapq.heappop(heap))  # counted apart: filed again below
                continue
            found = heap[0]
            break
        for item in set_aside:
            heapq.heappush(heap, item)
        return found

    def drop_front(self, status: str, queue: str) -> None:
        """The front of a FIFO is gone (its job evicted just now): the next one is filed, to
        be checked when it is reached."""
        where = (status, queue)
        fifo = self.fifos[where]
        fifo.popleft()
        if fifo:
            self._file(where, fifo[0])
        else:
            del self.fifos[where]
            self._filed.pop(where, None)

    def put_back(self, status: str, queue: str, finished_ms: int, job_id: int) -> None:
        """An entry taken off a FIFO's front for a job that stays (one set aside while its
        workflow ran, scheduler/upstream.py) goes back in its place; not counted again. It is
        older than most of the FIFO: its place is found by bisection from the front."""
        where = (status, queue)
        place = (finished_ms, job_id)
        fifo = self.fifos.get(where)
        if fifo is None:
            self.fifos[where] = deque((place,))
            self._file(where, place)
            return
        index = bisect.bisect_left(fifo, place)
        fifo.insert(index, place)
        if index == 0:
            self._file(where, place)

    def _file(self, where: Fifo, entry: Place) -> None:
        self._filed[where] = entry
        heap = self._heaps[where[0]]
        heapq.heappush(heap, (entry[0], entry[1], where[1]))
        if len(heap) > 2 * len(self._filed) + FILINGS_SLACK:
            # Filings replaced since are dropped only when a merge reaches them, and one busy
            # queue never merges (`only_fifo`): rebuilt from the current ones, the heap stays
            # bounded (the order it gives depends on the filings, not on the heap's shape).
            status = where[0]
            heap[:] = [(place[0], place[1], queue)
                       for (kept, queue), place in self._filed.items() if kept == status]
            heapq.heapify(heap)

    def entries(self) -> int:
        """Entries held, stale ones included (for the invariant checks)."""
        return sum(len(fifo) for fifo in self.fifos.values())
