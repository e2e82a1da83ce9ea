"""What a node process does with its threads and at its stop.

Its threads are all started with it: a burst of requests that read off the event loop (the
archive's summary in `GET /v1/cluster` and `/metrics`) adds none. The endurance run judges a
node's thread count for growth (chaos/tier2/checkers/slopes.py), so a pool that grows lazily to
its bound over an hour looks like a leak there and hides a real one. And a stop is prompt: it
names a slow step while it runs, and it does not wait out writes that cannot commit."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from raftcron.cluster import node as node_module
from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode
from raftcron.cluster.node import io_pool

ROUNDS = 3
AT_ONCE = 24


def threads_of(node: LocalNode) -> int:
    assert node.pid is not None
    return len(os.listdir(f"/proc/{node.pid}/task"))


def test_requests_read_off_the_loop_start_no_thread(cluster: LocalCluster) -> None:
    before = {node.node_id: threads_of(node) for node in cluster.nodes}
    paths = ("/v1/cluster", "/metrics")
    with ThreadPoolExecutor(AT_ONCE) as callers:
        for _ in range(ROUNDS):
            answers = list(callers.map(
                lambda i: cluster.request(cluster.nodes[i % 3], "GET", paths[i % 2])[0],
                range(AT_ONCE * 3)))
            assert set(answers) == {200}, answers

    after = {node.node_id: threads_of(node) for node in cluster.nodes}
    assert after == before


def test_the_io_pool_has_all_its_threads_when_made_and_starts_no_more() -> None:
    before = threading.active_count()
    pool = io_pool(3)
    try:
        assert threading.active_count() == before + 3
        assert sorted(pool.map(lambda i: i * i, range(50))) == [i * i for i in range(50)]
        assert threading.active_count() == before + 3
    finally:
        pool.shutdown(wait=True)
    assert threading.active_count() == before


class _Part:
    """A node's part with an async stop, slow or not."""

    def __init__(self, stop_s: float = 0.0) -> None:
        self.stop_s = stop_s

    async def stop(self) -> None:
        await asyncio.sleep(self.stop_s)

    async def close(self) -> None:
        pass

    def destroy(self) -> None:
        pass


def test_a_stop_step_still_running_after_its_bound_says_which_step_it_is(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A stop killed for its slowness never logs its summary: the slow step names itself."""
    monkeypatch.setattr(node_module, "STOP_STEP_SLOW_S", 0.05)
    fast = _Part()
    parts = SimpleNamespace(
        services=SimpleNamespace(stopping=asyncio.Event()), listener=None, runner=None,
        waiters=SimpleNamespace(close=lambda: None), leader_stamps=fast, notifier=fast,
        ticker=_Part(stop_s=0.3), membership=fast, clock_poller=fast, reach_watch=fast,
        activity_sampler=fast, archive_filler=None, raft=fast,
        proposer=SimpleNamespace(stop=lambda: None))
    parts._stop_http = lambda: node_module.Node._stop_http(parts)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="raftcron.node"):
        asyncio.run(node_module.Node._stop_steps(parts))  # type: ignore[arg-type]
    slow = [r for r in caplog.records if getattr(r, "action", None) == "node_stop_slow"]
    assert [r.step for r in slow] == ["ticker"]  # type: ignore[attr-defined]
    [summary] = [r for r in caplog.records if getattr(r, "action", None) == "node_stopped"]
    assert summary.steps_s["ticker"] >= 0.3  # type: ignore[attr-defined]


def proposal_failures(cluster: LocalCluster, node: LocalNode) -> float:
    status, text, _ = cluster.request(node, "GET", "/metrics")
    assert status == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in str(text).splitlines()
               if line.startswith("raftcron_proposal_failures_total"))


def test_a_node_stops_promptly_while_a_write_waits_for_a_leader_it_will_not_get(
        cluster: LocalCluster) -> None:
    """A write that cannot commit (no majority) waits its commit timeout, and retries for up
    to twice that; the HTTP server's stop waits for the requests in flight, so a stopping node
    waited 3 s here (the test cluster's commit timeout), up to 9 before it cancelled the write
    (the harness allows 10). A stopping node answers its waiting writes and retries nothing."""
    alone, *others = cluster.nodes
    for node in others:
        cluster.stop(node)
    answers: list[object] = []
    writer = threading.Thread(target=lambda: answers.append(cluster.request(
        alone, "POST", "/v1/jobs", {"task": "t", "request_id": "stop-while-waiting"},
        timeout_s=20)))
    writer.start()
    try:
        cluster.wait_for(lambda: proposal_failures(cluster, alone) > 0 or None, 5,
                         "the write's first failed proposal")
        assert writer.is_alive()
        started = time.monotonic()
        cluster.stop(alone)
        took = time.monotonic() - started
    finally:
        writer.join(30)
    assert took < 2.0, (took, answers)
