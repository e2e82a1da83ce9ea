"""Snapshots (cluster/storage/snapshots.py), the log's agreement with them at start
(journal.reconcile) and the data dir as a whole (datadir.py): a snapshot is current only once
written whole and only when newer, a transfer that does not check out is refused, and every
combination of files that lost something is refused naming the file."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.config import SERIALIZER_STATE

from raftcron.chaos.sim.disk import SimDisk
from raftcron.cluster.storage import snapshots
from raftcron.cluster.storage.datadir import LegacyDataDir, open_data_dir
from raftcron.cluster.storage.disk import Disk, OsDisk
from raftcron.cluster.storage.journal import reconcile
from raftcron.cluster.storage.raftlog import LogDamaged, RaftLog, StorageError
from raftcron.cluster.storage.snapshots import Snapshot, SnapshotStore

from .logmodel import Place, command, entries


class Source:
    """A state machine: its snapshot bytes, and what it was asked to load."""

    def __init__(self, state: bytes = b"the state") -> None:
        self.state = state
        self.loaded: list[bytes] = []

    def snapshot_bytes(self) -> bytes:
        return self.state

    def load_snapshot(self, blob: bytes) -> None:
        self.loaded.append(blob)


def entry(index: int, term: int) -> tuple[bytes, int, int]:
    return command(index, term), index, term


def serialized(index: int, term: int) -> tuple[Any, ...]:
    """What PySyncObj hands the serializer: (data, last entry, the one before, members)."""
    return None, entry(index, term), entry(index - 1, term), {"n2", "n1"}


def store_on(disk: Disk, directory: str, source: Source | None = None) -> SnapshotStore:
    return SnapshotStore(directory, source or Source(), fork=False, disk=disk)


@pytest.fixture
def disk() -> SimDisk:
    disk = SimDisk()
    disk.makedirs("/a")
    disk.makedirs("/b")
    return disk


def written(disk: Disk, directory: str, index: int, term: int,
            source: Source | None = None) -> SnapshotStore:
    store = store_on(disk, directory, source)
    store.serialize(serialized(index, term), index - 1)
    assert store.checkSerializing() == (SERIALIZER_STATE.SUCCESS, index - 1)
    return store


# -- writing and loading -----------------------------------------------------------------------


def test_a_snapshot_written_inline_is_current_once_check_serializing_says_success(
        disk: SimDisk) -> None:
    store = written(disk, "/a", 10, 2)
    assert store.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)
    assert disk.listdir("/a") == ["snapshot"]
    assert snapshots.check(disk.read("/a/snapshot"), "/a/snapshot") == (10, 2)
    assert store.current is not None and store.current.index == 10
    source = Source()
    again = store_on(disk, "/a", source)
    assert again.deserialize() == (None, entry(10, 2), entry(9, 2), ["n1", "n2"])
    again.deserialize()
    assert source.loaded == [b"the state"]  # loaded once, however often PySyncObj asks
    # ... and not kept once loaded: at a million retained jobs the decoded state is hundreds
    # of megabytes, which a restarted node held for as long as it ran.
    assert again.current is not None and again.current.state == b""


def test_a_current_snapshot_survives_a_power_cut(disk: SimDisk) -> None:
    written(disk, "/a", 10, 2)
    disk.power_cut(random.Random(0))
    assert store_on(disk, "/a").current is not None


def test_a_snapshot_is_synced_even_when_the_log_is_not(disk: SimDisk) -> None:
    """With durability "os" the compaction after a snapshot deletes log segments: a snapshot
    renamed into place unsynced used to be torn by a power cut, and the node never started."""
    store = SnapshotStore("/a", Source(), durable=False, fork=False, disk=disk)
    store.serialize(serialized(10, 2), 9)
    assert store.checkSerializing() == (SERIALIZER_STATE.SUCCESS, 9)
    disk.power_cut(random.Random(0))
    assert snapshots.check(disk.read("/a/snapshot"), "/a/snapshot") == (10, 2)


def test_an_older_snapshot_finishing_after_a_newer_one_is_current_is_dropped(
        disk: SimDisk) -> None:
    """Finding S2: a follower's own snapshot at 30 must not replace the leader's at 50 that it
    installed meanwhile (or the next start would clear the log past 30)."""
    leader = written(disk, "/b", 50, 3)
    follower = store_on(disk, "/a")
    assert transfer(leader, follower)
    follower.serialize(serialized(30, 2), 29)
    assert follower.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)
    assert disk.listdir("/a") == ["snapshot"]
    assert snapshots.check(disk.read("/a/snapshot"), "/a/snapshot") == (50, 3)


@pytest.mark.processes
def test_a_forked_writer_that_finishes_after_a_newer_install_is_dropped(tmp_path: Path) -> None:
    """The same with a real fork: the child renames nothing, the node keeps the newer one."""
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    leader_dir.mkdir()
    follower_dir.mkdir()
    leader = written(OsDisk(), str(leader_dir), 50, 3)
    follower = SnapshotStore(str(follower_dir), Source(b"older state"), fork=True)
    follower.serialize(serialized(30, 2), 29)  # the child writes the older one...
    child = follower._child_pid
    assert child
    assert transfer(leader, follower) is True  # ...while the leader's newer one is installed
    os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)  # the child is done, not yet reaped
    assert follower.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)
    assert snapshots.check((follower_dir / "snapshot").read_bytes(), "") == (50, 3)
    assert sorted(os.listdir(follower_dir)) == ["snapshot"]


def test_a_damaged_snapshot_file_is_refused_naming_it(disk: SimDisk) -> None:
    written(disk, "/a", 10, 2)
    disk.flip_bit("/a/snapshot", random.Random(1), start=snapshots.HEADER_BYTES)
    with pytest.raises(LogDamaged) as damaged:
        store_on(disk, "/a")
    assert damaged.value.path == "/a/snapshot" and "checksum" in damaged.value.problem
    file = disk.open("/a/snapshot")
    file.truncate(10)
    with pytest.raises(LogDamaged, match="shorter than a snapshot header"):
        store_on(disk, "/a")


def test_without_a_snapshot_there_is_nothing_to_load_or_send(disk: SimDisk) -> None:
    store = store_on(disk, "/a")
    assert store.getTransmissionData("n2") is None
    with pytest.raises(LogDamaged, match="is missing"):
        store.deserialize()


# -- sending to a follower ---------------------------------------------------------------------


def transfer(sender: SnapshotStore, receiver: SnapshotStore,
             damage: int | None = None) -> bool | None:
    """Every chunk from sender to receiver; what the last one answered (None: none sent)."""
    answer: bool | None = None
    number = 0
    while True:
        data = sender.getTransmissionData("n2")
        if data is None:
            return answer if number else False
        chunk, first, last = data
        if damage == number and chunk:
            chunk = chunk[:-1] + bytes([chunk[-1] ^ 1])  # in the data, not the chunk's header
        answer = receiver.setTransmissionData((chunk, first, last))
        number += 1
        if last:
            return answer
        assert answer is False


def test_a_snapshot_sent_in_chunks_arrives_whole_and_is_loaded(
        disk: SimDisk, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "CHUNK_BYTES", 64)
    state = random.Random(0).randbytes(2_000)
    leader = written(disk, "/b", 10, 2, Source(state))
    source = Source()
    follower = store_on(disk, "/a", source)
    assert transfer(leader, follower) is True
    assert disk.read("/a/snapshot") == disk.read("/b/snapshot")
    assert follower.current is not None and follower.current.index == 10
    follower.deserialize()
    assert source.loaded == [state]
    assert follower.current.state == b""  # an installed snapshot's state is not kept either
    assert disk.listdir("/a") == ["snapshot"]


def test_followers_sent_the_same_snapshot_at_once_share_one_copy_of_it(
        disk: SimDisk, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader sending its snapshot to two followers holds the file's bytes once, not once per
    follower (a state of hundreds of MB); a newer snapshot is read afresh."""
    monkeypatch.setattr(snapshots, "CHUNK_BYTES", 64)
    state = random.Random(0).randbytes(2_000)
    leader = written(disk, "/b", 10, 2, Source(state))
    reads: list[str] = []
    real_read = disk.read
    monkeypatch.setattr(disk, "read", lambda path: (reads.append(path), real_read(path))[1])
    for directory in ("/n2", "/n3", "/n4"):
        disk.makedirs(directory)
    followers = {name: store_on(disk, f"/{name}", Source()) for name in ("n2", "n3")}
    done = {name: False for name in followers}
    for _ in range(1_000):  # chunks to each in turn, as the Raft thread sends them
        for name, follower in followers.items():
            if done[name]:
                continue
            data = leader.getTransmissionData(name)
            assert data is not None
            chunk, first, last = data
            done[name] = follower.setTransmissionData((chunk, first, last)) or last
        if all(done.values()):
            break
    assert all(follower.current is not None and follower.current.index == 10
               for follower in followers.values())
    assert reads == ["/b/snapshot"]
    # A transfer that starts once a newer snapshot is current reads the newer file.
    leader.serialize(serialized(20, 3), 19)
    assert leader.checkSerializing() == (SERIALIZER_STATE.SUCCESS, 19)
    assert transfer(leader, store_on(disk, "/n4", Source())) is True
    assert reads.count("/b/snapshot") == 2


