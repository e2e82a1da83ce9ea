"""The dashboard charts' samples (cluster/ops/activity.py): rates from cumulative counters, across
resets and gaps, claim latency quantiles from histogram buckets, and the ring's bounds.
Pure: every reading is made here, with the times it carries."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raftcron.cluster.ops import activity
from raftcron.cluster.ops.activity import (
    QUEUES_PER_SAMPLE_MAX,
    SAMPLES_KEPT,
    ActivityReading,
    ActivityRing,
    bucket_increase,
    increase,
    quantile_ms,
)
from raftcron.cluster.telemetry.histogram import Histogram

BOUNDS_S = (0.001, 0.01, 0.1)  # buckets: <=1 ms, <=10 ms, <=100 ms, +Inf


def reading(at_s: float, totals: dict[str, dict[str, int]] | None = None, *,
            buckets: tuple[int, ...] = (0, 0, 0, 0), ready: bool = True) -> ActivityReading:
    return ActivityReading(at_ms=int(1_700_000_000_000 + at_s * 1000), mono_s=at_s,
                           totals=totals or {}, claim_buckets=buckets, ready=ready)


def submitted(**by_queue: int) -> dict[str, dict[str, int]]:
    return {"submitted": dict(by_queue)}


def ring_of(*readings: ActivityReading) -> ActivityRing:
    ring = ActivityRing(BOUNDS_S)
    for each in readings:
        ring.record(each)
    return ring


@pytest.mark.parametrize(("before", "after", "expected"), [
    (0, 0, 0),
    (10, 25, 15),
    (25, 25, 0),
    (25, 7, 7),  # reset: the new value is all that happened since
    (25, 0, 0),
])
def test_a_counter_s_increase_reads_a_drop_as_a_reset(before: int, after: int,
                                                      expected: int) -> None:
    assert increase(before, after) == expected


def test_the_first_sample_is_a_gap_and_the_next_has_rates_per_second() -> None:
    ring = ring_of(reading(0, submitted(emails=100)),
                   reading(5, {"submitted": {"emails": 110}, "succeeded": {"emails": 105},
                               "failed": {"emails": 1}}))
    first, second = ring.samples
    assert first["gap"] and first["queues"] == {} and first["claims"] is None
    assert not second["gap"] and second["interval_ms"] == 5000
    assert second["queues"] == {"emails": {"submitted_per_s": 2.0, "succeeded_per_s": 21.0,
                                           "failed_per_s": 0.2}}
    assert ring.started_ms == first["at_ms"]


def test_rates_stay_right_across_a_counter_reset() -> None:
    ring = ring_of(reading(0, submitted(a=1000)), reading(10, submitted(a=1050)),
                   reading(20, submitted(a=30)), reading(30, submitted(a=60)))
    rates = [s["queues"].get("a", {}).get("submitted_per_s") for s in list(ring.samples)[1:]]
    assert rates == [5.0, 3.0, 3.0]  # never negative, never the drop of 1020


def test_a_new_queue_counts_from_zero_and_an_idle_one_is_left_out() -> None:
    ring = ring_of(reading(0, submitted(old=7)), reading(2, submitted(old=7, new=4)))
    assert ring.samples[-1]["queues"] == {
        "new": {"submitted_per_s": 2.0, "succeeded_per_s": 0.0, "failed_per_s": 0.0}}


def test_an_interval_while_the_node_is_not_ready_is_a_gap_and_no_burst_follows() -> None:
    """A node replaying its log climbs by what it applies: that is no throughput."""
    ring = ring_of(reading(0, submitted(a=0)), reading(5, submitted(a=50_000), ready=False),
                   reading(10, submitted(a=90_000)), reading(15, submitted(a=90_010)))
    samples = list(ring.samples)
    assert [s["gap"] for s in samples] == [True, True, True, False]
    assert samples[-1]["queues"]["a"]["submitted_per_s"] == 2.0


def test_past_the_cap_the_quietest_queues_are_summed_as_other_queues() -> None:
    extra = 5
    before = {f"q{i:02}": 0 for i in range(QUEUES_PER_SAMPLE_MAX + extra)}
    after = {name: 100 + i for i, name in enumerate(sorted(before))}  # q00 the quietest
    ring = ring_of(reading(0, submitted(**before)), reading(1, submitted(**after)))
    last = ring.samples[-1]
    assert len(last["queues"]) == QUEUES_PER_SAMPLE_MAX
    assert set(last["queues"]) == {f"q{i:02}" for i in range(extra, QUEUES_PER_SAMPLE_MAX + extra)}
    assert last["other_queues"] == {"queues": extra, "submitted_per_s": float(sum(range(100, 105))),
                                    "succeeded_per_s": 0.0, "failed_per_s": 0.0}


def test_the_ring_keeps_at_most_samples_kept_and_answers_those_after_a_moment() -> None:
    ring = ActivityRing(BOUNDS_S)
    for second in range(SAMPLES_KEPT + 50):
        ring.record(reading(second, submitted(a=second)))
    assert len(ring.samples) == SAMPLES_KEPT
    assert SAMPLES_KEPT * activity.SAMPLE_S == activity.KEPT_S
    newest = ring.samples[-1]["at_ms"]
    assert [s["at_ms"] for s in ring.since(newest - 2000)] == [newest - 1000, newest]
    assert ring.since(newest) == []
    assert ring.since(0) == list(ring.samples)


def test_claim_latency_comes_from_the_interval_s_observations_only() -> None:
    ring = ring_of(reading(0, buckets=(50, 0, 0, 0)),  # old, fast claims: not this interval's
                   reading(5, buckets=(50, 0, 10, 0)),
                   reading(10, buckets=(50, 0, 10, 0)))
    busy, idle = list(ring.samples)[1:]
    assert busy["claims"]["count"] == 10
    assert 10 < busy["claims"]["p50_ms"] <= busy["claims"]["p99_ms"] <= 100
    assert idle["claims"] == {"count": 0, "p50_ms": None, "p99_ms": None}


@pytest.mark.parametrize(("before", "after", "expected"), [
    ((1, 2, 3, 0), (1, 5, 3, 1), (0, 3, 0, 1)),
    ((4, 4, 4, 4), (1, 0, 0, 0), (1, 0, 0, 0)),  # reset: all of the new histogram
    ((0, 0), (1, 0, 0, 0), (1, 0, 0, 0)),
])
def test_a_histogram_s_increase_per_bucket(before: tuple[int, ...], after: tuple[int, ...],
                                           expected: tuple[int, ...]) -> None:
    assert bucket_increase(before, after) == expected


@pytest.mark.parametrize(("q", "buckets", "expected"), [
    (0.5, (0, 0, 0, 0), None),
    (0.5, (10, 0, 0, 0), 0.5),  # half way into (0, 1 ms]
    (0.5, (0, 10, 0, 0), 5.5),  # half way into (1, 10 ms]
    (0.99, (0, 100, 0, 0), 9.91),
    (0.5, (5, 0, 5, 0), 1.0),  # the 5th of 10 is the last of the first bucket
    (0.99, (0, 0, 0, 3), 100.0),  # +Inf: the highest finite bound
])
def test_a_quantile_is_interpolated_in_its_bucket(q: float, buckets: tuple[int, ...],
                                                  expected: float | None) -> None:
    assert quantile_ms(q, buckets, BOUNDS_S) == expected


def test_the_sampler_reads_the_counters_the_histogram_and_readiness() -> None:
    histogram = Histogram()
    totals: dict[str, Any] = {"submitted": {"a": 1}}
    ring = ActivityRing()
    sampler = activity.ActivitySampler(ring, totals=lambda: totals, claim_latency=histogram,
                                       ready=lambda: True)
    sampler.take()
    histogram.observe(0.004)
    totals = {"submitted": {"a": 3}}
    sampler.take()
    last = ring.samples[-1]
    assert not last["gap"] and last["claims"]["count"] == 1
    assert last["queues"]["a"]["submitted_per_s"] > 0


def test_the_counter_query_copies_the_three_counters_the_charts_draw() -> None:
    state = SimpleNamespace(
        counters={"submitted": {"a": 3}, "claimed": {"a": 2}, "failed": {"b": 1}})
    totals = activity.counter_totals(state)
    assert totals == {"submitted": {"a": 3}, "succeeded": {}, "failed": {"b": 1}}
    assert totals["submitted"] is not state.counters["submitted"]
