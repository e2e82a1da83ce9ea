"""The segment log (cluster/storage/raftlog.py) on a real folder and on SimDisk: what is synced
comes back after a reload, a torn last batch is cut and reported, any other damage is refused
naming the file."""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

from cluster.storage import records
from cluster.storage.raftlog import CLEAN_MARK, LogDamaged, RaftLog, StorageUnavailable

from .logmodel import Image, Place, command, entries


@pytest.fixture(params=["os", "sim"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    # No cache: every command is read back from the segment files, at the offsets the index
    # keeps (a wrong offset would otherwise hide behind the cache).
    if request.param == "os":
        return Place.on_os(str(tmp_path), cache_bytes_max=0)
    return Place.in_memory(cache_bytes_max=0)


def fill(log: RaftLog, first: int, last: int, term: int, *, sync_each: bool = False,
         size: int = 24) -> None:
    for index in range(first, last + 1):
        log.append(index, term, command(index, term, size))
        if sync_each:
            log.sync()
    log.sync()


def expected(first: int, last: int, term: int, size: int = 24) -> list[tuple[int, int, bytes]]:
    return [(index, term, command(index, term, size)) for index in range(first, last + 1)]


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
    assert log.has_unsynced_entries
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


# -- torn tails and damage ---------------------------------------------------------------------


def newest_segment(place: Place) -> str:
    return place.path(place.segments()[-1])


def cut_file(place: Place, path: str, size: int) -> None:
    file = place.disk.open(path)
    file.truncate(size)
    file.close()


def test_a_torn_last_batch_is_cut_and_reported(place: Place) -> None:
    log = place.open()
    fill(log, 1, 3, term=1)
    path = newest_segment(place)
    whole = len(place.disk.read(path))
    fill(log, 4, 4, term=1)
    log.close(clean=False)
    torn = len(place.disk.read(path)) - 5
    cut_file(place, path, torn)
    again = place.open()
    assert entries(again) == expected(1, 3, 1)
    report = again.report
    assert (report.torn_segment, report.torn_bytes_cut) == (path, torn - whole)
    assert report.torn_problem is not None and f"offset {whole}" in report.torn_problem
    assert len(place.disk.read(path)) == whole  # cut on disk, not only skipped
    fill(again, 4, 5, term=2)
    assert entries(place.crash(again)) == expected(1, 3, 1) + expected(4, 5, 2)


def test_an_empty_newest_segment_left_by_a_crash_while_creating_it_is_removed_at_start(
        place: Place) -> None:
    """A kill -9 (or a power cut) between creating a segment and writing its header leaves an
    empty file. It used to become the segment written to next, with no header, and the start
    after that refused the log as damaged."""
    log = place.open()
    fill(log, 1, 3, term=1)
    log.close(clean=False)
    place.disk.create(place.path("log-00000002.seg")).close()
    again = place.open()
    assert entries(again) == expected(1, 3, 1)
    assert again.report.torn_segment == place.path("log-00000002.seg")
    fill(again, 4, 4, term=1)
    assert entries(place.crash(again)) == expected(1, 4, 1)


def test_an_empty_segment_with_a_newer_one_behind_it_is_damage(place: Place) -> None:
    log = place.open()
    fill(log, 1, 3, term=1)
    log.close(clean=False)
    first = place.path("log-00000001.seg")
    cut_file(place, first, 0)
    file = place.disk.create(place.path("log-00000002.seg"))
    file.append(records.batch(1, [records.segment_header(2)]))
    file.close()
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == first and "is empty" in damaged.value.problem


def first_entry_offset(place: Place, path: str) -> int:
    """Where the first entry frame of a segment starts (past its header batch)."""
    data = place.disk.read(path)
    scan = records.scan(data, 0, None)
    for batch in scan.batches:
        for frame in batch.frames:
            if frame.kind == records.KIND_ENTRY:
                return frame.offset
    raise AssertionError("no entry in the segment")


def flip(place: Place, path: str, offset: int) -> None:
    data = bytearray(place.disk.read(path))
    data[offset] ^= 0x10
    cut_file(place, path, 0)
    file = place.disk.open(path)
    file.append(bytes(data))
    file.sync()
    file.close()


def test_a_flipped_bit_in_a_synced_batch_with_a_later_batch_is_damage(place: Place) -> None:
    log = place.open()
    fill(log, 1, 1, term=1)
    fill(log, 2, 2, term=1)
    log.close(clean=False)
    path = newest_segment(place)
    flip(place, path, first_entry_offset(place, path) + 20)
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == path
    assert "does not check out" in damaged.value.problem


def test_a_flipped_bit_in_an_older_segment_is_damage_even_at_its_end(place: Place) -> None:
    place.segment_bytes_max = 600
    log = place.open()
    fill(log, 1, 12, term=1, sync_each=True, size=100)
    log.close(clean=False)
    first = place.path(place.segments()[0])
    size = len(place.disk.read(first))
    flip(place, first, size - 3)  # its last batch: not torn, newer segments follow
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == first


def test_a_missing_segment_the_newest_one_lists_is_damage(place: Place) -> None:
    place.segment_bytes_max = 600
    log = place.open()
    fill(log, 1, 12, term=1, sync_each=True, size=100)
    log.close(clean=False)
    names = place.segments()
    assert len(names) >= 3
    place.disk.unlink(place.path(names[1]))
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == place.path(names[1])
    assert "is missing" in damaged.value.problem


def test_a_missing_middle_segment_is_damage_even_when_the_newest_looks_torn(
        place: Place) -> None:
    """Segment 2 deleted, segment 3 holding its header and a torn batch: the header's batch
    number does not follow segment 1's, which used to read as a torn tail, so segment 3 was
    deleted and the log started short (entries 1..4 of 8 synced), with no error."""
    place.segment_bytes_max = 600
    log = place.open()
    index = 0
    while len(place.segments()) < 3:
        index += 1
        fill(log, index, index, term=1, size=100)
    log.close(clean=False)
    newest = newest_segment(place)
    cut_file(place, newest, len(place.disk.read(newest)) - 5)
    place.disk.unlink(place.path("log-00000002.seg"))
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == place.path("log-00000002.seg")
    assert place.disk.exists(newest)


def test_after_a_clean_stop_a_shortened_newest_segment_is_damage_not_a_torn_tail(
        place: Place) -> None:
    log = place.open()
    fill(log, 1, 4, term=1, sync_each=True)
    log.close(clean=True)
    path = newest_segment(place)
    cut_file(place, path, len(place.disk.read(path)) - 7)
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == path and "changed since the node stopped" in str(damaged.value)


def test_after_a_clean_stop_a_whole_batch_appended_to_the_newest_segment_is_damage(
        place: Place) -> None:
    log = place.open()
    fill(log, 1, 2, term=1)
    log.close(clean=True)
    path = newest_segment(place)
    file = place.disk.open(path)
    file.append(records.batch(99, [records.entry(3, 1, b"smuggled")]))
    file.close()
    with pytest.raises(LogDamaged, match="changed since the node stopped cleanly"):
        place.open()


def test_the_clean_stop_mark_is_used_once(place: Place) -> None:
    log = place.open()
    fill(log, 1, 2, term=1)
    log.close(clean=True)
    again = place.open()
    assert again.report.clean_stop and CLEAN_MARK not in place.disk.listdir(place.directory)
    fill(again, 3, 3, term=1)
    again.close(clean=False)  # a crash after the restart: no mark judges this segment
    assert entries(place.open()) == expected(1, 3, 1)


# -- a full disk -------------------------------------------------------------------------------


def test_a_full_disk_fails_the_sync_keeps_the_changes_and_writes_them_when_room_is_back() -> None:
    place = Place.in_memory(cache_bytes_max=0)
    log = place.open()
    fill(log, 1, 2, term=1)
    place.sim.fill_up(30)
    log.append(3, 1, command(3, 1, 200))
    with pytest.raises(StorageUnavailable, match="write failed"):
        log.sync()
    assert log.has_unsynced_entries
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


# -- power loss (SimDisk) ----------------------------------------------------------------------


def test_a_power_cut_leaves_exactly_what_was_synced() -> None:
    place = Place.in_memory(segment_bytes_max=500)
    log = place.open()
    fill(log, 1, 9, term=2, sync_each=True, size=60)
    log.set_hard_state(3, "n1")
    log.set_commit(9)
    log.sync()
    synced = Image.of(log)
    log.append(10, 3, b"never synced")
    log.set_commit(10)
    place.sim.power_cut(random.Random(1))
    again = place.open()
    assert Image.of(again) == synced
