"""The segment log (cluster/storage/raftlog.py) on a real folder and on SimDisk: what is synced
comes back after a reload (entries, truncations, compactions, hard state, across segments),
and a full disk fails a write without leaving half of it."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from raftcron.cluster.storage.raftlog import StorageUnavailable

from .logmodel import Place, command, entries, expected, fill


@pytest.fixture(params=["os", "sim"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    # No cache: every command is read back from the segment files, at the offsets the index
    # keeps (a wrong offset would otherwise hide behind the cache).
    if request.param == "os":
        return Place.on_os(str(tmp_path), cache_bytes_max=0)
    return Place.in_memory(cache_bytes_max=0)


# -- round trips -------------------------------------------------------------------------------


def test_synced_entries_come_back_after_a_crash_and_after_a_clean_stop(place: Place) -> None:
    log = place.open()
    fill(log, 1, 5, term=1)
    log = place.crash(log)
    assert entries(log) == expected(1, 5, 1)
    with place.reopened(log, clean=True) as again:
        assert entries(again) == expected(1, 5, 1) and again.report.clean_stop


def test_entries_never_synced_are_not_on_disk(place: Place) -> None:
    log = place.open()
    fill(log, 1, 3, term=1)
    log.append(4, 1, b"not synced")
    assert log.dirty and log.durable_through == 3
    again = place.crash(log)
    assert entries(again) == expected(1, 3, 1)


def test_a_truncation_survives_a_reload(place: Place) -> None:
    log = place.open()
    fill(log, 1, 6, term=1)
    log.truncate_from(4)
    fill(log, 4, 5, term=2)
    again = place.crash(log)
    assert entries(again) == expected(1, 3, 1) + expected(4, 5, 2)


def test_a_reset_then_a_new_start_survives_a_reload(place: Place) -> None:
    log = place.open()
    fill(log, 1, 4, term=1)
    log.reset()
    fill(log, 9, 10, term=3)
    again = place.crash(log)
    assert entries(again) == expected(9, 10, 3) and again.first_index == 9


def test_a_compaction_survives_a_reload(place: Place) -> None:
    log = place.open()
    fill(log, 1, 8, term=1)
    log.compact_to(6)
    log.sync()
    again = place.crash(log)
    assert again.first_index == 6 and entries(again) == expected(6, 8, 1)


def test_a_compaction_may_not_empty_the_log_nor_an_append_leave_a_gap(place: Place) -> None:
    log = place.open()
    fill(log, 1, 3, term=1)
    with pytest.raises(ValueError, match="would empty the log"):
        log.compact_to(4)
    with pytest.raises(ValueError, match="append of index 5 after 3"):
        log.append(5, 1, b"x")


def test_hard_state_and_commit_survive_a_reload(place: Place) -> None:
    log = place.open()
    fill(log, 1, 4, term=1)
    log.set_hard_state(3, "n2")  # durable when it returns: no sync called
    log.set_commit(4)
    log.sync()
    again = place.crash(log)
    assert (again.term, again.voted_for, again.commit_index) == (3, "n2", 4)
    again.set_hard_state(4, None)
    assert (place.crash(again).term, place.open().voted_for) == (4, None)


def test_segments_rotate_and_compaction_deletes_the_dead_ones(place: Place) -> None:
    place.segment_bytes_max = 1_000
    log = place.open()
    log.set_hard_state(7, "n3")
    fill(log, 1, 40, term=7, sync_each=True, size=100)
    log.set_commit(40)
    log.sync()
    before = place.segments()
    assert len(before) >= 4
    log.compact_to(38)
    log.sync()
    after = place.segments()
    assert len(after) < len(before) and after[-1] == before[-1]
    assert before[0] not in after
    again = place.crash(log)
    assert entries(again) == expected(38, 40, 7, size=100)
    # The first segments held the hard state; the newest segments' headers carry it on.
    assert (again.term, again.voted_for, again.commit_index) == (7, "n3", 40)
    assert again.report.segments == len(after)


def test_a_full_log_reloads_what_it_wrote_across_many_segments(place: Place) -> None:
    place.segment_bytes_max = 700
    log = place.open()
    for term in range(1, 6):
        fill(log, log.last_index + 1, log.last_index + 7, term=term, sync_each=term % 2 == 0,
             size=90)
        log.truncate_from(log.last_index - 1)
        log.sync()
    want = entries(log)
    assert entries(place.crash(log)) == want


def test_a_compaction_written_after_its_segment_survives_the_deletion_of_that_segment(
        place: Place) -> None:
    """The COMPACT frame of a compaction lands in the newest segment, while the entry it names
    is in an older one. Once a later compaction deleted that older segment, a reload replays
    the frame with no entry before it left: it must not move the entries' indexes (it did,
    and the log came back as entries 22..23 of 22..30, the others silently gone)."""
    place.segment_bytes_max = 1_000
    log = place.open()
    fill(log, 1, 30, term=1, sync_each=True, size=100)
    log.compact_to(12)
    log.sync()
    log.compact_to(22)
    log.sync()
    assert "log-00000001.seg" not in place.segments()
    again = place.crash(log)
    assert entries(again) == expected(22, 30, 1, size=100)
    again.compact_to(27)
    again.sync()
    assert entries(place.crash(again)) == expected(27, 30, 1, size=100)

# -- a full disk -------------------------------------------------------------------------------


def test_a_full_disk_fails_the_sync_keeps_the_changes_and_writes_them_when_room_is_back() -> None:
    place = Place.in_memory(cache_bytes_max=0)
    log = place.open()
    fill(log, 1, 2, term=1)
    place.sim.fill_up(30)
    log.append(3, 1, command(3, 1, 200))
    with pytest.raises(StorageUnavailable, match="write failed"):
        log.sync()
    assert log.dirty and log.durable_through == 2
    stuck = place.open()
    assert entries(stuck) == expected(1, 2, 1) and not stuck.report.torn_segment  # no half batch
    stuck.close(clean=False)
    place.sim.fill_up(None)
    log.sync()
    assert entries(place.crash(log)) == [*expected(1, 2, 1), (3, 1, command(3, 1, 200))]


def test_a_full_disk_while_starting_a_segment_leaves_no_segment_behind() -> None:
    place = Place.in_memory(segment_bytes_max=300)
    log = place.open()
    fill(log, 1, 3, term=1, size=100)
    segments = place.segments()
    place.sim.fill_up(10)
    log.append(4, 1, b"x")
    with pytest.raises(StorageUnavailable):
        log.sync()
    assert place.segments() == segments
    place.sim.fill_up(None)
    log.sync()
    assert entries(place.crash(log))[-1] == (4, 1, b"x")


def test_an_io_error_is_storage_unavailable_not_a_crash() -> None:
    place = Place.in_memory()
    log = place.open()
    fill(log, 1, 1, term=1)
    place.sim.fill_up(0)
    with pytest.raises(StorageUnavailable) as failed:
        log.set_hard_state(2, "n1")
    assert isinstance(failed.value.__cause__, OSError)
    assert failed.value.__cause__.errno == errno.ENOSPC


# -- the bytes a compaction frees ----------------------------------------------------------------


def test_the_log_counts_the_bytes_of_its_commands_through_every_change(place: Place) -> None:
    log = place.open()
    fill(log, 1, 8, term=1, size=100)
    assert log.entry_bytes == 800
    log.compact_to(6)
    log.truncate_from(8)
    fill(log, 8, 9, term=2, size=50)
    assert log.entry_bytes == 2 * 100 + 2 * 50
    again = place.crash(log)
    assert again.entry_bytes == 300


def test_a_log_past_its_byte_limit_asks_for_a_compaction_now_and_then(tmp_path: Path) -> None:
    """PySyncObj compacts by entry count and time only: a flood of large commands (refused
    ones too) would fill the disk first. The storage asks for a compaction past
    `compaction_max_bytes`, at most every COMPACTION_ASK_EVERY_S."""
    from raftcron.cluster.storage.node import COMPACTION_ASK_EVERY_S, RaftStorage

    class Source:
        def snapshot_bytes(self) -> bytes:
            return b""

        def load_snapshot(self, blob: bytes) -> None:
            pass

    now_s = [100.0]
    asked: list[float] = []
    storage = RaftStorage(str(tmp_path), node_id="n1", source=Source(), fork=False,
                          monotonic=lambda: now_s[0])
    try:
        storage.compaction_max_bytes = 1_000
        storage.request_compaction = lambda: asked.append(now_s[0])
        for index in range(1, 10):
            storage.log.append(index, 1, command(index, 1, 100))
            storage.sync()
        assert asked == []  # 900 bytes
        storage.log.append(10, 1, command(10, 1, 200))
        storage.sync()
        assert asked == [100.0]
        storage.log.append(11, 1, command(11, 1, 200))
        storage.sync()
        assert asked == [100.0]  # asked already, a snapshot takes seconds
        now_s[0] += COMPACTION_ASK_EVERY_S
        storage.log.append(12, 1, command(12, 1, 200))
        storage.sync()
        assert asked == [100.0, 100.0 + COMPACTION_ASK_EVERY_S]
    finally:
        storage.close()
