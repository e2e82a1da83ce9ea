"""Archive retention in the core (scheduler/archiving.py): once the cluster is finalized every
job that leaves is numbered and counted by the minute it left in; a Tick moves the floor past
whole minutes older than `max_age_ms` or beyond `max_bytes`, the same on every replica and
across snapshot and restore."""

from __future__ import annotations

import pytest

from raftcron.scheduler import limits
from raftcron.scheduler.archiving import BUCKETS_DROPPED_PER_TICK_MAX, ArchiveLedger
from raftcron.scheduler.commands import Ack
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.settings import ArchiveRetention, parse_section
from raftcron.scheduler.snapshot import digest, restore, snapshot

MINUTE = limits.MINUTE_MS


def finish(d: Driver, count: int, **fields: object) -> list[int]:
    ids = d.submit_many(count, max_attempts=1, **fields)
    claimed = d.claim(max=count)
    d.claim(max=0, acks=tuple(Ack(i, t, "succeeded") for i, t in claimed))
    return ids


@pytest.fixture
def d() -> Driver:
    driver = Driver()
    driver.finalize(retention={"succeeded": {"max_count": 0}})  # every finished job leaves
    driver.state.leaving = []
    return driver


def left(d: Driver) -> list[tuple[int, int]]:
    """(seq, job id) of what left since the last call."""
    leaving, d.state.leaving = d.state.leaving or [], []
    return [(seq, job.id) for seq, job in leaving]


def test_each_job_that_leaves_is_numbered_in_order(d: Driver) -> None:
    ids = finish(d, 5)
    d.tick(advance_ms=1)
    assert left(d) == list(zip(range(1, 6), ids, strict=True))
    ledger = d.state.archive_ledger
    assert ledger.next_seq == 6 and ledger.floor == 1 and ledger.bytes > 0


def test_the_floor_passes_minutes_older_than_the_age_whole(d: Driver) -> None:
    d.put_settings("archive", {"max_age_ms": limits.HOUR_MS})
    finish(d, 3)
    d.tick(advance_ms=1)
    d.tick(advance_ms=MINUTE)  # the next minute
    finish(d, 2)
    d.tick(advance_ms=1)
    assert [seq for seq, _ in left(d)] == [1, 2, 3, 4, 5]
    ledger = d.state.archive_ledger
    first_minute = ledger.buckets[0][0]
    # Its last row is older than an hour from first_minute + 61 min on: not a ms before.
    d.tick(advance_ms=first_minute + 61 * MINUTE - 1 - d.now_ms)
    assert ledger.floor == 1
    d.tick(advance_ms=1)
    assert ledger.floor == 4  # its three rows go, together
    d.tick(advance_ms=MINUTE)
    assert ledger.floor == 6 and ledger.bytes == 0


def test_the_floor_passes_the_oldest_minutes_beyond_the_bytes(d: Driver) -> None:
    for _ in range(3):  # three minutes of ten jobs of 50 KB: about 1.5 MB
        finish(d, 10, payload="x" * 50_000)
        d.tick(advance_ms=MINUTE)
    ledger = d.state.archive_ledger
    per_minute = ledger.bytes // 3
    assert 2 * per_minute < 1 << 20 < 3 * per_minute
    d.put_settings("archive", {"max_bytes": 1 << 20})
    d.tick(advance_ms=1)
    assert ledger.floor == 11 and ledger.bytes == 2 * per_minute  # the oldest minute went


def test_a_lowered_age_drops_many_minutes_over_ticks_and_asks_for_the_next() -> None:
    ledger = ArchiveLedger()
    for minute in range(BUCKETS_DROPPED_PER_TICK_MAX + 5):
        ledger.record(minute * MINUTE, 100)
    rule = ArchiveRetention(max_age_ms=limits.HOUR_MS)
    now = (BUCKETS_DROPPED_PER_TICK_MAX + 5 + 61) * MINUTE
    assert ledger.trim(now, rule) is True  # bounded: more is left
    assert ledger.floor == BUCKETS_DROPPED_PER_TICK_MAX + 1
    assert ledger.trim(now, rule) is False
    assert ledger.bytes == 0 and ledger.floor == ledger.next_seq


def test_the_ledger_is_replicated_state_the_same_after_a_restore(d: Driver) -> None:
    d.put_settings("archive", {"max_age_ms": limits.HOUR_MS})
    for _ in range(5):
        finish(d, 4)
        d.tick(advance_ms=20 * MINUTE)
    copy = Driver(restore(snapshot(d.state)))
    assert copy.state.archive_ledger.to_list() == d.state.archive_ledger.to_list()
    assert digest(copy.state) == digest(d.state)
    for driver in (d, copy):
        driver.tick(advance_ms=30 * MINUTE)
    assert copy.state.archive_ledger.to_list() == d.state.archive_ledger.to_list()
    assert d.state.archive_ledger.floor > 1


def test_before_the_gate_nothing_is_numbered_and_the_setting_is_refused() -> None:
    d = Driver()
    d.state.leaving = []
    ids = finish(d, 2)
    d.tick(advance_ms=limits.RETENTION_MS_DEFAULT + 1)
    assert left(d) == [(0, ids[0]), (0, ids[1])]
    assert d.state.archive_ledger.next_seq == 1
    with pytest.raises(Refused) as refused:
        d.put_settings("archive", {"max_age_ms": limits.HOUR_MS})
    assert refused.value.code == "not_finalized"


@pytest.mark.parametrize("value, field", [
    ({"max_age_ms": 1}, "archive.max_age_ms"),
    ({"max_bytes": 1024}, "archive.max_bytes"),
    ({"max_rows": 5}, "archive.max_rows"),
])
def test_an_archive_setting_out_of_bounds_is_refused_naming_the_field(
        value: dict[str, int], field: str) -> None:
    with pytest.raises(Invalid) as refused:
        parse_section("archive", value)
    assert refused.value.field == field
