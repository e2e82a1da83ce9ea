"""Search attributes on a real cluster (DESIGN.md §9.2): payload paths declared in the settings
(from a new cluster's config, the API or the CLI) are indexed by every member's archive, and
then an evicted job is found by such a path on every member without a created or finished
range; a path left out of the setting is unindexed again, and needs a range once more."""

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


def submit(cluster: LocalCluster, queue: str, count: int, first: int = 0) -> list[int]:
    status, created, _ = cluster.call("POST", "/v1/jobs/batch", {"jobs": [
        {"task": "invoice", "queue": queue,
         "payload": {"customer": {"id": n}, "region": "eu" if n % 2 else "us"}}
        for n in range(first, first + count)]})
    assert status == 201, created
    return [job["id"] for job in created["jobs"]]


def search(cluster: LocalCluster, node: LocalNode, query: str) -> tuple[int, Any]:
    status, body, _ = cluster.request(node, "GET", f"/v1/jobs?{query}",
                                      token=cluster.admin_token)
    return status, body


def indexed(cluster: LocalCluster, node: LocalNode) -> list[str]:
    status, view, _ = cluster.request(node, "GET", "/v1/cluster", token=cluster.admin_token)
    assert status == 200, view
    return list(view["archive"]["indexed"])


def wait_indexed(cluster: LocalCluster, paths: list[str]) -> None:
    cluster.wait_for(lambda: all(indexed(cluster, node) == paths for node in cluster.nodes)
                     or None, 20, f"every member's archive indexes {paths}")


def wait_archived(cluster: LocalCluster, job_ids: list[int]) -> None:
    def archived(node: LocalNode, job_id: int) -> bool:
        status, view, _ = cluster.request(node, "GET", f"/v1/jobs/{job_id}")
        return status == 200 and view.get("archived") is True

    cluster.wait_for(lambda: all(archived(node, job_id) for node in cluster.nodes
                                 for job_id in job_ids) or None, 15, "archived on every member")


def test_evicted_jobs_are_found_by_a_declared_path_without_a_range_on_every_member(
        cluster_factory: ClusterKeeper) -> None:
    cluster = cluster_factory.open(settings={"search_attributes": {"paths": ["region"]},
                                             "retention": {"succeeded": {"max_count": 0}}})
    admin = cluster.admin_token
    status, settings, _ = cluster.call("GET", "/v1/settings", token=admin)
    assert settings["search_attributes"] == {"paths": ["region"]}, settings  # from the config
    wait_indexed(cluster, ["region"])
    ids = submit(cluster, "billing", 10)  # customers 0..9
    drain(cluster, "billing")
    wait_archived(cluster, ids)  # every finished job leaves the state at once

    for node in cluster.nodes:
        status, refused = search(cluster, node, "payload.customer.id=3")
        assert status == 400 and refused["error"]["field"] == "created_from_ms", refused
        assert "not a search attribute" in refused["error"]["message"]
        status, found = search(cluster, node, "payload.region=eu&limit=3")
        assert status == 200, found
        assert [job["id"] for job in found["jobs"]] == [ids[9], ids[7], ids[5]]

    connect = ",".join(node.url for node in cluster.nodes)
    declared = subprocess.run(
        [sys.executable, "-m", "raftcron.cluster.commandline", "settings", "search-attributes",
         "region", "customer.id", "--connect", connect],
        capture_output=True, text=True, timeout=60, check=False)
    assert declared.returncode == 0, declared.stderr
    assert "search attributes: customer.id, region" in declared.stdout
    wait_indexed(cluster, ["customer.id", "region"])
    later = submit(cluster, "billing", 4, first=3)  # archived after the index was built
    drain(cluster, "billing")
    wait_archived(cluster, later)
    for node in cluster.nodes:
        status, found = search(cluster, node, "payload.customer.id=3")
        assert status == 200, found
        assert [(job["id"], job["archived"]) for job in found["jobs"]] == [
            (later[0], True), (ids[3], True)]
        assert found["next_cursor"] is None
        status, found = search(cluster, node, "payload.customer.id.gte=8&payload.region=us")
        assert [job["id"] for job in found["jobs"]] == [ids[8]], found
        status, refused = search(cluster, node, "payload.customer.id=null")
        assert status == 400 and "null" in refused["error"]["message"], refused

    status, body, _ = cluster.call("PUT", "/v1/settings/search_attributes",
                                   {"paths": ["region"]}, token=admin)
    assert status == 200 and body["search_attributes"] == {"paths": ["region"]}, body
    wait_indexed(cluster, ["region"])
    status, refused = search(cluster, cluster.nodes[2], "payload.customer.id=3")
    assert status == 400 and refused["error"]["field"] == "created_from_ms", refused
    status, refused, _ = cluster.call("PUT", "/v1/settings/search_attributes",
                                      {"paths": ["customer id"]}, token=admin)
    assert status == 400 and refused["error"]["field"] == "search_attributes.paths[0]", refused
