"""The archive on a real cluster (DESIGN.md §9.2): a job that retention evicts is still found
by id on every member, as it was when it finished, with `"archived": true`; across a `kill -9`
and restart from a snapshot that covers the eviction (the snapshot waited for the archive) and
one whose log still holds it (replayed, written again); across a `kill -9` between the eviction
and the archive's write (the writer held, a compaction asked for meanwhile); retried, it is
409. One search finds live and archived jobs by any field, each once across pages."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import ClusterKeeper
from drains import drain, job_on, keep_succeeded, wait_archived

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode
from raftcron.cluster.http import bounds

pytestmark = pytest.mark.processes


def submit(cluster: LocalCluster, queue: str, count: int) -> list[int]:
    status, created, _ = cluster.call("POST", "/v1/jobs/batch", {"jobs": [
        {"task": "invoice", "queue": queue, "payload": {"customer": {"id": n}}}
        for n in range(count)]})
    assert status == 201, created
    return [job["id"] for job in created["jobs"]]


def test_an_evicted_job_is_found_archived_on_every_member_and_after_restarts(
        cluster_factory: ClusterKeeper) -> None:
    cluster = cluster_factory.open()
    keep_succeeded(cluster, 5)
    ids = submit(cluster, "billing", 12)
    drain(cluster, "billing", result=lambda job: {"done": job["payload"]["customer"]})
    first = cluster.nodes[0]
    finished = {job_id: job_on(cluster, first, job_id) for job_id in ids}
    evicted = ids[:7]  # the newest 5 stay
    wait_archived(cluster, evicted, "the 7 evicted jobs")
    for node in cluster.nodes:
        for job_id in evicted:
            view = job_on(cluster, node, job_id)
            assert view is not None
            live = finished[job_id]
            assert live is not None and live["status"] == "succeeded"
            # What the job was when it left the state: status, payload, result, history.
            assert {**view, "archived": None} == {**live, "archived": None}, (node, job_id)
        for job_id in ids[7:]:
            view = job_on(cluster, node, job_id)
            assert view is not None and "archived" not in view

    status, refused, _ = cluster.call("POST", f"/v1/jobs/{evicted[0]}/retry", {},
                                      token=cluster.admin_token)
    assert status == 409 and "archived" in refused["error"]["message"], refused

    # A snapshot covers the evictions, the log before it goes: restarted from it, a member
    # still finds them (the snapshot waited for the archive to make them durable).
    for node in cluster.nodes:
        status, _, _ = cluster.request(node, "POST", "/v1/cluster/compact",
                                       token=cluster.admin_token)
        assert status in (200, 202)
    cluster.restart(first)  # SIGKILL
    cluster.wait_ready(30)
    for job_id in evicted:
        view = job_on(cluster, first, job_id)
        assert view is not None and view["archived"] is True and view["payload"] == {
            "customer": {"id": ids.index(job_id)}}

    # Evictions after the snapshot, then a kill -9: replayed from the log, written again.
    more = submit(cluster, "billing", 5)
    drain(cluster, "billing", result=lambda job: {"done": job["payload"]["customer"]})
    victim = cluster.nodes[1]
    wait_archived(cluster, ids[7:], "the next 5 evicted jobs")
    cluster.restart(victim)
    cluster.wait_ready(30)
    for job_id in ids:
        view = job_on(cluster, victim, job_id)
        assert view is not None and view["archived"] is True
    for job_id in more:
        view = job_on(cluster, victim, job_id)
        assert view is not None and "archived" not in view


@contextlib.contextmanager
def archive_held(node: LocalNode) -> Iterator[sqlite3.Connection]:
    """Hold the write lock of the node's archive from this process (`BEGIN IMMEDIATE` on its
    SQLite file): the node's writer can commit nothing, as behind a stalled disk, until the
    hold ends. The connection sees the file as it is (nobody else can change it)."""
    db = sqlite3.connect(node.data_dir / "archive.sqlite", isolation_level=None, timeout=10)
    try:
        db.execute("BEGIN IMMEDIATE")
        yield db
    finally:
        db.execute("ROLLBACK")
        db.close()


def cluster_view(cluster: LocalCluster, node: LocalNode) -> dict[str, Any]:
    status, view, _ = cluster.request(node, "GET", "/v1/cluster", token=cluster.admin_token)
    assert status == 200, view
    return dict(view)


def test_a_member_killed_between_eviction_and_archive_write_still_finds_every_job(
        cluster_factory: ClusterKeeper) -> None:
    """The window made real: a follower's archive writer is held (its file's write lock taken
    from here), jobs finish and are evicted, the follower applies the evictions (it answers
    them from the writer's hand-over, none is in its file), a compaction is asked for (its
    snapshot is written and must wait for the archive), then `kill -9`. Restarted, it replays
    the evictions from its log and finds every job. A snapshot that did not wait would cover
    the evictions, and the jobs would be in neither the state nor the archive (404)."""
    cluster = cluster_factory.open()
    admin = cluster.admin_token
    keep_succeeded(cluster, 0)
    victim = cluster.followers()[0]
    with archive_held(victim) as archive_file:
        ids = submit(cluster, "held", 30)
        drain(cluster, "held", result=lambda job: {"done": job["payload"]["customer"]})
        applied = cluster.wait_for(lambda: (lambda view: view["applied_index"] if view[
            "archive"]["pending_jobs"] >= len(ids) else None)(cluster_view(cluster, victim)),
            15, "the victim holds the 30 evicted jobs for its held writer")
        for job_id in ids:
            view = job_on(cluster, victim, job_id)
            assert view is not None and view["archived"] is True, view
        in_file = archive_file.execute(
            f"SELECT count(*) FROM jobs WHERE id IN ({','.join('?' * len(ids))})",
            ids).fetchone()[0]
        assert in_file == 0  # evicted, not written: the window
        status, _, _ = cluster.request(victim, "POST", "/v1/cluster/compact", token=admin)
        assert status == 202

        def snapshot_reaches_the_evictions() -> bool:
            written = [int(path.name.split(".")[1])
                       for path in victim.data_dir.glob("snapshot.*.tmp")]
            current = cluster_view(cluster, victim)["storage"]["snapshot_index"]
            return max([current, *written]) >= applied

        cluster.wait_for(snapshot_reaches_the_evictions, 30,
                         "a snapshot of the victim past its evictions (current or waiting)")
        cluster.kill(victim)  # SIGKILL: the writer never wrote them
    cluster.start_node(victim)
    cluster.wait_ready(30)
    wait_archived(cluster, ids, "the 30 jobs evicted before the kill")
    for number, job_id in enumerate(ids):
        view = job_on(cluster, victim, job_id)
        assert view is not None and view["status"] == "succeeded", view
        assert view["payload"] == {"customer": {"id": number}}
        assert view["result"] == {"done": {"id": number}}


def search(cluster: LocalCluster, node: LocalNode, **params: Any) -> list[dict[str, Any]]:
    """Every page of a search on one node, following next_cursor (bounded)."""
    found: list[dict[str, Any]] = []
    cursor = None
    for _ in range(200):
        query = {**params, **({"cursor": cursor} if cursor else {})}
        path = "/v1/jobs?" + "&".join(f"{name}={value}" for name, value in query.items())
        status, body, _ = cluster.request(node, "GET", path, token=cluster.admin_token)
        assert status == 200, body
        found += body["jobs"]
        cursor = body["next_cursor"]
        if cursor is None:
            return found
    raise AssertionError("a search that never ends")


def test_a_page_of_large_jobs_ends_at_its_byte_bound_and_the_walk_finds_each_once(
        cluster_factory: ClusterKeeper) -> None:
    """150 jobs of 60 KB payloads (9 MB), 80 of them archived: `limit=1000` used to answer all
    of them in one page, the node holding its whole JSON at once (a page of 1,000 such jobs
    took a node from 57 to 158 MiB); now each half of a page ends past PAGE_BYTES_MAX."""
    cluster = cluster_factory.open()
    keep_succeeded(cluster, 20)
    blob = "x" * 60_000
    ids: list[int] = []
    for batch in range(25):  # 6 a command: a command is at most 512 KiB
        status, created, _ = cluster.call("POST", "/v1/jobs/batch", {"jobs": [
            {"task": "big", "queue": "big", "payload": {"n": batch * 6 + n, "blob": blob}}
            for n in range(6)]})
        assert status == 201, created
        ids += [job["id"] for job in created["jobs"]]
    assert drain(cluster, "big", limit=100) == 100
    wait_archived(cluster, ids[:80], "the 80 evicted jobs")
    node = cluster.nodes[0]
    status, first, _ = cluster.request(node, "GET", "/v1/jobs?task=big&limit=1000",
                                       token=cluster.admin_token)
    assert status == 200, first
    assert 0 < len(first["jobs"]) < 150 and first["next_cursor"] is not None
    assert len(json.dumps(first)) < 2 * bounds.PAGE_BYTES_MAX + 2 * len(blob) + 100_000
    every = search(cluster, node, task="big", limit=1000)
    assert [job["id"] for job in every] == sorted(ids, reverse=True)
    assert sorted(job["payload"]["n"] for job in every) == list(range(150))


def test_one_search_finds_live_and_archived_jobs_by_payload_field_each_once(
        cluster_factory: ClusterKeeper) -> None:
    cluster = cluster_factory.open()
    keep_succeeded(cluster, 6)
    ids = submit(cluster, "search", 15)  # customer ids 0..14
    drain(cluster, "search")
    waiting = submit(cluster, "search-later", 3)  # queued, never claimed: live
    wait_archived(cluster, ids[:9], "the oldest 9")
    for node in cluster.nodes:
        # Every job once, newest first, whatever the page size, across the boundary.
        for limit in (1, 4, 100):
            every = search(cluster, node, task="invoice", limit=limit)
            assert [job["id"] for job in every] == sorted(ids + waiting, reverse=True)
            assert [job["id"] for job in every if job.get("archived")] == ids[8::-1]
        by_field = search(cluster, node, **{"payload.customer.id.gte": 3,
                                            "payload.customer.id.lte": 10,
                                            "created_from_ms": 0})
        # The waiting jobs' customers are 0..2: none in range.
        assert sorted(job["id"] for job in by_field) == ids[3:11]
        one = search(cluster, node, **{"payload.customer.id": 2, "created_from_ms": 0,
                                       "status": "succeeded"})
        assert [job["id"] for job in one] == [ids[2]] and one[0]["archived"] is True
        live_only = search(cluster, node, queue="search", archived="false")
        assert [job["id"] for job in live_only] == ids[:8:-1]
    connect = ",".join(node.url for node in cluster.nodes)
    listed = subprocess.run(
        [sys.executable, "-m", "raftcron.cluster.commandline", "jobs", "list", "--payload",
         "customer.id=2", "--created-from", "0", "--task", "invoice", "--archived",
         "--connect", connect], capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:] if line.strip()]
    assert [(int(row[0]), row[1], row[2]) for row in rows] == [
        (ids[2], "succeeded", "(archived)")], listed.stdout
    status, refused, _ = cluster.request(cluster.nodes[0], "GET",
                                         "/v1/jobs?payload.customer.id=2",
                                         token=cluster.admin_token)
    assert status == 400 and refused["error"]["field"] == "created_from_ms", refused
    status, refused, _ = cluster.request(cluster.nodes[0], "GET", "/v1/jobs?colour=red",
                                         token=cluster.admin_token)
    assert status == 400 and refused["error"]["field"] == "colour", refused


def test_archive_retention_drops_the_same_rows_on_every_member(
        cluster_factory: ClusterKeeper) -> None:
    cluster = cluster_factory.open()
    admin = cluster.admin_token
    keep_succeeded(cluster, 0)
    ids: list[int] = []
    for first in range(0, 20, 5):  # 5 x 60 KB a batch: under the 512 KiB a command may be
        status, created, _ = cluster.call("POST", "/v1/jobs/batch", {"jobs": [
            {"task": "big", "queue": "big",
             "payload": {"customer": {"id": n}, "blob": "x" * 60_000}}
            for n in range(first, first + 5)]})
        assert status == 201, created
        ids += [job["id"] for job in created["jobs"]]
    drain(cluster, "big")
    wait_archived(cluster, ids, "20 jobs of 60 KB")
    status, body, _ = cluster.call("GET", "/v1/settings", token=admin)
    assert body["usage"]["archive"]["bytes"] > 1 << 20  # 1.2 MB: more than the least allowed
    status, body, _ = cluster.call("PUT", "/v1/settings/archive", {"max_bytes": 1 << 20},
                                   token=admin)
    assert status == 200 and body["archive"]["max_bytes"] == 1 << 20, body
    # The oldest minute's rows go together (all 20, unless they left across a minute's
    # edge), and every member keeps exactly the same ones: the newest.
    usage = cluster.wait_for(lambda: (lambda u: u if u["archive"]["floor"] > 1 else None)(
        cluster.call("GET", "/v1/settings", token=admin)[1]["usage"]), 15, "the floor moved")
    assert usage["archive"]["bytes"] <= 1 << 20

    def kept_on(node: LocalNode) -> list[int]:
        return [job_id for job_id in ids if job_on(cluster, node, job_id) is not None]

    # Trimmed when the row count (kept in the trim's own transaction) says so, nothing left
    # to write: reading the 20 jobs one by one while a trim commits would see some of them
    # before it, some after.
    for node in cluster.nodes:
        cluster.wait_for(lambda node=node: (lambda archive: archive["rows"] < 20 and archive[
            "pending_jobs"] == 0)(cluster_view(cluster, node)["archive"]), 15,
            f"the archive of {node.node_id} trimmed")
    kept = {node.node_id: kept_on(node) for node in cluster.nodes}
    first = kept[cluster.nodes[0].node_id]
    assert all(k == first for k in kept.values()), kept
    assert first == ids[len(ids) - len(first):]  # the newest stay, if any
    for node in cluster.nodes:
        status, view, _ = cluster.request(node, "GET", "/v1/cluster", token=admin)
        assert view["archive"]["rows"] == len(first), view
