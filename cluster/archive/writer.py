"""The archive's writer: takes the jobs each applied entry removed from the state and writes
them to the node's `ArchiveStore`, on a thread of its own (DESIGN.md §9.2).

The Raft thread only hands over the records it removed (`put`, a list append under a lock):
decoding them into the API's view, encoding the JSON and the SQLite commit with its sync all
happen here, batched. `durable_through(index)` says whether every job removed by the entries
up to `index` is committed; the snapshot store waits for it before it makes a snapshot current
(a snapshot must never cover an eviction the archive has not made durable: after a crash the
node replays only the entries after its snapshot, so an eviction before it would be lost).

Handed-over jobs stay readable here (`pending_job`, `pending_jobs`) until their commit: a
reader that looks in the state and here under the apply lock, then in the archive, finds every
job once (a job leaves this list only once the archive has it).

The hand-over is bounded (`PENDING_JOBS_MAX`): when the disk is slower than evictions for long,
`wait_for_room` holds the Raft thread (outside the apply lock), so applying slows to what the
archive can take (as it does for the log's own fsync) rather than let memory grow. A write
that fails (disk full, EIO) is retried; until one succeeds `problem` names it and the node's
storage reports unhealthy.

Search attributes' indexes are built and dropped here too, when the state's setting changes
(`set_attributes`, handed over as the floor is), one at a time between batches. SQLite builds
an index whole, holding the write lock: on a big archive the jobs handed over meanwhile wait
(about 3 s per million rows, README "Benchmarks"), and past the hand-over's bound so does
applying.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from raftcron.cluster.archive.store import ArchiveError, ArchiveStore, Row
from raftcron.scheduler.frozen import FrozenJob
from raftcron.scheduler.jobs import Job
from raftcron.scheduler.views import job_view

log = logging.getLogger("raftcron.archive")

PENDING_JOBS_MAX = 50_000  # removed jobs waiting for the writer (tens of MB at most)
BATCH_JOBS_MAX = 5_000  # jobs per transaction
RETRY_S = 1.0  # after a failed write
TRIM_ROWS_MAX = 5_000  # rows one trim transaction deletes
INDEX_RETRY_S = 30.0  # after a failed index build or drop
PUT_WAIT_LOG_S = 5.0  # a Raft thread held longer than this by a full hand-over is logged


class ArchiveWriter:
    def __init__(self, store: ArchiveStore, *, pending_max: int = PENDING_JOBS_MAX,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.pending_max = pending_max
        self.monotonic = monotonic
        self._cond = threading.Condition()
        self._pending: deque[tuple[int, Sequence[tuple[int, Job | FrozenJob]]]] = deque()
        self._pending_jobs = 0
        self._by_id: dict[int, Job | FrozenJob] = {}  # the jobs in `_pending`
        # Archive retention (scheduler/archiving.py): rows numbered below `_floor` go; every
        # row below `_trimmed` is gone already.
        self._floor = 1
        self._trimmed = 1
        # Search attributes (DESIGN.md §9.2): the paths the state declares (None until the Raft
        # thread says), and those this archive holds an index of (read by the API, without
        # the lock: a frozenset replaced whole).
        self._attributes: tuple[str, ...] | None = None
        self._attributes_index = 0  # the entry whose setting `_attributes` is
        self._attributes_through = store.attributes_through()  # what the indexes follow
        self.indexed: frozenset[str] = frozenset(store.attributes())
        self._index_retry_at = 0.0  # after a failed build or drop
        self._durable_index = store.through_index()  # the last index committed
        self._stopping = False
        self.problem: str | None = None
        self.rows_written = 0
        self._thread = threading.Thread(target=self._run, name="archive-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, index: int, jobs: Sequence[tuple[int, Job | FrozenJob]]) -> None:
        """The jobs the entry at `index` removed (the Raft thread, under the apply lock, so a
        reader sees each job in the state or here, never in neither). Never waits: see
        `wait_for_room`."""
        with self._cond:
            self._pending.append((index, jobs))
            self._pending_jobs += len(jobs)
            for _, job in jobs:
                self._by_id[job.id] = job
            self._cond.notify_all()

    def set_floor(self, floor: int) -> None:
        """The state's archive floor after an entry (the Raft thread): rows below it go."""
        if floor > self._floor:
            with self._cond:
                self._floor = max(self._floor, floor)
                self._cond.notify_all()

    def set_attributes(self, paths: tuple[str, ...], index: int) -> None:
        """The state's search attributes after the entry at `index` (the Raft thread): this
        thread builds and drops their indexes, a Raft thread must not (a build reads the
        whole archive). An entry at or before the one whose setting the indexes follow is a
        replay after a restart: it changes nothing (else a restart from a snapshot older
        than a change of the setting would drop an index, then build it again)."""
        if index <= self._attributes_through or paths == self._attributes:
            return
        with self._cond:
            self._attributes = paths
            self._attributes_index = index
            self._cond.notify_all()

    def wait_indexed(self, timeout_s: float) -> bool:
        """Until the archive holds an index of each search attribute the state declares and of
        no other (False: not within `timeout_s`)."""
        deadline = self.monotonic() + timeout_s
        with self._cond:
            while self._attributes is None or self.indexed != set(self._attributes):
                left = deadline - self.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def wait_for_room(self) -> None:
        """Hold the Raft thread (outside the apply lock) while the hand-over is over its
        bound: applying slows to what the archive's disk takes, as it does to the log's."""
        with self._cond:
            waited_from = None
            while self._pending_jobs >= self.pending_max and not self._stopping:
                waited_from = waited_from or self.monotonic()
                self._cond.wait(0.5)
        if waited_from is not None and self.monotonic() - waited_from > PUT_WAIT_LOG_S:
            log.warning("the archive held applying for %.1f s: its disk is slower than "
                        "evictions", self.monotonic() - waited_from,
                        extra={"action": "archive_behind"})

    def pending_job(self, job_id: int) -> Job | FrozenJob | None:
        """A job handed over and not yet committed (call under the apply lock with the state
        read: together they hold every job the archive does not)."""
        with self._cond:
            return self._by_id.get(job_id)

    def pending_jobs(self) -> list[Job | FrozenJob]:
        with self._cond:
            return list(self._by_id.values())

    def durable_through(self, index: int) -> bool:
        """Every job removed by an entry at or before `index` that was handed over is
        committed (entries that removed nothing are never handed over)."""
        with self._cond:
            return self._covered(index)

    def _covered(self, index: int) -> bool:
        return not self._pending or self._pending[0][0] > index

    def wait_durable(self, index: int, timeout_s: float) -> bool:
        deadline = self.monotonic() + timeout_s
        with self._cond:
            while not self._covered(index):
                left = deadline - self.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def stop(self, timeout_s: float = 10.0) -> None:
        """Write what is pending (for at most `timeout_s`), then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _take(self) -> tuple[list[tuple[int, Sequence[tuple[int, Job | FrozenJob]]]], bool]:
        """The oldest entries' jobs, left in `_pending` (readers see them) until committed."""
        with self._cond:
            while (not self._pending and not self._stopping and self._trimmed >= self._floor
                   and self._index_change() is None):
                self._cond.wait(1.0)
            taken: list[tuple[int, Sequence[tuple[int, Job | FrozenJob]]]] = []
            count = 0
            for item in self._pending:
                if count >= BATCH_JOBS_MAX:
                    break
                taken.append(item)
                count += len(item[1])
            return taken, self._stopping and len(taken) == len(self._pending)

    def _run(self) -> None:
        while True:
            taken, last = self._take()
            if taken:
                self._write(taken)
            self._trim()
            if last:
                return
            self._change_index()

    def _trim(self) -> None:
        """Drop what archive retention let go, a bounded number of rows per transaction."""
        floor = self._floor
        if self._trimmed >= floor:
            return
        try:
            while self.store.trim(floor, rows_max=TRIM_ROWS_MAX) == TRIM_ROWS_MAX:
                if self._stopping:
                    return
        except ArchiveError as error:
            log.error("%s; retrying after the next write", error,
                      extra={"action": "archive_trim_failed"})
            return
        self._trimmed = floor

    def _index_change(self) -> tuple[str, str] | None:
        """The next index to drop, or else to build: ("drop" | "add", path)."""
        wanted = self._attributes
        if wanted is None:  # not told yet (a restart): keep what is built
            return None
        if self._stopping or self.monotonic() < self._index_retry_at:
            return None
        stale = sorted(self.indexed - set(wanted))
        if stale:
            return "drop", stale[0]
        missing = [path for path in wanted if path not in self.indexed]
        return ("add", missing[0]) if missing else None

    def _change_index(self) -> None:
        """Build or drop one search attribute's index, between two batches: a build holds the
        archive's write lock while it reads every row (SQLite builds an index whole), so the
        jobs handed over meanwhile wait for it, and a second index waits for them."""
        change = self._index_change()
        if change is None:
            return
        action, path = change
        started = self.monotonic()
        try:
            if action == "add":
                self.store.add_attribute(path, through_index=self._attributes_index)
            else:
                self.store.drop_attribute(path, through_index=self._attributes_index)
        except ArchiveError as error:
            # Writes go on meanwhile (a build that failed may have read every row first).
            log.error("%s; retrying in %.0f s", error, INDEX_RETRY_S,
                      extra={"action": "archive_index_failed", "path": path})
            self._index_retry_at = self.monotonic() + INDEX_RETRY_S
            return
        with self._cond:
            self.indexed = self.indexed | {path} if action == "add" else self.indexed - {path}
            self._cond.notify_all()
        done = "built" if action == "add" else "dropped"
        log.info("search attribute %s: index %s in %.1f s", path, done,
                 self.monotonic() - started, extra={"action": f"archive_index_{done}",
                                                    "path": path})

    def _write(self, taken: list[tuple[int, Sequence[tuple[int, Job | FrozenJob]]]]) -> None:
        rows = [Row.of_view(job_view(job), index, seq)
                for index, jobs in taken for seq, job in jobs]
        through = taken[-1][0]
        while True:
            try:
                self.store.write(rows, through)
                break
            except ArchiveError as error:
                if self.problem is None:
                    log.error("%s; retrying every %.0f s", error, RETRY_S,
                              extra={"action": "archive_unavailable"})
                self.problem = str(error)
                with self._cond:
                    if self._stopping:
                        return
                    self._cond.wait(RETRY_S)
        if self.problem is not None:
            log.warning("the archive is writable again", extra={"action": "archive_recovered"})
            self.problem = None
        if any(0 < row.seq < self._trimmed for row in rows):
            self._trimmed = 1  # written after their retention passed them: trimmed again
        with self._cond:
            self._durable_index = max(self._durable_index, through)
            for _, jobs in taken:
                self._pending.popleft()
                for _, job in jobs:
                    if self._by_id.get(job.id) is job:
                        del self._by_id[job.id]
            self._pending_jobs -= sum(len(jobs) for _, jobs in taken)
            self.rows_written += len(rows)
            self._cond.notify_all()

    def summary(self) -> dict[str, Any]:
        with self._cond:
            return {"pending_jobs": self._pending_jobs, "durable_index": self._durable_index,
                    "problem": self.problem, "indexed": sorted(self.indexed)}
