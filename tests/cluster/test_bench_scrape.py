"""The bench's reading of /metrics pages and the soak's arithmetic: pure functions, no cluster."""

from __future__ import annotations

import math

import pytest

from raftcron.cluster.dev.bench import scrape
from raftcron.cluster.dev.bench.soakload import backlog_slope

PAGE = """# HELP raftcron_queue_depth Queued jobs by queue
# TYPE raftcron_queue_depth gauge
raftcron_queue_depth{queue="a"} 3
raftcron_queue_depth{queue="b"} 4
raftcron_state_bytes 1234
raftcron_evictions_total{reason="age"} 0
raftcron_evictions_total{reason="budget"} 7
raftcron_claim_latency_seconds_bucket{node="n1",le="0.01"} 2
raftcron_claim_latency_seconds_bucket{node="n1",le="0.1"} 4
raftcron_claim_latency_seconds_bucket{node="n1",le="+Inf"} 4
raftcron_claim_latency_seconds_bucket{node="n2",le="0.01"} 0
raftcron_claim_latency_seconds_bucket{node="n2",le="0.1"} 4
raftcron_claim_latency_seconds_bucket{node="n2",le="+Inf"} 4
"""


def test_samples_are_found_by_name_and_label_and_summed() -> None:
    assert scrape.sample(PAGE, "raftcron_queue_depth", 'queue="b"') == 4
    assert scrape.total(PAGE, "raftcron_queue_depth") == 7
    assert scrape.sample(PAGE, "raftcron_state_bytes") == 1234
    assert scrape.by_label(PAGE, "raftcron_evictions_total", "reason") == {"age": 0, "budget": 7}
    assert scrape.sample(PAGE, "raftcron_missing") == 0


def test_the_buckets_of_several_nodes_add_up_bound_by_bound() -> None:
    counts = scrape.buckets(PAGE, "raftcron_claim_latency_seconds")
    assert counts == {0.01: 2, 0.1: 8, math.inf: 8}


@pytest.mark.parametrize(
    ("counts", "fraction", "expected"),
    [
        ({0.01: 2, 0.1: 8, math.inf: 8}, 0.25, 0.01),  # rank 2: the first bucket's top
        ({0.01: 2, 0.1: 8, math.inf: 8}, 0.5, 0.04),  # rank 4: a third into (0.01, 0.1]
        ({0.01: 0, 0.1: 0, math.inf: 5}, 0.99, 0.1),  # in +Inf: the highest finite bound
        ({0.01: 4, math.inf: 4}, 0.5, 0.005),  # from 0 in the first bucket
        ({0.01: 0, math.inf: 0}, 0.5, None),  # nothing observed
        ({}, 0.5, None),
    ],
)
def test_a_quantile_is_interpolated_within_its_bucket(
    counts: dict[float, float], fraction: float, expected: float | None
) -> None:
    found = scrape.quantile(counts, fraction)
    assert found == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    ("samples", "slope"),
    [
        ([(0, 100), (1, 100), (2, 100)], 0.0),
        ([(0, 0), (1, 10), (2, 20)], 10.0),
        ([(0, 50), (1, 40), (2, 30), (3, 20)], -10.0),
        ([(0, 5)], 0.0),
    ],
)
def test_the_ramp_reads_the_backlog_trend_as_a_least_squares_slope(
    samples: list[tuple[float, float]], slope: float
) -> None:
    assert backlog_slope(samples) == pytest.approx(slope)
