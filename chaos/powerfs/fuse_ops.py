"""The FUSE side: mfusepy's high-level callbacks mapped onto a `Volume`, and the mount loop.

This module owns the binding (mfusepy, ctypes over Debian's libfuse3) and the mount options;
the semantics are all in `volume.py`. What the options mean for processes on the mount:

- `attr_timeout=0,entry_timeout=0,negative_timeout=0`: the kernel asks again for every lookup
  and stat, so a cut shows at once in names and sizes;
- no `direct_io` and no writeback cache: writes go to the daemon as they happen (write-through),
  reads may be served from the kernel's page cache, which is dropped on every open and, after a
  cut, for every path the old live view had (`fuse_invalidate_path`). Shared writable mmap works:
  the kernel sends dirty pages as writes at msync, munmap, close or writeback;
- `hard_remove`: an unlinked open file is not renamed to `.fuse_hidden*` (which would be a
  visible, syncable name), `use_ino`: st_ino is powerfs's inode number;
- `default_permissions` (the kernel checks modes), `allow_other` when root;
- no `lock`/`flock` callbacks: the kernel keeps POSIX and BSD locks itself, which is right for
  processes on one machine; no xattr callbacks: xattrs fail with EOPNOTSUPP.

mfusepy drops the flags of rename, the file handle of ftruncate and UTIME_NOW/UTIME_OMIT of
utimensat; `_Fuse` passes them on.

The disk faults (`faults.py`) are asked here, before the volume is: a delayed fsync sleeps on its
own FUSE thread, outside the volume's lock, so the rest of the mount keeps being served.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

from raftcron.chaos.powerfs.binding import mfusepy
from raftcron.chaos.powerfs.faults import FaultInjector
from raftcron.chaos.powerfs.volume import Volume

log = logging.getLogger("powerfs")

LOOP_ENDED_BY_SIGNAL = 8
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
WRITE_BYTES_MAX = 1 << 20  # the kernel's default is 128 KiB per FUSE write

P = ParamSpec("P")
R = TypeVar("R")


def _errors_as_eio(method: Callable[P, R]) -> Callable[P, R]:
    """An unexpected exception is a powerfs bug: log it, answer EIO (never a silent EINVAL)."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except OSError:
            raise
        except Exception as error:
            log.exception("powerfs bug in %s", method.__name__)
            raise OSError(errno.EIO, os.strerror(errno.EIO)) from error

    return wrapper


def _caller() -> tuple[int, int, int]:
    """(uid, gid, umask) of the process that made the current request."""
    context = mfusepy._libfuse.fuse_get_context().contents
    return context.uid, context.gid, context.umask


