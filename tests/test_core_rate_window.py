"""A queue's rate limit as an exact window once the cluster is finalized (DESIGN.md §9.4):
at most `max` starts in ANY window of `per_ms` ms of state time; the bucket for limits put
before finalize (kept until put again) and for those asking for `burst`."""

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftcron.scheduler import queues
from raftcron.scheduler.commands import ClaimJobs
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.flowcommands import PauseQueue, PutQueue, ResumeQueue
from raftcron.scheduler.flowspecs import QueueSpec
from raftcron.scheduler.flowviews import queue_view
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.snapshot import restore, snapshot


def put_queue(d: Driver, name: str = "default", **spec: Any) -> None:
    d.ok(PutQueue(d.request_id(), name, QueueSpec.parse(spec)))


def finalized() -> Driver:
    d = Driver()
    d.finalize()
    d.tick()  # the finalize leaves its first eviction pass to the next Tick
    assert d.state.next_due_ms() is None
    return d


def claimed(d: Driver, count: int = 50) -> int:
    return len(d.claim(max=count))


def test_a_window_starts_max_in_any_window_not_twice_max_across_its_edge() -> None:
    d = finalized()
    put_queue(d, rate_limit={"max": 5, "per_ms": 250})  # slices of 1 ms: exact
    d.submit_many(40)
    assert claimed(d, 3) == 3
    d.tick(advance_ms=100)
    assert claimed(d) == 2  # 5 in the window that began 100 ms ago
    d.tick(advance_ms=149)
    assert claimed(d) == 0  # a bucket would have refilled 3 tokens by now
    d.tick(advance_ms=1)  # the first 3 starts leave the window
    assert claimed(d) == 3
    d.tick(advance_ms=99)
    assert claimed(d) == 0
    d.tick(advance_ms=1)  # the 2 starts made at +100 leave
    assert claimed(d) == 2
    view = queue_view(d.state, "default")
    assert view["rate_rule"] == "window" and view["tokens"] == 0
    assert view["held"]["queue_rate"] == 40 - 10
    assert violations(d.state) == []


def test_the_ticker_is_told_when_a_full_window_opens() -> None:
    d = finalized()
    put_queue(d, rate_limit={"max": 2, "per_ms": 200})
    d.submit_many(5)
    start = d.now_ms
    assert claimed(d) == 2
    assert d.state.next_due_ms() == start + 200
    d.tick(advance_ms=200)
    assert claimed(d) == 2
    assert claimed(d) == 0
    assert d.state.next_due_ms() == start + 400
    d.tick(advance_ms=200)
    assert claimed(d) == 1
    # Nothing waits in the queue: what is due next is the first lease's end, not the window.
    assert d.state.next_due_ms() == start + 30_000


def test_a_long_window_counts_starts_at_the_end_of_their_slice_late_never_early() -> None:
    d = finalized()
    put_queue(d, rate_limit={"max": 1, "per_ms": 60_000})  # slices of 235 ms
    d.submit_many(3)
    start = d.now_ms
    assert claimed(d) == 1
    slice_end = start - start % 235 + 234
    d.tick(start + 60_000 - 1)
    assert claimed(d) == 0
    d.tick(slice_end + 60_000 - 1)
    assert claimed(d) == 0
    assert d.state.next_due_ms() == slice_end + 60_000
    d.tick(slice_end + 60_000)
    assert claimed(d) == 1


def test_a_limit_put_before_finalize_keeps_the_bucket_until_it_is_put_again() -> None:
    d = Driver()
    put_queue(d, rate_limit={"max": 5, "per_ms": 1_000})
    d.submit_many(30)
    assert claimed(d) == 5
    d.finalize()
    d.ok(PauseQueue(d.request_id(), "default"))
    d.ok(ResumeQueue(d.request_id(), "default"))  # pausing is not putting the limit again
    assert queue_view(d.state, "default")["rate_rule"] == "bucket"
    d.tick(advance_ms=1_000)
    assert claimed(d) == 5  # the bucket's refill
    d.tick(advance_ms=400)
    assert claimed(d) == 2
    put_queue(d, rate_limit={"max": 5, "per_ms": 1_000})  # put again: the window from now
    assert queue_view(d.state, "default")["rate_rule"] == "window"
    # The tokens the bucket had spent count as starts made now: no fresh burst.
    assert claimed(d) == 0
    d.tick(advance_ms=999)
    assert claimed(d) == 0
    d.tick(advance_ms=4)
    assert claimed(d) == 5


