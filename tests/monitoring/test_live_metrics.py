"""The kit against real nodes: every metric a dashboard panel or an alert rule names is one a live
node's `/metrics` declares, and `raftcron_member_reachable` follows a member that stops and
comes back; the cycle collector's pauses are timed by the node itself. Three `raftcron node`
processes on loopback (cluster/dev/localcluster.py), closed at the end whatever the test did;
every wait has a deadline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

from .kit import declared_families, is_exported, used_metric_names

pytestmark = pytest.mark.processes
SECRET = "monitoring-kit-test-secret"
# A receiver that is never there: the notification's figures exist once it is created.
NOWHERE = "http://127.0.0.1:9/raftcron"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", nodes=3, raft=FAST_RAFT) as started:
        started.start()
        started.wait_ready(timeout_s=30)
        yield started


def families(cluster: LocalCluster, node: LocalNode) -> dict[str, str]:
    status, text, _ = cluster.request(node, "GET", "/metrics")
    assert status == 200, text
    return declared_families(text)


def test_every_metric_a_panel_or_a_rule_names_is_in_a_live_nodes_metrics(
    cluster: LocalCluster,
) -> None:
    # Some figures appear only once there is something to show: a notification's once one
    # exists, the budget once the first leader finalized the cluster, a clock's skew once
    # the peers' clocks were read. Create what the node needs, then wait for it.
    status, created, _ = cluster.call("PUT", "/v1/notifications/ops", {
        "url": NOWHERE, "events": ["dead_letter"], "secret": SECRET,
        "request_id": "put-ops"})
    assert status in (200, 201), created
    used = used_metric_names()
    assert len(used) > 20, used
    node = cluster.nodes[0]

    def missing() -> dict[str, list[str]]:
        declared = families(cluster, node)
        return {name: where for name, where in used.items() if not is_exported(name, declared)}

    try:
        cluster.wait_for(lambda: not missing(), 30, "every metric the kit names")
    finally:
        assert missing() == {}, f"named by the kit, not in {node.node_id}'s /metrics"
    # Not on a panel: the cycle collector's pauses, timed from the node's own hook.
    assert families(cluster, node).get("raftcron_gc_pause_seconds") == "histogram"
    status, text, _ = cluster.request(node, "GET", "/metrics")
    assert status == 200, text
    for generation in ("0", "1", "2"):
        assert (f'raftcron_gc_pause_seconds_count{{node="{node.node_id}",'
                f'generation="{generation}"}}') in text


def reachable_from(cluster: LocalCluster, node: LocalNode) -> dict[str, float]:
    status, text, _ = cluster.request(node, "GET", "/metrics")
    assert status == 200, text
    seen = {}
    prefix = f'raftcron_member_reachable{{node="{node.node_id}",member="'
    for line in text.splitlines():
        if line.startswith(prefix):
            member, _, value = line.removeprefix(prefix).partition('"} ')
            seen[member] = float(value)
    return seen


def test_a_member_that_stops_is_unreachable_from_the_others_until_it_is_back(
    cluster: LocalCluster,
) -> None:
    everyone = {node.node_id: 1.0 for node in cluster.nodes}
    for node in cluster.nodes:
        cluster.wait_for(lambda node=node: reachable_from(cluster, node) == everyone, 15,
                         f"{node.node_id} reaching every member")
    stopped = cluster.nodes[2]
    cluster.stop(stopped)
    without = {**everyone, stopped.node_id: 0.0}
    # raft.connection_timeout_s is 1 s under FAST_RAFT: 0 within a few seconds, not at once
    for node in cluster.nodes[:2]:
        cluster.wait_for(lambda node=node: reachable_from(cluster, node) == without, 15,
                         f"{node.node_id} seeing {stopped.node_id} unreachable")
    cluster.start_node(stopped)
    for node in cluster.nodes:
        cluster.wait_for(lambda node=node: reachable_from(cluster, node) == everyone, 30,
                         f"{node.node_id} reaching every member again")
