"""What the segment log (`raftlog.RaftLog`) is made of besides its own logic: its errors, the
names of its files, the checks of its marks and segment headers at load, and `Flight`, a batch
written off the Raft thread."""

from __future__ import annotations

import json
import os
import zlib
from collections import deque
from dataclasses import dataclass

from raftcron.cluster.storage import records
from raftcron.cluster.storage.disk import Buffer, Disk, File

CLEAN_MARK = "log.clean"
# The newest segment ever made, written (synced, renamed) right after making it: without it a
# deleted newest segment would look like a log that never reached it, and the node would start
# short. A crash before it is written leaves the previous name, which is never wrong (it only
# says "at least"); a missing mark is tolerated, so only a second deletion could hide the first.
HEAD_MARK = "log.head"


class StorageError(Exception):
    """The node's data dir cannot be used as it is."""


class LogDamaged(StorageError):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class SyncFailed(StorageError):
    """An fsync (of a segment or of the log's folder) failed. Unlike a failed write, this is
    never retried: after a failed writeback the kernel may have dropped the pages it could not
    write and marked them clean, so a later fsync that succeeds proves nothing about them
    (PostgreSQL's "fsyncgate"). The storage latches (`RaftStorage.fsync_failed`) until the
    process restarts and reads back what the disk really holds."""


class StorageUnavailable(StorageError):
    """A write or sync failed (disk full, I/O error): nothing was acknowledged on it."""


def segment_name(number: int) -> str:
    return f"log-{number:08d}.seg"


def segment_number(name: str) -> int | None:
    if name.startswith("log-") and name.endswith(".seg") and name[4:-4].isdigit():
        return int(name[4:-4])
    return None


@dataclass
class LoadReport:
    segments: int = 0
    entries: int = 0
    torn_bytes_cut: int = 0
    torn_segment: str | None = None
    torn_problem: str | None = None
    clean_stop: bool = False


@dataclass
class Flight:
    """One batch written and fsynced off the Raft thread (`begin_sync` .. `finish_sync`).
    Only ``run`` touches the file; everything else stays with the Raft thread."""

    number: int  # the segment it goes to
    offset: int
    data: bytes
    frames: list[bytes]
    entries: list[tuple[int, int]]  # (raft index, frame number) to place once written
    commit_before: int  # the commit index written before this batch
    with_commit: bool  # its last frame is the commit index
    last_index: int  # the log's end when it was made (lowered by later truncations)
    compacted: bool
    file: File
    durable: bool
    error: OSError | None = None
    failed_in_sync: bool = False
    done: bool = False

    def land_here(self) -> None:
        """Write it on the calling thread (a log without a sync thread: tests, tools)."""
        if not self.done:
            self.run()
            self.done = True

    def run(self) -> None:
        """The I/O, on whichever thread the storage gives it (`RaftStorage` a worker)."""
        try:
            self.file.append(self.data)
        except OSError as error:
            self.error = error
            return
        if self.durable:
            try:
                self.file.sync()
            except OSError as error:
                self.error, self.failed_in_sync = error, True


def read_clean_mark(disk: Disk, directory: str, names: list[str]) -> dict[str, object] | None:
    if CLEAN_MARK not in names:
        return None
    path = os.path.join(directory, CLEAN_MARK)
    try:
        mark = json.loads(disk.read(path))
        if not isinstance(mark, dict) or not {"segment", "size", "crc32"} <= set(mark):
            raise ValueError("fields missing")
    except ValueError as error:
        raise LogDamaged(path, f"is not a valid clean-stop mark ({error})") from None
    return mark


def read_head_mark(disk: Disk, directory: str, names: list[str]) -> int | None:
    if HEAD_MARK not in names:
        return None
    path = os.path.join(directory, HEAD_MARK)
    try:
        mark = json.loads(disk.read(path))
        number = segment_number(mark["segment"]) if isinstance(mark, dict) else None
        if not isinstance(number, int):
            raise ValueError("no segment name")
    except (ValueError, KeyError, TypeError) as error:
        raise LogDamaged(path, f"is not a valid newest-segment mark ({error})") from None
    return number


def check_clean_mark(path: str, mark: dict[str, object], number: int, data: Buffer) -> None:
    if mark["segment"] != segment_name(number):
        raise LogDamaged(path, f"is the newest segment, but the node stopped with "
                               f"{mark['segment']} as its newest")
    if mark["size"] != len(data) or mark["crc32"] != zlib.crc32(data):
        raise LogDamaged(path, f"changed since the node stopped cleanly ({len(data)} bytes, "
                               f"{mark['size']} at the stop)")


def check_segment_header(path: str, number: int, frame: records.Frame) -> None:
    magic, version, found = (records.decode_segment_header(frame.body)
                             if frame.kind == records.KIND_SEGMENT else (b"", 0, 0))
    if magic != records.SEGMENT_MAGIC:
        raise LogDamaged(path, "does not start with a raftcron log segment header")
    if version != records.SEGMENT_FORMAT_VERSION:
        raise LogDamaged(path, f"is log format version {version}; this release reads "
                               f"version {records.SEGMENT_FORMAT_VERSION}")
    if found != number:
        raise LogDamaged(path, f"says it is segment {found}")


def write_mark(disk: Disk, directory: str, name: str, fields: dict[str, object]) -> None:
    """A small JSON file made durable whole: written, synced, renamed, its folder synced."""
    temporary = os.path.join(directory, name + ".tmp")
    try:
        disk.write_file(temporary, [json.dumps(fields).encode()], sync=True)
        disk.rename(temporary, os.path.join(directory, name))
        disk.sync_dir(directory)
    except OSError as error:
        raise StorageUnavailable(f"{temporary}: write failed: {error}") from error


def cut_torn_tail(disk: Disk, directory: str, path: str, scan: records.Scan) -> None:
    """Cut a newest segment back to its last whole batch (a crash tore the last write)."""
    if scan.good_end == 0:
        disk.unlink(path)
        disk.sync_dir(directory)
        return
    file = disk.open(path)
    try:
        file.truncate(scan.good_end)
        file.sync()
    finally:
        file.close()


class CommandCache:
    """Recent commands by raft index, within a byte budget, oldest evicted first."""

    def __init__(self) -> None:
        self._commands: dict[int, bytes] = {}
        self._order: deque[int] = deque()
        self.bytes = 0

    def get(self, index: int) -> bytes | None:
        return self._commands.get(index)

    def put(self, index: int, command: bytes) -> None:
        self.drop(index)
        self._commands[index] = command
        self._order.append(index)
        self.bytes += len(command)

    def put_oldest(self, index: int, command: bytes) -> None:
        """At load, newest first: each goes before those already there."""
        self._commands[index] = command
        self._order.appendleft(index)
        self.bytes += len(command)

    def drop(self, index: int) -> None:
        command = self._commands.pop(index, None)
        if command is not None:
            self.bytes -= len(command)

    def evict(self, bytes_max: int, keep_from: int | None) -> None:
        """Down to `bytes_max`, never an index from `keep_from` on (not written yet)."""
        while self.bytes > bytes_max and self._order:
            oldest = self._order[0]
            if keep_from is not None and oldest >= keep_from and oldest in self._commands:
                break
            self.drop(self._order.popleft())
        if len(self._order) > 4 * max(1, len(self._commands)) + 1024:
            self._order = deque(i for i in self._order if i in self._commands)
