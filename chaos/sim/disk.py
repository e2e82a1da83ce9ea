"""An in-memory disk for the simulation: a page cache over a durable image, seeded.

Owns `SimDisk`, an implementation of cluster.storage.disk's `Disk` and `File` protocols with
OsDisk's semantics (files opened O_APPEND, ``read_at`` raising on a short read, ``create``
exclusive, ``write_file`` replacing a file's bytes, ``rename`` replacing its target, sorted
``listdir``), that keeps apart what a program has written from what a power loss would leave:

- every file (an inode) has its live bytes (the page cache) and its durable bytes; ``File.sync``
  makes that file's bytes durable, and ``write_file(..., sync=True)`` does the same;
- every folder has its live names and its durable names; creates, renames and unlinks are
  pending operations of their folder until ``sync_dir`` of that folder makes them durable
  (a rename across folders is an unlink in one and a link in the other). A file whose bytes
  were synced but whose name never was is gone after a power cut, as on a real filesystem;
- folders themselves (``makedirs``) are durable at once: a node makes its data dir once.

``crash`` is a kill -9: the page cache survives, only the open files of the dead process stop
working (and a cut armed for its calls is off). ``power_cut(rng, tear=True)`` drops what was
not durable; with ``tear`` it keeps, for each file, a random prefix of the bytes appended since
its last sync (a torn last write; after an unsynced truncation, either the old bytes or the
truncation and a prefix of what followed), and for each folder a random prefix of its pending
name operations, in order (a journaling filesystem commits metadata in order).
``cut_power_at(op)`` arms a power cut at the op-th mutating call from now, raising `PowerCut`
from inside it (``disarm`` takes it back), so a test can cut power at every instant of a
storage operation. ``flip_bit`` damages the medium (live and durable bytes alike); ``fill_up``
leaves a budget of free bytes, beyond which writes fail with ENOSPC after writing what fits.
Every random choice comes from the rng passed in: the same seed, the same disk.
It never touches the real filesystem.
"""

from __future__ import annotations

import errno
import posixpath
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

UNLIMITED_FREE_BYTES = 1 << 40


class PowerCut(BaseException):
    """Raised by an armed `SimDisk.cut_power_at`: the machine lost power inside this call.
    A BaseException, so the storage's own ``except OSError`` / ``except Exception`` blocks do
    not treat it as an I/O error it could recover from."""


@dataclass
class _Inode:
    number: int
    data: bytearray = field(default_factory=bytearray)  # live: what reads return
    durable: bytes = b""  # what a power cut leaves, at least
    low: int = 0  # the shortest the file was since its last sync: data[:low] == durable[:low]

    def synced(self) -> None:
        self.durable = bytes(self.data)
        self.low = len(self.data)

    def after_power_cut(self, rng: random.Random, tear: bool) -> None:
        if tear and not (self.low < len(self.durable) and rng.random() < 0.5):
            kept = self.low + rng.randint(0, len(self.data) - self.low)
            self.data = bytearray(self.data[:kept])
        else:
            self.data = bytearray(self.durable)
        self.synced()


NameChanges = list[tuple[str, "_Inode | None"]]  # names set (or removed: None) atomically


@dataclass
class _Folder:
    live: dict[str, _Inode] = field(default_factory=dict)
    durable: dict[str, _Inode] = field(default_factory=dict)
    pending: list[NameChanges] = field(default_factory=list)

    def change(self, changes: NameChanges) -> None:
        for name, inode in changes:
            if inode is None:
                self.live.pop(name, None)
            else:
                self.live[name] = inode
        self.pending.append(changes)

    def synced(self) -> None:
        self.durable = dict(self.live)
        self.pending.clear()

    def after_power_cut(self, rng: random.Random, tear: bool) -> None:
        kept = rng.randint(0, len(self.pending)) if tear and self.pending else 0
        names = dict(self.durable)
        for changes in self.pending[:kept]:
            for name, inode in changes:
                if inode is None:
                    names.pop(name, None)
                else:
                    names[name] = inode
        self.live = names
        self.synced()


