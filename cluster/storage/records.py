"""Framing of the Raft log's files: checksummed frames, grouped in batches.

A frame is ``[u32 length][u32 crc32][u8 kind][body]``; the length and the checksum cover the
kind byte and the body. Every write the log makes is one *batch*: a ``BATCH`` frame (a magic,
the batch's sequence number, how many frames follow and how many bytes they take) and then
those frames. A batch is written with one ``write`` and, in ``fsync`` mode, one ``fdatasync``
before the next batch starts; so when any frame of a later batch is on disk, every earlier
batch was complete on disk (it was synced before the later one was written).

That is what tells a torn tail from damage (``scan``): a batch that does not check out, with no
valid later batch behind it, is the last write cut short by a crash or a power loss (it was
never acknowledged: nothing is acknowledged before its sync returns), so it is cut off. A batch
that does not check out with a valid later batch behind it was synced and has since changed:
that is damage, and the node refuses to start.

This module owns only bytes: no files, no log semantics.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from raftcron.cluster.storage.disk import Buffer

FRAME_HEAD = struct.Struct("<II")  # length of kind + body, crc32 of kind + body
FRAME_HEAD_BYTES = FRAME_HEAD.size
FRAME_BYTES_MAX = 64 << 20  # a log entry is far smaller (PySyncObj discards 10 MB commands)

BATCH_MAGIC = b"RCB1"
_BATCH = struct.Struct("<4sQII")  # magic, batch sequence number, frames, bytes of the frames

# Frame kinds. A kind is never reused for another meaning.
KIND_SEGMENT = 1  # first frame of a segment file: magic, format version, segment number
KIND_BATCH = 2
KIND_ENTRY = 3  # u64 index, u64 term, the command bytes
KIND_TRUNCATE = 4  # u64 index: entries at and after it are gone (0: all of them)
KIND_COMPACT = 5  # u64 index: entries before it are gone (a snapshot covers them)
KIND_HARD_STATE = 6  # u64 term, the voted-for node id (utf-8; empty: none)
KIND_COMMIT = 7  # u64 commit index
KIND_SEGMENTS = 8  # u32 count, then u64 segment numbers: the files the log is made of

_ENTRY = struct.Struct("<QQ")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Frame:
    kind: int
    body: bytes
    offset: int  # where the frame starts in its file
    end: int  # where the next frame starts


def frame(kind: int, body: bytes) -> bytes:
    payload = bytes((kind,)) + body
    return FRAME_HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def batch(sequence: int, frames: list[bytes]) -> bytes:
    """One write: the batch header and its frames."""
    size = sum(len(f) for f in frames)
    head = frame(KIND_BATCH, _BATCH.pack(BATCH_MAGIC, sequence, len(frames), size))
    return head + b"".join(frames)


def entry(index: int, term: int, command: bytes) -> bytes:
    return frame(KIND_ENTRY, _ENTRY.pack(index, term) + command)


def index_frame(kind: int, index: int) -> bytes:
    return frame(kind, _U64.pack(index))


def hard_state(term: int, voted_for: str | None) -> bytes:
    return frame(KIND_HARD_STATE, _U64.pack(term) + (voted_for or "").encode())


def segments(numbers: list[int]) -> bytes:
    return frame(KIND_SEGMENTS, struct.pack(f"<I{len(numbers)}Q", len(numbers), *numbers))


def read_frame(buffer: Buffer, offset: int) -> Frame | None:
    """The frame at ``offset``, or None when it is cut short or its checksum is wrong."""
    head_end = offset + FRAME_HEAD_BYTES
    if head_end > len(buffer):
        return None
    length, crc = FRAME_HEAD.unpack_from(buffer, offset)
    end = head_end + length
    if length < 1 or length > FRAME_BYTES_MAX or end > len(buffer):
        return None
    payload = bytes(buffer[head_end:end])
    if zlib.crc32(payload) != crc:
        return None
    return Frame(payload[0], payload[1:], offset, end)


def decode_entry(body: bytes) -> tuple[int, int, bytes]:
    index, term = _ENTRY.unpack_from(body)
    return index, term, body[_ENTRY.size:]


def decode_index(body: bytes) -> int:
    (index,) = _U64.unpack(body)
    return int(index)


def decode_hard_state(body: bytes) -> tuple[int, str | None]:
    (term,) = _U64.unpack_from(body)
    voted_for = body[_U64.size:].decode()
    return int(term), voted_for or None


def decode_segments(body: bytes) -> list[int]:
    (count,) = struct.unpack_from("<I", body)
    return list(struct.unpack_from(f"<{count}Q", body, 4))


def entry_command_offset(frame_offset: int) -> int:
    """Where an entry frame's command bytes start, from where the frame starts."""
    return frame_offset + FRAME_HEAD_BYTES + 1 + _ENTRY.size


