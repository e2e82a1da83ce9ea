"""The request-id table (DESIGN.md §8.2): a retry within the client's deadline is never applied
twice, however many requests and consistent reads came between; the table is bounded by bytes
and by time."""

from __future__ import annotations

import gc
import tracemalloc
import uuid

import pytest
from snapshot_v1 import as_version_1

from raftcron.scheduler import limits
from raftcron.scheduler.commands import Barrier, SubmitJobs, Tick
from raftcron.scheduler.errors import Ok, Rejected
from raftcron.scheduler.requests import RequestLog
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec
from raftcron.scheduler.state import SchedulerState

T0_MS = 1_800_000_000_000


def submit(request_id: str, key: str | None = None) -> SubmitJobs:
    return SubmitJobs(request_id, (JobSpec.parse({"task": "t", "key": key}),))


def test_250k_request_ids_and_consistent_reads_between_do_not_make_a_late_retry_a_duplicate():
    """E16 of the wave-2 audit: the first submit's id was evicted by a count cap (200,000), and
    every `?consistent=1` read (a Barrier with a fresh id) took a slot."""
    state = SchedulerState()
    state.apply(Tick(T0_MS))
    first = state.apply(submit("client-req-1"))
    assert first == Ok({"jobs": [[1, True]]})
    state.apply(submit("keyed-0", key="k"))  # job 2; every later one answers it (cheap, Ok)
    now_ms = T0_MS
    for n in range(250_000):
        assert isinstance(state.apply(submit(f"other-{n}", key="k")), Ok)
        state.apply(Barrier(uuid.UUID(int=n).hex))  # a consistent read
        if n % 1_000 == 0:
            now_ms += 1_000  # 250 s in all: well inside a client's retry deadline
            state.apply(Tick(now_ms))
    retried = state.apply(submit("client-req-1"))
    assert retried == first
    assert len(state.table) == 2


def test_a_barrier_takes_no_place_in_the_table_and_still_commits():
    state = SchedulerState()
    state.apply(Tick(T0_MS))
    assert state.apply(Barrier("audit:1")) == Ok({})
    assert len(state.requests) == 0


def test_past_its_byte_budget_the_table_drops_only_entries_older_than_the_retry_window():
    log = RequestLog(bytes_max=10_000, hard_bytes_max=40_000)
    value = {"jobs": [[n, True] for n in range(20)]}
    log.remember("old", 1, 0, value, T0_MS)
    later_ms = T0_MS + limits.REQUEST_RETRY_MS
    for n in range(200):
        log.remember(f"new-{n}", 1, 0, value, later_ms)
    assert log.get("old") is None  # over budget and past the retry window: dropped
    assert log.get("new-0") is not None  # over budget but young: kept
    assert log.bytes > log.bytes_max
    assert log.full()  # the hard cap: the state refuses new requests until time passes


def test_a_full_table_refuses_a_new_request_and_answers_a_retry():
    state = SchedulerState()
    state.requests = RequestLog(bytes_max=1_000, hard_bytes_max=2_000)
    state.apply(Tick(T0_MS))
    first = state.apply(submit("r-1"))
    n = 2
    while not state.requests.full():
        assert isinstance(state.apply(submit(f"r-{n}", key="k")), Ok)
        n += 1
    refused = state.apply(submit("r-new"))
    assert isinstance(refused, Rejected) and refused.code == "busy"
    assert refused.http_status == 503
    assert state.apply(submit("r-1")) == first  # a retry is still answered
    jobs = len(state.table)
    state.apply(Tick(T0_MS + limits.REQUEST_RETRY_MS + 1))
    state.apply(Tick(T0_MS + limits.REQUEST_WINDOW_MS + 1))
    assert not state.requests.full()
    assert isinstance(state.apply(submit("r-new")), Ok) and len(state.table) == jobs + 1


def test_entries_expire_after_the_window_and_the_bytes_follow():
    log = RequestLog()
    log.remember("a", 1, 0, {"jobs": [[1, True]]}, T0_MS)
    assert log.bytes > 0
    log.expire(T0_MS + limits.REQUEST_WINDOW_MS)
    assert log.get("a") is None and log.bytes == 0 and len(log) == 0


@pytest.mark.parametrize("version", [1, 2])
def test_the_table_survives_a_snapshot_of_this_and_of_the_previous_format(version: int):
    state = SchedulerState()
    state.apply(Tick(T0_MS))
    first = state.apply(submit("r-1"))
    blob = snapshot(state)  # no format 3 section in use: format 2, as the release before wrote
    if version == 1:  # the 0.1 layout: the result value itself, not its msgpack bytes
        blob = as_version_1(blob)
    restored = restore(blob)
    assert restored.requests.get("r-1") == state.requests.get("r-1")
    assert restored.requests.bytes == state.requests.bytes
    assert restored.apply(submit("r-1")) == first
    if version == 2:
        assert snapshot(restored) == blob


@pytest.mark.parametrize("count", [20_000, 21_900])  # a dict near full, and just grown
def test_an_entry_takes_about_the_memory_the_budget_counts_for_it(count: int):
    """What the state budget counts for a remembered request (its overhead, the id, the
    answer) is about what it takes: entries with ids as clients make them (a fresh string
    each, as a decoded command holds) and a submit's answer, measured by tracemalloc, within
    10 % (the dict's slots come in powers of two). The entries were tuples of four with
    their ints and a deque of pairs: 1.7 times the count, so a node's memory grew twice as
    fast as its counted state under a steady load."""
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        log = RequestLog()
        for number in range(count):
            log.remember(f"req-{uuid.uuid4().hex}", 3, 2**32 - 1 - number,
                         {"jobs": [[10_000 + number, True]]}, T0_MS + number)
        gc.collect()
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert taken <= 1.1 * log.bytes, (taken / count, log.bytes / count)
    assert log.get(next(iter(log.results))) == (3, 2**32 - 1, {"jobs": [[10_000, True]]})


def test_a_restore_reads_request_ids_one_at_a_time_not_a_list_of_all_of_them():
    """An install on a running follower holds two states; the request ids (most of a busy
    state) were unpacked whole beside the table built from them: the restore's peak was 2.5
    times what it kept, now about 1.3 (the read buffer and the last entries in flight)."""
    state = SchedulerState()
    state.apply(Tick(T0_MS))
    for number in range(20_000):
        state.requests.remember(f"req-{uuid.uuid4().hex}", 3, number,
                                {"jobs": [[number, True]]}, T0_MS)
    blob = snapshot(state)
    del state
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        restored = restore(blob)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(restored.requests) == 20_000
    assert peak - before <= 1.6 * (kept - before), (peak - before) / (kept - before)
