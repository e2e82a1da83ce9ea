"""A node's archive on disk (DESIGN.md §9.2): the finished jobs that left the replicated state,
one SQLite row each, found by id and by any field.

SQLite from the standard library: one file, transactions, an index on any expression
(`json_extract` of a payload path, for search attributes), and a page cache that keeps the
archive's size off the node's memory. A row holds the job as the API shows it (`doc`, the JSON
of `views.job_view`, payload and result included) beside the columns searches filter on.

A row is written by job id with `INSERT OR REPLACE`: a node that replays its log after a
restart writes the same rows again and ends with the same archive.

Gaps: every job that leaves a finalized cluster's state has a sequence number, so a member
knows which rows it should hold. `next_seq` (in `meta`) is where its account ends: below it
each number was written, or is recorded in `gaps` as missing (a snapshot installed from the
leader jumped over the evictions of the entries it covers; an empty or restored data dir).
A member fills its gaps from a peer (cluster/archive/fill.py) with `fill`, which never
replaces a row of its own. `left_index` is the log
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
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

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
CREATE TABLE IF NOT EXISTS gaps (lo INTEGER PRIMARY KEY, hi INTEGER NOT NULL);
"""
_COLUMNS = ("id, task, queue, status, schedule, key, worker, error, created_ms, finished_ms, "
            "left_index, seq, bytes, doc")
FILL_ROWS_MAX = 2_000  # rows one answer to a peer carries
FILL_BYTES_MAX = 4 << 20  # and their documents' bytes (one 60 KB payload is ~60 KB)


class ArchiveError(Exception):
    """The archive cannot be opened, read or written (a damaged file, a full or failing disk)."""


def stored_schema(db: sqlite3.Connection) -> object:
    """The schema version an archive's file says it is of (None: a new file, none yet)."""
    found = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
    return None if found is None else found[0]


def check_schema(found: object, path: str) -> None:
    """ArchiveError unless `found` (`stored_schema`) is the version this release reads: a
    node's own archive at its start, and a backup's archive before a restore
    (cluster/ops/backup.py)."""
    if found != SCHEMA_VERSION:
        raise ArchiveError(f"the archive {path} is of schema {found}; this release reads "
                           f"{SCHEMA_VERSION}")