class SimFile:
    """An open file of a `SimDisk`; it stops working when its process dies."""

    def __init__(self, disk: SimDisk, path: str, inode: _Inode) -> None:
        self.disk, self.path, self.inode = disk, path, inode
        self.epoch = disk.epoch
        self.closed = False

    def _check(self) -> None:
        if self.closed or self.epoch != self.disk.epoch:
            raise OSError(errno.EBADF, f"{self.path}: the file is closed or its process died")

    def append(self, data: bytes) -> None:
        self._check()
        cut = self.disk._count()
        fits = self.disk._grow(self.inode, bytes(data))
        self.disk._after(cut, fits, self.path)

    def sync(self) -> None:
        self._check()
        self.disk._after(self.disk._count(), True, self.path)
        self.inode.synced()

    def read_at(self, offset: int, size: int) -> bytes:
        self._check()
        data = bytes(self.inode.data[offset:offset + size])
        if len(data) != size:
            raise OSError(errno.EIO, f"short read of {self.path} at {offset}")
        return data

    def size(self) -> int:
        self._check()
        return len(self.inode.data)

    def truncate(self, size: int) -> None:
        self._check()
        cut = self.disk._count()
        data = self.inode.data
        if size < len(data):
            del data[size:]
            self.inode.low = min(self.inode.low, size)
        else:
            data.extend(bytes(size - len(data)))
        self.disk._after(cut, True, self.path)

    def close(self) -> None:
        self.closed = True


