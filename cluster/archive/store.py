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
import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from raftcron.cluster.archive.query import document, payload_value, where
from raftcron.scheduler.search import JobFilter, last_worker, payload_path

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
            doc=document(view),
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
        found = self.db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
        if found is None:
            self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
            self.db.execute("INSERT INTO meta VALUES ('rows', 0)")
            self.db.execute("INSERT INTO meta VALUES ('bytes', 0)")
        elif found[0] != SCHEMA_VERSION:
            raise ArchiveError(f"the archive {self.path} is of schema {found[0]}; this release "
                               f"reads {SCHEMA_VERSION}")

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
        sql, params = _select(query, before_id=before_id, limit=limit, min_id=min_id)
        try:
            found = self.db.execute(sql, params).fetchall()
        except sqlite3.Error as error:
            raise ArchiveError(f"cannot read the archive {self.path}: {error}") from None
        return [json.loads(doc) for (doc,) in found]

    def plan(self, query: JobFilter, *, before_id: int | None = None, limit: int = 100,
             min_id: int = 0) -> list[str]:
        """How SQLite answers `search` (EXPLAIN QUERY PLAN, one line per step): which index."""
        sql, params = _select(query, before_id=before_id, limit=limit, min_id=min_id)
        # A plan is made when its statement is prepared, from the schema the connection read
        # last: a read of the schema table reads it again if another connection changed it,
        # and its version in the text makes a new statement (a cached one is not prepared
        # again).
        self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        version = self.db.execute("PRAGMA schema_version").fetchone()[0]
        return [str(row[-1]) for row in self.db.execute(
            f"EXPLAIN QUERY PLAN /* schema {version} */ {sql}", params)]

    # -- search attributes ----------------------------------------------------------------

    def attributes(self) -> list[str]:
        """The search attributes (dotted payload paths) this archive holds an index of."""
        found = self.db.execute("SELECT name FROM meta WHERE name LIKE 'attribute:%'")
        return sorted(name.removeprefix(_ATTRIBUTE) for (name,) in found)

    def attributes_through(self) -> int:
        """The log index of the setting the search attributes' indexes follow (0: none)."""
        found = self._one("SELECT value FROM meta WHERE name = 'attributes_index'", ())
        return 0 if found is None else int(found[0])

    def add_attribute(self, path: str, *, through_index: int = 0) -> None:
        """Index a search attribute, declared by the setting of the entry at `through_index`.
        SQLite builds an index whole, in one transaction that holds the archive's write lock
        throughout: every row is read (seconds per million rows: README, "Benchmarks"), and
        no row can be written meanwhile."""
        index = _index_name(path)
        self._change_schema(
            f"CREATE INDEX IF NOT EXISTS {index} ON jobs ({payload_value(_names(path))})",
            "INSERT OR REPLACE INTO meta VALUES (?, ?)", (_ATTRIBUTE + path, index),
            through_index)

    def drop_attribute(self, path: str, *, through_index: int = 0) -> None:
        self._change_schema(f"DROP INDEX IF EXISTS {_index_name(path)}",
                            "DELETE FROM meta WHERE name = ?", (_ATTRIBUTE + path,),
                            through_index)

    def _change_schema(self, ddl: str, record: str, params: tuple[str, ...],
                       through_index: int) -> None:
        """An index, its record in `meta` and the setting's index, in one transaction: a
        crash leaves all or none."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute(ddl)
            self.db.execute(record, params)
            self.db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('attributes_index', max(?, coalesce("
                "(SELECT value FROM meta WHERE name = 'attributes_index'), 0)))",
                (through_index,))
            self.db.execute("COMMIT")
        except sqlite3.Error as error:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise ArchiveError(f"cannot change the indexes of the archive {self.path}: "
                               f"{error}") from None

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
        file_bytes = sum(os.path.getsize(path) for path in self._files())
        return {"rows": rows, "row_bytes": row_bytes, "oldest_finished_ms": oldest,
                "file_bytes": file_bytes}

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


_ATTRIBUTE = "attribute:"  # a row of `meta` per search attribute indexed: its index's name


def _names(path: str) -> tuple[str, ...]:
    """A search attribute's names. The setting let only valid paths in; one that is not
    would be SQL text: a bug, refused here too."""
    names = payload_path(path)
    if names is None:
        raise ValueError(f"{path!r} is not a payload path")
    return names


def _index_name(path: str) -> str:
    """The name of a search attribute's index: the path itself may hold '-', and SQLite's
    names are better plain."""
    _names(path)
    return "jobs_attribute_" + hashlib.sha256(path.encode()).hexdigest()[:16]


def _select(query: JobFilter, *, before_id: int | None, limit: int,
            min_id: int) -> tuple[str, list[Any]]:
    clause, params = where(query)
    if before_id is not None:
        clause += " AND id < ?"
        params.append(before_id)
    if min_id > 0:
        clause += " AND id >= ?"
        params.append(min_id)
    return f"SELECT doc FROM jobs WHERE {clause} ORDER BY id DESC LIMIT ?", [*params, limit]
