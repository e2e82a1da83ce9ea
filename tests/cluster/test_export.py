"""`raftcron jobs export` against a real cluster (cluster/commandline/exportcli.py): live and
archived jobs that a search matches, each exactly once with its payload and result, into a file that
appears only whole or onto standard output; and through a leader killed and restarted in the
middle of an export, which goes on from its cursor instead of starting over."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ClusterKeeper
from drains import drain, wait_archived

from raftcron.cluster.clients.client import Client
from raftcron.cluster.commandline import exportcli
from raftcron.cluster.dev.localcluster import LocalCluster

pytestmark = pytest.mark.processes

KEPT = 4  # finished jobs retention keeps: the older ones go to the archive


def submit(cluster: LocalCluster, queue: str, customers: range) -> list[int]:
    status, created, _ = cluster.call("POST", "/v1/jobs/batch", {"jobs": [
        {"task": "invoice", "queue": queue, "payload": {"customer": {"id": n}, "note": "né"}}
        for n in customers]})
    assert status == 201, created
    return [job["id"] for job in created["jobs"]]


def export(cluster: LocalCluster, *words: str) -> subprocess.CompletedProcess[str]:
    connect = ",".join(node.url for node in cluster.nodes)
    return subprocess.run(
        [sys.executable, "-m", "raftcron.cluster.commandline", "jobs", "export", *words,
         "--connect", connect], capture_output=True, text=True, timeout=120, check=False)


def rows(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def finished_and_waiting(cluster_factory: ClusterKeeper) -> tuple[LocalCluster, list[int],
                                                                   list[int]]:
    """A cluster with 23 finished jobs (the oldest 19 archived) and 3 still queued."""
    cluster = cluster_factory.open()
    status, body, _ = cluster.call("PUT", "/v1/settings/retention",
                                   {"succeeded": {"max_count": KEPT}}, token=cluster.admin_token)
    assert status == 200, body
    finished = submit(cluster, "export", range(23))
    drain(cluster, "export", result=lambda job: {"paid": job["payload"]["customer"]["id"]})
    waiting = submit(cluster, "export-later", range(100, 103))
    wait_archived(cluster, finished[:-KEPT], f"the oldest {len(finished) - KEPT}")
    return cluster, finished, waiting


def test_an_export_gives_every_live_and_archived_job_once_with_payload_into_a_whole_file(
        finished_and_waiting: tuple[LocalCluster, list[int], list[int]], tmp_path: Path) -> None:
    cluster, finished, waiting = finished_and_waiting
    out = tmp_path / "jobs.jsonl"
    done = export(cluster, "--task", "invoice", "--out", str(out), "--page-size", "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and not Path(f"{out}.partial").exists()
    assert done.stderr.splitlines()[-1].startswith(
        f"raftcron jobs export: {len(finished) + len(waiting)} jobs in "), done.stderr
    exported = rows(out.read_text("utf-8"))
    assert [job["id"] for job in exported] == sorted(finished + waiting, reverse=True)
    by_id = {job["id"]: job for job in exported}
    for customer, job_id in enumerate(finished):
        job = by_id[job_id]
        assert job["archived"] is (job_id in finished[:-KEPT]), job
        assert job["payload"] == {"customer": {"id": customer}, "note": "né"}
        assert (job["status"], job["result"]) == ("succeeded", {"paid": customer})
    for customer, job_id in zip(range(100, 103), waiting, strict=True):
        assert by_id[job_id]["archived"] is False and by_id[job_id]["status"] == "queued"
        assert by_id[job_id]["payload"]["customer"] == {"id": customer}

    # The filters of `jobs list`, onto standard output: archived jobs by a payload range.
    done = export(cluster, "--archived", "--payload", "customer.id.gte=3", "--payload",
                  "customer.id.lte=8", "--created-from", "0", "--quiet")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert [job["id"] for job in rows(done.stdout)] == finished[8:2:-1]

    # A search the cluster refuses (a payload field without a time range) exits 1, no file.
    refused = tmp_path / "refused.jsonl"
    done = export(cluster, "--payload", "customer.id=3", "--out", str(refused))
    assert done.returncode == 1 and "created_from_ms" in done.stderr, done.stderr
    assert not refused.exists() and not Path(f"{refused}.partial").exists()


class RestartsTheLeader:
    """A client whose second page is asked right after the leader was killed (-9) and started
    again: the page is retried on the other nodes, through the election."""

    def __init__(self, client: Client, cluster: LocalCluster) -> None:
        self.client = client
        self.cluster = cluster
        self.pages = 0
        self.restarted = ""

    def jobs(self, **params: Any) -> dict[str, Any]:
        self.pages += 1
        if self.pages == 2:
            leader = self.cluster.leader()
            self.cluster.restart(leader)
            self.restarted = leader.node_id
        return self.client.jobs(**params)


def test_an_export_goes_on_from_its_cursor_through_a_leader_restart(
        finished_and_waiting: tuple[LocalCluster, list[int], list[int]], tmp_path: Path) -> None:
    cluster, finished, waiting = finished_and_waiting
    connect = [node.url for node in cluster.nodes]
    position = exportcli.Position()
    with Client(connect, consistent_reads=True, retry_deadline_s=30) as client, \
            open(tmp_path / "jobs.jsonl", "wb") as sink:
        paging = RestartsTheLeader(client, cluster)
        exportcli.export_jobs(paging, {"task": "invoice"}, sink, page_size=5,
                              position=position, progress=exportcli.Progress(None))
        failovers = client.aio.failovers
    assert failovers >= 1  # the second page was asked of another node than the first
    assert paging.restarted and paging.pages == 6  # 26 jobs, 5 a page: nothing asked twice
    exported = rows((tmp_path / "jobs.jsonl").read_text("utf-8"))
    assert [job["id"] for job in exported] == sorted(finished + waiting, reverse=True)
    assert position.done and position.jobs == len(exported)
    cluster.wait_ready(30)
