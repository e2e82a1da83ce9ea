"""The cycle collector's pauses, timed per generation and written on /metrics."""

from __future__ import annotations

import gc
import re
from collections.abc import Callable

from metricfakes import ProposerFigures

from raftcron.cluster.ops.metrics import NodeStats, render
from raftcron.cluster.telemetry.gcpauses import PAUSE_SECONDS, GcPauses, process_pauses
from raftcron.scheduler.driver import Driver


def readings(*values: float) -> Callable[[], float]:
    """A clock that reads `values`, one per call."""
    return iter(values).__next__


def test_each_collection_is_timed_from_its_start_to_its_stop_in_its_generation() -> None:
    pauses = GcPauses(clock=readings(10.0, 10.0004, 20.0, 20.12))
    pauses("start", {"generation": 0})
    pauses("stop", {"generation": 0, "collected": 3, "uncollectable": 0})
    pauses("start", {"generation": 1})
    pauses("stop", {"generation": 1, "collected": 0, "uncollectable": 0})
    young, middle, full = (pauses.pauses[generation] for generation in (0, 1, 2))
    assert (young.count, middle.count, full.count) == (1, 1, 0)
    assert abs(young.sum_s - 0.0004) < 1e-9 and abs(middle.sum_s - 0.12) < 1e-9
    assert young.counts[0] == 1  # under half a millisecond
    assert middle.counts[PAUSE_SECONDS.index(0.25)] == 1  # in (0.1, 0.25]


def test_a_stop_without_its_start_is_not_counted() -> None:
    pauses = GcPauses(clock=readings(5.0))
    pauses("stop", {"generation": 2})  # hooked in while a collection ran
    assert all(histogram.count == 0 for histogram in pauses.pauses.values())


def test_the_process_recorder_is_hooked_once_and_sees_real_collections() -> None:
    first = process_pauses()
    assert process_pauses() is first
    assert sum(callback is first for callback in gc.callbacks) == 1
    before = first.pauses[2].count
    gc.collect()
    assert first.pauses[2].count == before + 1


def test_metrics_write_one_histogram_family_with_a_series_per_generation() -> None:
    pauses = GcPauses(clock=readings(1.0, 1.002))
    pauses("start", {"generation": 1})
    pauses("stop", {"generation": 1})
    text = render(Driver().state, node_id="n1", role=2, term=1, commit_index=1,
                  applied_index=1, stats=NodeStats(gc_pauses=pauses),
                  proposer=ProposerFigures())  # type: ignore[arg-type]
    assert text.count("# TYPE raftcron_gc_pause_seconds histogram") == 1
    counts = {match[1]: float(match[2]) for match in re.finditer(
        r'^raftcron_gc_pause_seconds_count\{node="n1",generation="(\d)"\} (\S+)$', text,
        re.MULTILINE)}
    assert counts == {"0": 0.0, "1": 1.0, "2": 0.0}
    assert 'raftcron_gc_pause_seconds_bucket{node="n1",generation="1",le="0.0025"} 1' in text
    assert 'raftcron_gc_pause_seconds_bucket{node="n1",generation="1",le="0.001"} 0' in text
