"""Bounded state on a real cluster (DESIGN.md §9.1), with budgets small enough for `make test`:
a flood of large payloads is refused by name while every node's memory stays flat, workers
still drain and make room, retention by count and by age evicts exactly what it says, a
schedule firing over the budget counts what it could not fire, and the CLI says all of it
plainly."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from conftest import ClusterKeeper
from drains import drain

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

pytestmark = pytest.mark.processes

BUDGET = 8 << 20
PAYLOAD = "x" * 60_000  # about 60 KB, the size of the flood measured in research/wave3.md


def rss_bytes(node: LocalNode) -> int:
    assert node.pid is not None
    with open(f"/proc/{node.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {node.node_id}")


def usage(cluster: LocalCluster, node: LocalNode) -> dict[str, Any]:
    status, body, _ = cluster.request(node, "GET", "/v1/settings")
    assert status == 200, body
    return dict(body["usage"])


def submit_batch(cluster: LocalCluster, count: int = 8) -> tuple[int, Any, Any]:
    return cluster.call("POST", "/v1/jobs/batch", {"jobs": [{"task": "t", "payload": PAYLOAD,
                                                             "queue": "flood"}] * count})


def fill(cluster: LocalCluster) -> tuple[int, Any, Any]:
    """Submit batches of 8 large jobs, then single ones, until one large job is refused; that
    refusal."""
    for count in (8, 1):
        for _ in range(200):
            answer = submit_batch(cluster, count)
            if answer[0] == 507:
                break
            assert answer[0] == 201, answer[1]
        else:
            raise AssertionError(f"200 batches of {count} x 60 KB never refused by 8 MiB")
    return answer


def test_a_flood_of_large_payloads_is_refused_by_name_while_memory_stays_flat(
        cluster_factory: ClusterKeeper) -> None:
    cluster = cluster_factory.open(settings={"budget": {"bytes": BUDGET}})
    status, refused, headers = fill(cluster)
    error = refused["error"]
    assert (status, error["code"]) == (507, "state_full")
    assert error["budget_bytes"] == BUDGET and error["state_bytes"] <= BUDGET
    assert error["queues"][0]["queue"] == "flood" and "budget" in error["message"]
    assert headers.get("Retry-After") == "5"
    before = {node.node_id: rss_bytes(node) for node in cluster.nodes}
    refusals = 0
    for _ in range(150):  # 72 MB more offered: nine budgets' worth
        answer = submit_batch(cluster)
        refusals += answer[0] == 507
    assert refusals == 150
    for node in cluster.nodes:
        assert usage(cluster, node)["state_bytes"] <= BUDGET
        grown = rss_bytes(node) - before[node.node_id]
        assert grown < 48 << 20, f"{node.node_id} grew {grown >> 20} MiB while refusing"
    # Workers still drain, and what they finish makes room for new work.
    assert drain(cluster, "flood") > 0
    accepted = submit_batch(cluster)
    assert accepted[0] == 201, accepted[1]
    metrics = cluster.request(cluster.nodes[0], "GET", "/metrics")[1]
    assert "raftcron_evictions_total{reason=\"budget\"}" in metrics
    assert f"raftcron_state_budget_bytes {BUDGET}" in metrics


def test_retention_by_count_and_by_age_evicts_exactly_what_it_says(
        cluster_factory: ClusterKeeper) -> None:
    cluster = cluster_factory.open()
    admin = cluster.admin_token
    status, body, _ = cluster.call("PUT", "/v1/settings/retention",
                                   {"succeeded": {"max_count": 5}}, token=admin)
    assert status == 200 and body["retention"]["succeeded"]["max_count"] == 5, body
    status, created, _ = cluster.call(
        "POST", "/v1/jobs/batch", {"jobs": [{"task": "t", "queue": "kept"}] * 12})
    ids = [job["id"] for job in created["jobs"]]
    assert drain(cluster, "kept") == 12

    def kept() -> list[int]:
        """Those still in the state: an evicted job is answered from the archive."""
        answers = [(job_id, cluster.call("GET", f"/v1/jobs/{job_id}")) for job_id in ids]
        assert all(status == 200 for _, (status, _, _) in answers)
        return [job_id for job_id, (_, view, _) in answers if "archived" not in view]

    survivors = cluster.wait_for(lambda: kept() if len(kept()) == 5 else None, 10,
                                 "the newest 5 kept")
    assert survivors == ids[-5:]  # one claim round finished them in id order
    cluster.call("PUT", "/v1/settings/retention", {"succeeded": {"max_age_ms": 1_500}},
                 token=admin)
    cluster.wait_for(lambda: kept() == [] or None, 15, "every job older than 1.5 s gone")
    for node in cluster.nodes:
        assert usage(cluster, node)["evicted"] == {"age": 5, "count": 7, "budget": 0}


def test_a_schedule_firing_over_the_budget_counts_each_fire_it_could_not_make(
        cluster_factory: ClusterKeeper) -> None:
    cluster = cluster_factory.open(settings={"budget": {"bytes": BUDGET}})
    fill(cluster)
    for size in (6_000, 600, 0):  # what is left, filled too: not even an empty job fits
        for _ in range(100):
            answer = cluster.call("POST", "/v1/jobs", {"task": "t", "payload": "y" * size})
            if answer[0] == 507:
                break
    status, body, _ = cluster.call("PUT", "/v1/schedules/every-second",
                                   {"every": "1s", "job": {"task": "t"}},
                                   token=cluster.admin_token)
    assert status in (200, 201), body

    def refused_fires() -> int | None:
        view = cluster.call("GET", "/v1/schedules/every-second")[1]
        return view["misfires_state_full"] if view["misfires_state_full"] >= 3 else None

    cluster.wait_for(refused_fires, 20, "three fires refused for want of room")
    events = cluster.call("GET", "/v1/events?limit=1000")[1]["events"]
    refused = [e for e in events if e["kind"] == "misfired"
               and e.get("reason") == "state_full"]
    assert refused, events[-5:]
    metrics = cluster.request(cluster.nodes[0], "GET", "/metrics")[1]
    assert 'raftcron_schedule_skipped_total{schedule="every-second",reason="state_full"}' in metrics


def test_the_cli_shows_and_changes_the_settings_and_says_plainly_when_the_state_is_full(
        cluster_factory: ClusterKeeper) -> None:
    cluster = cluster_factory.open(settings={"budget": {"bytes": BUDGET}})
    connect = ",".join(node.url for node in cluster.nodes)

    def cli(*words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "raftcron.cluster.commandline", *words,
                               "--connect", connect], capture_output=True, text=True,
                              timeout=60, check=False)

    shown = cli("settings", "show")
    assert shown.returncode == 0, shown.stderr
    assert "budget: 8.0 MiB" in shown.stdout and "succeeded" in shown.stdout
    fill(cluster)
    full = cli("submit", "t", "--payload", '{"x": "' + "z" * 60_000 + '"}')
    assert full.returncode == 1
    assert "state_full" in full.stderr and "budget" in full.stderr
    raised = cli("settings", "budget", "64MiB")
    assert raised.returncode == 0, raised.stderr
    assert "budget: 64.0 MiB" in raised.stdout
    assert cli("submit", "t", "--payload", '{"x": 1}').returncode == 0
    retention = cli("settings", "retention", "--succeeded-count", "10",
                    "--queue", "audit:succeeded:30d:-")
    assert retention.returncode == 0, retention.stderr
    assert "audit" in retention.stdout and "30d" in retention.stdout
    bad = cli("settings", "retention", "--queue", "audit:done:1h:5")
    assert bad.returncode == 2 and "NAME:OUTCOME:AGE:COUNT" in bad.stderr
