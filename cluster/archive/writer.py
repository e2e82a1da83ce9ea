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

Gaps (store.py): a snapshot installed from the leader (or a data dir that lost its archive)
puts the state past evictions this member never wrote. `restored` sees it, as the state's
next archive number against the writer's own account, and records the range as missing; the
filler (fill.py) asks a peer for those rows and hands them here (`fill`), so every change to
the file is made by this one thread in order.

Search attributes' indexes are built and dropped here too, when the state's setting changes
(`set_attributes`, handed over as the floor is), one at a time between batches. SQLite builds
an index whole, holding the write lock: on a big archive the jobs handed over meanwhile wait
(about 3 s per million rows, docs/proof/benchmarks.md), and past the hand-over's bound so does
applying.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from raftcron.cluster.archive.store import ArchiveError, ArchiveStore, Row
from raftcron.scheduler.frozen import FrozenJob
from raftcron.scheduler.jobs import Job
from raftcron.scheduler.views import job_view

log = logging.getLogger("raftcron.archive")
Handed = tuple[int, Sequence[tuple[int, Job | FrozenJob]], Sequence[int]]

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
        # (log index, the jobs its entry removed, the ids it purged), oldest first
        self._pending: deque[Handed] = deque()
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
        # The account of archive numbers: each one below it is written, handed over, or in a
        # gap. Gaps to record, and peers' rows to fill them with, wait here for the thread.
        self._next_seq = store.next_seq()
        self._new_gaps: list[tuple[int, int]] = []
        self._fills: deque[tuple[Sequence[Row], int, int, Future[int]]] = deque()
        self.gaps: list[tuple[int, int]] = store.gaps()  # as committed: replaced, not changed
        # Whether a job id is purged (the state's tombstones; set by the node): a fill never
        # writes its row. Read on this thread: the fill and the purge's delete are in order.
        self.purged: Callable[[int], bool] = lambda job_id: False
        self._stopping = False
        self.problem: str | None = None
        self.rows_written = 0
        self._thread = threading.Thread(target=self._run, name="archive-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, index: int, jobs: Sequence[tuple[int, Job | FrozenJob]],
            purged: Sequence[int] = ()) -> None:
        """The jobs the entry at `index` removed and the ids it purged (the Raft thread, under
        the apply lock, so a reader sees each job in the state or here, never in neither, and
        a purged one nowhere). Never waits: see `wait_for_room`."""
        with self._cond:
            self._pending.append((index, jobs, purged))
            self._pending_jobs += len(jobs) + len(purged)
            for seq, job in jobs:
                self._by_id[job.id] = job
                if seq >= self._next_seq:
                    self._next_seq = seq + 1
            for job_id in purged:
                self._by_id.pop(job_id, None)
            self._cond.notify_all()

    def restored(self, next_seq: int, floor: int, purged: Sequence[int] = ()) -> None:
        """The state was replaced by a snapshot (the Raft thread): the jobs numbered from this
        archive's account up to the state's `next_seq` left without passing here. Recorded as
        missing, from `floor` on (retention let the rest go). `purged`: the state's tombstones,
        whose rows this archive may still hold (it missed the purge): deleted."""
        if purged:
            self.put(0, (), list(purged))  # index 0: every snapshot waits for it
        with self._cond:
            if next_seq <= self._next_seq:
                return  # the node's own snapshot: its evictions are written (it waited)
            lo = max(self._next_seq, floor)
            log.warning("the archive misses the jobs numbered %d to %d (a snapshot past their "
                        "evictions): filling them from a peer", lo, next_seq - 1,
                        extra={"action": "archive_gap"})
            self._new_gaps.append((lo, next_seq))
            self._next_seq = next_seq
            self._cond.notify_all()

    def fill(self, rows: Sequence[Row], lo: int, filled_to: int) -> Future[int]:
        """A peer's rows for the gap starting at `lo`, covering [lo, filled_to): written by the
        thread (the future: how many were new; ArchiveError if it could not)."""
        done: Future[int] = Future()
        with self._cond:
            if self._stopping:
                done.set_exception(ArchiveError("the archive is closing"))
                return done
            self._fills.append((rows, lo, filled_to, done))
            self._cond.notify_all()
        return done

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

    def _take(self) -> tuple[list[Handed], bool]:
        """The oldest entries' jobs, left in `_pending` (readers see them) until committed."""
        with self._cond:
            while (not self._pending and not self._stopping and self._trimmed >= self._floor
                   and not self._new_gaps and not self._fills
                   and self._index_change() is None):
                self._cond.wait(1.0)
            taken: list[Handed] = []
            count = 0
            for item in self._pending:
                if count >= BATCH_JOBS_MAX:
                    break
                taken.append(item)
                count += len(item[1]) + len(item[2])
            return taken, self._stopping and len(taken) == len(self._pending)

    def _run(self) -> None:
        while True:
            try:
                if self._turn():
                    return
            except Exception as error:  # a bug: never a silent end of the archive
                # A thread that died here would leave the hand-over to fill up and then hold
                # applying for good, unexplained. It says so, makes the storage unhealthy
                # (as a write that fails does), and tries again.
                if self.problem is None or not self.problem.startswith("unexpected"):
                    log.critical("the archive's writer failed", exc_info=True,
                                 extra={"action": "archive_writer_failed"})
                self.problem = f"unexpected {type(error).__name__}: {error}"
                with self._cond:
                    if self._stopping:
                        return
                    self._cond.wait(RETRY_S)

    def _turn(self) -> bool:
        """One turn of the thread: write what was handed over, trim, mend gaps, change an
        index. Whether the thread is done (stopping, everything written)."""
        taken, last = self._take()
        if taken:
            self._write(taken)
        self._trim()
        self._mend()
        if last:
            with self._cond:
                fills, self._fills = list(self._fills), deque()
            for _, _, _, done in fills:
                done.set_exception(ArchiveError("the archive is closing"))
            return True
        self._change_index()
        return False

    def _mend(self) -> None:
        """Record the new gaps, write the peers' rows for the old ones."""
        with self._cond:
            new_gaps, self._new_gaps = self._new_gaps, []
            fills, self._fills = list(self._fills), deque()
        try:
            for lo, hi in new_gaps:
                self.store.record_gap(lo, hi)
        except ArchiveError as error:
            log.error("%s; retrying every %.0f s", error, RETRY_S,
                      extra={"action": "archive_gap_unrecorded"})
            with self._cond:
                self._new_gaps[:0] = new_gaps
                if not self._stopping:
                    self._cond.wait(RETRY_S)
        outcomes: list[tuple[Future[int], int | ArchiveError]] = []
        for rows, lo, filled_to, done in fills:
            kept = [row for row in rows if not self.purged(row.id)]  # never brought back
            try:
                outcomes.append((done, self.store.fill(kept, lo, filled_to)))
            except ArchiveError as error:
                outcomes.append((done, error))
        if new_gaps or fills:
            try:
                self.gaps = self.store.gaps()
            except ArchiveError as error:
                log.error("%s", error, extra={"action": "archive_unreadable"})
        for done, outcome in outcomes:  # once `gaps` says what they filled
            if isinstance(outcome, ArchiveError):
                done.set_exception(outcome)
            else:
                done.set_result(outcome)

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
        if self.gaps and self.gaps[0][0] < floor:  # the trim shrank them
            with contextlib.suppress(ArchiveError):
                self.gaps = self.store.gaps()

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

    def _write(self, taken: list[Handed]) -> None:
        rows = [Row.of_view(job_view(job), index, seq)
                for index, jobs, _ in taken for seq, job in jobs]
        purged = [job_id for _, _, ids in taken for job_id in ids]
        through = max(index for index, _, _ in taken)
        while True:
            try:
                self.store.write(rows, through, purged)
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
            for _, jobs, ids in taken:
                self._pending.popleft()
                for _, job in jobs:
                    if self._by_id.get(job.id) is job:
                        del self._by_id[job.id]
                self._pending_jobs -= len(jobs) + len(ids)
            self.rows_written += len(rows)
            self._cond.notify_all()

    def summary(self) -> dict[str, Any]:
        with self._cond:
            return {"pending_jobs": self._pending_jobs, "durable_index": self._durable_index,
                    "problem": self.problem, "gaps": [list(gap) for gap in self.gaps[:10]],
                    "indexed": sorted(self.indexed)}