def test_burst_asks_for_a_bucket_and_is_refused_before_finalize() -> None:
    d = Driver()
    with pytest.raises(Refused) as refused:
        put_queue(d, rate_limit={"max": 5, "per_ms": 1_000, "burst": 20})
    assert refused.value.rejected.code == "not_finalized"
    assert refused.value.rejected.field == "rate_limit.burst"
    assert d.state.queues == {}
    d.finalize()
    put_queue(d, rate_limit={"max": 5, "per_ms": 1_000, "burst": 20})
    d.submit_many(50)
    assert claimed(d) == 20  # the burst at once
    d.tick(advance_ms=1_000)
    assert claimed(d) == 5  # then max per per_ms
    view = queue_view(d.state, "default")
    assert view["rate_rule"] == "bucket"
    assert view["rate_limit"] == {"max": 5, "per_ms": 1_000, "burst": 20}
    assert violations(d.state) == []


def test_a_changed_window_keeps_its_starts_and_grants_no_fresh_burst() -> None:
    d = finalized()
    put_queue(d, rate_limit={"max": 10, "per_ms": 250})
    d.submit_many(40)
    assert claimed(d, 8) == 8
    put_queue(d, rate_limit={"max": 20, "per_ms": 250})
    assert claimed(d) == 12
    put_queue(d, rate_limit={"max": 4, "per_ms": 100})  # the 20 starts still count
    assert claimed(d) == 0
    d.tick(advance_ms=100)
    assert claimed(d) == 4
    assert violations(d.state) == []


def test_a_window_survives_snapshot_and_restore_exactly() -> None:
    d = finalized()
    put_queue(d, "q", rate_limit={"max": 3, "per_ms": 1_000})
    d.submit_many(10, queue="q")
    assert len(d.claim(queues=("q",), max=2)) == 2
    d.tick(advance_ms=300)
    assert len(d.claim(queues=("q",), max=5)) == 1
    again = Driver(restore(snapshot(d.state)))
    assert snapshot(again.state) == snapshot(d.state)
    claim = ClaimJobs("after-restore", "w1", ("q",), 5, 30_000, ())
    for replica in (d, again):
        replica.tick(advance_ms=699)
        assert replica.ok(claim)["jobs"] == []
        replica.tick(advance_ms=4)  # the two first starts leave the window (slices of 4 ms)
    answers = [replica.ok(dataclasses.replace(claim, request_id="later")) for replica in (d, again)]
    assert len(answers[0]["jobs"]) == 2 and answers[0] == answers[1]
    assert snapshot(again.state) == snapshot(d.state)


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 6),
    per_ms=st.sampled_from([50, 256, 1_000, 7_777]),
    steps=st.lists(st.tuples(st.integers(0, 3_000), st.integers(1, 8)), min_size=1, max_size=40),
)
def test_no_window_ever_holds_more_than_max_and_none_opens_a_slice_late(
    limit: int, per_ms: int, steps: list[tuple[int, int]]
) -> None:
    """Against the rule itself: every window [s, s + per_ms) of start times holds at most
    `max`, and a claim gets what the exact rule allows as of one slice earlier."""
    control = queues.QueueControl(
        QueueSpec.parse({"rate_limit": {"max": limit, "per_ms": per_ms}}), 0, queues.WINDOW
    )
    slice_ms = -(-per_ms // queues.LOG_RUNS_MAX)
    starts: list[int] = []
    now = 10_000
    for advance, wanted in steps:
        now += advance
        allowed = queues.tokens_at(control, now)
        assert allowed is not None
        exact_then = limit - sum(1 for t in starts if t > now - slice_ms - per_ms)
        assert allowed >= min(limit, max(0, exact_then)), "a window opened more than a slice late"
        taken = min(allowed, wanted)
        queues.spend(control, now, taken)
        starts += [now] * taken
        for s in starts:
            assert sum(1 for t in starts if s <= t < s + per_ms) <= limit
    assert len(control.log) // 2 <= queues.LOG_RUNS_MAX + 1


def test_a_start_log_stays_within_its_slices_however_many_starts_it_records() -> None:
    """The memory bound of a window (4 KiB a queue, 33 runs a key) pushed past: 20,000 starts
    at distinct milliseconds of one minute's window keep at most slices + 1 runs."""
    from array import array

    from raftcron.scheduler.ratekeys import KEY_RUNS_MAX
    from raftcron.scheduler.startlog import record_starts

    for runs_max in (queues.LOG_RUNS_MAX, KEY_RUNS_MAX):
        log = array("q")
        for at in range(20_000):
            record_starts(log, 1_000_000 + at * 3, 1, 60_000, runs_max)
            assert len(log) // 2 <= runs_max + 1
        assert sum(log[1::2]) == 20_000  # every start still counted (all within the window)
