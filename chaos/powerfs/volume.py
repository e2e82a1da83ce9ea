"""The live filesystem that processes on the mount see, and the power cut that resets it.

`Volume` owns the live view (names, attributes, file content through `FileData`), open handles,
and the generation of the mount; `disk.py` owns the durable view. Every public method is atomic
under one lock, so the FUSE thread and the control thread see one order of events.

Rules:
- Every change is visible to every process at once; only `fsync` (a file) and `fsyncdir` (a
  directory) move anything to BACKING_DIR. `close`, `flush` and `sync(2)` make nothing durable.
- `cut` is a power cut: pending changes are dropped (with `torn`, the last unsynced write of
  each durably named file first reaches the disk in part: a prefix whose length a seeded
  generator picks per path), the stash is emptied, and the live view is rebuilt from
  BACKING_DIR. Handles opened before a cut belong to an old generation: every operation on them
  fails with EIO (a process that held a file open across a power cut was killed by it).
- A failed fsync (`fsync(fh, fail_errno=...)`, the disk faults of `faults.py`) loses the file's
  dirty pages (`FileData.lose`): never durable, still read until a cut. Of a directory it makes
  nothing durable and keeps the entries pending. A read-only disk refuses an fsync that has
  something to make durable (EROFS) and keeps it pending.
- Errors are OSErrors with an errno, which the FUSE adapter returns to the caller.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, ParamSpec, TypeVar

from raftcron.chaos.powerfs.disk import STASH_NAME, BackingDisk
from raftcron.chaos.powerfs.pages import PAGE_BYTES
from raftcron.chaos.powerfs.power import pending_changes, tear_last_writes
from raftcron.chaos.powerfs.tree import ROOT_INO, Inode, InodeTable, Kind

DIRTY_BYTES_MAX_DEFAULT = 2 << 30
NAME_BYTES_MAX = 255
RENAME_NOREPLACE = 1

P = ParamSpec("P")
R = TypeVar("R")


def fail(code: int) -> NoReturn:
    raise OSError(code, os.strerror(code))


def locked(method: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with args[0].lock:  # type: ignore[attr-defined]
            return method(*args, **kwargs)

    return wrapper


@dataclass
class Handle:
    node: Inode
    flags: int
    generation: int


class Volume:
    """The mount's live view over a BackingDisk, with handles, generations and power cuts."""

    def __init__(self, backing: str, *, dirty_bytes_max: int = DIRTY_BYTES_MAX_DEFAULT) -> None:
        self.lock = threading.Lock()
        self.dirty_bytes_max = dirty_bytes_max
        self.generation = 0
        self.cuts = 0
        self.handles: dict[int, Handle] = {}
        self.next_fh = 1
        self.dirty_bytes_bound = 0  # grows with writes; recounted exactly when it looks full
        self.table = InodeTable()
        self.disk = BackingDisk(backing, self.table)
        self.disk.load()

    # -- lookups -----------------------------------------------------------------------------

    def _resolve(self, path: str) -> Inode:
        node = self.table.root
        for part in path.strip("/").split("/") if path not in ("", "/") else ():
            if node.kind is not Kind.DIR:
                fail(errno.ENOTDIR)
            ino = node.entries.get(part)
            if ino is None:
                fail(errno.ENOENT)
            node = self.table[ino]
        return node

    def _parent(self, path: str, *, creating: bool = False) -> tuple[Inode, str]:
        head, name = path.rstrip("/").rsplit("/", 1)
        parent = self._resolve(head or "/")
        if parent.kind is not Kind.DIR:
            fail(errno.ENOTDIR)
        if creating:
            if parent.ino == ROOT_INO and name == STASH_NAME:
                fail(errno.EPERM)
            if len(name.encode("utf-8", "surrogateescape")) > NAME_BYTES_MAX:
                fail(errno.ENAMETOOLONG)
        return parent, name

    def _handle(self, fh: int) -> Handle:
        handle = self.handles.get(fh)
        if handle is None or handle.generation != self.generation:
            fail(errno.EIO)
        return handle

    def _node(self, path: str | None, fh: int | None) -> Inode:
        """The inode of a request: its handle's when it has one (EIO if from before a cut)."""
        if fh is not None:
            return self._handle(fh).node
        if path is None:
            fail(errno.ESTALE)  # an unlinked file asked for by path: libfuse has none for it
        return self._resolve(path)

    def _new_handle(self, node: Inode, flags: int) -> int:
        fh, self.next_fh = self.next_fh, self.next_fh + 1
        self.handles[fh] = Handle(node, flags, self.generation)
        node.open_count += 1
        return fh

    # -- attributes --------------------------------------------------------------------------

    @locked
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        node = self._node(path, fh)
        if node.kind is Kind.DIR:
            nlink = 2 + sum(self.table[i].kind is Kind.DIR for i in node.entries.values())
        else:
            nlink = node.nlink
        return {
            "st_mode": node.mode, "st_ino": node.ino, "st_nlink": nlink,
            "st_uid": node.uid, "st_gid": node.gid, "st_size": node.size,
            "st_atime": node.atime_ns, "st_mtime": node.mtime_ns, "st_ctime": node.ctime_ns,
            "st_blksize": PAGE_BYTES, "st_blocks": (node.size + 511) // 512,
        }

    @locked
    def chmod(self, path: str | None, mode: int) -> None:
        node = self._node(path, None)
        node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(mode)
        node.touch(modified=False)

    @locked
    def chown(self, path: str | None, uid: int, gid: int) -> None:
        node = self._node(path, None)
        if uid != -1:
            node.uid = uid
        if gid != -1:
            node.gid = gid
        node.touch(modified=False)

    @locked
    def utimens(self, path: str | None, times_ns: tuple[int | None, int | None]) -> None:
        """Set atime and mtime (None: leave it as it is)."""
        node = self._node(path, None)
        node.touch(modified=False)
        atime_ns, mtime_ns = times_ns
        if atime_ns is not None:
            node.atime_ns = atime_ns
        if mtime_ns is not None:
            node.mtime_ns = mtime_ns

    @locked
    def readlink(self, path: str) -> str:
        node = self._resolve(path)
        if node.kind is not Kind.SYMLINK:
            fail(errno.EINVAL)
        return node.target

    @locked
    def readdir(self, fh: int) -> list[tuple[str, int, int]]:
        node = self._handle(fh).node
        listing = [(".", node.mode, node.ino), ("..", stat.S_IFDIR, ROOT_INO)]
        for name, ino in node.entries.items():
            child = self.table[ino]
            listing.append((name, child.mode, child.ino))
        return listing

    def statfs(self) -> dict[str, int]:
        st = os.statvfs(self.disk.root)
        return {
            "f_bsize": st.f_bsize, "f_frsize": st.f_frsize, "f_blocks": st.f_blocks,
            "f_bfree": st.f_bfree, "f_bavail": st.f_bavail, "f_files": st.f_files,
            "f_ffree": st.f_ffree, "f_favail": st.f_favail, "f_namemax": NAME_BYTES_MAX,
        }

    # -- names -------------------------------------------------------------------------------

    def _link_new(self, path: str, kind: Kind, mode: int, uid: int, gid: int) -> Inode:
        parent, name = self._parent(path, creating=True)
        if name in parent.entries:
            fail(errno.EEXIST)
        node = self.table.add(kind, mode, uid, gid)
        node.nlink = 1
        parent.entries[name] = node.ino
        parent.touch()
        return node

    @locked
    def mkdir(self, path: str, mode: int, uid: int, gid: int) -> None:
        self._link_new(path, Kind.DIR, stat.S_IFDIR | stat.S_IMODE(mode), uid, gid)

    @locked
    def symlink(self, path: str, target: str, uid: int, gid: int) -> None:
        node = self._link_new(path, Kind.SYMLINK, stat.S_IFLNK | 0o777, uid, gid)
        node.target = target

    @locked
    def create(self, path: str, mode: int, flags: int, uid: int, gid: int) -> int:
        parent, name = self._parent(path, creating=True)
        existing = parent.entries.get(name)
        if existing is not None:
            if flags & os.O_EXCL:
                fail(errno.EEXIST)
            return self._open(self.table[existing], flags)
        node = self._link_new(path, Kind.FILE, stat.S_IFREG | stat.S_IMODE(mode), uid, gid)
        return self._new_handle(node, flags)

    @locked
    def link(self, path: str, existing_path: str) -> None:
        node = self._resolve(existing_path)
        if node.kind is Kind.DIR:
            fail(errno.EPERM)
        parent, name = self._parent(path, creating=True)
        if name in parent.entries:
            fail(errno.EEXIST)
        parent.entries[name] = node.ino
        node.nlink += 1
        node.touch(modified=False)
        parent.touch()

    @locked
    def unlink(self, path: str) -> None:
        parent, name = self._parent(path)
        node = self._resolve(path)
        if node.kind is Kind.DIR:
            fail(errno.EISDIR)
        self._drop_entry(parent, name, node)

    @locked
    def rmdir(self, path: str) -> None:
        parent, name = self._parent(path)
        node = self._resolve(path)
        if node.kind is not Kind.DIR:
            fail(errno.ENOTDIR)
        if node.entries:
            fail(errno.ENOTEMPTY)
        self._drop_entry(parent, name, node)

    def _drop_entry(self, parent: Inode, name: str, node: Inode) -> None:
        del parent.entries[name]
        parent.touch()
        node.nlink -= 1
        node.touch(modified=False)
        self.disk.release_if_unused(node)

    @locked
    def rename(self, old: str, new: str, flags: int = 0) -> None:
        if flags & ~RENAME_NOREPLACE:
            fail(errno.EINVAL)  # RENAME_EXCHANGE and RENAME_WHITEOUT are not supported
        old_parent, old_name = self._parent(old)
        node = self._resolve(old)
        new_parent, new_name = self._parent(new, creating=True)
        replaced_ino = new_parent.entries.get(new_name)
        if replaced_ino is not None and flags & RENAME_NOREPLACE:
            fail(errno.EEXIST)
        if replaced_ino == node.ino:
            return  # POSIX: the same name, or two links to one file: nothing happens
        if node.kind is Kind.DIR and (new + "/").startswith(old.rstrip("/") + "/"):
            fail(errno.EINVAL)
        if replaced_ino is not None:
            replaced = self.table[replaced_ino]
            if replaced.kind is Kind.DIR and node.kind is not Kind.DIR:
                fail(errno.EISDIR)
            if node.kind is Kind.DIR and replaced.kind is not Kind.DIR:
                fail(errno.ENOTDIR)
            if replaced.kind is Kind.DIR and replaced.entries:
                fail(errno.ENOTEMPTY)
            self._drop_entry(new_parent, new_name, replaced)
        del old_parent.entries[old_name]
        new_parent.entries[new_name] = node.ino
        old_parent.touch()
        new_parent.touch()
        node.touch(modified=False)

    # -- file content ------------------------------------------------------------------------

    def _open(self, node: Inode, flags: int) -> int:
        if node.kind is Kind.FILE and flags & os.O_TRUNC and node.file.size:
            node.file.truncate(0)
            node.touch()
        return self._new_handle(node, flags)

    @locked
    def open(self, path: str, flags: int) -> int:
        return self._open(self._resolve(path), flags)

    @locked
    def opendir(self, path: str) -> int:
        node = self._resolve(path)
        if node.kind is not Kind.DIR:
            fail(errno.ENOTDIR)
        return self._new_handle(node, os.O_RDONLY)

    @locked
    def release(self, fh: int) -> None:
        handle = self.handles.pop(fh, None)
        if handle is None or handle.generation != self.generation:
            return
        handle.node.open_count -= 1
        self.disk.release_if_unused(handle.node)

    @locked
    def read(self, fh: int, size: int, offset: int) -> bytes:
        node = self._handle(fh).node
        return node.file.read(offset, size, self.disk.reader(node))

    @locked
    def write(self, fh: int, data: bytes, offset: int) -> int:
        handle = self._handle(fh)
        node = handle.node
        if handle.flags & os.O_APPEND:
            offset = node.file.size
        self._reserve(len(data))
        node.file.write(offset, data, self.disk.reader(node))
        node.touch()
        return len(data)

    @locked
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> None:
        node = self._node(path, fh)
        if node.kind is Kind.DIR:
            fail(errno.EISDIR)
        if node.kind is not Kind.FILE:
            fail(errno.EINVAL)
        if length > node.file.size:
            self._reserve(PAGE_BYTES)
        node.file.truncate(length)
        node.touch()

    @locked
    def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        if mode != 0:
            fail(errno.EOPNOTSUPP)  # only plain allocation (which here only grows the size)
        node = self._handle(fh).node
        if offset + length > node.file.size:
            self._reserve(PAGE_BYTES)
            node.file.truncate(offset + length)
            node.touch()

    def _reserve(self, data_bytes: int) -> None:
        """Refuse a write with ENOSPC when unsynced data would pass `dirty_bytes_max`."""
        needed = data_bytes + 2 * PAGE_BYTES
        if self.dirty_bytes_bound + needed > self.dirty_bytes_max:
            self.dirty_bytes_bound = self._dirty_bytes()
            if self.dirty_bytes_bound + needed > self.dirty_bytes_max:
                fail(errno.ENOSPC)
        self.dirty_bytes_bound += needed

    def _dirty_bytes(self) -> int:
        """What unsynced data holds in memory: dirty pages and lost ones."""
        return sum(n.data.dirty_bytes + n.data.lost_bytes
                   for n in self.table.inodes.values() if n.data is not None)

    # -- durability --------------------------------------------------------------------------

    @locked
    def fsync(self, fh: int, *, fail_errno: int | None = None, read_only: bool = False) -> None:
        """Make a file or directory durable; or fail with `fail_errno`, losing a file's dirty
        pages; or, on a read-only disk, fail with EROFS if there is anything to make durable."""
        node = self._handle(fh).node
        if fail_errno is not None:
            if node.kind is Kind.FILE:
                node.file.lose()
            fail(fail_errno)
        if read_only and (
            (node.kind is Kind.FILE and node.file.dirty)
            or (node.kind is Kind.DIR and node.entries != node.durable_entries)
        ):
            fail(errno.EROFS)
        if node.kind is Kind.DIR:
            self.disk.sync_dir(node)
        elif node.kind is Kind.FILE:
            self.disk.sync_file(node)

    @locked
    def sync_all(self) -> dict[str, Any]:
        pending = pending_changes(self.table)
        self.disk.sync_all()
        return pending

    @locked
    def status(self) -> dict[str, Any]:
        return {
            "generation": self.generation, "cuts": self.cuts, "open_handles": len(self.handles),
            **pending_changes(self.table),
        }

    @locked
    def cut(self, *, torn: bool = False, seed: int = 0) -> dict[str, Any]:
        """A power cut. Returns what was lost, and the torn writes, for the chaos log."""
        report: dict[str, Any] = {
            "generation": self.generation + 1, "open_handles": len(self.handles),
            **pending_changes(self.table),
        }
        report["paths"] = self.table.live_paths()
        torn_writes = tear_last_writes(self.table, self.disk, seed=seed) if torn else []
        report["torn_writes"] = torn_writes
        self.disk.close_all()
        self.generation += 1
        self.cuts += 1
        self.handles.clear()
        self.dirty_bytes_bound = 0
        self.table = InodeTable(first_ino=self.table.next_ino)
        self.disk = BackingDisk(self.disk.root, self.table)
        self.disk.load()
        return report

    @locked
    def close(self, *, sync: bool) -> None:
        """The mount goes away: a clean unmount syncs everything first, `sync=False` drops."""
        if sync:
            self.disk.sync_all()
        self.disk.drop_stash()