def test_a_snapshot_names_the_cluster_of_the_node_that_wrote_it_wherever_it_goes(
        disk: SimDisk) -> None:
    """Written with the node's [cluster] name, read back at start, sent to a follower, and
    told by the file's first bytes (what a backup's header says) as by the whole file."""
    store = SnapshotStore("/b", Source(random.Random(0).randbytes(2_000)), fork=False,
                          disk=disk, cluster_name="prod-eu")
    store.serialize(serialized(10, 2), 9)
    assert store.checkSerializing() == (SERIALIZER_STATE.SUCCESS, 9)
    assert store.current is not None and store.current.cluster_name == "prod-eu"
    data = disk.read("/b/snapshot")
    assert snapshots.decode(data, "/b/snapshot").cluster_name == "prod-eu"
    assert snapshots.cluster_name_in(data[:snapshots.HEADER_BYTES + 1024]) == "prod-eu"
    again = store_on(disk, "/b")
    assert again.current is not None and again.current.cluster_name == "prod-eu"
    follower = store_on(disk, "/a")  # a follower keeps the leader's file as it is
    assert transfer(store, follower) is True
    assert follower.current is not None and follower.current.cluster_name == "prod-eu"


def test_a_snapshot_damaged_in_transfer_is_refused_and_not_installed(
        disk: SimDisk, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "CHUNK_BYTES", 64)
    leader = written(disk, "/b", 10, 2, Source(random.Random(0).randbytes(2_000)))
    follower = store_on(disk, "/a")
    assert transfer(leader, follower, damage=5) is False
    assert follower.current is None and disk.listdir("/a") == []
    assert transfer(leader, follower) is True  # the next, whole transfer is installed


