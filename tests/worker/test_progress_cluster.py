"""A handler's progress on a real 3-node cluster with a real worker process: `raftcron jobs
show` sees the report while the job runs, and the finished job keeps the last one."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftcron.cluster.clients.client import Client
from raftcron.cluster.commandline import main as cli
from raftcron.cluster.dev.localcluster import LocalCluster

from .conftest import StartWorker, eventually


def jobs_show(cluster: LocalCluster, capsys: pytest.CaptureFixture[str], job_id: int) -> str:
    connect = ",".join(node.url for node in cluster.nodes)
    code = cli.main(["jobs", "show", "--connect", connect, str(job_id)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_jobs_show_follows_a_running_handlers_progress(
    cluster: LocalCluster,
    client: Client,
    queue: str,
    start_worker: StartWorker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    release = tmp_path / "release"
    job = client.submit("report-progress", {"total": 4, "release": str(release)}, queue=queue)
    start_worker(queue, "w-progress")

    shown = eventually(
        lambda: (out := jobs_show(cluster, capsys, job["id"])) and "25% (1/4)" in out and out,
        20, "jobs show to print the first report")
    assert '"step 1"' in shown and "(attempt 1)" in shown and "running" in shown
    running = client.job(job["id"])
    assert running["status"] == "running"
    assert running["progress"]["data"] == {"started": 1}

    release.write_text("go")
    finished = eventually(
        lambda: (read := client.job(job["id"]))["status"] == "succeeded" and read,
        20, "the job to succeed")
    # Three reports within a second at the end: the last one is the one kept.
    assert finished["progress"]["value"] == {"done": 4, "total": 4}
    assert finished["progress"]["message"] == "step 4"
    assert finished["result"] == {"steps": 4}
    assert "100% (4/4)" in eventually(
        lambda: (out := jobs_show(cluster, capsys, job["id"])) and "100%" in out and out,
        10, "jobs show to print the last report")