class SimDisk:
    """`Disk` in memory: live and durable bytes and names (see the module docstring)."""

    def __init__(self) -> None:
        self.epoch = 0  # a crash or a power cut starts a new one: old open files stop working
        self.operations = 0  # mutating calls so far (what `cut_power_at` counts)
        self.power_cuts = 0
        self._folders: dict[str, _Folder] = {"/": _Folder()}
        self._inodes = 0
        self._free_limit: int | None = None  # total bytes the files may hold; None: no limit
        self._armed: tuple[int, random.Random, bool] | None = None

    # --- the Disk protocol -----------------------------------------------------------------

    def listdir(self, directory: str) -> list[str]:
        folder = self._folder(directory)
        prefix = self._normal(directory).rstrip("/") + "/"
        children = {path[len(prefix):] for path in self._folders
                    if path.startswith(prefix) and "/" not in path[len(prefix):] and path != "/"}
        return sorted(set(folder.live) | children)

    def exists(self, path: str) -> bool:
        path = self._normal(path)
        if path in self._folders:
            return True
        parent, name = posixpath.split(path)
        folder = self._folders.get(parent)
        return folder is not None and name in folder.live

    def read(self, path: str) -> bytes:
        return bytes(self._inode(path).data)


    def view(self, path: str) -> bytes:
        return self.read(path)
    def create(self, path: str) -> SimFile:
        folder, name = self._parent(path)
        if name in folder.live or self._normal(path) in self._folders:
            raise FileExistsError(errno.EEXIST, "file exists", path)
        cut = self._count()
        inode = self._new_inode()
        folder.change([(name, inode)])
        self._after(cut, True, path)
        return SimFile(self, path, inode)

    def open(self, path: str) -> SimFile:
        return SimFile(self, path, self._inode(path))

    def write_file(self, path: str, chunks: Iterable[bytes], *, sync: bool) -> None:
        folder, name = self._parent(path)
        cut = self._count()  # one call: a cut in it leaves the bytes written, not synced
        inode = folder.live.get(name)
        if inode is None:
            inode = self._new_inode()
            folder.change([(name, inode)])
        else:  # open(..., "wb"): O_TRUNC
            del inode.data[:]
            inode.low = 0
        fits = all(self._grow(inode, bytes(chunk)) for chunk in chunks)
        self._after(cut, fits, path)
        if sync:
            inode.synced()

    def rename(self, source: str, target: str) -> None:
        source_folder, source_name = self._parent(source)
        target_folder, target_name = self._parent(target)
        inode = source_folder.live.get(source_name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", source)
        cut = self._count()
        if source_folder is target_folder:
            source_folder.change([(source_name, None), (target_name, inode)])
        else:
            source_folder.change([(source_name, None)])
            target_folder.change([(target_name, inode)])
        self._after(cut, True, target)

    def unlink(self, path: str) -> None:
        folder, name = self._parent(path)
        if name not in folder.live:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        cut = self._count()
        folder.change([(name, None)])
        self._after(cut, True, path)

    def sync_dir(self, directory: str) -> None:
        folder = self._folder(directory)
        self._after(self._count(), True, directory)
        folder.synced()

    def makedirs(self, directory: str) -> None:
        path = self._normal(directory)
        while path not in self._folders:
            self._folders[path] = _Folder()
            path = posixpath.dirname(path)

    def free_bytes(self, directory: str) -> int:
        self._folder(directory)
        if self._free_limit is None:
            return UNLIMITED_FREE_BYTES
        return max(0, self._free_limit - self.used_bytes())

    # --- faults ----------------------------------------------------------------------------

    def crash(self) -> None:
        """kill -9 of the process using the disk: its open files die, the page cache stays;
        a power cut armed for that process's calls (`cut_power_at`) is off."""
        self.epoch += 1
        self._armed = None

    def power_cut(self, rng: random.Random, *, tear: bool = True) -> None:
        """Everything not durable is gone (see the module docstring for ``tear``)."""
        self.epoch += 1
        self.power_cuts += 1
        self._armed = None
        for path in sorted(self._folders):
            self._folders[path].after_power_cut(rng, tear)
        for inode in sorted(self._reachable(), key=lambda item: item.number):
            inode.after_power_cut(rng, tear)

    def cut_power_at(self, operation: int, rng: random.Random, *, tear: bool = True) -> None:
        """The ``operation``-th mutating call from now (0: the next) cuts the power and raises
        `PowerCut`. A write or a name change reaches the page cache first; a sync does not."""
        self._armed = (self.operations + operation, rng, tear)

    def disarm(self) -> None:
        """No armed power cut any more (the fault is healed)."""
        self._armed = None

    def flip_bit(self, path: str, rng: random.Random, *, start: int = 0,
                 end: int | None = None) -> tuple[int, int]:
        """Damage on the medium: one bit of the file's bytes in [start, end) flips, in the
        live and the durable image. Returns (offset, bit)."""
        inode = self._inode(path)
        stop = len(inode.data) if end is None else min(end, len(inode.data))
        if stop <= start:
            raise ValueError(f"{path}: no bytes in [{start}, {stop}) to flip")
        offset, bit = rng.randrange(start, stop), rng.randrange(8)
        inode.data[offset] ^= 1 << bit
        if offset < len(inode.durable):
            durable = bytearray(inode.durable)
            durable[offset] ^= 1 << bit
            inode.durable = bytes(durable)
        return offset, bit

    def fill_up(self, bytes_free: int | None) -> None:
        """From now on only ``bytes_free`` more bytes fit (None: no limit again)."""
        self._free_limit = None if bytes_free is None else self.used_bytes() + bytes_free

    def used_bytes(self) -> int:
        return sum(len(inode.data) for inode in self._reachable())

    def durable_bytes(self, path: str) -> bytes:
        """What a power cut without tearing would leave in this file (for tests)."""
        return self._inode(path).durable

    # --- internals -------------------------------------------------------------------------

    def _count(self) -> bool:
        """Count a mutating call; True when it is the one an armed power cut waits for."""
        number = self.operations
        self.operations += 1
        return self._armed is not None and number == self._armed[0]

    def _after(self, cut: bool, fits: bool, path: str) -> None:
        """End of a call's effects on the page cache: the armed cut, or ENOSPC."""
        if cut:
            assert self._armed is not None
            _, rng, tear = self._armed
            self.power_cut(rng, tear=tear)
            raise PowerCut(f"power cut at operation {self.operations - 1} ({path})")
        if not fits:
            raise OSError(errno.ENOSPC, f"no space left on device writing {path}")

    def _grow(self, inode: _Inode, data: bytes) -> bool:
        """Append what fits in the free budget; whether all of it did."""
        room = len(data) if self._free_limit is None else max(
            0, self._free_limit - self.used_bytes())
        inode.data.extend(data[:room])
        return room >= len(data)

    def _reachable(self) -> list[_Inode]:
        seen: dict[int, _Inode] = {}
        for folder in self._folders.values():
            for inode in folder.live.values():
                seen[inode.number] = inode
        return list(seen.values())

    def _new_inode(self) -> _Inode:
        self._inodes += 1
        return _Inode(self._inodes)

    @staticmethod
    def _normal(path: str) -> str:
        return posixpath.normpath(posixpath.join("/", path))

    def _folder(self, directory: str) -> _Folder:
        folder = self._folders.get(self._normal(directory))
        if folder is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", directory)
        return folder

    def _parent(self, path: str) -> tuple[_Folder, str]:
        parent, name = posixpath.split(self._normal(path))
        return self._folder(parent), name

    def _inode(self, path: str) -> _Inode:
        normal = self._normal(path)
        if normal in self._folders:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        folder, name = self._parent(path)
        inode = folder.live.get(name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return inode
