"""A snapshot's body as one zlib stream, compressed in parts as the state is produced.

A snapshot of 100,000 schedules and a million retained jobs is a 247 MB msgpack body. It was
built whole, copied into the body once more, and compressed by `zlib.compress` (level 1) on one
core: 0.9 s in the node, 1.3-1.4 s in the forked writer, whose every new page is a fault (a
scale run counted 338,000 of them in a writer, and 1.4-4.0 s of system time). Here the body's
msgpack is written in pieces: the state comes as the core's pieces (`snapshot_pieces`, a few
MB each) and is never joined; each part is compressed by itself on a thread (zlib releases the
GIL) while the next is built, every part but the last ending on a sync flush so that their raw
deflate blocks join into one stream, as pigz makes them; the state's bin header, which needs
its length, is compressed last and put before it. The result is a standard zlib stream
(header, blocks, Adler-32 of the whole), which `zlib.decompress` reads, in this release and the
ones before it: the file's format is unchanged, only its compressed bytes differ (a part's
blocks do not refer back into the part before it), by about 0.05% in size.
"""

from __future__ import annotations

import os
import zlib
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import msgpack

LEVEL = 1  # level 9 took 8.3 s for a 129 MB state, level 1 0.25 s, the same size
PART_BYTES = 4 << 20  # small enough that the threads end together, large enough to compress
THREADS_MAX = 4
_HEADER = b"\x78\x01"  # deflate, 32 KiB window, "fastest" (what zlib.compress(data, 1) writes)
_ADLER_BASE = 65521


class Pieces:
    """A bytes value of a body given as its pieces (joined, they are the value)."""

    def __init__(self, pieces: Iterable[bytes | memoryview]) -> None:
        self.pieces = pieces


def compress_body(body: Mapping[str, Any], *, threads: int | None = None) -> bytes:
    """The zlib stream of `msgpack.packb(body, use_bin_type=True)`, where a `Pieces` value
    (at most one) stands for the bytes it joins to. `threads` compress parts at once (default:
    the machine's cores, at most 4)."""
    packer = msgpack.Packer(use_bin_type=True)
    before: list[bytes] = [packer.pack_map_header(len(body))]
    streamed: Pieces | None = None
    after: list[bytes] = []
    for key, value in body.items():
        (after if streamed is not None else before).append(packer.pack(key))
        if isinstance(value, Pieces):
            if streamed is not None:
                raise ValueError("a body streams one value at most")
            streamed = value
        else:
            (after if streamed is not None else before).append(packer.pack(value))
    with _Parts(_workers(threads)) as parts:
        length, checksum = parts.feed(streamed.pieces if streamed is not None else ())
        head = b"".join(before)
        if streamed is not None:
            head += _bin_header(length)
        tail = b"".join(after)
        blocks = [_deflate(head, final=False), *parts.blocks(), _deflate(tail, final=True)]
    checksum = adler32_combine(zlib.adler32(head), checksum, length)
    checksum = adler32_combine(checksum, zlib.adler32(tail), len(tail))
    return b"".join([_HEADER, *blocks, checksum.to_bytes(4, "big")])


def compress(pieces: Iterable[bytes | memoryview], *, threads: int | None = None) -> bytes:
    """The zlib stream of the pieces joined."""
    with _Parts(_workers(threads)) as parts:
        _, checksum = parts.feed(pieces)
        blocks = [*parts.blocks(), _deflate(b"", final=True)]
    return b"".join([_HEADER, *blocks, checksum.to_bytes(4, "big")])


def _bin_header(length: int) -> bytes:
    """msgpack's header of a bin of `length` bytes, the shortest, as msgpack writes it."""
    if length < 1 << 8:
        return b"\xc4" + length.to_bytes(1, "big")
    if length < 1 << 16:
        return b"\xc5" + length.to_bytes(2, "big")
    return b"\xc6" + length.to_bytes(4, "big")


def _workers(threads: int | None) -> int:
    return max(1, min(threads or os.cpu_count() or 1, THREADS_MAX))


class _Parts:
    """Parts of `PART_BYTES` compressed on `workers` threads in the order they were fed; at
    most two per thread wait, so a producer faster than the threads does not pile them up."""

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(workers) if workers > 1 else None
        self.pending: deque[Future[bytes]] = deque()
        self.done: list[bytes] = []
        self.waiting_max = 2 * workers

    def __enter__(self) -> _Parts:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def feed(self, pieces: Iterable[bytes | memoryview]) -> tuple[int, int]:
        """Compress what the pieces join to; (its length, its Adler-32)."""
        length, checksum = 0, 1
        held: list[bytes | memoryview] = []
        held_bytes = 0
        for piece in pieces:
            length += len(piece)
            checksum = zlib.adler32(piece, checksum)
            held.append(piece)
            held_bytes += len(piece)
            if held_bytes >= PART_BYTES:
                self._submit(held)
                held, held_bytes = [], 0
        if held:
            self._submit(held)
        return length, checksum

    def blocks(self) -> list[bytes]:
        while self.pending:
            self.done.append(self.pending.popleft().result())
        return self.done

    def _submit(self, pieces: list[bytes | memoryview]) -> None:
        part = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if self.pool is None:
            self.done.append(_deflate(part, final=False))
            return
        while len(self.pending) >= self.waiting_max:
            self.done.append(self.pending.popleft().result())
        self.pending.append(self.pool.submit(_deflate, part, final=False))


def _deflate(part: bytes | memoryview, *, final: bool) -> bytes:
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)  # raw deflate: no header
    return compressor.compress(part) + compressor.flush(zlib.Z_FINISH if final
                                                        else zlib.Z_SYNC_FLUSH)


def adler32_combine(first: int, second: int, second_length: int) -> int:
    """The Adler-32 of two byte strings joined, from each one's (zlib's adler32_combine)."""
    rem = second_length % _ADLER_BASE
    sum1 = first & 0xFFFF
    sum2 = rem * sum1 % _ADLER_BASE
    sum1 += (second & 0xFFFF) + _ADLER_BASE - 1
    sum2 += ((first >> 16) & 0xFFFF) + ((second >> 16) & 0xFFFF) + _ADLER_BASE - rem
    sum1 %= _ADLER_BASE
    sum2 %= _ADLER_BASE
    return sum1 | (sum2 << 16)
