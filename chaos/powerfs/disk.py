"""The durable side of powerfs: BACKING_DIR as the disk, changed only when a sync asks.

This module owns every change to BACKING_DIR and keeps it equal to the durable view of the
inode table (`Inode.links`, `Inode.durable_entries`): after each of its methods returns, the
tree under BACKING_DIR is exactly what those fields say. Nothing else writes there.

- `sync_file` (fsync, fdatasync) writes a file's dirty pages and size into its disk object.
- `sync_dir` (fsync of a directory) makes the directory's durable entries equal to its live ones:
  names that went away or now name another inode are removed, new names are linked.
- An inode that holds durable bytes but has no durable name yet (a file fsynced before its
  directory, or one whose last durable name was removed while it is still alive) lives in the
  orphan stash `BACKING_DIR/.powerfs-orphans/<ino>`, on the same filesystem so that a later
  directory sync links or renames it into place. The stash is what a crash would leave to fsck:
  `load` (at mount and after a cut) deletes it. It is hidden from the mount.
- Files with several durable names are hard links on disk; a directory moved by a sync is
  renamed on disk (a directory has one durable name).

Disk objects are found by path, built from the durable links (`path_of`); file descriptors of
the disk objects are cached (`fd_of`), bounded, and stay valid across renames.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections import OrderedDict

from raftcron.chaos.powerfs.pages import DiskReader
from raftcron.chaos.powerfs.tree import ROOT_INO, STASH_INO, Inode, InodeTable, Kind

STASH_NAME = ".powerfs-orphans"
FDS_MAX = 256
IS_ROOT = os.geteuid() == 0


class BackingDisk:
    """BACKING_DIR and the durable view of one inode table."""

    def __init__(self, root: str, table: InodeTable) -> None:
        self.root = os.path.realpath(root)
        self.stash = os.path.join(self.root, STASH_NAME)
        self.table = table
        self.fds: OrderedDict[int, int] = OrderedDict()

    # -- loading -----------------------------------------------------------------------------

    def load(self) -> None:
        """Fill the (empty) table from BACKING_DIR: live view = durable view; stash emptied."""
        if os.path.lexists(self.stash):
            shutil.rmtree(self.stash)
        os.mkdir(self.stash, 0o700)
        top = os.stat(self.root)
        self._add_from_stat(top, ino=ROOT_INO)
        by_disk_inode: dict[tuple[int, int], Inode] = {}
        stack: list[tuple[str, Inode]] = [(self.root, self.table.root)]
        while stack:
            path, directory = stack.pop()
            with os.scandir(path) as listing:
                entries = sorted(listing, key=lambda e: e.name)
            for entry in entries:
                if directory.ino == ROOT_INO and entry.name == STASH_NAME:
                    continue
                st = entry.stat(follow_symlinks=False)
                node = by_disk_inode.get((st.st_dev, st.st_ino))
                if node is None:
                    if Kind.of_mode(st.st_mode) is None:
                        continue  # sockets, FIFOs and devices are not shown
                    node = self._add_from_stat(st)
                    if node.kind is Kind.FILE:
                        by_disk_inode[(st.st_dev, st.st_ino)] = node
                    elif node.kind is Kind.SYMLINK:
                        node.target = os.readlink(entry.path)
                    else:
                        stack.append((entry.path, node))
                node.nlink += 1
                node.links.add((directory.ino, entry.name))
                directory.entries[entry.name] = node.ino
                directory.durable_entries[entry.name] = node.ino

    def _add_from_stat(self, st: os.stat_result, ino: int | None = None) -> Inode:
        kind = Kind.of_mode(st.st_mode)
        assert kind is not None
        return self.table.add(
            kind, st.st_mode, st.st_uid, st.st_gid, ino=ino,
            times_ns=(st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns),
            durable_size=st.st_size if kind is Kind.FILE else 0,
        )

    # -- finding disk objects ----------------------------------------------------------------

    def path_of(self, node: Inode) -> str:
        if node.ino == ROOT_INO:
            return self.root
        parent_ino, name = min(node.links)
        if parent_ino == STASH_INO:
            return os.path.join(self.stash, name)
        return os.path.join(self.path_of(self.table[parent_ino]), name)

    def fd_of(self, node: Inode) -> int:
        fd = self.fds.get(node.ino)
        if fd is not None:
            self.fds.move_to_end(node.ino)
            return fd
        fd = os.open(self.path_of(node), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        self.fds[node.ino] = fd
        while len(self.fds) > FDS_MAX:
            _, old = self.fds.popitem(last=False)
            os.close(old)
        return fd

    def reader(self, node: Inode) -> DiskReader:
        def read(offset: int, length: int) -> bytes:
            return os.pread(self.fd_of(node), length, offset)

        return read

    def close_fd(self, node: Inode) -> None:
        fd = self.fds.pop(node.ino, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        while self.fds:
            os.close(self.fds.popitem()[1])

    # -- syncing -----------------------------------------------------------------------------

    def sync_file(self, node: Inode) -> None:
        """fsync/fdatasync: the file's content, size, mode and times become durable."""
        self.ensure_present(node)
        fd = self.fd_of(node)
        node.file.flush(fd)
        os.fchmod(fd, stat.S_IMODE(node.mode))
        os.utime(fd, ns=(node.atime_ns, node.mtime_ns))
        if IS_ROOT:
            os.fchown(fd, node.uid, node.gid)

    def sync_dir(self, directory: Inode) -> None:
        """fsync of a directory: its durable entries become its live entries."""
        self.ensure_present(directory)
        for name, ino in list(directory.durable_entries.items()):
            if directory.entries.get(name) != ino:
                self.remove_link(directory, name)
        for name, ino in directory.entries.items():
            if name not in directory.durable_entries:
                self.add_link(directory, name, self.table[ino])
        if directory.ino != ROOT_INO:
            os.chmod(self.path_of(directory), stat.S_IMODE(directory.mode))

    def sync_all(self) -> None:
        """What a clean shutdown does: every reachable file and directory, top down."""
        stack = [self.table.root]
        while stack:
            directory = stack.pop()
            self.sync_dir(directory)
            for ino in directory.entries.values():
                child = self.table[ino]
                if child.kind is Kind.DIR:
                    stack.append(child)
                elif child.kind is Kind.FILE and child.file.dirty:
                    self.sync_file(child)

    def ensure_present(self, node: Inode) -> None:
        """Give an inode a disk object (in the stash) if it has none yet."""
        if node.links or node.ino == ROOT_INO:
            return
        name = str(node.ino)
        path = os.path.join(self.stash, name)
        self._create(node, path)
        node.links.add((STASH_INO, name))

    def add_link(self, directory: Inode, name: str, node: Inode) -> None:
        target = os.path.join(self.path_of(directory), name)
        if node.kind is Kind.DIR and node.links:
            ((old_parent, old_name),) = node.links
            os.rename(self.path_of(node), target)
            if old_parent != STASH_INO:
                del self.table[old_parent].durable_entries[old_name]
            node.links = set()
        elif node.links:
            os.link(self.path_of(node), target, follow_symlinks=False)
            for parent, stashed in [link for link in node.links if link[0] == STASH_INO]:
                os.unlink(os.path.join(self.stash, stashed))
                node.links.discard((parent, stashed))
        else:
            self._create(node, target)
        node.links.add((directory.ino, name))
        directory.durable_entries[name] = node.ino

    def remove_link(self, directory: Inode, name: str) -> None:
        node = self.table[directory.durable_entries[name]]
        path = os.path.join(self.path_of(directory), name)
        if len(node.links) > 1:
            os.unlink(path)
            node.links.discard((directory.ino, name))
        elif node.alive:
            # Still in use (renamed elsewhere live, or open): keep its durable bytes.
            stashed = str(node.ino)
            os.rename(path, os.path.join(self.stash, stashed))
            node.links = {(STASH_INO, stashed)}
        else:
            self._delete(node, path)
        del directory.durable_entries[name]

    def release_if_unused(self, node: Inode) -> None:
        """Forget an inode that is neither alive nor durably named; free what it held."""
        if node.alive:
            return
        if node.data is not None:
            node.data.forget_pages()
        if all(parent == STASH_INO for parent, _ in node.links):
            if node.links:
                self._delete(node, self.path_of(node))
            self.close_fd(node)
            self.table.forget(node)

    def drop_stash(self) -> None:
        """Remove the stash (a clean unmount: nothing alive is left in it)."""
        self.close_all()
        if os.path.lexists(self.stash):
            shutil.rmtree(self.stash)

    def _create(self, node: Inode, path: str) -> None:
        mode = stat.S_IMODE(node.mode)
        if node.kind is Kind.FILE:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, mode)
            self.close_fd(node)
            self.fds[node.ino] = fd
            node.file.disk_size = 0
            node.file.base_len = 0
        elif node.kind is Kind.DIR:
            os.mkdir(path, mode)
        else:
            os.symlink(node.target, path)
        if IS_ROOT:
            with contextlib.suppress(OSError):
                os.lchown(path, node.uid, node.gid)

    def _delete(self, node: Inode, path: str) -> None:
        if node.kind is Kind.DIR:
            for child in list(node.durable_entries):
                self.remove_link(node, child)
            os.rmdir(path)
        else:
            os.unlink(path)
        node.links = set()
        self.close_fd(node)
        if not node.alive:
            self.table.forget(node)
