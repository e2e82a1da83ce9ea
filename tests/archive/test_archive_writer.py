"""The archive on one node (cluster/archive): the jobs an entry removes from the state are
written to SQLite by a thread of their own, found by id as the API shows them, rewritten
identically on replay, and a snapshot waits until they are durable."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.config import SERIALIZER_STATE

from raftcron.cluster.archive.store import ArchiveError, ArchiveStore, Row
from raftcron.cluster.archive.writer import ArchiveWriter
from raftcron.cluster.storage.disk import OsDisk
from raftcron.cluster.storage.snapshots import SnapshotStore
from raftcron.scheduler import limits
from raftcron.scheduler.commands import Ack
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.views import job_view


def finished(d: Driver, count: int, **fields: Any) -> list[int]:
    ids = d.submit_many(count, max_attempts=1, **fields)
    claimed = d.claim(max=count)
    d.claim(max=0, acks=tuple(Ack(job_id, token, "succeeded", result={"n": job_id})
                              for job_id, token in claimed))
    return ids


def leave(d: Driver) -> list[Any]:
    """Every finished job leaves by age (the 7 days before the gate): what the state hands."""
    d.state.leaving = []
    d.tick(advance_ms=limits.RETENTION_MS_DEFAULT + 1)
    leaving, d.state.leaving = d.state.leaving, None
    return leaving


@pytest.fixture
def d() -> Driver:
    return Driver()


def test_the_state_hands_over_the_jobs_it_removes_only_when_asked(d: Driver) -> None:
    ids = finished(d, 3)
    views = {job_id: job_view(d.state.job(job_id)) for job_id in ids}
    assert d.state.leaving is None
    leaving = leave(d)
    assert sorted(job.id for _, job in leaving) == ids
    assert {job.id: job_view(job) for _, job in leaving} == views
    assert {seq for seq, _ in leaving} == {0}  # not finalized: numbered for nothing
    assert len(d.state.table) == 0


def test_an_archived_job_is_found_by_id_as_the_api_showed_it(tmp_path: Path, d: Driver) -> None:
    ids = finished(d, 5, task="invoice", payload={"customer": {"id": 42}}, key=None)
    views = {job_id: job_view(d.state.job(job_id)) for job_id in ids}
    store = ArchiveStore(str(tmp_path))
    writer = ArchiveWriter(store)
    writer.start()
    try:
        writer.put(17, leave(d))
        assert writer.wait_durable(17, 10)
    finally:
        writer.stop()
    reader = ArchiveStore(str(tmp_path), readonly=True)
    for job_id in ids:
        assert reader.get(job_id) == views[job_id]
    assert reader.get(ids[-1] + 1) is None
    assert reader.through_index() == 17
    totals = reader.totals()
    assert totals["rows"] == 5 and totals["row_bytes"] > 0
    assert totals["oldest_finished_ms"] == min(v["finished_ms"] for v in views.values())


def test_a_replayed_eviction_writes_the_same_row_again(tmp_path: Path, d: Driver) -> None:
    leaving = leave_after(d, 4)
    store = ArchiveStore(str(tmp_path))
    rows = [Row.of_view(job_view(job), 9, seq) for seq, job in leaving]
    store.write(rows, 9)
    store.write(rows, 9)  # the node restarted and replayed the entry
    dump = sorted(store.db.execute("SELECT * FROM jobs").fetchall())
    assert len(dump) == 4
    again = ArchiveStore(str(tmp_path))
    again.write(rows[2:] + rows[:1], 9)  # a replay from a later snapshot: some of them
    assert sorted(again.db.execute("SELECT * FROM jobs").fetchall()) == dump
    totals = again.totals()  # kept beside the rows, not counted again
    assert totals["rows"] == 4 and totals["row_bytes"] == sum(row.bytes for row in rows)


def leave_after(d: Driver, count: int) -> list[Any]:
    finished(d, count)
    return leave(d)


def test_a_snapshot_waits_until_the_archive_has_made_its_evictions_durable(
        tmp_path: Path) -> None:
    class Source:
        def snapshot_bytes(self) -> bytes:
            return b"state"

        def load_snapshot(self, blob: bytes) -> None:
            pass

    snapshots = SnapshotStore(str(tmp_path), Source(), fork=False, disk=OsDisk())
    durable = {"through": 5}
    snapshots.may_cover = lambda index: index <= durable["through"]
    entry = (b"x", 10, 2)
    snapshots.serialize((None, entry, (b"x", 9, 2), {"n1"}), 9)
    # Written, but the archive has made only the evictions up to 5 durable: not current.
    assert snapshots.checkSerializing() == (SERIALIZER_STATE.SERIALIZING, 9)
    assert snapshots.current is None
    snapshots.serialize((None, (b"x", 11, 2), entry, {"n1"}), 10)  # asked again: still one
    assert snapshots.checkSerializing() == (SERIALIZER_STATE.SERIALIZING, 9)
    durable["through"] = 10
    assert snapshots.checkSerializing() == (SERIALIZER_STATE.SUCCESS, 9)
    assert snapshots.current is not None and snapshots.current.index == 10


def test_durable_through_counts_only_the_entries_handed_over(tmp_path: Path, d: Driver) -> None:
    writer = ArchiveWriter(ArchiveStore(str(tmp_path)))
    assert writer.durable_through(1_000)  # nothing handed over: nothing to wait for
    gate = threading.Event()
    store_write = writer.store.write

    def slow_write(rows: Any, through: int, purged: Any = ()) -> None:
        gate.wait(10)
        store_write(rows, through, purged)

    writer.store.write = slow_write  # type: ignore[method-assign]
    writer.start()
    try:
        leaving = leave_after(d, 2)
        writer.put(20, leaving)
        assert writer.durable_through(19)
        assert not writer.durable_through(20) and not writer.durable_through(25)
        # Until committed, the jobs are read from the hand-over (they are in no state now).
        first = leaving[0][1]
        assert writer.pending_job(first.id) is first
        assert writer.pending_jobs() == [job for _, job in leaving]
        assert writer.store.get(first.id) is None
        gate.set()
        assert writer.wait_durable(25, 10)
        assert writer.durable_through(25)
        assert writer.pending_job(first.id) is None and writer.pending_jobs() == []
        assert writer.store.get(first.id) is not None
    finally:
        gate.set()
        writer.stop()


def test_a_write_that_fails_is_retried_and_named_until_it_succeeds(
        tmp_path: Path, d: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("raftcron.cluster.archive.writer.RETRY_S", 0.05)
    writer = ArchiveWriter(ArchiveStore(str(tmp_path)))
    failures = {"left": 3}
    store_write = writer.store.write
    seen: list[str | None] = []

    def failing_write(rows: Any, through: int, purged: Any = ()) -> None:
        if failures["left"]:
            failures["left"] -= 1
            seen.append(writer.problem)
            raise ArchiveError("cannot write the archive: disk I/O error")
        store_write(rows, through, purged)

    writer.store.write = failing_write  # type: ignore[method-assign]
    writer.start()
    try:
        writer.put(3, leave_after(d, 1))
        assert writer.wait_durable(3, 10)
    finally:
        writer.stop()
    assert seen[1:] == ["cannot write the archive: disk I/O error"] * 2  # named while failing
    assert writer.problem is None
    assert writer.store.get(1) is not None


def test_a_full_hand_over_holds_the_applying_thread_until_the_writer_catches_up(
        tmp_path: Path, d: Driver) -> None:
    writer = ArchiveWriter(ArchiveStore(str(tmp_path)), pending_max=2)
    writer.put(1, leave_after(d, 2))  # the writer is not running yet: 2 pending
    done = threading.Event()

    def hand_over() -> None:
        writer.wait_for_room()
        writer.put(2, leave_after(Driver(), 1))
        done.set()

    thread = threading.Thread(target=hand_over)
    thread.start()
    try:
        assert not done.wait(0.3)  # held: the bound is reached
        writer.start()
        assert done.wait(10)
        assert writer.wait_durable(2, 10)
    finally:
        thread.join(10)
        writer.stop()


def test_an_archive_of_another_schema_is_refused_naming_both(tmp_path: Path) -> None:
    ArchiveStore(str(tmp_path)).close()
    db = sqlite3.connect(tmp_path / "archive.sqlite")
    db.execute("UPDATE meta SET value = 99 WHERE name = 'schema'")
    db.commit()
    db.close()
    with pytest.raises(ArchiveError, match="of schema 99; this release reads 1"):
        ArchiveStore(str(tmp_path))


def test_rows_below_the_floor_go_with_their_totals_even_those_written_late(
        tmp_path: Path) -> None:
    d = Driver()
    d.finalize(retention={"succeeded": {"max_count": 0}})
    d.state.leaving = []
    finished(d, 6)
    d.tick(advance_ms=1)
    leaving, d.state.leaving = d.state.leaving, []
    assert [seq for seq, _ in leaving] == [1, 2, 3, 4, 5, 6]
    writer = ArchiveWriter(ArchiveStore(str(tmp_path)))
    writer.start()
    try:
        writer.put(5, leaving[:4])
        assert writer.wait_durable(5, 10)
        writer.set_floor(3)  # rows 1 and 2 go
        # Rows 5 and 6 arrive after a floor that passed them already (a tiny archive).
        writer.set_floor(7)
        writer.put(6, leaving[4:])
        assert writer.wait_durable(6, 10)
        deadline = time.monotonic() + 10
        while writer.store.totals()["rows"] and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        writer.stop()
    assert writer.store.totals()["rows"] == 0 and writer.store.totals()["row_bytes"] == 0
    pre_gate = Row.of_view(job_view(leaving[0][1]), 1, seq=0)
    writer.store.write([pre_gate], 7)
    assert writer.store.trim(10**9) == 0  # archived before the gate: no number, kept


def test_an_unexpected_error_in_the_writer_is_named_retried_and_never_ends_the_thread(
        tmp_path: Path, d: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("raftcron.cluster.archive.writer.RETRY_S", 0.05)
    real_view = job_view
    failures = {"left": 2}
    seen: list[str | None] = []
    writer = ArchiveWriter(ArchiveStore(str(tmp_path)))

    def failing_view(job: Any, **options: Any) -> Any:
        if failures["left"]:
            failures["left"] -= 1
            seen.append(writer.problem)
            raise KeyError("a field the view did not expect")
        return real_view(job, **options)

    monkeypatch.setattr("raftcron.cluster.archive.writer.job_view", failing_view)
    writer.start()
    try:
        writer.put(4, leave_after(d, 2))
        assert writer.wait_durable(4, 10)
    finally:
        writer.stop()
    assert seen[1] is not None and seen[1].startswith("unexpected KeyError"), seen
    assert writer.problem is None and writer._thread.is_alive() is False
    assert writer.store.get(1) is not None and writer.store.get(2) is not None
