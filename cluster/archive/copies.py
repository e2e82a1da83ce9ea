"""The archive as a file that leaves its node: a consistent copy made while the node runs
(`GET /v1/cluster/backup/archive`, cluster/http/backup.py), checked where it lands, and put
into a new node's data dir by `raftcron restore` (cluster/ops/backup.py).

- A copy is SQLite's `VACUUM INTO` on a read-only connection of its own: one read transaction,
  so the copy is the archive as of one commit, whole, while the writer goes on (in WAL mode a
  reader does not hold a writer back; the write-ahead log only grows until the copy is done).
  It lands in the data dir as `archive.sqlite.backup`, a database with no log beside it, and
  is unlinked as soon as it is open: only the stream reading it keeps it, so a stream that ends
  any way at all frees its space. A node stopped while it made one removes what is left when
  its archive opens again (`remove_leftovers`).
- A file is trusted only once it opens as SQLite, `PRAGMA integrity_check` says ok, and its
  schema is the version `ArchiveStore` reads (`check_file`). Checks open the file read-only and
  immutable: they write nothing beside it.
- A backup's archive names the snapshot it goes with (`mark_backup_of`: its index, term and
  state digest), so a restore never pairs it with the snapshot of another backup.
- A restore keeps the rows of the jobs that left the state at or before the snapshot's index
  and drops the others (`restore_file`): the archive is copied after the snapshot, and a job
  that left after it is still in the snapshot's state, or was made after it (and the restored
  cluster will give its id to another job).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO

from raftcron.cluster.archive.store import (
    ARCHIVE_NAME,
    ArchiveError,
    check_schema,
    stored_schema,
)

COPY_NAME = ARCHIVE_NAME + ".backup"  # the copy a backup streams, in the data dir
RESTORING_NAME = ARCHIVE_NAME + ".restoring"  # a restore's copy until it is complete
TOP_PROBLEMS = 5  # what a damaged file's refusal quotes of integrity_check's findings


@dataclass(frozen=True)
class ArchiveFile:
    """An archive file and what it holds, as its own totals say (`store.py` keeps them)."""

    path: str
    rows: int
    row_bytes: int
    size_bytes: int
    through_index: int  # every job that left the state up to this index is in it
    backup_of: dict[str, Any] | None  # the snapshot of the backup it belongs to, if marked


class ArchiveCopier:
    """One copy of a node's archive into its data dir: `copy` runs on a thread of its own and
    `interrupt`, from any thread, stops it (a client that went away, a node that stops)."""

    def __init__(self, directory: str) -> None:
        self.source = os.path.join(directory, ARCHIVE_NAME)
        self.path = os.path.join(directory, COPY_NAME)
        self._lock = threading.Lock()  # interrupt vs close: never on a closed connection
        try:
            self._db: sqlite3.Connection | None = sqlite3.connect(
                f"file:{self.source}?mode=ro", uri=True, check_same_thread=False)
        except sqlite3.Error as error:
            raise ArchiveError(f"cannot open the archive {self.source}: {error}") from None

    def copy(self) -> tuple[ArchiveFile, BinaryIO]:
        """The copy, described, and open for reading (its name already unlinked)."""
        directory = os.path.dirname(self.path)
        remove_leftovers(directory)
        try:
            assert self._db is not None, "copy runs once"
            self._db.execute("VACUUM INTO ?", (self.path,))
            described = check_file(self.path, integrity=False)
            handle = open(self.path, "rb")  # noqa: SIM115 (the caller streams it, then closes)
        except sqlite3.Error as error:
            raise ArchiveError(f"cannot copy the archive {self.source}: {error}") from None
        finally:
            self._close()
            remove_leftovers(directory)
        return described, handle

    def interrupt(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.interrupt()

    def _close(self) -> None:
        with self._lock:
            if self._db is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
                self._db = None


def remove_leftovers(directory: str) -> None:
    """A copy and its journal left by a node that stopped while it made one."""
    for name in (COPY_NAME, COPY_NAME + "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))


def check_file(path: str, *, integrity: bool = True) -> ArchiveFile:
    """The archive in the file at `path`, once it opens as SQLite, holds an archive of the
    schema this release reads and (with `integrity`) passes `PRAGMA integrity_check`;
    ArchiveError naming the problem otherwise."""
    if not os.path.isfile(path):
        raise ArchiveError(f"the archive {path} does not exist (or is not a file)")
    if os.path.getsize(path) == 0:
        raise ArchiveError(f"the archive {path} is empty")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as error:
        raise ArchiveError(f"the archive {path} does not open: {error}") from None
    try:
        if integrity:
            found = [row[0] for row in db.execute(f"PRAGMA integrity_check({TOP_PROBLEMS})")]
            if found != ["ok"]:
                raise ArchiveError(f"the archive {path} is damaged (SQLite's integrity check: "
                                   f"{'; '.join(found)})")
        tables = {name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"jobs", "meta"} <= tables:
            raise ArchiveError(f"{path} is a SQLite file but not a raftcron archive (it has no "
                               "jobs and meta tables)")
        check_schema(stored_schema(db), path)
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
    except sqlite3.Error as error:
        raise ArchiveError(f"the archive {path} is damaged, or not a SQLite file ({error})"
                           ) from None
    finally:
        db.close()
    mark = meta.get("backup_of")
    return ArchiveFile(path, int(meta.get("rows", 0)), int(meta.get("bytes", 0)),
                       os.path.getsize(path), int(meta.get("through_index", 0)),
                       None if mark is None else dict(json.loads(mark)))


def mark_backup_of(path: str, snapshot: dict[str, Any]) -> None:
    """Write into the archive file at `path` the snapshot of the backup it belongs to."""
    try:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("PRAGMA synchronous = FULL")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('backup_of', ?)",
                       (json.dumps(snapshot, sort_keys=True),))
        finally:
            db.close()
    except sqlite3.Error as error:
        raise ArchiveError(f"cannot write to the archive {path}: {error}") from None


def restore_file(archive: ArchiveFile, directory: str, through_index: int,
                 next_seq: int) -> int:
    """Put the checked `archive` into the data dir `directory` as its node's archive, without
    the jobs that left after `through_index` (the snapshot's index): a copy under another name
    until it is complete and synced, then renamed. Its account of archive numbers ends where
    the snapshot's does (`next_seq`): a gap is never recorded for the jobs dropped, nor kept
    past it. How many rows it holds."""
    restoring = os.path.join(directory, RESTORING_NAME)
    try:
        shutil.copyfile(archive.path, restoring)
        db = sqlite3.connect(restoring, isolation_level=None)
        try:
            db.execute("PRAGMA synchronous = FULL")
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM jobs WHERE left_index > ?", (through_index,))
            rows, row_bytes = db.execute(
                "SELECT count(*), coalesce(sum(bytes), 0) FROM jobs").fetchone()
            db.execute("UPDATE meta SET value = ? WHERE name = 'rows'", (rows,))
            db.execute("UPDATE meta SET value = ? WHERE name = 'bytes'", (row_bytes,))
            db.execute("UPDATE meta SET value = min(value, ?) WHERE name = 'through_index'",
                       (through_index,))
            db.execute("UPDATE meta SET value = ? WHERE name = 'next_seq'", (next_seq,))
            db.execute("DELETE FROM gaps WHERE lo >= ?", (next_seq,))
            db.execute("UPDATE gaps SET hi = min(hi, ?)", (next_seq,))
            db.execute("DELETE FROM meta WHERE name = 'backup_of'")  # the node's own now
            db.execute("COMMIT")
        finally:
            db.close()
        with open(restoring, "rb") as written:
            os.fsync(written.fileno())
        os.replace(restoring, os.path.join(directory, ARCHIVE_NAME))
    except (sqlite3.Error, OSError) as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(restoring)
        raise ArchiveError(f"cannot restore the archive {archive.path} into {directory}: "
                           f"{error}") from None
    return int(rows)
