"""Purge in the core (scheduler/purging.py): finished jobs leave for good, live ones without
being handed to the archive, archived ones by a tombstone every member's archive deletes and
keeps deleted until retention's floor passes it; refused before the upgrade gate; the same on
every replica, across snapshot and restore."""

from __future__ import annotations

import pytest
from test_core_archiving import finish

from raftcron.scheduler import limits, sizes
from raftcron.scheduler.commands import CancelJob
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.purging import PURGE_IDS_MAX, PurgeJobs
from raftcron.scheduler.snapshot import digest, restore, snapshot


@pytest.fixture
def d() -> Driver:
    driver = Driver()
    driver.finalize(retention={"succeeded": {"max_count": 3}})  # the oldest leave
    driver.state.leaving = []
    driver.state.archive_ledger.purging = []
    return driver


def purge(d: Driver, *ids: int) -> dict[str, int]:
    return d.ok(PurgeJobs(d.request_id(), ids))


def test_a_live_finished_job_leaves_without_a_row_and_an_archived_one_gets_a_tombstone(
        d: Driver) -> None:
    ids = finish(d, 5)
    d.tick(advance_ms=1)
    archived = [job.id for _, job in d.state.leaving or []]
    assert archived == ids[:2]  # 3 kept, the 2 oldest left for the archive
    d.state.leaving = []
    queued = d.submit(max_attempts=1)
    assert purge(d, ids[0], ids[4], queued) == {"purged": 2, "skipped": 1}
    ledger = d.state.archive_ledger
    # The archived one: a tombstone, handed to the archive to delete; the live one: gone,
    # never handed over (no member writes a row for it); the queued one: untouched.
    assert ledger.tombstones == {ids[0]: ledger.next_seq} and ledger.purging == [ids[0]]
    assert d.state.leaving == []
    assert d.state.table.get(ids[4]) is None and d.state.table.get(queued) is not None
    assert d.state.state_bytes() >= sizes.TOMBSTONE_BYTES


def test_a_failed_parent_with_a_dependent_left_is_not_purged(d: Driver) -> None:
    parent = d.submit(task="p")
    child = d.submit(task="c", depends_on=[parent])
    d.ok(CancelJob(d.request_id(), parent, None))  # the child stays, blocked
    assert purge(d, parent) == {"purged": 0, "skipped": 1}
    assert d.state.table.get(child) is not None


def test_tombstones_go_once_archive_retention_passes_them(d: Driver) -> None:
    d.put_settings("archive", {"max_age_ms": limits.HOUR_MS})
    ids = finish(d, 6)
    d.tick(advance_ms=1)
    purge(d, ids[0], ids[1])
    assert len(d.state.archive_ledger.tombstones) == 2
    d.tick(advance_ms=limits.HOUR_MS + 2 * limits.MINUTE_MS)  # their minute is past the age
    assert d.state.archive_ledger.floor > min(d.state.archive_ledger.tombstones.values(),
                                              default=0)
    assert d.state.archive_ledger.tombstones == {}


def test_tombstones_survive_snapshot_and_restore_and_count_in_the_digest(d: Driver) -> None:
    ids = finish(d, 5)
    d.tick(advance_ms=1)
    before = digest(d.state)
    purge(d, ids[0])
    assert digest(d.state) != before
    again = restore(snapshot(d.state))
    assert again.archive_ledger.tombstones == d.state.archive_ledger.tombstones
    assert digest(again) == digest(d.state)


def test_purge_is_refused_before_the_cluster_is_finalized() -> None:
    d = Driver()
    ids = finish(d, 1)
    with pytest.raises(Refused) as refused:
        d.ok(PurgeJobs(d.request_id(), (ids[0],)))
    assert refused.value.rejected.code == "not_finalized"
    assert d.state.table.get(ids[0]) is not None


@pytest.mark.parametrize("ids, message", [
    ([], "1 to"),
    (list(range(1, PURGE_IDS_MAX + 2)), "1 to"),
    ([1, 1], "twice"),
    ([0], "between"),
    (["1"], "integer"),
])
def test_a_purge_command_that_does_not_parse_names_ids(ids: list[object], message: str) -> None:
    with pytest.raises(Invalid, match=message) as error:
        PurgeJobs.from_wire({"ids": ids})
    assert error.value.field == "ids"


def test_decode_of_encode_gives_the_command_back() -> None:
    command = PurgeJobs("r-1", (5, 3, 9))
    assert PurgeJobs.from_wire(command.to_wire()) == command


def test_tombstones_past_the_budget_evict_finished_jobs_to_stay_within_it() -> None:
    """Purges are never refused for space; their tombstones count in the state, so past the
    budget finished jobs are evicted, as for anything else the state holds."""
    d = Driver()
    d.finalize(budget={"bytes": 1 << 20}, retention={"succeeded": {"max_count": 999}})
    kept = finish(d, 1_000)
    d.tick(advance_ms=1)  # the oldest leaves for the archive: tombstones from now are kept
    assert d.state.state_bytes() < 1 << 20
    assert sum(d.state.table.get(job_id) is not None for job_id in kept) == 999
    phantom = 10**9  # ids no state holds: archived elsewhere, as far as a purge knows
    for first in range(phantom, phantom + 8_000, PURGE_IDS_MAX):
        purge(d, *range(first, first + PURGE_IDS_MAX))
    d.tick(advance_ms=1)
    assert d.state.archive_ledger.tombstone_bytes == 8_000 * sizes.TOMBSTONE_BYTES
    assert d.state.state_bytes() <= 1 << 20
    assert sum(d.state.table.get(job_id) is not None for job_id in kept) < 999
