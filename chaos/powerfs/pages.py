"""The live content of one regular file: its durable bytes on disk plus dirty pages in memory.

This module owns the page arithmetic of powerfs's "page cache" and nothing else: no paths, no
FUSE, no locks. A file's live content is

- bytes `[0, base_len)` of its durable object on disk, except where a dirty page covers them,
- dirty pages (`PAGE_BYTES` each, full page images) wherever the program wrote since the last
  flush,
- zeros everywhere else up to `size`.

Invariants: `base_len <= size`; no dirty page starts at or past `size`; the bytes of a dirty page
past `size` are zero (so growing a file never shows old bytes). A truncate lowers `base_len`, so
bytes cut off and then grown back read as zeros even though the disk still holds them until the
next flush.

`flush(fd)` makes the live content the durable content (what fsync and fdatasync do);
`tear(fd, prefix_bytes)` puts a prefix of the last unflushed write on disk (the torn write of a
power cut). Both write through a file descriptor of the durable object the caller opened.

`lose()` is a failed fsync (powerfs's fsync_errno fault): the dirty pages become lost pages,
which reads still see (Linux keeps them in its page cache after a failed writeback) but which
no flush writes: their bytes are never made durable, so a power cut loses them even after a
later fsync that succeeds ("fsyncgate"). A write into a lost page makes it dirty again, whole,
as a write into a cached page does. The size is metadata and stays pending: a later flush makes
it durable, and what lay in lost pages then reads back from the disk as it was (zeros past the
old end).
"""

from __future__ import annotations

import os
from collections.abc import Callable

PAGE_BYTES = 4096
IOV_MAX = 1024  # Linux's limit on the buffers of one pwritev

# Reads `length` bytes of the durable object at `offset` (short at its end).
DiskReader = Callable[[int, int], bytes]


