"""A node's archive on disk (DESIGN.md §9.2): the finished jobs that left the replicated state,
one SQLite row each, found by id and by any field.

SQLite from the standard library: one file, transactions, an index on any expression
(`json_extract` of a payload path, for search attributes), and a page cache that keeps the
archive's size off the node's memory. A row holds the job as the API shows it (`doc`, the JSON
of `views.job_view`, payload and result included) beside the columns searches filter on.

A row is written by job id with `INSERT OR REPLACE`: a node that replays its log after a
restart writes the same rows again and ends with the same archive. `left_index` is the log
index of the entry that removed the job from the state; `seq` the number the state gave it
for archive retention (scheduler/archiving.py), which drops the rows below a floor on every
member alike (0: archived before the cluster was finalized, never dropped by it).

In `fsync` durability a commit is synced (`synchronous = FULL` with the write-ahead log); in
`os` durability it is left to the page cache (`NORMAL`), as the Raft log is.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from raftcron.cluster.archive.query import where
from raftcron.scheduler.search import JobFilter, last_worker

ARCHIVE_NAME = "archive.sqlite"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    task TEXT NOT NULL,
    queue TEXT NOT NULL,
    status TEXT NOT NULL,
    schedule TEXT,
    key TEXT,
    worker TEXT,
    error TEXT,
    created_ms INTEGER NOT NULL,
    finished_ms INTEGER,
    left_index INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_seq ON jobs (seq) WHERE seq > 0;
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (finished_ms);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_ms);
CREATE INDEX IF NOT EXISTS jobs_task ON jobs (task);
CREATE INDEX IF NOT EXISTS jobs_queue ON jobs (queue);
CREATE INDEX IF NOT EXISTS jobs_key ON jobs (key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_schedule ON jobs (schedule) WHERE schedule IS NOT NULL;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value) WITHOUT ROWID;
"""


class ArchiveError(Exception):
    """The archive cannot be opened, read or written (a damaged file, a full or failing disk)."""


def stored_schema(db: sqlite3.Connection) -> object:
    """The schema version an archive's file says it is of (None: a new file, none yet)."""
    found = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
    return None if found is None else found[0]


def check_schema(found: object, path: str) -> None:
    """ArchiveError unless `found` (`stored_schema`) is the version this release reads: a
    node's own archive at its start, and a backup's archive before a restore (cluster/backup.py)."""
    if found != SCHEMA_VERSION:
        raise ArchiveError(f"the archive {path} is of schema {found}; this release reads "
                           f"{SCHEMA_VERSION}")


@dataclass(frozen=True, slots=True)
class Row:
    """A job as the archive keeps it: `doc` is its API view, the rest what searches filter on."""

    id: int
    task: str
    queue: str
    status: str
    schedule: str | None
    key: str | None
    worker: str | None
    error: str | None
    created_ms: int
    finished_ms: int | None
    left_index: int
    seq: int
    doc: str

    @classmethod
    def of_view(cls, view: dict[str, Any], left_index: int, seq: int = 0) -> Row:
        """`view` with its history (`views.job_view`): the worker searched for is the last
        attempt's (a finished job's view names none of its own)."""
        return cls(
            id=view["id"],
            task=view["task"],
            queue=view["queue"],
            status=view["status"],
            schedule=view["schedule"],
            key=view["key"],
            worker=last_worker(view),
            error=view["error"],
            created_ms=view["created_ms"],
            finished_ms=view["finished_ms"],
            left_index=left_index,
            seq=seq,
            doc=json.dumps(view, separators=(",", ":"), ensure_ascii=False),
        )

    @property
    def bytes(self) -> int:
        """What the row counts for archive retention: its document's length, the same on every
        member (the page overhead of SQLite is not)."""
        return len(self.doc.encode())