def test_a_transfer_that_does_not_start_with_its_first_chunk_is_refused(disk: SimDisk) -> None:
    follower = store_on(disk, "/a")
    assert follower.setTransmissionData((b"middle", False, False)) is False
    assert follower.setTransmissionData((b"end", False, True)) is False
    assert follower.current is None


def test_every_chunk_received_is_reported_to_the_leader(
        disk: SimDisk, monkeypatch: pytest.MonkeyPatch) -> None:
    """PySyncObj's follower answers only the last chunk: a leader that heard nothing for its
    connection timeout dropped the connection mid-transfer, and a large snapshot on a busy
    machine was sent again and again (480 s to restart a node with a million jobs)."""
    monkeypatch.setattr(snapshots, "CHUNK_BYTES", 64)
    leader = written(disk, "/b", 10, 2, Source(random.Random(0).randbytes(1_000)))
    follower = store_on(disk, "/a")
    reported: list[int] = []
    follower.on_chunk = reported.append
    assert transfer(leader, follower) is True
    size = len(disk.read("/b/snapshot"))
    assert len(reported) == -(-size // 64) + 1  # every chunk, and the empty last one
    assert reported == sorted(reported) and reported[-1] == size


def test_a_chunk_lost_with_a_dropped_connection_ends_that_transfer_only(
        disk: SimDisk, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dropped connection loses the chunks in its buffer, and the leader may go on where it
    was. The chunk headers end that transfer at the gap (the whole-body check used to be what
    refused the joined remains); the next whole transfer is installed."""
    monkeypatch.setattr(snapshots, "CHUNK_BYTES", 64)
    leader = written(disk, "/b", 10, 2, Source(random.Random(0).randbytes(1_000)))
    follower = store_on(disk, "/a")
    sent = []
    while (data := leader.getTransmissionData("n2")) is not None:
        sent.append(data)
        if data[2]:
            break
    assert len(sent) > 5
    for data in sent[:3] + sent[4:]:  # the fourth chunk is lost
        assert follower.setTransmissionData(data) is False
    assert follower.current is None
    for data in sent[:3] + sent[:2]:  # a new transfer from its start, its start missed
        follower.setTransmissionData(data)
    assert follower.setTransmissionData(sent[-1]) is False
    assert follower.current is None
    for data in sent:
        answer = follower.setTransmissionData(data)
    assert answer is True and follower.current is not None


def test_a_snapshot_not_newer_than_the_current_one_is_not_installed(disk: SimDisk) -> None:
    leader = written(disk, "/b", 10, 2)
    follower = written(disk, "/a", 10, 2)
    assert transfer(leader, follower) is False


def test_a_leaders_snapshot_at_the_same_index_from_another_term_replaces_the_current_one(
        disk: SimDisk) -> None:
    """Raft installs the leader's snapshot unless the follower holds that very entry (index and
    term). A follower that lost writes (durability "os") can hold a snapshot of another history
    at the same index; refusing the leader's (only the index was compared) left it refusing
    every resend, never catching up."""
    leader = written(disk, "/b", 10, 3)
    source = Source()
    follower = written(disk, "/a", 10, 2, source)
    assert transfer(leader, follower) is True
    assert snapshots.check(disk.read("/a/snapshot"), "/a/snapshot") == (10, 3)
    follower.deserialize()
    assert source.loaded == [b"the state"]


# -- the log and the snapshot at start (reconcile) ---------------------------------------------


def snapshot_at(index: int, term: int) -> Snapshot:
    return Snapshot(index, term, entry(index - 1, term), entry(index, term), ["n1"], b"")


def log_holding(first: int, last: int, term: int) -> tuple[Place, RaftLog]:
    place = Place.in_memory()
    log = place.open()
    for index in range(1, last + 1):
        log.append(index, term, command(index, term))
    if first > 1:
        log.compact_to(first)
    log.sync()
    return place, log


def test_a_snapshot_newer_than_the_log_replaces_it_with_its_two_entries() -> None:
    place, log = log_holding(1, 5, term=1)
    reconcile(log, snapshot_at(10, 2), "/node/snapshot")
    assert entries(log) == [(9, 2, command(9, 2)), (10, 2, command(10, 2))]
    assert log.commit_index == 10
    assert entries(place.crash(log)) == entries(log)  # reconciled durably


def test_a_log_holding_the_snapshots_last_entry_keeps_what_follows() -> None:
    _, log = log_holding(1, 20, term=1)
    reconcile(log, snapshot_at(10, 1), "/node/snapshot")
    assert log.first_index == 9
    assert entries(log) == [(i, 1, command(i, 1)) for i in range(9, 21)]
    assert log.commit_index == 10


def test_a_log_holding_the_snapshots_index_with_another_term_is_replaced() -> None:
    _, log = log_holding(1, 20, term=1)
    reconcile(log, snapshot_at(10, 2), "/node/snapshot")
    assert entries(log) == [(9, 2, command(9, 2)), (10, 2, command(10, 2))]


def test_a_gap_between_the_snapshot_and_the_log_is_damage() -> None:
    _, log = log_holding(15, 20, term=1)
    with pytest.raises(LogDamaged) as damaged:
        reconcile(log, snapshot_at(10, 1), "/node/snapshot")
    assert damaged.value.path == "/node/log" and "entries between are lost" in str(damaged.value)


def test_a_log_starting_past_index_1_without_a_snapshot_is_damage() -> None:
    _, log = log_holding(5, 9, term=1)
    with pytest.raises(LogDamaged) as damaged:
        reconcile(log, None, "/node/snapshot")
    assert damaged.value.path == "/node/snapshot" and "is missing" in damaged.value.problem


def test_a_commit_index_past_the_end_of_the_log_is_damage() -> None:
    _, log = log_holding(1, 5, term=1)
    log.set_commit(8)
    log.sync()
    with pytest.raises(LogDamaged, match="committed, but it ends at 5"):
        reconcile(log, None, "/node/snapshot")


def test_a_whole_log_without_a_snapshot_is_left_as_it_is() -> None:
    _, log = log_holding(1, 5, term=1)
    log.set_commit(5)
    reconcile(log, None, "/node/snapshot")
    assert entries(log) == [(i, 1, command(i, 1)) for i in range(1, 6)]


# -- the data dir ------------------------------------------------------------------------------


def test_a_data_dir_of_release_0_1_0_is_refused_with_the_command_that_migrates_it(
        tmp_path: Path) -> None:
    (tmp_path / "raft.journal").write_bytes(b"old")
    with pytest.raises(LegacyDataDir) as legacy:
        open_data_dir(str(tmp_path), "n1")
    assert "raftcron storage migrate" in str(legacy.value) and "raft.journal" in str(legacy.value)


def test_an_initialised_data_dir_without_a_log_is_damage(tmp_path: Path) -> None:
    datadir = open_data_dir(str(tmp_path), "n1")
    assert datadir.new
    datadir.mark_initialised(OsDisk())
    datadir.release()
    with pytest.raises(LogDamaged) as damaged:
        open_data_dir(str(tmp_path), "n1")
    assert damaged.value.path == str(tmp_path / "log-00000001.seg")
    assert "--rejoin-empty" in damaged.value.problem


def test_a_log_without_the_storage_mark_is_damage(tmp_path: Path) -> None:
    (tmp_path / "log-00000001.seg").write_bytes(b"")
    with pytest.raises(LogDamaged, match=r"raftcron\.storage: is missing"):
        open_data_dir(str(tmp_path), "n1")


def test_a_second_open_of_a_data_dir_in_use_is_refused(tmp_path: Path) -> None:
    first = open_data_dir(str(tmp_path), "n1")
    with pytest.raises(StorageError, match="in use by another process"):
        open_data_dir(str(tmp_path), "n1")
    first.release()
    open_data_dir(str(tmp_path), "n1").release()


def test_a_data_dir_of_another_node_is_refused(tmp_path: Path) -> None:
    open_data_dir(str(tmp_path), "n1").release()
    with pytest.raises(StorageError, match="belongs to node 'n1', not 'n2'"):
        open_data_dir(str(tmp_path), "n2")


def test_a_stop_waits_for_a_killed_writer_only_a_bounded_time(
    disk: SimDisk, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A killed writer inside a long fsync is not reaped until the call returns; the stop
    does not wait for the disk on its behalf (it can no longer make anything current)."""
    store = store_on(disk, "/a")
    store._child_pid, store._child_path = 999_999, "/a/snapshot.10.tmp"
    disk.write_file("/a/snapshot.10.tmp", [b"half a snapshot"], sync=False)
    signals: list[tuple[int, int]] = []
    monkeypatch.setattr(snapshots.os, "kill", lambda pid, sig: signals.append((pid, sig)))
    monkeypatch.setattr(snapshots.os, "waitpid", lambda pid, options: (0, 0))  # never gone

    store.kill_writer(wait_s=0.2)

    assert signals == [(999_999, snapshots.signal.SIGKILL)]
    assert not disk.exists("/a/snapshot.10.tmp") and not store._child_pid
    assert "not yet gone" in caplog.text
