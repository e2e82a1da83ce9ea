"""A node's data dir as a whole: who owns it, which format it holds, whether it is new.

- ``LOCK``: an exclusive flock for as long as the node runs; a second process on the same
  data dir (a second node, a leftover) is refused with the reason.
- ``raftcron.storage``: written once, when the data dir is first made (format, version, node
  id). A data dir with this mark and no log has lost its log: the node refuses to start rather
  than start empty. One with a log or a snapshot but no mark is damaged too.
- ``--rejoin-empty``: the operator says this node lost its data and comes back empty. The
  mark then says ``rejoining`` until the node has caught up with a leader (see `hooks`):
  until then it neither votes nor stands for election, also across restarts.
- A data dir of raftcron 0.1.0 (PySyncObj's ``raft.journal``, ``raft.journal.meta``,
  ``raft.dump``) is refused with the command that migrates it.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass

from raftcron.cluster.storage.disk import Disk, OsDisk
from raftcron.cluster.storage.raftlog import (
    CLEAN_MARK,
    HEAD_MARK,
    LogDamaged,
    StorageError,
    segment_number,
)

MARK_NAME = "raftcron.storage"
MARK_FORMAT = "raftcron-storage"
MARK_VERSION = 1
LOCK_NAME = "LOCK"
LEGACY_NAMES = ("raft.journal", "raft.journal.meta", "raft.dump")


class LegacyDataDir(StorageError):
    """A data dir written by raftcron 0.1.0."""


@dataclass
class DataDir:
    path: str
    node_id: str
    lock_fd: int
    new: bool  # nothing was ever acknowledged from here: no log yet, or an empty first one
    rejoining: bool = False  # lost its data; a learner until caught up

    def mark_initialised(self, disk: Disk) -> None:
        """The log exists: from now on, a data dir without one has lost it."""
        if self.new:
            _write_mark(disk, self.path, self.node_id, initialised=True,
                        rejoining=self.rejoining)
            self.new = False

    def finish_rejoin(self, disk: Disk) -> None:
        if self.rejoining:
            _write_mark(disk, self.path, self.node_id, initialised=True, rejoining=False)
            self.rejoining = False

    def release(self) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


def holds_storage(names: list[str]) -> bool:
    return any(segment_number(name) is not None or name == "snapshot" for name in names)


def holds_log(names: list[str]) -> bool:
    """A made log always has a segment (a new one exists before the mark says so)."""
    return any(segment_number(name) is not None for name in names)


def open_data_dir(path: str, node_id: str, *, disk: Disk | None = None,
                  rejoin_empty: bool = False,
                  migrate_hint: str = "raftcron storage migrate --config <node.toml>") -> DataDir:
    disk = disk or OsDisk()
    disk.makedirs(path)
    lock_fd = _lock(path) if isinstance(disk, OsDisk) else -1
    try:
        names = disk.listdir(path)
        mark_path = os.path.join(path, MARK_NAME)
        if rejoin_empty:
            return _rejoin_empty(disk, path, node_id, lock_fd, names)
        if MARK_NAME not in names:
            legacy = [name for name in LEGACY_NAMES if name in names]
            if legacy:
                raise LegacyDataDir(
                    f"{path} holds a raftcron 0.1.0 data dir ({', '.join(legacy)}); this release "
                    f"stores its log differently: migrate it first with `{migrate_hint}`")
            if holds_storage(names):
                raise LogDamaged(mark_path, "is missing, but the data dir holds a log or a "
                                            "snapshot")
            _write_mark(disk, path, node_id, initialised=False)
            return DataDir(path, node_id, lock_fd, new=True)
        initialised, rejoining = _check_mark(disk, mark_path, node_id)
        if not initialised:
            return DataDir(path, node_id, lock_fd, new=True, rejoining=rejoining)
        if not holds_log(names):
            raise LogDamaged(os.path.join(path, "log-00000001.seg"),
                             "is missing: the data dir was initialised but holds no log segment, "
                             "so the entries acknowledged after its snapshot are lost (to rejoin "
                             "as an empty node, see `raftcron node --rejoin-empty`)")
        return DataDir(path, node_id, lock_fd, new=False, rejoining=rejoining)
    except BaseException:
        if lock_fd >= 0:
            os.close(lock_fd)
        raise


def _rejoin_empty(disk: Disk, path: str, node_id: str, lock_fd: int,
                  names: list[str]) -> DataDir:
    """Start over empty, as a learner, on the operator's word that the data is lost."""
    mark_path = os.path.join(path, MARK_NAME)
    if MARK_NAME in names:
        initialised, rejoining = _check_mark(disk, mark_path, node_id)
        if rejoining:  # restarted while catching up: still a learner
            return DataDir(path, node_id, lock_fd, new=not initialised, rejoining=True)
    if holds_storage(names):
        raise StorageError(
            f"{path} still holds a log or a snapshot: --rejoin-empty is for a node whose data "
            f"is gone; move the data dir away first (it may be what the cluster needs)")
    # The marks of the log that is gone describe it, not the log this node starts now: the
    # head mark would call the new, empty log short.
    for name in (HEAD_MARK, CLEAN_MARK):
        if name in names:
            disk.unlink(os.path.join(path, name))
    _write_mark(disk, path, node_id, initialised=False, rejoining=True)
    return DataDir(path, node_id, lock_fd, new=True, rejoining=True)


def _lock(path: str) -> int:
    lock_path = os.path.join(path, LOCK_NAME)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StorageError(f"{path} is in use by another process (its {LOCK_NAME} is held)") \
            from None
    return fd


def _write_mark(disk: Disk, path: str, node_id: str, *, initialised: bool,
                rejoining: bool = False) -> None:
    mark = json.dumps({"format": MARK_FORMAT, "version": MARK_VERSION, "node_id": node_id,
                       "initialised": initialised, "rejoining": rejoining})
    temporary = os.path.join(path, MARK_NAME + ".tmp")
    disk.write_file(temporary, [mark.encode() + b"\n"], sync=True)
    disk.rename(temporary, os.path.join(path, MARK_NAME))
    disk.sync_dir(path)


def _check_mark(disk: Disk, mark_path: str, node_id: str) -> tuple[bool, bool]:
    """(the log was made, the node is rejoining); raises when the mark is not ours."""
    try:
        mark = json.loads(disk.read(mark_path))
    except (ValueError, OSError) as error:
        raise LogDamaged(mark_path, f"is not readable ({error})") from None
    if not isinstance(mark, dict) or mark.get("format") != MARK_FORMAT:
        raise LogDamaged(mark_path, "is not a raftcron storage mark")
    if mark.get("version") != MARK_VERSION:
        raise LogDamaged(mark_path, f"is storage format version {mark.get('version')}; this "
                                    f"release reads version {MARK_VERSION}")
    if mark.get("node_id") != node_id:
        raise StorageError(f"{mark_path}: this data dir belongs to node {mark.get('node_id')!r}, "
                           f"not {node_id!r}")
    initialised, rejoining = mark.get("initialised"), mark.get("rejoining", False)
    if not isinstance(initialised, bool) or not isinstance(rejoining, bool):
        raise LogDamaged(mark_path, "does not say whether the log was made")
    return initialised, rejoining
