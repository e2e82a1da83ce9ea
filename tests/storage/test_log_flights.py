"""A follower's batches written off the Raft thread (`RaftLog.begin_sync` .. `finish_sync`, the
`SyncWorker`): entries stay readable while their batch is in flight, an ack claims only what is
durable, a truncation meanwhile is never undone by the batch's late placement, a failed write
puts the batch back before what came after it, a failed fsync latches, and a power cut while a
batch is in flight loses only what no ack claimed.
"""

from __future__ import annotations

import errno
import random
import threading
from pathlib import Path

import pytest

from raftcron.cluster.storage.disk import OsDisk, OsFile
from raftcron.cluster.storage.node import RaftStorage
from raftcron.cluster.storage.raftlog import Flight, RaftLog, StorageUnavailable, SyncFailed
from raftcron.cluster.storage.syncworker import SyncWorker

from .logmodel import Place, command, entries, expected, fill


def in_memory() -> Place:
    return Place.in_memory(cache_bytes_max=0)  # every read of a written entry is from disk


def lands(log: RaftLog, flight: Flight | None) -> None:
    """The sync thread's part (write, fsync), then the Raft thread's (`finish_sync`)."""
    assert flight is not None
    flight.run()
    flight.done = True
    log.finish_sync()


def entries_4_and_5_in_flight() -> tuple[Place, RaftLog, Flight | None]:
    """A log holding 1-3 durable, whose batch of 4 and 5 was handed over, not written yet."""
    place = in_memory()
    log = place.open()
    fill(log, 1, 3, term=1)
    log.append(4, 1, command(4, 1))
    log.append(5, 1, command(5, 1))
    return place, log, log.begin_sync()


def test_entries_in_flight_are_read_from_the_cache_and_acks_wait_for_them() -> None:
    place, log, flight = entries_4_and_5_in_flight()
    assert flight is not None and log.durable_through == 3
    log.append(6, 1, command(6, 1))  # buffered meanwhile: the next batch
    assert entries(log) == expected(1, 6, 1)  # 4-6 from the cache, even with no cache budget
    lands(log, flight)
    assert log.durable_through == 5 and log.dirty
    assert entries(log) == expected(1, 6, 1)
    log.sync()
    assert log.durable_through == 6
    again = place.crash(log)
    assert entries(again) == expected(1, 6, 1)


def test_a_truncation_while_a_batch_is_in_flight_wins_over_its_late_placement() -> None:
    place, log, flight = entries_4_and_5_in_flight()
    log.truncate_from(4)  # a new leader's conflicting entries replace 4 and 5
    log.append(4, 2, command(4, 2))
    assert log.durable_through == 3
    lands(log, flight)
    assert log.durable_through == 3  # the batch's 4 was term 1: not the log's 4
    assert entries(log) == [*expected(1, 3, 1), (4, 2, command(4, 2))]
    log.sync()
    assert log.durable_through == 4
    again = place.crash(log)
    assert entries(again) == [*expected(1, 3, 1), (4, 2, command(4, 2))]


def test_a_failed_write_in_flight_is_buffered_again_before_what_came_after() -> None:
    place = in_memory()
    log = place.open()
    fill(log, 1, 2, term=1)
    log.set_commit(2)
    log.append(3, 1, command(3, 1, 200))
    place.sim.fill_up(30)
    flight = log.begin_sync()
    assert flight is not None
    log.append(4, 1, command(4, 1))
    flight.run()
    flight.done = True
    with pytest.raises(StorageUnavailable, match="write failed"):
        log.finish_sync()
    assert log.durable_through == 2 and log.dirty
    place.sim.fill_up(None)
    log.sync()
    assert log.durable_through == 4
    again = place.crash(log)
    assert entries(again) == [*expected(1, 2, 1), (3, 1, command(3, 1, 200)),
                              (4, 1, command(4, 1))]
    assert again.commit_index == 2


def test_a_failed_fsync_in_flight_latches() -> None:
    place = in_memory()
    log = place.open()
    fill(log, 1, 2, term=1)
    log.append(3, 1, command(3, 1))
    flight = log.begin_sync()
    assert flight is not None
    flight.error, flight.failed_in_sync, flight.done = OSError(errno.EIO, "injected"), True, True
    with pytest.raises(SyncFailed):
        log.finish_sync()
    assert log.sync_failed is not None and log.durable_through == 2
    with pytest.raises(SyncFailed):
        log.sync()
    with pytest.raises(SyncFailed):
        log.begin_sync()


@pytest.mark.parametrize("seed", range(20))
def test_a_power_cut_with_a_batch_in_flight_keeps_everything_an_ack_claimed(seed: int) -> None:
    rng = random.Random(seed)
    place = in_memory()
    log = place.open()
    fill(log, 1, 2, term=1)
    index, claimed = 2, 2
    for _ in range(rng.randint(1, 30)):
        for _ in range(rng.randint(1, 3)):
            index += 1
            log.append(index, 1, command(index, 1))
        flight = log.flight or log.begin_sync()
        if flight is not None and rng.random() < 0.6:
            lands(log, flight)  # the worker wrote it (or not yet: a slow disk)
        claimed = log.durable_through  # what an ack would have claimed by now
    place.sim.power_cut(rng, tear=True)
    again = place.open()
    assert again.last_index >= claimed
    assert entries(again)[:claimed] == expected(1, claimed, 1)


class SlowFile(OsFile):
    """fdatasync waits for the test to let it go: a disk whose sync stalls."""

    def __init__(self, path: str, flags: int, gate: threading.Event) -> None:
        super().__init__(path, flags)
        self.gate = gate

    def sync(self) -> None:
        assert self.gate.wait(10)
        super().sync()


class SlowDisk(OsDisk):
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()

    def create(self, path: str) -> SlowFile:
        import os
        return SlowFile(path, os.O_CREAT | os.O_EXCL, self.gate)

    def open(self, path: str) -> SlowFile:
        return SlowFile(path, 0, self.gate)


class NoSource:
    def serialize_state(self) -> bytes:
        raise AssertionError("no snapshot in this test")


def test_the_worker_syncs_while_the_caller_goes_on_and_wakes_it_when_done(tmp_path: Path) -> None:
    disk = SlowDisk()
    storage = RaftStorage(tmp_path / "data", node_id="n1", source=NoSource(),  # type: ignore[arg-type]
                          durability="fsync", fork=False, disk=disk)
    try:
        assert isinstance(storage.worker, SyncWorker)
        storage.log.append(1, 1, b"\x01one")
        disk.gate.clear()  # the disk stalls
        assert storage.sync_async()  # handed over: returns at once
        assert storage.log.flight is not None and storage.log.durable_through == 0
        storage.log.append(2, 1, b"\x01two")
        assert storage.sync_async()  # still in flight: nothing more to do
        assert storage.log.durable_through == 0
        disk.gate.set()
        import select
        ready, _, _ = select.select([storage.worker.read_fd], [], [], 10)
        assert ready, "the worker never said its batch was done"
        storage.worker.drain()
        assert storage.sync_async()  # takes the first batch, hands the second over
        assert storage.log.durable_through >= 1
        assert storage.sync()  # at once: waits for the batch in flight, writes the rest
        assert storage.log.durable_through == 2
    finally:
        disk.gate.set()
        storage.close()
