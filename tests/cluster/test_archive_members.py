"""The same answers on every member (DESIGN.md §9.2): a member that lost its data and rejoined
empty, and one added after the evictions, install a snapshot past evictions they never wrote;
each records the gap, fills it from a peer, and meanwhile answers reads through a peer. Once
filled, each answers every archived job from its own archive."""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any

import pytest
from conftest import ClusterKeeper
from drains import drain, job_on, keep_succeeded, wait_archived
from test_archive import submit

from raftcron.cluster.archive.fill import LOCAL_HEADER
from raftcron.cluster.dev import joining
from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

pytestmark = pytest.mark.processes


def archive_of(cluster: LocalCluster, node: LocalNode) -> dict[str, Any]:
    status, view, _ = cluster.request(node, "GET", "/v1/cluster", token=cluster.admin_token)
    assert status == 200, view
    return dict(view["archive"])


def local_search(cluster: LocalCluster, node: LocalNode, query: str) -> dict[str, Any]:
    """A search answered from `node`'s own archive (as a forwarded read is: never passed on)."""
    status, body, _ = cluster.request(node, "GET", f"/v1/jobs?{query}", token=cluster.admin_token,
                                      headers={LOCAL_HEADER: "1"})
    assert status == 200, body
    return dict(body)


def rejoin_empty(cluster: LocalCluster, victim: LocalNode) -> None:
    """`victim` loses its data dir and comes back empty (`--rejoin-empty`): the others'
    logs are compacted first, so it gets a snapshot that covers every eviction, and no row."""
    cluster.kill(victim)
    shutil.rmtree(victim.data_dir)
    for other in cluster.live_nodes():
        cluster.request(other, "POST", "/v1/cluster/compact", token=cluster.admin_token)
    command = cluster.command
    cluster.command = lambda node: [  # type: ignore[method-assign]
        *command(node), *(["--rejoin-empty"] if node is victim else [])]
    cluster.start_node(victim)
    cluster.wait_for(lambda: any("rejoin_caught_up" in line
                                 for line in cluster.log_lines(victim)), 60,
                     f"{victim.node_id} rejoining")


def filled(cluster: LocalCluster, node: LocalNode, what: str) -> dict[str, Any]:
    """Until `node` misses no archived job; its archive's figures then."""
    return cluster.wait_for(lambda: (lambda a: a if a["missing_jobs"] == 0 and a["filled_rows"]
                                     else None)(archive_of(cluster, node)), 60, what)


def test_a_member_rejoined_empty_and_one_added_later_fill_their_archive_from_a_peer(
        cluster_factory: ClusterKeeper) -> None:
    cluster = cluster_factory.open()
    admin = cluster.admin_token
    keep_succeeded(cluster, 0)
    ids = submit(cluster, "fill", 40)  # customer ids 0..39
    drain(cluster, "fill", result=lambda job: {"done": job["payload"]["customer"]})
    wait_archived(cluster, ids, "40 evicted jobs")
    expected = {job_id: job_on(cluster, cluster.nodes[0], job_id) for job_id in ids}

    # n3 loses its data dir and comes back empty.
    victim = cluster.nodes[2]
    rejoin_empty(cluster, victim)
    # Answered at once, from a peer while the gap is open or from its own archive once filled.
    for job_id in ids[::7]:
        assert job_on(cluster, victim, job_id) == expected[job_id]
    figures = filled(cluster, victim, "n3's archive filled")
    assert figures["rows"] == 40 and figures["filled_rows"] == 40, figures
    assert any("archive_gap" in line for line in cluster.log_lines(victim))
    assert_whole(cluster, victim, ids, expected)

    # A fourth member, added now: it too catches up by snapshot (the leader compacted).
    for other in cluster.live_nodes():
        cluster.request(other, "POST", "/v1/cluster/compact", token=admin)
    newcomer = joining.join_node(cluster, "n4")
    cluster.start_node(newcomer)
    status, answer, _ = cluster.call("POST", "/v1/cluster/members?wait_s=60",
                                     joining.body(newcomer), token=admin, timeout_s=90)
    assert status == 201, answer
    figures = filled(cluster, newcomer, "n4's archive filled")
    assert figures["rows"] == 40, figures
    assert_whole(cluster, newcomer, ids, expected)


def assert_whole(cluster: LocalCluster, node: LocalNode, ids: list[int],
                 expected: dict[int, Any]) -> None:
    """`node` answers every one of `ids` from its own archive, by id and by payload field."""
    for job_id in ids:
        status, view, _ = cluster.request(node, "GET", f"/v1/jobs/{job_id}",
                                          headers={LOCAL_HEADER: "1"})
        assert status == 200 and view == expected[job_id], (node.node_id, job_id, view)
    found = local_search(cluster, node, "payload.customer.id.gte=10&payload.customer.id.lte=19"
                                        "&created_from_ms=0&limit=100")
    assert "archive_incomplete" not in found
    assert sorted(job["id"] for job in found["jobs"]) == ids[10:20]


def test_a_purge_removes_live_and_archived_jobs_on_every_member_and_a_fill_never_brings_them_back(
        cluster_factory: ClusterKeeper) -> None:
    cluster = cluster_factory.open()
    admin = cluster.admin_token
    keep_succeeded(cluster, 4)
    status, created, _ = cluster.call("POST", "/v1/jobs/batch", {"jobs": [
        {"task": "invoice", "queue": "purge", "payload": {"customer": {"id": n % 3}}}
        for n in range(12)]})
    assert status == 201, created
    ids = [job["id"] for job in created["jobs"]]
    drain(cluster, "purge")
    wait_archived(cluster, ids[:8], "the oldest 8")
    gone = ids[1::3]  # customer 1: three archived, one still live
    connect = ",".join(node.url for node in cluster.nodes)
    purged = subprocess.run(
        [sys.executable, "-m", "raftcron.cluster.commandline", "jobs", "purge", "--payload",
         "customer.id=1", "--created-from", "0", "--yes", "--connect", connect,
         *(["--api-token", admin] if admin else [])],
        capture_output=True, text=True, timeout=60, check=False)
    assert purged.returncode == 0, purged.stderr
    assert "purged 4 of 4" in purged.stdout, purged.stdout
    for node in cluster.nodes:
        # At once, on every member that applied the purge (a consistent read waits for it),
        # whether or not its archive's writer has deleted the rows yet.
        for job_id in gone:
            status, _, _ = cluster.request(node, "GET", f"/v1/jobs/{job_id}?consistent=1")
            assert status == 404, (node.node_id, job_id)
        kept = [job_id for job_id in ids if job_on(cluster, node, job_id) is not None]
        assert kept == [job_id for job_id in ids if job_id not in gone]
        found = local_search(cluster, node, "payload.customer.id=1&created_from_ms=0")
        assert found["jobs"] == []
    # A member rejoined empty fills its archive from its peers: never the purged jobs.
    victim = cluster.nodes[1]
    rejoin_empty(cluster, victim)
    figures = filled(cluster, victim, "the rejoined member's archive filled")
    assert figures["rows"] == 8 - 3, figures
    for job_id in gone:
        status, _, _ = cluster.request(victim, "GET", f"/v1/jobs/{job_id}",
                                       headers={LOCAL_HEADER: "1"})
        assert status == 404
