"""The Raft log and its hard state (term, vote, commit index) in checksummed segment files.

What it owns: ``log-NNNNNNNN.seg`` files in one folder. Every change is a frame appended to
the newest segment (`records`): an entry, a truncation ("entries from i on are gone"), a
compaction ("entries before i are gone"), the hard state, the commit index, the list of live
segments. Changes are buffered in memory and reach the file as one batch at `sync()`: one
write and, with ``durable=True``, one fdatasync, whatever the batch holds (group commit). The
caller decides when a change must be durable (before an acknowledgement, a vote, counting
itself toward a majority); `set_hard_state` syncs at once, because Raft acts on it at once.

Replaying the segments in order rebuilds the log: a truncation or a compaction is atomic
because it is one frame. A new segment starts with a copy of the hard state and the live
segment list, so older segments can be deleted once the entries they hold are compacted away
(after the list without them is durable); ``log.head`` names the newest segment made, so a
deleted newest segment is damage, not a shorter log. With ``durable=False`` only the newest
segment's tail is ever unsynced: a segment is synced when the next one starts, and the
compaction before segments are deleted; so a power loss costs the last writes, never the log.
Loading checks everything: a torn last batch is cut (the caller logs it); any other damage,
a missing segment, a gap in the indexes or a segment that changed since a clean stop raises
`LogDamaged` naming the file and the damage.

Memory: commands are read back from the files by offset (an index of four numbers per entry);
only recent commands are cached, not the whole log between compactions.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import zlib
from array import array
from collections.abc import Callable

from raftcron.cluster.storage import records
from raftcron.cluster.storage.disk import Buffer, Disk, File, OsDisk
from raftcron.cluster.storage.logparts import (
    CLEAN_MARK,
    HEAD_MARK,
    CommandCache,
    Flight,
    LoadReport,
    LogDamaged,
    StorageError,
    StorageUnavailable,
    SyncFailed,
    check_clean_mark,
    check_segment_header,
    cut_torn_tail,
    read_clean_mark,
    read_head_mark,
    segment_name,
    segment_number,
    write_mark,
)

__all__ = ["CLEAN_MARK", "HEAD_MARK", "Flight", "LoadReport", "LogDamaged", "RaftLog",
           "StorageError", "StorageUnavailable", "SyncFailed", "segment_name", "segment_number"]

SEGMENT_BYTES_MAX = 64 << 20
CACHE_BYTES_MAX = 32 << 20
# The first byte of a PySyncObj command that changes the Raft configuration (its
# `_COMMAND_TYPE.MEMBERSHIP`): the log keeps the indexes of those entries, because a node's
# voters are the ones the latest of them names, committed or not (cluster/membership).
CONFIG_COMMAND = b"\x02"


class RaftLog:
    def __init__(self, directory: str, *, durable: bool = True, disk: Disk | None = None,
                 segment_bytes_max: int = SEGMENT_BYTES_MAX,
                 cache_bytes_max: int = CACHE_BYTES_MAX, read_only: bool = False) -> None:
        self.directory = directory
        self.read_only = read_only  # for `raftcron storage check`: report, change nothing
        self.durable = durable
        self.disk: Disk = disk or OsDisk()
        self.segment_bytes_max = segment_bytes_max
        self.cache_bytes_max = cache_bytes_max
        self.first_index = 0  # raft index of the oldest entry held (0: none ever)
        self._terms = array("Q")
        self._segments_of = array("I")
        self._offsets = array("Q")
        self._lengths = array("I")
        self.entry_bytes = 0  # the commands' bytes in the log now (what compaction frees)
        self.config_indexes: list[int] = []  # entries that change the configuration, ascending
        self._cache = CommandCache()
        self.term = 0
        self.voted_for: str | None = None
        self.commit_index = 0
        self._commit_written = 0
        self._pending: list[bytes] = []
        self._pending_entries: list[tuple[int, int]] = []  # (raft index, frame number)
        self._files: dict[int, File] = {}
        self._sizes: dict[int, int] = {}
        self._current = 0
        self._sequence = 0
        self._compacted = False
        self.sync_failed: str | None = None  # the first failed fsync: latched (`SyncFailed`)
        self.flight: Flight | None = None  # a batch being written off the Raft thread
        # How to wait for a flight: the storage's worker; alone, the log writes it itself.
        self.flight_waiter: Callable[[Flight], None] = Flight.land_here
        self.report = LoadReport()
        self._load()
        # Every entry up to here is on the disk (fsync mode: durable); acks claim no more.
        self.durable_through = self.last_index

    # --- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._terms)

    @property
    def last_index(self) -> int:
        return self.first_index + len(self._terms) - 1 if self._terms else 0

    def term_at(self, index: int) -> int:
        return int(self._terms[self._position(index)])

    def command_at(self, index: int) -> bytes:
        position = self._position(index)
        cached = self._cache.get(index)
        if cached is not None:
            return cached
        number = self._segments_of[position]
        try:
            return self._files[number].read_at(self._offsets[position], self._lengths[position])
        except OSError as error:  # a disk that cannot give back a record: damage, by name
            raise LogDamaged(self._path(number), f"entry {index} cannot be read at offset "
                                                 f"{self._offsets[position]}: {error}") from error

    def _position(self, index: int) -> int:
        position = index - self.first_index
        if not self._terms or not 0 <= position < len(self._terms):
            raise IndexError(f"log index {index} not in [{self.first_index}, {self.last_index}]")
        return position

    @property
    def dirty(self) -> bool:
        return bool(self._pending) or self.commit_index != self._commit_written

    # --- changing (buffered until sync) ----------------------------------------------------

    def append(self, index: int, term: int, command: bytes) -> None:
        if self._terms and index != self.last_index + 1:
            raise ValueError(f"log append of index {index} after {self.last_index}")
        if not self._terms:
            self.first_index = index
        self._pending_entries.append((index, len(self._pending)))
        self._pending.append(records.entry(index, term, command))
        self._terms.append(term)
        self._segments_of.append(0)
        self._offsets.append(0)
        self._lengths.append(len(command))
        self.entry_bytes += len(command)
        self._cache.put(index, command)
        if command[:1] == CONFIG_COMMAND:
            self.config_indexes.append(index)

    def truncate_from(self, index: int) -> None:
        """Entries at and after ``index`` are gone (index <= first: all of them)."""
        keep = max(0, index - self.first_index) if self._terms else 0
        if keep >= len(self._terms):
            return
        for dropped in range(self.first_index + keep, self.last_index + 1):
            self._cache.drop(dropped)
        self.entry_bytes -= sum(self._lengths[keep:])
        for column in (self._terms, self._segments_of, self._offsets, self._lengths):
            del column[keep:]
        self._forget_config_entries(from_index=self.first_index + keep)
        self._pending.append(records.index_frame(records.KIND_TRUNCATE, max(index, 0)))
        gone = self.first_index + keep  # the first index no longer held
        self.durable_through = min(self.durable_through, gone - 1)
        if self.flight is not None:  # what it wrote for the indexes gone is not theirs now
            self.flight.entries = [(i, n) for i, n in self.flight.entries if i < gone]
            self.flight.last_index = min(self.flight.last_index, gone - 1)

    def reset(self) -> None:
        self.truncate_from(0)

    def compact_to(self, index: int) -> None:
        """Entries before ``index`` are gone: a durable snapshot covers them."""
        drop = index - self.first_index
        if not self._terms or drop <= 0:
            return
        if drop >= len(self._terms):
            raise ValueError(f"compaction to {index} would empty the log (last {self.last_index})")
        for dropped in range(self.first_index, index):
            self._cache.drop(dropped)
        self.entry_bytes -= sum(self._lengths[:drop])
        for column in (self._terms, self._segments_of, self._offsets, self._lengths):
            del column[:drop]
        self.first_index = index
        self._forget_config_entries(before_index=index)
        self._pending.append(records.index_frame(records.KIND_COMPACT, index))
        self._compacted = True

    def _forget_config_entries(self, *, from_index: int | None = None,
                               before_index: int | None = None) -> None:
        if from_index is not None:
            self.config_indexes = [i for i in self.config_indexes if i < from_index]
        if before_index is not None:
            self.config_indexes = [i for i in self.config_indexes if i >= before_index]

    def set_hard_state(self, term: int, voted_for: str | None) -> None:
        """Term and vote, durable when this returns (Raft acts on them at once)."""
        self.term, self.voted_for = term, voted_for
        self._pending.append(records.hard_state(term, voted_for))
        self.sync()

    def set_commit(self, index: int) -> None:
        self.commit_index = index  # written with the next batch; never needed for safety

    # --- writing ---------------------------------------------------------------------------

    def sync(self) -> None:
        """Write everything buffered as one batch; with durable=True, fdatasync it.
        Raises StorageUnavailable (and keeps the changes buffered) when the write fails, and
        SyncFailed when an fsync failed, now or ever before in this process (`SyncFailed`)."""
        if self.sync_failed is not None:
            raise SyncFailed(self.sync_failed)
        if self.flight is not None:
            self.wait_flight()
            self.finish_sync()
        if not self.dirty:
            return
        if self._current == 0 or self._sizes[self._current] >= self.segment_bytes_max:
            try:
                if self._current and not self.durable:
                    self._sync_file(self._current)  # only the newest segment may be torn
                self._new_segment()
            except OSError as error:  # creating a file or syncing a folder: nothing written
                raise StorageUnavailable(f"{self.directory}: new segment: {error}") from error
        frames, _ = self._batch_frames()
        offset = self._write(self._current, frames)
        self._place_entries(self._current, offset, frames, self._pending_entries)
        self._pending.clear()
        self._pending_entries.clear()
        self._commit_written = self.commit_index
        self.durable_through = self.last_index
        self._evict()
        if self._compacted:
            self._compacted = False
            try:
                self._drop_dead_segments()
            except OSError as error:  # the batch is durable; dead segments wait for the next
                raise StorageUnavailable(f"{self.directory}: dead segments: {error}") from error

    def _batch_frames(self) -> tuple[list[bytes], bool]:
        """What is buffered, and the commit index if it moved (whether it was added)."""
        with_commit = self.commit_index != self._commit_written
        commit = [records.index_frame(records.KIND_COMMIT, self.commit_index)]
        return [*self._pending, *(commit if with_commit else [])], with_commit

    def ensure_segment(self) -> None:
        """A new log's first segment, made (and durable) before anything is stored in it."""
        if self._current == 0:
            self._new_segment()

    def _write(self, number: int, frames: list[bytes]) -> int:
        """Append one batch to a segment; the batch's start offset."""
        file = self._files[number]
        data = records.batch(self._sequence + 1, frames)
        offset = self._sizes[number]
        try:
            file.append(data)
        except OSError as error:
            with contextlib.suppress(OSError):  # no half batch for the next one to follow
                file.truncate(offset)
            raise StorageUnavailable(f"{self._path(number)}: write failed: {error}") from error
        if self.durable:
            try:
                file.sync()
            except OSError as error:
                raise self._latch(f"{self._path(number)}: fsync failed: {error}") from error
        self._sequence += 1
        self._sizes[number] = offset + len(data)
        return offset

    def _place_entries(self, segment: int, batch_offset: int, frames: list[bytes],
                       entries: list[tuple[int, int]]) -> None:
        """Point the index at where this batch put each entry that is still in the log."""
        starts = []
        position = batch_offset + len(records.batch(0, []))
        for item in frames:
            starts.append(position)
            position += len(item)
        for index, number in entries:
            if self._terms and self.first_index <= index <= self.last_index:
                slot = index - self.first_index
                self._segments_of[slot] = segment
                self._offsets[slot] = records.entry_command_offset(starts[number])

    # --- writing off the Raft thread -------------------------------------------------------

    def begin_sync(self) -> Flight | None:
        """Make what is buffered one batch for another thread to write (`Flight.run`), and
        return it; None when there is nothing to write, a batch is already in flight, or the
        batch needs a new segment (then it is written here, at once, as `sync` does: once per
        segment). Until `finish_sync` the entries it holds are read from the cache, and acks
        claim only `durable_through`. Raises as `sync` does."""
        if self.sync_failed is not None:
            raise SyncFailed(self.sync_failed)
        if self.flight is not None or not self.dirty:
            return None
        if self._current == 0 or self._sizes[self._current] >= self.segment_bytes_max:
            self.sync()
            return None
        frames, with_commit = self._batch_frames()
        number, offset = self._current, self._sizes[self._current]
        data = records.batch(self._sequence + 1, frames)
        self.flight = Flight(number=number, offset=offset, data=data, frames=frames,
                             entries=list(self._pending_entries),
                             commit_before=self._commit_written, with_commit=with_commit,
                             last_index=self.last_index, compacted=self._compacted,
                             file=self._files[number], durable=self.durable)
        self._sequence += 1  # reserved: the next batch follows it in the file
        self._sizes[number] = offset + len(data)
        self._pending.clear()
        self._pending_entries.clear()
        self._commit_written = self.commit_index
        self._compacted = False
        return self.flight

    def wait_flight(self) -> None:
        """Block until the batch in flight is written (the storage's worker says when)."""
        if self.flight is not None and not self.flight.done:
            self.flight_waiter(self.flight)

    def finish_sync(self) -> None:
        """Take a finished flight's outcome, on the Raft thread: its entries placed and
        durable; or, if the write failed, its changes buffered again before what came after
        (StorageUnavailable); or, if its fsync failed, the latch (SyncFailed)."""
        flight = self.flight
        if flight is None or not flight.done:
            return
        self.flight = None
        if flight.error is not None:
            if flight.failed_in_sync:
                raise self._latch(f"{self._path(flight.number)}: fsync failed: "
                                  f"{flight.error}") from flight.error
            with contextlib.suppress(OSError):  # no half batch for the next one to follow
                flight.file.truncate(flight.offset)
            self._sequence -= 1
            self._sizes[flight.number] = flight.offset
            frames = flight.frames[:-1] if flight.with_commit else flight.frames
            shift = len(frames)
            self._pending_entries = [*flight.entries, *(
                (index, number + shift) for index, number in self._pending_entries)]
            self._pending = [*frames, *self._pending]
            self._commit_written = flight.commit_before
            self._compacted = self._compacted or flight.compacted
            raise StorageUnavailable(f"{self._path(flight.number)}: write failed: "
                                     f"{flight.error}") from flight.error
        self._place_entries(flight.number, flight.offset, flight.frames, flight.entries)
        self.durable_through = max(self.durable_through,
                                   min(flight.last_index, self.last_index))
        self._evict()
        if flight.compacted:
            try:
                self._drop_dead_segments()
            except OSError as error:  # the batch is durable; dead segments wait for the next
                self._compacted = True
                raise StorageUnavailable(f"{self.directory}: dead segments: {error}") from error

    def _sync_file(self, number: int) -> None:
        try:
            self._files[number].sync()
        except OSError as error:
            raise self._latch(f"{self._path(number)}: fsync failed: {error}") from error

    def _sync_dir(self) -> None:
        try:
            self.disk.sync_dir(self.directory)
        except OSError as error:
            raise self._latch(f"{self.directory}: fsync of the folder failed: {error}") from error

    def _latch(self, problem: str) -> SyncFailed:
        if self.sync_failed is None:
            self.sync_failed = problem
        return SyncFailed(problem)

    def _new_segment(self) -> None:
        number = self._current + 1
        path = self._path(number)
        if self.disk.exists(path):  # a torn, empty leftover of a crash while creating it
            self.disk.unlink(path)
        self._files[number] = self.disk.create(path)
        self._sizes[number] = 0
        live = [*sorted(self._files)]
        header = [records.segment_header(number), records.hard_state(self.term, self.voted_for),
                  records.index_frame(records.KIND_COMMIT, self._commit_written),
                  records.segments(live)]
        try:
            self._write(number, header)
            if not self.durable:
                self._sync_file(number)  # even then: a segment's header is its identity
            self._sync_dir()
        except (OSError, StorageError):
            self._files.pop(number).close()
            del self._sizes[number]
            self.disk.unlink(path)
            raise
        self._current = number
        write_mark(self.disk, self.directory, HEAD_MARK, {"segment": segment_name(number)})

    def _drop_dead_segments(self) -> None:
        """Delete segments before the one holding the oldest live entry (never the newest)."""
        oldest_live = self._segments_of[0] if self._terms else self._current
        dead = [number for number in self._files if number < oldest_live and
                number != self._current]
        if not dead:
            return
        self._write(self._current, [records.segments(
            [number for number in sorted(self._files) if number not in dead])])
        if not self.durable:
            self._sync_file(self._current)  # the compaction is on disk before its segments go
        for number in dead:
            self._files.pop(number).close()
            del self._sizes[number]
            self.disk.unlink(self._path(number))
        self._sync_dir()

    def close(self, *, clean: bool) -> None:
        """Sync and close; a clean stop leaves a mark that the newest segment is whole."""
        try:
            if clean:
                self.sync()
                self._write_clean_mark()
        finally:
            for file in self._files.values():
                file.close()
            self._files.clear()

    def _write_clean_mark(self) -> None:
        if not self._current:
            return
        data = self.disk.read(self._path(self._current))
        write_mark(self.disk, self.directory, CLEAN_MARK, {
            "segment": segment_name(self._current), "size": len(data),
            "crc32": zlib.crc32(data)})

    def _evict(self) -> None:
        # Entries not written yet (buffered, or in a flight) are read from the cache only.
        unplaced = [entries[0][0] for entries in (
            self._pending_entries, self.flight.entries if self.flight else []) if entries]
        self._cache.evict(self.cache_bytes_max, min(unplaced, default=None))

    # --- loading ---------------------------------------------------------------------------

    def _path(self, number: int) -> str:
        return os.path.join(self.directory, segment_name(number))

    def _load(self) -> None:
        names = self.disk.listdir(self.directory)
        numbers = sorted(n for n in map(segment_number, names) if n is not None)
        clean = read_clean_mark(self.disk, self.directory, names)
        head = read_head_mark(self.disk, self.directory, names)
        if head is not None and head > (numbers[-1] if numbers else 0):
            raise LogDamaged(self._path(head), f"is missing: the log reached it ({HEAD_MARK} "
                                               f"names it), and no newer segment is there")
        for older, newer in itertools.pairwise(numbers):
            if newer != older + 1:  # segments go only from the oldest and the newest end
                raise LogDamaged(self._path(older + 1), f"is missing ({segment_name(older)} and "
                                                        f"{segment_name(newer)} are there)")
        listed: list[int] | None = None
        sequence: int | None = None
        for position, number in enumerate(numbers):
            path = self._path(number)
            try:
                data = self.disk.view(path)
            except OSError as error:
                raise LogDamaged(path, f"cannot be read: {error}") from error
            try:
                found = self._load_segment(number, path, data, clean, head, sequence,
                                           newest=position == len(numbers) - 1)
            finally:
                if isinstance(data, mmap.mmap):
                    data.close()
            if found is not None:
                sequence, listed = found[0], found[1] or listed
        self._sequence = sequence or 0
        self._commit_written = self.commit_index
        self.entry_bytes = sum(self._lengths)
        self.report.segments = len(self._files)
        self.report.entries = len(self._terms)
        self.report.clean_stop = clean is not None
        if listed is not None:
            missing = [n for n in listed if n not in self._files]
            if missing:
                raise LogDamaged(self._path(missing[0]), "is missing (the newest segment "
                                                         "lists it as part of the log)")
        self._cache_tail()
        if clean is not None and not self.read_only:
            self.disk.unlink(os.path.join(self.directory, CLEAN_MARK))
            self.disk.sync_dir(self.directory)

    def _load_segment(self, number: int, path: str, data: Buffer,
                      clean: dict[str, object] | None, head: int | None,
                      sequence: int | None, *, newest: bool,
                      ) -> tuple[int | None, list[int] | None] | None:
        """Check and replay one segment; (the last batch's number, the segment list it
        holds if any), or None for a torn newest segment with nothing whole in it."""
        if newest and clean is not None:
            check_clean_mark(path, clean, number, data)
        # The head mark is written after the segment's header was synced: a segment it
        # names had a whole header, so an empty or headless one is damage, not a crash.
        made_whole = head is not None and number <= head
        if not data and (not newest or clean is not None or made_whole):
            raise LogDamaged(path, "is empty: a segment starts with its header")
        scan = records.scan(data, 0, sequence, keep=False)
        if not data:  # a crash between creating the newest segment and writing its header
            scan = records.Scan([], 0, "an empty segment (its header was never written)")
        if scan.problem is not None:
            if not newest or scan.damaged or clean is not None or (
                    made_whole and scan.good_end == 0):
                raise LogDamaged(path, scan.problem)
            self.report.torn_bytes_cut = len(data) - scan.good_end
            self.report.torn_segment, self.report.torn_problem = path, scan.problem
            if not self.read_only:
                cut_torn_tail(self.disk, self.directory, path, scan)
            if scan.good_end == 0:
                return None
        self._files[number] = self.disk.open(path)
        self._sizes[number] = scan.good_end
        self._current = number
        listed = None
        batches = records.batches(data, 0, scan.good_end)  # one at a time, not all held
        for index, frame in enumerate(records.frames_of(batches)):
            if index == 0:
                check_segment_header(path, number, frame)
            found = self._replay(path, number, frame)
            if found is not None:
                listed = found
        return (scan.last_sequence if scan.good_end else sequence), listed

    def _cache_tail(self) -> None:
        """The newest entries are read all the time (the last index, what followers lack)."""
        budget = self.cache_bytes_max // 4
        index = self.last_index
        while self._terms and index >= self.first_index and budget > 0:
            command = self.command_at(index)
            self._cache.put_oldest(index, command)
            budget -= len(command)
            index -= 1

    def _replay(self, path: str, number: int, frame: records.Frame) -> list[int] | None:
        kind = frame.kind
        if kind == records.KIND_ENTRY:
            index, term, command = records.decode_entry(frame.body)
            if self._terms and index != self.last_index + 1:
                raise LogDamaged(path, f"entry {index} at offset {frame.offset} follows entry "
                                       f"{self.last_index}")
            if not self._terms:
                self.first_index = index
            self._terms.append(term)
            self._segments_of.append(number)
            self._offsets.append(records.entry_command_offset(frame.offset))
            self._lengths.append(len(command))
            if command[:1] == CONFIG_COMMAND:
                self.config_indexes.append(index)
        elif kind == records.KIND_TRUNCATE:
            index = records.decode_index(frame.body)
            keep = max(0, index - self.first_index) if self._terms else 0
            for column in (self._terms, self._segments_of, self._offsets, self._lengths):
                del column[keep:]
            self._forget_config_entries(from_index=self.first_index + keep)
        elif kind == records.KIND_COMPACT:
            index = records.decode_index(frame.body)
            drop = min(max(0, index - self.first_index), len(self._terms))
            for column in (self._terms, self._segments_of, self._offsets, self._lengths):
                del column[:drop]
            self._forget_config_entries(before_index=index)
            # A compaction may name an index before the first entry replayed: the entries it
            # dropped were in segments deleted since. The entries here stay where they are.
            self.first_index = max(self.first_index, index) if self._terms else index
        elif kind == records.KIND_HARD_STATE:
            self.term, self.voted_for = records.decode_hard_state(frame.body)
        elif kind == records.KIND_COMMIT:
            self.commit_index = records.decode_index(frame.body)
        elif kind == records.KIND_SEGMENTS:
            return records.decode_segments(frame.body)
        elif kind != records.KIND_SEGMENT:
            raise LogDamaged(path, f"holds a frame of unknown kind {kind} at offset "
                                   f"{frame.offset}")
        return None
