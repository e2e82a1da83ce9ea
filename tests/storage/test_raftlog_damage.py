"""The segment log's loading rule (cluster/storage/raftlog.py, records.py): a torn last
batch, or an empty newest segment, is the last write cut short by a crash and is cut and
reported; anything else (a changed synced batch, an empty or missing segment, a segment changed
since a clean stop) is damage, refused naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftcron.cluster.storage import records
from raftcron.cluster.storage.raftlog import CLEAN_MARK, HEAD_MARK, LogDamaged

from .logmodel import Place, entries, expected, fill


@pytest.fixture(params=["os", "sim"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    # No cache: every command is read back from the segment files, at the offsets the index
    # keeps (a wrong offset would otherwise hide behind the cache).
    if request.param == "os":
        return Place.on_os(str(tmp_path), cache_bytes_max=0)
    return Place.in_memory(cache_bytes_max=0)


def newest_segment(place: Place) -> str:
    return place.path(place.segments()[-1])


def crashed_with_segments(place: Place, *, last: int) -> None:
    """Entries 1..last of 100 bytes, one sync each, in 600-byte segments, then a crash."""
    place.segment_bytes_max = 600
    log = place.open()
    fill(log, 1, last, term=1, sync_each=True, size=100)
    log.close(clean=False)


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
    crashed_with_segments(place, last=12)
    first = place.path(place.segments()[0])
    size = len(place.disk.read(first))
    flip(place, first, size - 3)  # its last batch: not torn, newer segments follow
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == first


def test_a_missing_segment_the_newest_one_lists_is_damage(place: Place) -> None:
    crashed_with_segments(place, last=12)
    names = place.segments()
    assert len(names) >= 3
    place.disk.unlink(place.path(names[1]))
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == place.path(names[1])
    assert "is missing" in damaged.value.problem


def test_a_missing_oldest_segment_the_newest_one_lists_is_damage(place: Place) -> None:
    crashed_with_segments(place, last=12)
    place.disk.unlink(place.path("log-00000001.seg"))
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == place.path("log-00000001.seg")
    assert "the newest segment lists it" in damaged.value.problem


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


def test_a_deleted_newest_segment_is_damage_not_a_shorter_log(place: Place) -> None:
    """After a crash (no clean-stop mark) the older segments alone looked like a whole log that
    never reached the newest: the node started short, its latest entries and vote gone."""
    crashed_with_segments(place, last=12)
    names = place.segments()
    assert len(names) >= 3
    place.disk.unlink(place.path(names[-1]))
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == place.path(names[-1])
    assert "is missing" in damaged.value.problem


@pytest.mark.parametrize("size", [0, 10])
def test_a_newest_segment_cut_to_before_its_header_after_it_was_made_is_damage(
        place: Place, size: int) -> None:
    """Its header was synced before the head mark named it: with no header left, this is not
    the torn creation of a segment (that one is removed), it is a segment that lost its data."""
    crashed_with_segments(place, last=12)
    newest = newest_segment(place)
    cut_file(place, newest, size)
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == newest


def test_a_lost_head_mark_is_tolerated_and_written_again(place: Place) -> None:
    crashed_with_segments(place, last=6)
    place.disk.unlink(place.path(HEAD_MARK))
    again = place.open()
    assert entries(again) == expected(1, 6, 1, size=100)
    fill(again, 7, 12, term=1, sync_each=True, size=100)
    assert place.disk.exists(place.path(HEAD_MARK))
    assert entries(place.crash(again)) == expected(1, 12, 1, size=100)


def test_a_head_mark_that_does_not_parse_is_damage(place: Place) -> None:
    log = place.open()
    fill(log, 1, 3, term=1)
    log.close(clean=False)
    place.disk.write_file(place.path(HEAD_MARK), [b"{not json"], sync=True)
    with pytest.raises(LogDamaged) as damaged:
        place.open()
    assert damaged.value.path == place.path(HEAD_MARK)