class FileData:
    """One file's live content as an overlay of dirty pages on its durable bytes."""

    __slots__ = ("base_len", "disk_size", "last_write", "lost", "pages", "size")

    def __init__(self, durable_size: int = 0) -> None:
        self.size = durable_size
        self.base_len = durable_size
        self.disk_size = durable_size
        self.pages: dict[int, bytearray] = {}
        self.lost: dict[int, bytearray] = {}  # pages a failed fsync lost (see `lose`)
        # (offset, bytes) of the last write since the last flush, for torn-write mode; a
        # truncate clears it, because the last change was then not a write.
        self.last_write: tuple[int, bytes] | None = None

    @property
    def dirty(self) -> bool:
        """Whether the live content differs from what a flush last made durable."""
        return bool(self.pages) or self.size != self.disk_size or self.base_len != self.disk_size

    @property
    def dirty_bytes(self) -> int:
        return len(self.pages) * PAGE_BYTES

    @property
    def lost_bytes(self) -> int:
        return len(self.lost) * PAGE_BYTES

    def read(self, offset: int, length: int, read_disk: DiskReader) -> bytes:
        """The live bytes `[offset, offset + length)`, clipped at the live size."""
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        if offset < self.base_len:
            durable = read_disk(offset, min(end, self.base_len) - offset)
            if not self.pages and not self.lost and len(durable) == end - offset:
                return durable
            out = bytearray(end - offset)
            out[: len(durable)] = durable
        else:
            out = bytearray(end - offset)
        for overlay in (self.lost, self.pages):  # a page is in one of them at most
            if overlay:
                _overlay(out, offset, end, overlay)
        return bytes(out)

    def write(self, offset: int, data: bytes, read_disk: DiskReader) -> int:
        """Apply a write to the live content; returns how many pages became dirty."""
        if not data:
            return 0
        end = offset + len(data)
        view = memoryview(data)
        new_pages = 0
        for page_index in range(offset // PAGE_BYTES, (end - 1) // PAGE_BYTES + 1):
            page_start = page_index * PAGE_BYTES
            start, stop = max(offset, page_start), min(end, page_start + PAGE_BYTES)
            page = self.pages.get(page_index)
            if page is None:
                page = self.lost.pop(page_index, None)  # dirty again, whole
                if page is None and stop - start == PAGE_BYTES:
                    page = bytearray(view[start - offset : stop - offset])
                elif page is None:
                    page = self._load_page(page_index, read_disk)
                self.pages[page_index] = page
                new_pages += 1
            page[start - page_start : stop - page_start] = view[start - offset : stop - offset]
        self.size = max(self.size, end)
        self.last_write = (offset, bytes(data))
        return new_pages

    def truncate(self, length: int) -> int:
        """Set the live size; returns how many dirty pages were dropped."""
        dropped = 0
        if length < self.size:
            self.base_len = min(self.base_len, length)
            first_gone = -(-length // PAGE_BYTES)
            for page_index in [p for p in self.pages if p >= first_gone]:
                del self.pages[page_index]
                dropped += 1
            for page_index in [p for p in self.lost if p >= first_gone]:
                del self.lost[page_index]
            for overlay in (self.pages, self.lost):
                tail = overlay.get(length // PAGE_BYTES)
                if tail is not None and length % PAGE_BYTES:
                    tail[length % PAGE_BYTES :] = bytes(PAGE_BYTES - length % PAGE_BYTES)
        self.size = length
        self.last_write = None
        return dropped

    def forget_pages(self) -> int:
        """Drop the dirty pages of a file nobody can reach any more; returns how many."""
        dropped = len(self.pages)
        self.pages.clear()
        self.lost.clear()
        self.last_write = None
        return dropped

    def lose(self) -> int:
        """A failed fsync: the dirty pages become lost (see the module docstring); how many."""
        lost = len(self.pages)
        self.lost.update(self.pages)
        self.pages.clear()
        self.last_write = None  # nothing of it may reach the disk, torn or not
        return lost

    def flush(self, fd: int) -> int:
        """Make the live content durable through `fd`; returns how many pages were written."""
        if self.base_len < self.disk_size:
            os.ftruncate(fd, self.base_len)
        run: list[int] = []
        for page_index in sorted(self.pages):
            if run and (page_index != run[-1] + 1 or len(run) == IOV_MAX):
                self._write_run(fd, run)
                run = []
            run.append(page_index)
        if run:
            self._write_run(fd, run)
        written = len(self.pages)
        os.ftruncate(fd, self.size)
        self.pages.clear()
        self.base_len = self.disk_size = self.size
        self.last_write = None
        return written

    def tear(self, fd: int, prefix_bytes: int) -> None:
        """Put the first `prefix_bytes` of the last unflushed write on disk, nothing else."""
        if self.last_write is None or prefix_bytes <= 0:
            return
        offset, data = self.last_write
        _pwrite_all(fd, memoryview(data)[:prefix_bytes], offset)

    def _load_page(self, page_index: int, read_disk: DiskReader) -> bytearray:
        page = bytearray(PAGE_BYTES)
        page_start = page_index * PAGE_BYTES
        if page_start < self.base_len:
            durable = read_disk(page_start, min(PAGE_BYTES, self.base_len - page_start))
            page[: len(durable)] = durable
        return page

    def _write_run(self, fd: int, run: list[int]) -> None:
        start = run[0] * PAGE_BYTES
        buffers = [memoryview(self.pages[p]) for p in run]
        last_keep = self.size - run[-1] * PAGE_BYTES
        if last_keep < PAGE_BYTES:
            buffers[-1] = buffers[-1][:last_keep]
        total = sum(len(b) for b in buffers)
        if os.pwritev(fd, buffers, start) != total:
            # A short vectored write (rare on regular files): finish page by page.
            for page_index, buffer in zip(run, buffers, strict=True):
                _pwrite_all(fd, buffer, page_index * PAGE_BYTES)


def _overlay(out: bytearray, offset: int, end: int, pages: dict[int, bytearray]) -> None:
    """Copy the parts of `pages` within [offset, end) into `out` (which starts at offset)."""
    first, last = offset // PAGE_BYTES, (end - 1) // PAGE_BYTES
    if last - first + 1 <= len(pages):
        touched = [p for p in range(first, last + 1) if p in pages]
    else:
        touched = [p for p in pages if first <= p <= last]
    for page_index in touched:
        page = pages[page_index]
        page_start = page_index * PAGE_BYTES
        start, stop = max(offset, page_start), min(end, page_start + PAGE_BYTES)
        out[start - offset : stop - offset] = page[start - page_start : stop - page_start]


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        count = os.pwrite(fd, data, offset)
        data, offset = data[count:], offset + count