class Row(NamedTuple):
    """A job as the archive keeps it: `doc` is its API view, the rest what searches filter on.
    A named tuple: every member makes one for every job that leaves the state, and a frozen
    dataclass's 13 guarded setattrs cost 1.5 us of it where a tuple costs 0.3."""

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
        return cls(view["id"], view["task"], view["queue"], view["status"], view["schedule"],
                   view["key"], last_worker(view), view["error"], view["created_ms"],
                   view["finished_ms"], left_index, seq, document(view))

    def to_wire(self) -> list[Any]:
        """The row as a peer sends it (`rows_by_seq`, cluster/archive/fill.py)."""
        return [self.id, self.task, self.queue, self.status, self.schedule, self.key,
                self.worker, self.error, self.created_ms, self.finished_ms, self.left_index,
                self.seq, self.doc]

    @classmethod
    def of_wire(cls, data: Any) -> Row:
        """A row a peer sent; ValueError naming what is wrong (its shape, a field's type)."""
        if not isinstance(data, list) or len(data) != 13:
            raise ValueError("a row is a list of 13 fields")
        row = cls(*data)
        text = (row.task, row.queue, row.status, row.doc)
        optional = (row.schedule, row.key, row.worker, row.error)
        numbers = (row.id, row.created_ms, row.left_index, row.seq)
        if (not all(isinstance(v, str) for v in text)
                or not all(v is None or isinstance(v, str) for v in optional)
                or not all(type(v) is int for v in numbers)
                or not (row.finished_ms is None or type(row.finished_ms) is int)
                or row.id < 1 or row.seq < 1):
            raise ValueError(f"row {data[0]!r} has a field of the wrong type")
        # The document is the job's view as `of_view` wrote it, its id first: checked by
        # that prefix (a peer is a member of the cluster). Parsing every document to check
        # it held a fill to 13-14k rows/s against 21k (fillbench, 200,000 rows).
        if not (row.doc.startswith(f'{{"id":{row.id},') and row.doc.endswith("}")):
            raise ValueError(f"row {row.id}: its document is not the job's")
        return row

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
            self.db.execute("INSERT INTO meta VALUES ('next_seq', 1)")
        else:
            check_schema(found, self.path)

    @contextlib.contextmanager
    def _transaction(self, doing: str) -> Iterator[None]:
        try:
            self.db.execute("BEGIN IMMEDIATE")
            yield
            self.db.execute("COMMIT")
        except sqlite3.Error as error:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise ArchiveError(f"cannot {doing} the archive {self.path}: {error}") from None

    def _held(self, ids: Sequence[int]) -> tuple[int, int]:
        """How many of `ids` have a row, and their bytes (in the transaction). The totals are
        kept beside the rows (a count over millions of rows at every scrape would not do)."""
        rows, size = 0, 0
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            found = self.db.execute(
                f"SELECT count(*), coalesce(sum(bytes), 0) FROM jobs WHERE id IN "
                f"({','.join('?' * len(chunk))})", chunk).fetchone()
            rows += found[0]
            size += found[1]
        return rows, size

    def _present(self, ids: Sequence[int]) -> set[int]:
        """Which of `ids` have a row."""
        present: set[int] = set()
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            present.update(row_id for (row_id,) in self.db.execute(
                f"SELECT id FROM jobs WHERE id IN ({','.join('?' * len(chunk))})", chunk))
        return present

    def _delete(self, ids: Sequence[int]) -> None:
        """Delete the rows of `ids` (in the transaction), with the totals."""
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            count, size = self._held(chunk)
            if count:
                self.db.execute(f"DELETE FROM jobs WHERE id IN ({','.join('?' * len(chunk))})",
                                chunk)
                self._add_totals(-count, -size)

    def _add_totals(self, rows: int, size: int) -> None:
        self.db.execute("UPDATE meta SET value = value + ? WHERE name = 'rows'", (rows,))
        self.db.execute("UPDATE meta SET value = value + ? WHERE name = 'bytes'", (size,))

    def _insert(self, rows: Sequence[Row], verb: str) -> None:
        self.db.executemany(
            f"{verb} INTO jobs ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [(r.id, r.task, r.queue, r.status, r.schedule, r.key, r.worker, r.error,
              r.created_ms, r.finished_ms, r.left_index, r.seq, r.bytes, r.doc) for r in rows])

    def write(self, rows: Sequence[Row], through_index: int,
              purged: Sequence[int] = ()) -> None:
        """The rows and the index they reach, in one transaction (durable when it returns, in
        `fsync` durability); then the rows of the `purged` job ids are deleted (a job purged
        after it left: its row goes, written in this batch or before)."""
        with self._transaction("write"):
            by_id = {r.id: r for r in rows}  # the last of a replayed id counts
            replaced_rows, replaced_bytes = self._held(list(by_id))
            self._add_totals(len(by_id) - replaced_rows,
                             sum(r.bytes for r in by_id.values()) - replaced_bytes)
            self._insert(rows, "INSERT OR REPLACE")
            self.db.execute("INSERT INTO meta VALUES ('through_index', ?) ON CONFLICT (name) "
                            "DO UPDATE SET value = max(value, excluded.value)", (through_index,))
            if purged:
                self._delete(list(purged))
            top = max((r.seq for r in rows), default=0)
            if top:
                self.db.execute("UPDATE meta SET value = max(value, ?) WHERE name = 'next_seq'",
                                (top + 1,))

    def trim(self, floor: int, *, rows_max: int = 10_000) -> int:
        """Delete at most `rows_max` rows numbered below `floor` (archive retention, the same
        rows on every member: scheduler/archiving.py), with the totals; how many went. Rows
        archived before the cluster was finalized have no number and stay. Gaps below the
        floor are gone too: nothing there is to be filled any more."""
        with self._transaction("trim"):
            ids = [row_id for (row_id,) in self.db.execute(
                "SELECT id FROM jobs WHERE seq > 0 AND seq < ? ORDER BY seq LIMIT ?",
                (floor, rows_max))]
            self._delete(ids)
            self.db.execute("DELETE FROM gaps WHERE hi <= ?", (floor,))
            self.db.execute("UPDATE gaps SET lo = ? WHERE lo < ?", (floor, floor))
        return len(ids)

    # -- gaps, and filling them from a peer -------------------------------------------------

    def next_seq(self) -> int:
        """Every sequence number below this is written, trimmed, or recorded as a gap."""
        return int(self._one("SELECT value FROM meta WHERE name = 'next_seq'", ())[0])

    def gaps(self) -> list[tuple[int, int]]:
        """The missing ranges [lo, hi) of sequence numbers, lowest first."""
        try:
            return [(lo, hi) for lo, hi in self.db.execute("SELECT lo, hi FROM gaps ORDER BY lo")]
        except sqlite3.Error as error:
            raise ArchiveError(f"cannot read the archive {self.path}: {error}") from None

    def record_gap(self, lo: int, hi: int) -> None:
        """The jobs numbered [lo, hi) left the state without this member writing them (it
        installed a snapshot past their evictions): missing, to be filled from a peer."""
        with self._transaction("record a gap in"):
            if lo < hi:
                self.db.execute("INSERT OR REPLACE INTO gaps VALUES (?, ?)", (lo, hi))
            self.db.execute("UPDATE meta SET value = max(value, ?) WHERE name = 'next_seq'",
                            (hi,))

    def fill(self, rows: Sequence[Row], lo: int, filled_to: int) -> int:
        """A peer's rows numbered [lo, filled_to), the part of the gap starting at `lo` it
        answered for: written unless this member holds the job already (its own row, written
        from its log, stands), and the gap shrunk to start at `filled_to`. How many were new."""
        with self._transaction("fill"):
            found = self.db.execute("SELECT hi FROM gaps WHERE lo = ?", (lo,)).fetchone()
            if found is None:
                return 0  # filled already, or trimmed away meanwhile
            hi = found[0]
            wanted = {r.id: r for r in rows if lo <= r.seq < min(filled_to, hi)}
            held = self._present(list(wanted))
            new = [r for r in wanted.values() if r.id not in held]
            self._insert(new, "INSERT")
            self._add_totals(len(new), sum(r.bytes for r in new))
            self.db.execute("DELETE FROM gaps WHERE lo = ?", (lo,))
            if filled_to < hi:
                self.db.execute("INSERT INTO gaps VALUES (?, ?)", (filled_to, hi))
        return len(new)

    def rows_by_seq(self, lo: int, hi: int, *, rows_max: int = FILL_ROWS_MAX,
                    bytes_max: int = FILL_BYTES_MAX) -> tuple[list[Row], int]:
        """What this member can tell a peer filling [lo, hi): its rows numbered from `lo`,
        lowest first, and `to`, the end of what the answer covers: every row in [lo, to) it
        holds is in it, and it misses none there (no gap of its own, nothing not yet written).
        `to == lo`: it cannot answer from `lo` (ask another member)."""
        try:
            self.db.execute("BEGIN")  # one read: the gaps and the rows as of one moment
            try:
                to = min(hi, int(self.db.execute(
                    "SELECT value FROM meta WHERE name = 'next_seq'").fetchone()[0]))
                gap = self.db.execute("SELECT lo FROM gaps WHERE hi > ? AND lo < ? ORDER BY lo "
                                      "LIMIT 1", (lo, to)).fetchone()
                if gap is not None:  # its own gap: the answer stops before it
                    to = max(lo, gap[0])
                found = self.db.execute(
                    "SELECT id, task, queue, status, schedule, key, worker, error, created_ms, "
                    "finished_ms, left_index, seq, doc FROM jobs WHERE seq > 0 AND seq >= ? "
                    "AND seq < ? ORDER BY seq LIMIT ?", (lo, to, rows_max))
                rows: list[Row] = []
                size = 0
                for fields in found:
                    rows.append(Row(*fields))
                    size += len(fields[-1])
                    if size >= bytes_max:
                        break
            finally:
                self.db.execute("COMMIT")
        except sqlite3.Error as error:
            raise ArchiveError(f"cannot read the archive {self.path}: {error}") from None
        if len(rows) >= rows_max or size >= bytes_max:
            to = rows[-1].seq + 1  # cut short: the next ask starts after the last row sent
        return rows, to

    def get(self, job_id: int) -> dict[str, Any] | None:
        found = self._one("SELECT doc FROM jobs WHERE id = ?", (job_id,))
        return None if found is None else dict(json.loads(found[0]))

    def search(self, query: JobFilter, *, before_id: int | None, limit: int,
               min_id: int = 0) -> list[dict[str, Any]]:
        """The archived jobs `query` matches, newest (highest id) first, from `min_id` up to
        below `before_id`."""
        return self.search_within(query, before_id=before_id, limit=limit, min_id=min_id)[0]

    def search_within(self, query: JobFilter, *, before_id: int | None, limit: int,
                      min_id: int = 0, bytes_max: int | None = None
                      ) -> tuple[list[dict[str, Any]], int]:
        """`search`, ending once the rows' documents reach `bytes_max` (never empty), and the
        floor of the answer: every matching row from it up to below `before_id` is in it
        (`min_id`, or the last row's id when cut for bytes)."""
        sql, params = _select(query, before_id=before_id, limit=limit, min_id=min_id)
        found: list[dict[str, Any]] = []
        size = 0
        try:
            rows = self.db.execute(sql, params)
            try:
                for (doc,) in rows:
                    found.append(json.loads(doc))
                    size += len(doc)
                    if bytes_max is not None and size >= bytes_max and len(found) < limit:
                        return found, int(found[-1]["id"])
            finally:
                rows.close()  # a statement left unfinished would hold its read snapshot
        except sqlite3.Error as error:
            raise ArchiveError(f"cannot read the archive {self.path}: {error}") from None
        return found, min_id

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
        throughout: every row is read (seconds per million rows: docs/proof/benchmarks.md), and
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
        size on disk and the disk's free bytes, the jobs missing (gaps to fill from a peer)."""
        rows, row_bytes, missing = self._one(
            "SELECT (SELECT value FROM meta WHERE name = 'rows'), "
            "(SELECT value FROM meta WHERE name = 'bytes'), "
            "(SELECT coalesce(sum(hi - lo), 0) FROM gaps)", ())
        oldest = self._one("SELECT min(finished_ms) FROM jobs", ())[0]
        disk = os.statvfs(os.path.dirname(self.path))
        return {"rows": rows, "row_bytes": row_bytes, "oldest_finished_ms": oldest,
                "file_bytes": self.file_bytes(), "disk_free_bytes": disk.f_bavail * disk.f_frsize,
                "missing_jobs": missing}

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
