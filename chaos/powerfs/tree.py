"""Inodes and the table that holds them: the two namespaces of powerfs side by side.

Every inode carries both views of itself:

- the live view, which the processes using the mount see: `nlink` (how many live directory
  entries name it), `entries` of a directory, attributes, and for a file its `FileData`;
- the durable view, which is what BACKING_DIR holds: `links`, the (parent inode, name) pairs
  that name it on disk, and `durable_entries` of a directory. A link whose parent is `STASH_INO`
  is a file in the orphan stash (see `disk.py`): an object that holds durable bytes but that no
  durable directory entry names yet.

An inode stays in the table while it is alive (a live entry names it or a handle holds it open)
or while it is on disk; `InodeTable.forget` is called when it is neither. This module owns the
data shapes only; `disk.py` changes the durable view, `volume.py` the live one.
"""

from __future__ import annotations

import enum
import stat
import time
from dataclasses import dataclass, field

from raftcron.chaos.powerfs.pages import FileData

ROOT_INO = 1
STASH_INO = 0  # the parent of stash links; not an inode of the table


class Kind(enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"

    @classmethod
    def of_mode(cls, mode: int) -> Kind | None:
        if stat.S_ISREG(mode):
            return cls.FILE
        if stat.S_ISDIR(mode):
            return cls.DIR
        if stat.S_ISLNK(mode):
            return cls.SYMLINK
        return None


@dataclass(eq=False)
class Inode:
    ino: int
    kind: Kind
    mode: int  # with the type bits
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    nlink: int = 0
    open_count: int = 0
    entries: dict[str, int] = field(default_factory=dict)
    durable_entries: dict[str, int] = field(default_factory=dict)
    links: set[tuple[int, str]] = field(default_factory=set)
    data: FileData | None = None
    target: str = ""  # a symlink's content

    @property
    def alive(self) -> bool:
        return self.ino == ROOT_INO or self.nlink > 0 or self.open_count > 0

    @property
    def file(self) -> FileData:
        assert self.data is not None, f"inode {self.ino} is a {self.kind.value}, not a file"
        return self.data

    @property
    def size(self) -> int:
        if self.data is not None:
            return self.data.size
        if self.kind is Kind.SYMLINK:
            return len(self.target.encode("utf-8", "surrogateescape"))
        return 4096

    def touch(self, *, modified: bool = True) -> None:
        now = time.time_ns()
        self.ctime_ns = now
        if modified:
            self.mtime_ns = now


class InodeTable:
    """The inodes of one generation of the mount; numbers are never reused, even across cuts."""

    def __init__(self, first_ino: int = ROOT_INO + 1) -> None:
        self.inodes: dict[int, Inode] = {}
        self.next_ino = first_ino

    def __getitem__(self, ino: int) -> Inode:
        return self.inodes[ino]

    def __len__(self) -> int:
        return len(self.inodes)

    @property
    def root(self) -> Inode:
        return self.inodes[ROOT_INO]

    def add(
        self, kind: Kind, mode: int, uid: int, gid: int, *, ino: int | None = None,
        times_ns: tuple[int, int, int] | None = None, durable_size: int = 0,
    ) -> Inode:
        if ino is None:
            ino, self.next_ino = self.next_ino, self.next_ino + 1
        atime, mtime, ctime = times_ns if times_ns is not None else (time.time_ns(),) * 3
        node = Inode(
            ino=ino, kind=kind, mode=mode, uid=uid, gid=gid,
            atime_ns=atime, mtime_ns=mtime, ctime_ns=ctime,
            data=FileData(durable_size) if kind is Kind.FILE else None,
        )
        self.inodes[ino] = node
        return node

    def forget(self, node: Inode) -> None:
        self.inodes.pop(node.ino, None)

    def live_paths(self) -> list[str]:
        """Every path of the live tree, parents before children (for cache invalidation)."""
        paths: list[str] = ["/"]
        stack: list[tuple[str, Inode]] = [("", self.root)]
        while stack:
            prefix, directory = stack.pop()
            for name, ino in directory.entries.items():
                child = self.inodes[ino]
                path = f"{prefix}/{name}"
                paths.append(path)
                if child.kind is Kind.DIR:
                    stack.append((path, child))
        return paths