class ArchiveStore:
    """The archive's SQLite file. Not thread-safe: one writer thread owns a store, and readers
    open their own (`reader`)."""

    def __init__(self, directory: str, *, durable: bool = True, readonly: bool = False) -> None:
        self.path = os.path.join(directory, ARCHIVE_NAME)
        try:
            if readonly:
                self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                          check_same_thread=False)
            else:
                self.db = sqlite3.connect(self.path, isolation_level=None,
                                          check_same_thread=False)
                self.db.execute("PRAGMA journal_mode = WAL")
                self.db.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
                self.db.executescript(_SCHEMA)
                self._check_version()
        except sqlite3.Error as error:
            raise ArchiveError(f"cannot open the archive {self.path}: {error}") from None

    def _check_version(self) -> None:
        found = stored_schema(self.db)
        if found is None:
            self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
            self.db.execute("INSERT INTO meta VALUES ('rows', 0)")
            self.db.execute("INSERT INTO meta VALUES ('bytes', 0)")
        else:
            check_schema(found, self.path)

    def write(self, rows: Sequence[Row], through_index: int) -> None:
        """The rows and the index they reach, in one transaction (durable when it returns, in
        `fsync` durability)."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
            # The totals are kept beside the rows (a count over millions of rows at every
            # scrape would not do): what the batch replaces is taken off first.
            replaced_rows, replaced_bytes = 0, 0
            ids = [r.id for r in rows]
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                found = self.db.execute(
                    f"SELECT count(*), coalesce(sum(bytes), 0) FROM jobs WHERE id IN "
                    f"({','.join('?' * len(chunk))})", chunk).fetchone()
                replaced_rows += found[0]
                replaced_bytes += found[1]
            self.db.execute(
                "UPDATE meta SET value = value + ? WHERE name = 'rows'",
                (len({r.id for r in rows}) - replaced_rows,))
            self.db.execute(
                "UPDATE meta SET value = value + ? WHERE name = 'bytes'",
                (sum({r.id: r.bytes for r in rows}.values()) - replaced_bytes,))
            self.db.executemany(
                "INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [(r.id, r.task, r.queue, r.status, r.schedule, r.key, r.worker, r.error,
                  r.created_ms, r.finished_ms, r.left_index, r.seq, r.bytes, r.doc)
                 for r in rows])
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('through_index', ?)",
                            (through_index,))
            self.db.execute("COMMIT")
        except sqlite3.Error as error:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise ArchiveError(f"cannot write the archive {self.path}: {error}") from None

    def trim(self, floor: int, *, rows_max: int = 10_000) -> int:
        """Delete at most `rows_max` rows numbered below `floor` (archive retention, the same
        rows on every member: scheduler/archiving.py), with the totals; how many went. Rows
        archived before the cluster was finalized have no number and stay."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
            ids = [row_id for (row_id,) in self.db.execute(
                "SELECT id FROM jobs WHERE seq > 0 AND seq < ? ORDER BY seq LIMIT ?",
                (floor, rows_max))]
            if ids:
                marks = ",".join("?" * len(ids))
                count, size = self.db.execute(
                    f"SELECT count(*), coalesce(sum(bytes), 0) FROM jobs WHERE id IN ({marks})",
                    ids).fetchone()
                self.db.execute(f"DELETE FROM jobs WHERE id IN ({marks})", ids)
                self.db.execute("UPDATE meta SET value = value - ? WHERE name = 'rows'",
                                (count,))
                self.db.execute("UPDATE meta SET value = value - ? WHERE name = 'bytes'",
                                (size,))
            self.db.execute("COMMIT")
            return len(ids)
        except sqlite3.Error as error:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise ArchiveError(f"cannot trim the archive {self.path}: {error}") from None

    def get(self, job_id: int) -> dict[str, Any] | None:
        found = self._one("SELECT doc FROM jobs WHERE id = ?", (job_id,))
        return None if found is None else dict(json.loads(found[0]))

    def search(self, query: JobFilter, *, before_id: int | None, limit: int,
               min_id: int = 0) -> list[dict[str, Any]]:
        """The archived jobs `query` matches, newest (highest id) first, from `min_id` up to
        below `before_id`."""
        clause, params = where(query)
        if before_id is not None:
            clause += " AND id < ?"
            params.append(before_id)
        if min_id > 0:
            clause += " AND id >= ?"
            params.append(min_id)
        try:
            found = self.db.execute(
                f"SELECT doc FROM jobs WHERE {clause} ORDER BY id DESC LIMIT ?",
                [*params, limit]).fetchall()
        except sqlite3.Error as error:
            raise ArchiveError(f"cannot read the archive {self.path}: {error}") from None
        return [json.loads(doc) for (doc,) in found]

    def through_index(self) -> int:
        """The log index every row up to which is written (0 for a new archive)."""
        found = self._one("SELECT value FROM meta WHERE name = 'through_index'", ())
        return 0 if found is None else int(found[0])

    def totals(self) -> dict[str, Any]:
        """Rows, their bytes (as retention counts them), the oldest finish time, the file's
        size on disk."""
        rows, row_bytes = self._one(
            "SELECT (SELECT value FROM meta WHERE name = 'rows'), "
            "(SELECT value FROM meta WHERE name = 'bytes')", ())
        oldest = self._one("SELECT min(finished_ms) FROM jobs", ())[0]
        return {"rows": rows, "row_bytes": row_bytes, "oldest_finished_ms": oldest,
                "file_bytes": self.file_bytes()}

    def file_bytes(self) -> int:
        """The archive's size on disk: its file and its write-ahead log."""
        return sum(os.path.getsize(path) for path in self._files())

    def _files(self) -> Iterable[str]:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(self.path + suffix):
                yield self.path + suffix

    def _one(self, sql: str, params: tuple[Any, ...]) -> Any:
        try:
            return self.db.execute(sql, params).fetchone()
        except sqlite3.Error as error:
            raise ArchiveError(f"cannot read the archive {self.path}: {error}") from None

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()
