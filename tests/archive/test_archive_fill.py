"""Gaps in a member's archive and their filling from a peer (cluster/archive/store.py, writer.py,
fill.py): a snapshot that jumps over evictions leaves a recorded gap; a peer answers only as far
as it can vouch for; filled rows never replace the member's own; retention shrinks gaps."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from raftcron.cluster.archive.fill import (
    COMPLETE_HEADER,
    LOCAL_HEADER,
    forward_read,
    parse_rows_answer,
)
from raftcron.cluster.archive.node import NodeArchive
from raftcron.cluster.archive.store import ArchiveStore, Row
from raftcron.cluster.archive.writer import ArchiveWriter
from raftcron.cluster.clients.peerhttp import PeerDialer
from raftcron.scheduler.commands import Ack
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.views import job_view


@pytest.fixture
def d() -> Driver:
    driver = Driver()
    driver.finalize(retention={"succeeded": {"max_count": 0}})  # every finished job leaves
    driver.state.leaving = []
    return driver


def evict(d: Driver, count: int) -> list[tuple[int, Any]]:
    """`count` jobs finish and leave: (seq, job) as the state hands them over."""
    ids = d.submit_many(count, max_attempts=1, payload={"n": 1})
    claimed = d.claim(max=count)
    d.claim(max=0, acks=tuple(Ack(i, t, "succeeded") for i, t in claimed))
    d.tick(advance_ms=1)
    leaving, d.state.leaving = d.state.leaving or [], []
    assert sorted(job.id for _, job in leaving) == ids
    return leaving


def rows_of(leaving: list[tuple[int, Any]], index: int = 1) -> list[Row]:
    return [Row.of_view(job_view(job), index, seq) for seq, job in leaving]


def test_a_peer_answers_its_rows_only_as_far_as_it_holds_them_all(
        tmp_path: Path, d: Driver) -> None:
    peer = ArchiveStore(str(tmp_path))
    rows = rows_of(evict(d, 10))  # numbered 1..10
    peer.write(rows[:4], 1)
    assert peer.next_seq() == 5
    peer.record_gap(5, 8)  # it missed 5..7 itself
    peer.write(rows[7:], 2)
    assert peer.next_seq() == 11 and peer.gaps() == [(5, 8)]
    found, to = peer.rows_by_seq(1, 20)
    assert [r.seq for r in found] == [1, 2, 3, 4] and to == 5  # stops before its gap
    assert found == rows[:4]
    assert peer.rows_by_seq(5, 20) == ([], 5)  # inside its gap: nothing it can vouch for
    found, to = peer.rows_by_seq(8, 20)
    assert [r.seq for r in found] == [8, 9, 10] and to == 11  # not past what it has written
    found, to = peer.rows_by_seq(1, 20, rows_max=2)
    assert [r.seq for r in found] == [1, 2] and to == 3  # cut short: the next ask goes on
    found, to = peer.rows_by_seq(1, 20, bytes_max=1)
    assert [r.seq for r in found] == [1] and to == 2


def test_a_fill_writes_the_peers_rows_shrinks_the_gap_and_keeps_the_members_own(
        tmp_path: Path, d: Driver) -> None:
    store = ArchiveStore(str(tmp_path))
    rows = rows_of(evict(d, 6))
    store.record_gap(1, 7)
    own = Row.of_view({**json.loads(rows[2].doc), "result": "own"}, 5, rows[2].seq)
    store.write([own], 5)  # replayed from its own log meanwhile: it stands
    assert store.fill(rows[:4], 1, 5) == 3  # rows 1..4, of which 3 new
    assert store.gaps() == [(5, 7)]
    assert store.get(rows[2].id) == json.loads(own.doc)
    assert store.fill(rows[4:], 5, 7) == 2
    assert store.gaps() == []
    assert store.fill(rows, 1, 7) == 0  # no such gap any more: nothing written
    totals = store.totals()
    assert totals["rows"] == 6 and totals["missing_jobs"] == 0
    assert totals["row_bytes"] == sum(r.bytes for r in [*rows[:2], own, *rows[3:]])


def test_retention_shrinks_the_gaps_below_its_floor(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    store.record_gap(3, 8)
    store.record_gap(10, 12)
    store.trim(5)
    assert store.gaps() == [(5, 8), (10, 12)]
    store.trim(9)
    assert store.gaps() == [(10, 12)]
    assert store.totals()["missing_jobs"] == 2


def test_a_snapshot_past_evictions_is_recorded_as_a_gap_and_filled(
        tmp_path: Path, d: Driver) -> None:
    peer_dir, member_dir = tmp_path / "peer", tmp_path / "member"
    peer_dir.mkdir()
    member_dir.mkdir()
    peer = ArchiveStore(str(peer_dir))
    first, later = evict(d, 3), evict(d, 4)  # numbered 1..3, then 4..7
    peer.write(rows_of(first) + rows_of(later, 2), 2)
    writer = ArchiveWriter(ArchiveStore(str(member_dir)))
    writer.start()
    try:
        writer.put(1, first)  # applied from the log: written here
        assert writer.wait_durable(1, 10)
        # Then a snapshot installed from the leader, past the entry that evicted 4..7.
        writer.restored(d.state.archive_ledger.next_seq, d.state.archive_ledger.floor)
        writer.restored(d.state.archive_ledger.next_seq, 1)  # again (a restart): no new gap
        wait_for(lambda: writer.gaps == [(4, 8)])
        rows, to = peer.rows_by_seq(4, 8)
        assert writer.fill(rows, 4, to).result(10) == 4
        assert writer.gaps == []
    finally:
        writer.stop()
    member = ArchiveStore(str(member_dir), readonly=True)
    for _, job in first + later:
        assert member.get(job.id) == job_view(job)


def test_a_member_restarted_on_its_own_snapshot_records_no_gap(
        tmp_path: Path, d: Driver) -> None:
    leaving = evict(d, 3)
    store = ArchiveStore(str(tmp_path))
    store.write(rows_of(leaving), 1)
    writer = ArchiveWriter(store)
    writer.start()
    try:
        writer.restored(d.state.archive_ledger.next_seq, 1)  # its snapshot waited for these
        writer.put(2, evict(d, 1))
        assert writer.wait_durable(2, 10)
        assert writer.gaps == [] and store.gaps() == []
    finally:
        writer.stop()


DOC = '{"id":1,"task":"t"}'  # a document of job 1, as of_view writes them: its id first


@pytest.mark.parametrize("body, message", [
    ({"rows": [], "to_seq": 9}, "to_seq 9 outside"),
    ({"rows": [], "to_seq": 1}, "to_seq 1 outside"),
    ({"rows": "x", "to_seq": 3}, "not {rows, to_seq}"),
    ({"rows": [[1, "t"]], "to_seq": 3}, "13 fields"),
    ({"rows": [[1, "t", "q", "succeeded", None, None, None, None, 0, 0, 1, 7, DOC]],
      "to_seq": 4}, "numbered 7, outside [2, 4)"),
    ({"rows": [[1, "t", "q", "succeeded", None, None, None, None, 0, 0, 1, 2, "{\"id\":5}"]],
      "to_seq": 4}, "not the job's"),
    ({"rows": [[1, "t", "q", 3, None, None, None, None, 0, 0, 1, 2, DOC]],
      "to_seq": 4}, "wrong type"),
])
def test_a_peers_answer_that_does_not_hold_together_is_refused_naming_why(
        body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_rows_answer(body, 2, 5)


def wait_for(condition: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_read_is_forwarded_marked_local_with_the_callers_credential() -> None:
    """forward_read asks the peers in turn: the first 200, or for a search the first from a
    member whose archive is whole; the peer is told to answer from its own (never pass it on)."""
    seen: list[tuple[str, str | None, str | None]] = []

    def peer(name: str, status: int, whole: bool) -> web.Application:
        async def answer(request: web.Request) -> web.Response:
            seen.append((name, request.headers.get(LOCAL_HEADER),
                         request.headers.get("Authorization")))
            return web.json_response({"from": name, "path": request.path_qs}, status=status,
                                     headers={COMPLETE_HEADER: "1" if whole else "0"})
        app = web.Application()
        app.router.add_get("/v1/jobs", answer)
        return app

    async def scenario() -> None:
        runners = []
        addresses = []
        for name, status, whole in (("down", 503, True), ("partial", 200, False),
                                    ("whole", 200, True)):
            runner = web.AppRunner(peer(name, status, whole))
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            port = runner.addresses[0][1]
            addresses.append((name, f"127.0.0.1:{port}"))
        try:
            dialer = PeerDialer("http", None)
            got = await forward_read(dialer, addresses, "/v1/jobs?task=a", "Bearer t",
                                     whole=False)
            assert got == (200, {"from": "partial", "path": "/v1/jobs?task=a"})
            got = await forward_read(dialer, addresses, "/v1/jobs?task=a", None, whole=True)
            assert got is not None and got[1]["from"] == "whole"
            assert await forward_read(dialer, addresses[:2], "/v1/jobs", None,
                                      whole=True) is None
        finally:
            for runner in runners:
                await runner.cleanup()

    asyncio.run(scenario())
    assert seen[:2] == [("down", "1", "Bearer t"), ("partial", "1", "Bearer t")]
    assert [name for name, _, _ in seen[2:]] == ["down", "partial", "whole", "down", "partial"]


def test_a_purge_deletes_rows_written_before_and_in_its_batch_and_no_fill_writes_them_again(
        tmp_path: Path, d: Driver) -> None:
    (tmp_path / "peer").mkdir()
    peer = ArchiveStore(str(tmp_path / "peer"))
    member_dir = tmp_path / "member"
    member_dir.mkdir()
    first, later = evict(d, 3), evict(d, 3)  # numbered 1..3, 4..6
    peer.write(rows_of(first) + rows_of(later), 2)  # a peer that has not applied the purge
    writer = ArchiveWriter(ArchiveStore(str(member_dir)))
    tombstones = {first[0][1].id, later[1][1].id}
    writer.purged = lambda job_id: job_id in tombstones
    writer.start()
    try:
        writer.put(1, first)
        writer.put(2, (), [first[0][1].id])  # purged after it was archived
        assert writer.pending_job(first[0][1].id) is None  # readers no longer see it
        assert writer.wait_durable(2, 10)
        # A snapshot past the entry that archived 4..6 and purged 5: a gap, and the purge.
        writer.restored(7, 1, sorted(tombstones))
        wait_for(lambda: writer.gaps == [(4, 7)])
        rows, to = peer.rows_by_seq(4, 7)
        assert writer.fill(rows, 4, to).result(10) == 2  # 4 and 6: never 5
    finally:
        writer.stop()
    member = ArchiveStore(str(member_dir), readonly=True)
    kept = {job.id for _, job in first + later} - tombstones
    assert {job.id for _, job in first + later if member.get(job.id)} == kept
    assert member.totals()["rows"] == len(kept)


def test_a_restored_snapshots_tombstones_delete_the_rows_the_member_still_holds(
        tmp_path: Path, d: Driver) -> None:
    leaving = evict(d, 3)
    store = ArchiveStore(str(tmp_path))
    store.write(rows_of(leaving), 1)  # then the member fell behind a purge of the second
    writer = ArchiveWriter(store)
    writer.start()
    try:
        writer.restored(4, 1, [leaving[1][1].id])
        assert writer.wait_durable(1, 10)
    finally:
        writer.stop()
    assert [store.get(job.id) is not None for _, job in leaving] == [True, False, True]


def test_a_purged_job_is_hidden_by_the_archive_before_its_row_is_deleted(
        tmp_path: Path, d: Driver) -> None:
    """The purge is applied (its tombstone in the state) before the writer deletes the row:
    a read by id in between finds no job, and the archive no longer says it holds it."""
    leaving = evict(d, 2)
    store = ArchiveStore(str(tmp_path))
    store.write(rows_of(leaving), 1)
    archive = NodeArchive(store, ArchiveWriter(store), ArchiveStore(str(tmp_path), readonly=True))
    gone, kept = leaving[0][1].id, leaving[1][1].id
    tombstones: set[int] = set()
    archive.writer.purged = lambda job_id: job_id in tombstones
    assert asyncio.run(archive.get(gone)) is not None
    tombstones.add(gone)  # applied; nothing handed to the (not started) writer yet
    assert store.get(gone) is not None  # the row is still in the file
    assert asyncio.run(archive.get(gone)) is None
    assert not asyncio.run(archive.holds(gone))
    assert asyncio.run(archive.get(kept)) == {**job_view(leaving[1][1]), "archived": True}
