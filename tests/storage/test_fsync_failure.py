"""A failed fsync latches (DESIGN.md §9.3): the storage never again treats a write as durable in
this process, even once the disk answers again, while a failed write (a full disk) recovers by
itself. After a failed writeback the kernel may have dropped the pages and marked them clean,
so a later fsync that succeeds says nothing about them ("fsyncgate"); retrying it as if it were
fine would acknowledge entries the disk may not hold.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from raftcron.cluster.ops.metrics import Writer, _storage_metrics
from raftcron.cluster.storage.disk import OsDisk, OsFile
from raftcron.cluster.storage.node import RaftStorage
from raftcron.cluster.storage.raftlog import LogDamaged, SyncFailed


class SickFile(OsFile):
    def __init__(self, path: str, flags: int, disk: SickDisk) -> None:
        super().__init__(path, flags)
        self.sick = disk

    def append(self, data: bytes) -> None:
        if self.sick.write_errno:
            raise OSError(self.sick.write_errno, "injected")
        super().append(data)

    def read_at(self, offset: int, size: int) -> bytes:
        if self.sick.read_errno:
            raise OSError(self.sick.read_errno, "injected")
        return super().read_at(offset, size)

    def sync(self) -> None:
        self.sick.syncs += 1
        if self.sick.sync_errno:
            raise OSError(self.sick.sync_errno, "injected")
        super().sync()


class SickDisk(OsDisk):
    """The real filesystem, with a write or an fsync that fails while a flag is set."""

    def __init__(self) -> None:
        self.sync_errno = 0
        self.write_errno = 0
        self.read_errno = 0
        self.syncs = 0

    def create(self, path: str) -> SickFile:
        return SickFile(path, os.O_CREAT | os.O_EXCL, self)  # as OsDisk.create

    def open(self, path: str) -> SickFile:
        return SickFile(path, 0, self)


class NoSource:
    def serialize_state(self) -> bytes:  # never called: no snapshot is taken here
        raise AssertionError("no snapshot in this test")


@pytest.fixture
def sick(tmp_path: Path) -> tuple[RaftStorage, SickDisk]:
    disk = SickDisk()
    storage = RaftStorage(tmp_path / "data", node_id="n1", source=NoSource(),  # type: ignore[arg-type]
                          durability="fsync", fork=False, disk=disk)
    return storage, disk


def test_a_failed_fsync_latches_until_the_process_restarts(
        sick: tuple[RaftStorage, SickDisk], tmp_path: Path) -> None:
    storage, disk = sick
    storage.log.append(1, 1, b"\x01first")
    assert storage.sync()
    storage.log.append(2, 1, b"\x01second")
    disk.sync_errno = errno.EIO
    assert not storage.sync()
    assert storage.fsync_failed is not None and "fsync failed" in storage.fsync_failed
    assert storage.problem is not None and storage.problem.startswith("fsync failed")
    assert not storage.healthy

    disk.sync_errno = 0  # the disk answers again: nothing is retried as if it were fine
    syncs = disk.syncs
    assert not storage.sync()
    assert disk.syncs == syncs
    with pytest.raises(SyncFailed):
        storage.log.set_hard_state(2, None)  # a vote would need it durable: refused too
    assert disk.syncs == syncs

    out = Writer()
    _storage_metrics(out, storage, "n1")
    text = out.text()
    assert 'raftcron_storage_fsync_failed{node="n1"} 1' in text
    assert 'raftcron_storage_healthy{node="n1"} 0' in text
    storage.close()

    again = RaftStorage(tmp_path / "data", node_id="n1", source=NoSource(),  # type: ignore[arg-type]
                        durability="fsync", fork=False, disk=SickDisk())
    assert again.fsync_failed is None and again.healthy
    assert again.log.last_index >= 1  # what the disk holds: at least the synced entry
    again.log.append(again.log.last_index + 1, 1, b"\x01after")
    assert again.sync()
    again.close()


def test_a_failed_write_recovers_by_itself(sick: tuple[RaftStorage, SickDisk]) -> None:
    storage, disk = sick
    storage.log.append(1, 1, b"\x01first")
    disk.write_errno = errno.ENOSPC
    assert not storage.sync()
    assert storage.fsync_failed is None and not storage.healthy
    disk.write_errno = 0
    assert storage.sync() and storage.healthy
    assert storage.log.command_at(1) == b"\x01first"
    storage.close()


def test_a_failed_fsync_of_the_folder_latches_too(sick: tuple[RaftStorage, SickDisk],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    storage, disk = sick
    storage.log.segment_bytes_max = 1  # the next batch starts a new segment: a folder sync

    def failing_sync_dir(directory: str) -> None:
        raise OSError(errno.EIO, "injected")

    storage.log.append(1, 1, b"\x01first")
    monkeypatch.setattr(disk, "sync_dir", failing_sync_dir)
    assert not storage.sync()
    assert storage.fsync_failed is not None
    monkeypatch.undo()
    assert not storage.sync()
    storage.close()


def test_a_record_the_disk_cannot_give_back_is_damage_named_by_file(
        tmp_path: Path) -> None:
    disk = SickDisk()
    storage = RaftStorage(tmp_path / "data", node_id="n1", source=NoSource(),  # type: ignore[arg-type]
                          durability="fsync", fork=False, disk=disk)
    storage.log.cache_bytes_max = 0
    for index in range(1, 4):
        storage.log.append(index, 1, b"\x01" + bytes(100))
    assert storage.sync()
    storage.log._evict()
    disk.read_errno = errno.EIO
    with pytest.raises(LogDamaged, match=r"log-00000001\.seg: entry 2 cannot be read"):
        storage.log.command_at(2)
    storage.close()

    def failing_view(path: str) -> bytes:
        raise OSError(errno.EIO, "injected")

    disk.view = failing_view  # type: ignore[method-assign]  # how the log reads a segment
    with pytest.raises(LogDamaged, match=r"log-00000001\.seg: cannot be read"):
        RaftStorage(tmp_path / "data", node_id="n1", source=NoSource(),  # type: ignore[arg-type]
                    durability="fsync", fork=False, disk=disk)


def test_a_leaders_disk_stalls_after_three_slow_syncs_within_five_seconds() -> None:
    """`SlowSyncs`, what makes a leader hand over (storage.hooks): one slow fsync on a busy
    disk is not a sick one; three over the bound within the window are."""
    from raftcron.cluster.storage.node import SlowSyncs

    slow = SlowSyncs(bound_s=0.4)
    slow.observe(100.0, 0.5)  # ended at 100.5
    slow.observe(101.0, 0.3)  # under the bound: not counted
    slow.observe(102.0, 0.6)
    assert not slow.stalling(102.7)
    slow.observe(103.0, 2.0)  # ended at 105.0
    assert slow.stalling(105.0)
    assert not slow.stalling(105.6)  # the first one left the window
    slow.forget()
    assert not slow.stalling(105.1)
    for start in (200.0, 202.0, 204.0):  # back-to-back 2 s stalls: sick after the third
        slow.observe(start, 2.0)
    assert slow.stalling(206.0)