@dataclass(frozen=True)
class Batch:
    sequence: int
    frames: list[Frame]
    offset: int
    end: int


@dataclass(frozen=True)
class Scan:
    """What a file holds: its good batches, and where and why reading stopped early."""

    batches: list[Batch]  # empty when scanned with keep=False (read them with `batches`)
    good_end: int  # the file's bytes up to here are whole batches
    problem: str | None = None  # None: the whole file was read
    damaged: bool = False  # True: a valid batch follows the problem (it is not a torn tail)
    last_sequence: int | None = None  # the number of the last good batch


def _batch_at(buffer: Buffer, offset: int) -> Batch | str:
    head = read_frame(buffer, offset)
    if head is None or head.kind != KIND_BATCH or len(head.body) != _BATCH.size:
        return "a batch header that does not check out"
    magic, sequence, count, size = _BATCH.unpack(head.body)
    if magic != BATCH_MAGIC:
        return "a batch header with the wrong magic"
    frames: list[Frame] = []
    position = head.end
    for number in range(count):
        item = read_frame(buffer, position)
        if item is None:
            return f"frame {number + 1} of {count} of batch {sequence} does not check out"
        frames.append(item)
        position = item.end
    if position != head.end + size:
        return f"batch {sequence} is {position - head.end} bytes, its header says {size}"
    return Batch(sequence, frames, offset, position)


def _valid_batch_after(buffer: Buffer, start: int,
                       after_sequence: int | None) -> int | None:
    """Offset of a valid batch numbered above ``after_sequence`` past ``start``, if any."""
    floor = -1 if after_sequence is None else after_sequence
    data = bytes(buffer)
    position = start
    while True:
        found = data.find(BATCH_MAGIC, position)
        if found < 0:
            return None
        candidate = found - FRAME_HEAD_BYTES - 1
        if candidate >= start:
            item = _batch_at(data, candidate)
            if isinstance(item, Batch) and item.sequence > floor:
                return candidate
        position = found + 1


def scan(buffer: Buffer, start: int, last_sequence: int | None, *,
         keep: bool = True) -> Scan:
    """Read the batches of a file from ``start``. ``last_sequence`` is the number of the batch
    before the first one here (batch numbers rise by one through the whole log); None for the
    first file, whose first batch may have any number. ``keep=False`` checks without keeping
    the batches (a node loading a 64 MiB segment held every frame of it at once)."""
    batches: list[Batch] = []
    position = start
    sequence = last_sequence
    while position < len(buffer):
        item = _batch_at(buffer, position)
        if isinstance(item, Batch) and sequence is not None and item.sequence != sequence + 1:
            item = f"batch {item.sequence} where batch {sequence + 1} was due"
        if isinstance(item, str):
            later = _valid_batch_after(buffer, position + 1, sequence)
            return Scan(batches, position, f"{item} at offset {position}", later is not None,
                        sequence)
        if keep:
            batches.append(item)
        sequence = item.sequence
        position = item.end
    return Scan(batches, position, last_sequence=sequence)


def batches(buffer: Buffer, start: int, end: int) -> Iterator[Batch]:
    """The batches between two offsets a `scan` found good, one at a time."""
    position = start
    while position < end:
        item = _batch_at(buffer, position)
        if not isinstance(item, Batch):
            raise ValueError(f"no good batch at offset {position}: {item}")
        yield item
        position = item.end


def frames_of(batches: Iterable[Batch]) -> Iterator[Frame]:
    for item in batches:
        yield from item.frames


SEGMENT_MAGIC = b"raftcron-log"
SEGMENT_FORMAT_VERSION = 1
_SEGMENT = struct.Struct("<12sIQ")  # magic, format version, segment number


def segment_header(number: int) -> bytes:
    return frame(KIND_SEGMENT, _SEGMENT.pack(SEGMENT_MAGIC, SEGMENT_FORMAT_VERSION, number))


def decode_segment_header(body: bytes) -> tuple[bytes, int, int]:
    if len(body) != _SEGMENT.size:
        return b"", 0, 0
    magic, version, number = _SEGMENT.unpack(body)
    return magic, int(version), int(number)
