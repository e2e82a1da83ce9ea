"""`/metrics`' held-back jobs (cluster/ops/metrics.py) and the queue view (scheduler/flowviews.py)
over one core state where every limit really holds jobs back: a queue at its cap, a queue
whose rate is used up, a concurrency key at its max (in its own queue and in another one), a
paused queue. In process: the state is built with the core's driver and rendered as a node
renders it, no node started."""

from __future__ import annotations

import re
from typing import Any

import pytest
from metricfakes import ProposerFigures

from raftcron.cluster.ops.metrics import NodeStats, render
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.flowcommands import PauseQueue, PutQueue
from raftcron.scheduler.flowspecs import QueueSpec
from raftcron.scheduler.flowviews import HELD_REASONS, queue_view

KEY = {"key": "acct-42", "max": 1}


def put_queue(d: Driver, name: str, **spec: Any) -> None:
    d.ok(PutQueue(d.request_id(), name, QueueSpec.parse(spec)))


def claimed(d: Driver, queue: str, max: int = 10) -> int:
    return len(d.claim(queues=(queue,), max=max))


@pytest.fixture
def d() -> Driver:
    d = Driver()
    put_queue(d, "capped", concurrency_max=1)
    d.submit_many(2, queue="capped")
    assert claimed(d, "capped") == 1
    put_queue(d, "metered", rate_limit={"max": 2, "per_ms": 60_000})
    d.submit_many(5, queue="metered")
    assert claimed(d, "metered") == 2
    d.submit_many(2, queue="keyed", concurrency=KEY)
    assert claimed(d, "keyed") == 1
    d.submit(queue="elsewhere", concurrency=KEY)  # the same key, a queue without limits
    d.submit_many(3, queue="paused")
    d.ok(PauseQueue(d.request_id(), "paused"))
    return d


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """One metric's samples: sorted label pairs -> value."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', match[1])))
            found[labels] = float(match[2])
    return found


def held_metric(d: Driver) -> dict[str, dict[str, float]]:
    """`raftcron_queue_held_jobs` as a node renders it: queue -> reason -> count."""
    text = render(d.state, node_id="n1", role=2, term=1, commit_index=1, applied_index=1,
                  stats=NodeStats(), proposer=ProposerFigures())  # type: ignore[arg-type]
    by_queue: dict[str, dict[str, float]] = {}
    for labels, value in samples(text, "raftcron_queue_held_jobs").items():
        named = dict(labels)
        by_queue.setdefault(named["queue"], {})[named["reason"]] = value
    return by_queue


@pytest.mark.parametrize(
    ("queue", "reason", "count"),
    [
        ("capped", "queue_concurrency", 1),
        ("metered", "queue_rate", 3),
        ("keyed", "key_concurrency", 1),
        ("elsewhere", "key_concurrency", 1),
        ("paused", "paused", 3),
    ],
)
def test_metrics_count_the_jobs_each_limit_holds_back_under_its_queue_and_reason(
    d: Driver, queue: str, reason: str, count: int
) -> None:
    expected = {name: float(count if name == reason else 0) for name in HELD_REASONS}
    assert held_metric(d)[queue] == expected
    # Really held back: a claim of the queue now hands out none of them.
    assert d.claim(queues=(queue,), max=10) == []


def test_the_queue_view_counts_held_jobs_as_the_metrics_do_in_every_queue(d: Driver) -> None:
    metric = held_metric(d)
    assert sorted(metric) == ["capped", "elsewhere", "keyed", "metered", "paused"]
    for queue, by_reason in metric.items():
        view = queue_view(d.state, queue)
        assert {reason: float(n) for reason, n in view["held"].items()} == by_reason, queue


def test_a_job_held_for_a_full_key_shows_in_the_view_of_a_queue_without_limits(
    d: Driver,
) -> None:
    view = queue_view(d.state, "elsewhere")
    assert (view["queued"], view["running"], view["concurrency_max"]) == (1, 0, None)
    assert view["held"] == {"paused": 0, "queue_concurrency": 0, "queue_rate": 0,
                            "key_concurrency": 1, "key_rate": 0}
    keyed = queue_view(d.state, "keyed")
    assert (keyed["queued"], keyed["running"], keyed["held"]["key_concurrency"]) == (1, 1, 1)
