"""A node's threads are all started with it: a burst of requests that read off the event loop
(the archive's summary in `GET /v1/cluster` and `/metrics`) adds none. The endurance run judges
a node's thread count for growth (chaos/tier2/checkers/slopes.py), so a pool that grows lazily
to its bound over an hour looks like a leak there and hides a real one."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

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
