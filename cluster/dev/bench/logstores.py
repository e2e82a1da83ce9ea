"""The two candidate stores for the Raft log and its term/vote/commit metadata (DESIGN.md §8.1).

Minimal but faithful to what a node would run, so that `cluster.bench.storebench` measures the
real cost of each one, fsync included. Neither is wired into a node yet.

- `SqliteStore`: stdlib sqlite3, WAL mode, `log(idx INTEGER PRIMARY KEY, term, data, crc)` and a
  one-row `meta` table; one transaction per batch (group commit). `synchronous` is FULL (the WAL
  is synced at every commit), NORMAL (synced only at checkpoints: a power loss can take back
  committed transactions) or OFF (never synced).
- `SegmentStore`: an etcd-style append-only log in segment files (`<first index>.seg`, a header
  with a format name, a version and the first index), records `[u32 length][u32 crc32][payload]`
  with payload `[u64 index][u64 term][data]`; one `os.write` per batch, then `os.fdatasync`
  (`sync="fdatasync"`), `os.fsync` (`"fsync"`) or nothing (`"none"`: durability "os"). The
  metadata is a small checksummed file replaced atomically (temporary file, sync, rename,
  directory sync).

Both give the same operations: `append` (one durable batch), `set_meta`, `truncate_from` (drop
entries at and after an index, as a follower does on a conflict), `compact_before` (drop entries
before an index, once a snapshot covers them) and `open` (read back every entry, checking each
checksum). A CRC covers the index, the term and the data of every entry in both stores: SQLite
has no checksum of its own on its pages.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import zlib
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

StoreEntry = tuple[int, int, bytes]  # (index, term, data)

ENTRY_HEAD = struct.Struct("<QQ")  # index, term: what the CRC covers before the data
SEGMENT_MAGIC = b"RCSEGLOG"
SEGMENT_VERSION = 1
SEGMENT_HEADER = struct.Struct("<8sIQI")  # magic, version, first index, crc32 of the 20 before
RECORD_HEAD = struct.Struct("<II")  # payload length, crc32 of the payload
META_MAGIC = b"RCMETA01"
META_LAYOUT = struct.Struct("<8sIQqQQI")  # magic, version, term, vote, commit, first index, crc
SEGMENT_BYTES = 64 * 1024 * 1024  # etcd's segment size
SQLITE_FORMAT = "raftcron-log"
SQLITE_VERSION = 1
SYNCS = ("fdatasync", "fsync", "none")
SYNCHRONOUS = ("FULL", "NORMAL", "OFF")


class StoreDamaged(Exception):
    """A checksum, a header or the order of the entries is wrong: the store must not be used."""


def entry_crc(index: int, term: int, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(ENTRY_HEAD.pack(index, term)))


@dataclass
class Meta:
    term: int = 0
    vote: int = -1  # -1: voted for nobody in this term
    commit: int = 0
    first_index: int = 1  # entries before it are covered by a snapshot


@dataclass
class OpenReport:
    """What `open` read: every entry of the log, each checksum checked."""

    first_index: int
    last_index: int
    entries: int  # entries of the log (first_index..last_index)
    bytes_read: int  # data bytes checked (including entries below first_index still on disk)
    skipped: int = 0  # entries still on disk below first_index (segment store only)
    torn_bytes: int = 0  # a torn tail after the last good record, cut off (segment store only)


class LogStore(Protocol):
    directory: Path
    last_index: int

    def append(self, entries: Sequence[StoreEntry]) -> None: ...
    def set_meta(self, meta: Meta) -> None: ...
    def truncate_from(self, index: int) -> None: ...
    def compact_before(self, index: int) -> None: ...
    def close(self) -> None: ...


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- A: SQLite ------------------------------------------------------------------------------


class SqliteStore:
    """The log and the metadata in one SQLite database, WAL mode, one transaction per call."""

    FILE = "raft.sqlite"

    def __init__(self, directory: Path, synchronous: str = "FULL") -> None:
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS}")
        self.directory = directory
        self.synchronous = synchronous
        self.db = sqlite3.connect(directory / self.FILE, isolation_level=None)
        mode = self.db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise RuntimeError(f"SQLite refused WAL mode (got {mode!r})")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        # Some builds (Debian's libsqlite3) zero every freed page: a compaction would then write
        # its whole size again. Nothing secret is in a freed log page.
        self.db.execute("PRAGMA secure_delete=OFF")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS log(idx INTEGER PRIMARY KEY, term INTEGER NOT NULL,"
            " data BLOB NOT NULL, crc INTEGER NOT NULL)"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS meta(id INTEGER PRIMARY KEY CHECK (id = 1),"
            " format TEXT NOT NULL, version INTEGER NOT NULL, term INTEGER NOT NULL,"
            " vote INTEGER NOT NULL, commit_index INTEGER NOT NULL, first_index INTEGER NOT NULL)"
        )
        self.db.execute(
            "INSERT OR IGNORE INTO meta VALUES (1, ?, ?, 0, -1, 0, 1)",
            (SQLITE_FORMAT, SQLITE_VERSION),
        )
        row = self.db.execute("SELECT max(idx) FROM log").fetchone()
        self.last_index = row[0] or 0

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")  # with synchronous=FULL: the WAL is synced before this returns

    def append(self, entries: Sequence[StoreEntry]) -> None:
        if entries[0][0] != self.last_index + 1:
            raise ValueError(f"append at {entries[0][0]}, the log ends at {self.last_index}")
        rows = [(index, term, data, entry_crc(index, term, data)) for index, term, data in entries]
        with self._transaction() as db:
            db.executemany("INSERT INTO log VALUES (?, ?, ?, ?)", rows)
        self.last_index = entries[-1][0]

    def set_meta(self, meta: Meta) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE meta SET term = ?, vote = ?, commit_index = ?, first_index = ?",
                (meta.term, meta.vote, meta.commit, meta.first_index),
            )

    def truncate_from(self, index: int) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM log WHERE idx >= ?", (index,))
        self.last_index = min(self.last_index, index - 1)

    def compact_before(self, index: int) -> None:
        # One transaction: a crash leaves either the old log or the compacted one.
        with self._transaction() as db:
            db.execute("DELETE FROM log WHERE idx < ?", (index,))
            db.execute("UPDATE meta SET first_index = max(first_index, ?)", (index,))

    def close(self) -> None:
        self.db.close()

    @classmethod
    def open(cls, directory: Path, synchronous: str = "FULL") -> tuple[SqliteStore, OpenReport]:
        """Open the database and read every entry back, checking its CRC and its index."""
        store = cls(directory, synchronous)
        row = store.db.execute(
            "SELECT format, version, first_index FROM meta WHERE id = 1"
        ).fetchone()
        if row is None or tuple(row[:2]) != (SQLITE_FORMAT, SQLITE_VERSION):
            raise StoreDamaged(f"{directory / cls.FILE}: no {SQLITE_FORMAT} v{SQLITE_VERSION} meta")
        first_index = row[2]
        where = directory / cls.FILE
        expected = first_index
        checked = 0
        cursor = store.db.execute("SELECT idx, term, data, crc FROM log ORDER BY idx")
        for index, term, data, crc in cursor:
            if index != expected:
                raise StoreDamaged(f"{where}: entry {index} where {expected} was due")
            if entry_crc(index, term, data) != crc:
                raise StoreDamaged(f"{where}: entry {index}: bad checksum")
            expected += 1
            checked += len(data)
        report = OpenReport(first_index, expected - 1, expected - first_index, checked)
        return store, report


# --- B: segment files -----------------------------------------------------------------------


@dataclass
class _Segment:
    path: Path
    first_index: int
    offsets: array[int]  # file offset of each record, in index order
    size: int  # bytes of the file that hold whole records (the header included)


class SegmentStore:
    """An append-only log in segment files, plus a metadata file replaced atomically."""

    META = "meta"

    def __init__(self, directory: Path, sync: str = "fdatasync", *, segment_bytes: int = 0) -> None:
        if sync not in SYNCS:
            raise ValueError(f"sync must be one of {SYNCS}")
        self.directory = directory
        self.sync = sync
        self.segment_bytes = segment_bytes or SEGMENT_BYTES
        self.segments: list[_Segment] = []
        self.fd = -1  # the last segment, open for appending
        self.meta = Meta()
        self.last_index = 0

    def _sync(self, fd: int) -> None:
        if self.sync == "fdatasync":
            os.fdatasync(fd)
        elif self.sync == "fsync":
            os.fsync(fd)

    def _sync_directory(self) -> None:
        if self.sync != "none":
            fsync_directory(self.directory)

    def _open_last(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.segments:
            self.fd = os.open(self.segments[-1].path, os.O_WRONLY | os.O_APPEND)

    def _new_segment(self, first_index: int) -> None:
        path = self.directory / f"{first_index:020d}.seg"
        head = SEGMENT_MAGIC + struct.pack("<IQ", SEGMENT_VERSION, first_index)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, head + struct.pack("<I", zlib.crc32(head)))
            self._sync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._sync_directory()  # the new file's name is durable before any record in it counts
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = fd
        self.segments.append(_Segment(path, first_index, array("Q"), SEGMENT_HEADER.size))

    def append(self, entries: Sequence[StoreEntry]) -> None:
        if entries[0][0] != self.last_index + 1:
            raise ValueError(f"append at {entries[0][0]}, the log ends at {self.last_index}")
        if not self.segments or self.segments[-1].size >= self.segment_bytes:
            self._new_segment(entries[0][0])
        segment = self.segments[-1]
        parts: list[bytes] = []
        offsets = array("Q")
        offset = segment.size
        for index, term, data in entries:
            head = ENTRY_HEAD.pack(index, term)
            crc = zlib.crc32(data, zlib.crc32(head))
            parts.extend((RECORD_HEAD.pack(len(head) + len(data), crc), head, data))
            offsets.append(offset)
            offset += RECORD_HEAD.size + len(head) + len(data)
        buffer = memoryview(b"".join(parts))
        written = os.write(self.fd, buffer)  # one write per batch (a loop only if it is short)
        while written < len(buffer):
            written += os.write(self.fd, buffer[written:])
        self._sync(self.fd)
        segment.offsets.extend(offsets)
        segment.size = offset
        self.last_index = entries[-1][0]

    def set_meta(self, meta: Meta) -> None:
        body = META_MAGIC + struct.pack(
            "<IQqQQ", SEGMENT_VERSION, meta.term, meta.vote, meta.commit, meta.first_index
        )
        temporary = self.directory / (self.META + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, body + struct.pack("<I", zlib.crc32(body)))
            self._sync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.directory / self.META)
        self._sync_directory()
        self.meta = Meta(meta.term, meta.vote, meta.commit, meta.first_index)

    def truncate_from(self, index: int) -> None:
        """Drop entries >= index. Newest segments go first, so a crash always leaves a prefix."""
        if index > self.last_index:
            return
        removed = False
        while self.segments and self.segments[-1].first_index >= index:
            os.unlink(self.segments.pop().path)
            removed = True
        if removed:
            self._sync_directory()
            self._open_last()
        if self.segments:
            segment = self.segments[-1]
            keep = index - segment.first_index
            if keep < len(segment.offsets):  # else the cut fell on a segment boundary
                offset = segment.offsets[keep]
                os.ftruncate(self.fd, offset)
                self._sync(self.fd)
                del segment.offsets[keep:]
                segment.size = offset
        self.last_index = index - 1

    def compact_before(self, index: int) -> None:
        """Drop entries < index: the metadata moves first_index, then whole old segments go.

        Oldest segments go first, so a crash leaves a contiguous suffix starting at or before
        first_index; entries below it still on disk are skipped when the log is read.
        """
        self.set_meta(Meta(self.meta.term, self.meta.vote, self.meta.commit, index))
        doomed = 0
        while doomed + 1 < len(self.segments) and self.segments[doomed + 1].first_index <= index:
            doomed += 1
        for segment in self.segments[:doomed]:
            os.unlink(segment.path)
        del self.segments[:doomed]
        if doomed:
            self._sync_directory()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @classmethod
    def _read_meta(cls, directory: Path) -> Meta:
        path = directory / cls.META
        if not path.exists():
            return Meta()
        raw = path.read_bytes()
        if len(raw) != META_LAYOUT.size:
            raise StoreDamaged(f"{path}: {len(raw)} bytes, {META_LAYOUT.size} expected")
        magic, version, term, vote, commit, first_index, crc = META_LAYOUT.unpack(raw)
        if magic != META_MAGIC or version != SEGMENT_VERSION or zlib.crc32(raw[:-4]) != crc:
            raise StoreDamaged(f"{path}: bad magic, version or checksum")
        return Meta(term, vote, commit, first_index)

    @classmethod
    def open(
        cls, directory: Path, sync: str = "fdatasync", *, segment_bytes: int = 0
    ) -> tuple[SegmentStore, OpenReport]:
        """Read every segment, checking each record; a torn tail of the last one is cut off."""
        store = cls(directory, sync, segment_bytes=segment_bytes)
        store.meta = cls._read_meta(directory)
        paths = sorted(directory.glob("*.seg"))
        expected = 0
        checked = skipped = torn = 0
        for number, path in enumerate(paths):
            raw = memoryview(path.read_bytes())
            if len(raw) < SEGMENT_HEADER.size:
                raise StoreDamaged(f"{path}: shorter than its header")
            magic, version, first_index, crc = SEGMENT_HEADER.unpack_from(raw)
            if (magic, version) != (SEGMENT_MAGIC, SEGMENT_VERSION) or crc != zlib.crc32(
                raw[: SEGMENT_HEADER.size - 4]
            ):
                raise StoreDamaged(f"{path}: bad header")
            if expected and first_index != expected:
                raise StoreDamaged(f"{path}: starts at {first_index} where {expected} was due")
            if not expected and first_index > store.meta.first_index:
                raise StoreDamaged(
                    f"{path}: the log starts at {first_index}, entries from"
                    f" {store.meta.first_index} are missing"
                )
            expected = first_index
            segment = _Segment(path, first_index, array("Q"), SEGMENT_HEADER.size)
            offset = SEGMENT_HEADER.size
            last = number == len(paths) - 1
            while offset < len(raw):
                end = offset + RECORD_HEAD.size
                length, crc = RECORD_HEAD.unpack_from(raw, offset) if end <= len(raw) else (0, 0)
                payload = raw[end : end + length]
                whole = end <= len(raw) and length >= ENTRY_HEAD.size and len(payload) == length
                if not whole or zlib.crc32(payload) != crc:
                    # In the last segment, a record cut short by the end of the file, a bad last
                    # record or zeros up to the end: a write torn by a crash, never acknowledged.
                    tail = raw[offset:]
                    cut = end + length >= len(raw) or not any(tail)
                    if last and cut:
                        torn = len(tail)
                        break
                    raise StoreDamaged(f"{path}: damaged record at byte {offset}")
                index, _term = ENTRY_HEAD.unpack_from(payload)
                if index != expected:
                    raise StoreDamaged(f"{path}: entry {index} where {expected} was due")
                segment.offsets.append(offset)
                checked += length - ENTRY_HEAD.size
                skipped += index < store.meta.first_index
                expected += 1
                offset = end + length
            segment.size = offset
            store.segments.append(segment)
        store.last_index = max(expected - 1, store.meta.first_index - 1)
        if torn:
            fd = os.open(paths[-1], os.O_WRONLY)
            try:
                os.ftruncate(fd, store.segments[-1].size)
                store._sync(fd)
            finally:
                os.close(fd)
        store._open_last()
        entries = store.last_index - store.meta.first_index + 1
        report = OpenReport(
            store.meta.first_index, store.last_index, entries, checked, skipped, torn
        )
        return store, report
