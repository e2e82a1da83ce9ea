"""A node's archive as the node composes it: the store in the data dir, its writer thread fed
by the state machine, a reader for the API, and the two ties to the storage (a snapshot waits
for the archive; an archive that cannot write makes the storage unhealthy)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from raftcron.cluster.archive.copies import remove_leftovers
from raftcron.cluster.archive.fill import ArchiveFiller
from raftcron.cluster.archive.store import ArchiveError, ArchiveStore, Row
from raftcron.cluster.archive.writer import ArchiveWriter
from raftcron.cluster.config import NodeConfig
from raftcron.cluster.storage.node import RaftStorage
from raftcron.scheduler.search import JobFilter
from raftcron.scheduler.views import job_view

log = logging.getLogger("raftcron.archive")
T = TypeVar("T")


class NodeArchive:
    def __init__(self, store: ArchiveStore, writer: ArchiveWriter, reader: ArchiveStore) -> None:
        self.store = store
        self.writer = writer
        self.reader = reader
        self._read_lock = threading.Lock()  # the reader is one SQLite connection
        self.filler: ArchiveFiller | None = None  # set by the node (it needs the event loop)
        # The archive backup this node is making (who asked, when), or None: one at a time,
        # since each holds a copy of the whole archive on the data dir's disk.
        self.copying: str | None = None

    def pending_view(self, job_id: int) -> dict[str, Any] | None:
        """A job that left the state and waits for the writer (read it under the apply lock
        with the state: then `get` finds the rest)."""
        job = self.writer.pending_job(job_id)
        return None if job is None else job_view(job) | {"archived": True}

    async def get(self, job_id: int) -> dict[str, Any] | None:
        """An archived job's view with `"archived": true`, or None. Off the event loop: a
        lookup by id is a few pages, but a disk may be slow."""
        view = await asyncio.to_thread(self._locked, self.reader.get, job_id)
        if view is None or self.writer.purged(job_id):  # checked after the read: a purge
            return None  # applied since hides the row its writer has yet to delete
        view["archived"] = True
        return view

    async def search(self, query: JobFilter, *, before_id: int | None, limit: int,
                     min_id: int, bytes_max: int | None = None
                     ) -> tuple[list[dict[str, Any]], int]:
        """Archived jobs `query` matches (newest first, `min_id` <= id < `before_id`, ending
        once their documents reach `bytes_max`), each with `"archived": true`, and the floor
        they are complete from (`ArchiveStore.search_within`); purged ones among them too, for
        the page's cursor to stay exact: the caller leaves out those `self.writer.purged`
        names after merging."""
        found, floor = await asyncio.to_thread(self._locked, partial(
            self.reader.search_within, query, before_id=before_id, limit=limit, min_id=min_id,
            bytes_max=bytes_max))
        for view in found:
            view["archived"] = True
        return found, floor

    async def rows_by_seq(self, lo: int, hi: int) -> tuple[list[Row], int]:
        """Rows for a peer filling [lo, hi), and where the answer covers to (store.py)."""
        return await asyncio.to_thread(self._locked, self.reader.rows_by_seq, lo, hi)

    @property
    def whole(self) -> bool:
        """This member misses no archived job (no gap waits for a peer)."""
        return not self.writer.gaps

    async def holds(self, job_id: int) -> bool:
        """Whether the job left the state into this archive (written, or on its way)."""
        return self.writer.pending_job(job_id) is not None or await self.get(job_id) is not None

    def summary(self) -> dict[str, Any]:
        """Rows, bytes, the oldest finish time and the file's size (from the totals kept
        beside the rows, and an index: cheap enough for every scrape), and the writer's
        backlog and problem."""
        try:
            totals = self._locked(self.reader.totals)
        except ArchiveError as error:
            totals = {"problem_reading": str(error)}
        filler = {} if self.filler is None else {
            "filled_rows": self.filler.filled_rows,
            "unanswered_gap": None if self.filler.unanswered is None
            else list(self.filler.unanswered)}
        return totals | self.writer.summary() | filler

    def _locked(self, read: Callable[..., T], *args: Any) -> T:
        with self._read_lock:
            return read(*args)

    def close(self) -> None:
        self.writer.stop()
        self.reader.close()
        self.store.close()


def open_archive(config: NodeConfig, storage: RaftStorage) -> NodeArchive:
    """The archive of the node whose storage is `storage` (its data dir open and locked)."""
    durable = config.storage.durability == "fsync"
    remove_leftovers(storage.directory)  # of a backup being made when the node stopped
    try:
        store = ArchiveStore(storage.directory, durable=durable)
        reader = ArchiveStore(storage.directory, readonly=True)
    except ArchiveError as error:
        storage.fatal(str(error))
        raise
    writer = ArchiveWriter(store)
    writer.start()
    storage.snapshots.may_cover = writer.durable_through
    storage.archive_problem = lambda: writer.problem
    return NodeArchive(store, writer, reader)
