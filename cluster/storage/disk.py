"""The few file operations the storage makes, behind one small interface.

Everything the log and the snapshot store write goes through a `Disk`, so a simulation can
put a disk model underneath (one that forgets what was not synced, or tears the last write)
while a node uses the real one, `OsDisk`. Durability is explicit: `File.sync` makes a file's
bytes durable (fdatasync), `Disk.sync_dir` makes a folder's names durable (a created, renamed
or removed file); nothing else promises anything.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterable
from typing import Protocol

Buffer = bytes | memoryview | mmap.mmap  # what frames are read from: read, or mapped (view)


class File(Protocol):
    def append(self, data: bytes) -> None: ...
    def sync(self) -> None: ...
    def read_at(self, offset: int, size: int) -> bytes: ...
    def size(self) -> int: ...
    def truncate(self, size: int) -> None: ...
    def close(self) -> None: ...


class Disk(Protocol):
    def listdir(self, directory: str) -> list[str]: ...
    def exists(self, path: str) -> bool: ...
    def read(self, path: str) -> bytes: ...
    def view(self, path: str) -> Buffer: ...
    def create(self, path: str) -> File: ...
    def open(self, path: str) -> File: ...
    def write_file(self, path: str, chunks: Iterable[bytes], *, sync: bool) -> None: ...
    def rename(self, source: str, target: str) -> None: ...
    def unlink(self, path: str) -> None: ...
    def sync_dir(self, directory: str) -> None: ...
    def makedirs(self, directory: str) -> None: ...
    def free_bytes(self, directory: str) -> int: ...


class OsFile:
    """A file opened for appending and reading at offsets."""

    def __init__(self, path: str, flags: int) -> None:
        self.path = path
        self.fd = os.open(path, flags | os.O_RDWR | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def read_at(self, offset: int, size: int) -> bytes:
        data = os.pread(self.fd, size, offset)
        if len(data) != size:
            raise OSError(errno.EIO, f"short read of {self.path} at {offset}")
        return data

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def close(self) -> None:
        os.close(self.fd)


class OsDisk:
    def listdir(self, directory: str) -> list[str]:
        return sorted(os.listdir(directory))

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def read(self, path: str) -> bytes:
        with open(path, "rb") as file:
            return file.read()

    def view(self, path: str) -> Buffer:
        """A whole file to read, mapped: its pages are the page cache's, not the process's
        (a node loading its log read every segment, up to 64 MiB, into its own memory)."""
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                return b""
            return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)

    def create(self, path: str) -> OsFile:
        return OsFile(path, os.O_CREAT | os.O_EXCL)

    def open(self, path: str) -> OsFile:
        return OsFile(path, 0)

    def write_file(self, path: str, chunks: Iterable[bytes], *, sync: bool) -> None:
        with open(path, "wb") as file:
            for chunk in chunks:
                file.write(chunk)
            file.flush()
            if sync:
                os.fsync(file.fileno())

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def sync_dir(self, directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def makedirs(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)

    def free_bytes(self, directory: str) -> int:
        stats = os.statvfs(directory)
        return stats.f_bavail * stats.f_frsize