class PowerOperations(mfusepy.Operations):  # type: ignore[misc]  # mfusepy has no types
    use_ns = True

    def __init__(
        self, volume: Volume, *, sync_on_exit: bool, faults: FaultInjector | None = None
    ) -> None:
        self.volume = volume
        self.sync_on_exit = sync_on_exit
        self.faults = faults or FaultInjector()
        self.fuse_handle: ctypes.c_void_p | None = None

    def init_with_config(self, conn_info: Any, config: Any) -> None:
        if conn_info is not None:
            conn_info.max_write = WRITE_BYTES_MAX  # libfuse clamps it to its buffer
        self.fuse_handle = ctypes.c_void_p(mfusepy._libfuse.fuse_get_context().contents.fuse)

    def destroy(self, path: str) -> None:
        self.volume.close(sync=self.sync_on_exit)

    def invalidate(self, paths: Iterable[str]) -> None:
        """Drop the kernel's cached pages and attributes of these paths (best effort)."""
        if self.fuse_handle is None:
            return
        invalidate = mfusepy._libfuse.fuse_invalidate_path
        for path in paths:
            invalidate(self.fuse_handle, path.encode("utf-8", "surrogateescape"))

    @_errors_as_eio
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        return self.volume.getattr(path, fh)

    @_errors_as_eio
    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        return [
            (name, {"st_mode": mode, "st_ino": ino}, 0)
            for name, mode, ino in self.volume.readdir(fh)
        ]

    @_errors_as_eio
    def readlink(self, path: str) -> str:
        return self.volume.readlink(path)

    @_errors_as_eio
    def mkdir(self, path: str, mode: int) -> int:
        self.faults.check_change(path)
        uid, gid, umask = _caller()
        self.volume.mkdir(path, mode & ~umask, uid, gid)
        return 0

    @_errors_as_eio
    def symlink(self, target: str, source: str) -> int:
        self.faults.check_change(target)
        uid, gid, _ = _caller()
        self.volume.symlink(target, source, uid, gid)
        return 0

    @_errors_as_eio
    def link(self, target: str, source: str) -> int:
        self.faults.check_change(target)
        self.volume.link(target, source)
        return 0

    @_errors_as_eio
    def create(self, path: str, mode: int, flags: int) -> int:
        self.faults.check_change(path)
        uid, gid, umask = _caller()
        return self.volume.create(path, mode & ~umask, flags, uid, gid)

    @_errors_as_eio
    def mknod(self, path: str, mode: int, dev: int) -> int:
        if not stat.S_ISREG(mode):
            raise OSError(errno.EPERM, "powerfs holds files, directories and symlinks only")
        self.faults.check_change(path)
        uid, gid, umask = _caller()
        self.volume.release(self.volume.create(path, mode & ~umask, os.O_EXCL, uid, gid))
        return 0

    @_errors_as_eio
    def open(self, path: str, flags: int) -> int:
        if flags & os.O_TRUNC:
            self.faults.check_change(path)
        return self.volume.open(path, flags)

    @_errors_as_eio
    def opendir(self, path: str) -> int:
        return self.volume.opendir(path)

    @_errors_as_eio
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self.faults.check_read(path)
        return self.volume.read(fh, size, offset)

    @_errors_as_eio
    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self.faults.check_write(path)
        return self.volume.write(fh, data, offset)

    @_errors_as_eio
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        self.faults.check_change(path)
        self.volume.truncate(path, length, fh)
        return 0

    @_errors_as_eio
    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        self.faults.check_change(path)
        self.volume.fallocate(fh, mode, offset, size)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0  # close(2) makes nothing durable

    @_errors_as_eio
    def release(self, path: str, fh: int) -> int:
        self.volume.release(fh)
        return 0

    @_errors_as_eio
    def releasedir(self, path: str, fh: int) -> int:
        self.volume.release(fh)
        return 0

    @_errors_as_eio
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._sync(path, fh)
        return 0

    @_errors_as_eio
    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._sync(path, fh)
        return 0

    def _sync(self, path: str | None, fh: int) -> None:
        delay_s = self.faults.fsync_delay_s(path)
        if delay_s > 0:
            time.sleep(delay_s)  # this request's thread only; the volume is not locked
        fail_errno, read_only = self.faults.fsync_failure(path)
        self.volume.fsync(fh, fail_errno=fail_errno, read_only=read_only)

    @_errors_as_eio
    def unlink(self, path: str) -> int:
        self.faults.check_change(path)
        self.volume.unlink(path)
        return 0

    @_errors_as_eio
    def rmdir(self, path: str) -> int:
        self.faults.check_change(path)
        self.volume.rmdir(path)
        return 0

    @_errors_as_eio
    def rename(self, old: str, new: str, flags: int = 0) -> int:
        self.faults.check_change(old, new)
        self.volume.rename(old, new, flags)
        return 0

    @_errors_as_eio
    def chmod(self, path: str, mode: int) -> int:
        self.faults.check_change(path)
        self.volume.chmod(path, mode)
        return 0

    @_errors_as_eio
    def chown(self, path: str, uid: int, gid: int) -> int:
        self.faults.check_change(path)
        self.volume.chown(path, uid, gid)
        return 0

    @_errors_as_eio
    def utimens(self, path: str, times: tuple[tuple[int, int], ...] | None = None) -> int:
        """times: (seconds, nanoseconds) of atime and mtime, as libfuse gives them."""
        self.faults.check_change(path)
        now = time.time_ns()
        if times is None:
            self.volume.utimens(path, (now, now))
            return 0
        atime_ns, mtime_ns = (
            now if nsec == UTIME_NOW else None if nsec == UTIME_OMIT else sec * 10**9 + nsec
            for sec, nsec in times
        )
        self.volume.utimens(path, (atime_ns, mtime_ns))
        return 0

    @_errors_as_eio
    def statfs(self, path: str) -> dict[str, int]:
        return self.volume.statfs()


class _Fuse(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy's FUSE with rename flags and ftruncate's handle passed through."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return self.operations.rename(  # type: ignore[no-any-return]
            old.decode(self.encoding, self.errors), new.decode(self.encoding, self.errors), flags
        )

    def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
        # mfusepy folds each timespec into one number, which loses UTIME_NOW and UTIME_OMIT.
        times = None
        if buf:
            times = tuple(
                (spec.tv_sec, spec.tv_nsec) for spec in (buf.contents.actime, buf.contents.modtime)
            )
        decoded = None if path is None else path.decode(self.encoding, self.errors)
        return self.operations.utimens(decoded, times)  # type: ignore[no-any-return]

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        fh = fip.contents.fh if fip else None
        decoded = None if path is None else path.decode(self.encoding, self.errors)
        return self.operations.truncate(decoded, length, fh)  # type: ignore[no-any-return]


def run_fuse_loop(operations: PowerOperations, mountpoint: str) -> None:
    """Mount and serve until unmounted or signalled (SIGINT, SIGTERM, SIGHUP end the loop)."""
    options: dict[str, Any] = {
        "foreground": True,
        # libfuse's multithreaded loop: a delayed fsync (faults.py) holds one FUSE thread, not
        # the mount, as a slow disk holds only the process that waits for it. The volume's lock
        # still serializes the work; the threads cost small requests about 40% (a write, an
        # fsync and a stat: 4,800 rounds/s with one thread, 2,900-3,000 with the pool here).
        "fsname": "powerfs",
        "subtype": "powerfs",
        "default_permissions": True,
        "attr_timeout": 0,
        "entry_timeout": 0,
        "negative_timeout": 0,
        "hard_remove": True,
        "use_ino": True,
    }
    if os.geteuid() == 0:
        options["allow_other"] = True
    try:
        _Fuse(operations, mountpoint, **options)
    except RuntimeError as error:
        # fuse_main's 8: the loop ended with an error, which is how libfuse reports that its
        # SIGTERM/SIGINT/SIGHUP handler stopped it; the unmount and `destroy` still ran.
        if error.args != (LOOP_ENDED_BY_SIGNAL,):
            raise
        log.info("action=stopped_by_signal")
