"""The shell task through a real cluster and real worker processes: a worker serves it only
when allowed, and a shell job cannot read the worker's token or settings back (DESIGN.md §8.3).
"""

from __future__ import annotations

from pathlib import Path

from raftcron.cluster.clients.client import Client

from .conftest import StartWorker

WORKER_SECRET = "wrk-secret-token-123"


def test_a_worker_runs_no_shell_job_unless_allowed(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(queue, "w-no-shell", allow_shell=False)
    marker = tmp_path / "RAN"
    job = client.submit("shell", {"argv": ["touch", str(marker)]}, queue=queue, max_attempts=1)
    done = client.wait(job["id"], timeout_s=30)
    assert done["status"] == "failed" and "no handler for task 'shell'" in done["error"]
    assert not marker.exists()


def test_a_shell_job_cannot_read_the_workers_token_or_settings(
    client: Client, queue: str, start_worker: StartWorker
) -> None:
    start_worker(queue, "w-shell", extra_env={
        "RAFTCRON_API_TOKEN": WORKER_SECRET, "RAFTCRON_WAIT_MS": "900", "APP_SECRET": "s3"})
    job = client.submit("shell", {"argv": ["sh", "-c", "env"]}, queue=queue, max_attempts=1)
    done = client.wait(job["id"], timeout_s=30)
    assert done["status"] == "succeeded", done
    names = {line.split("=", 1)[0] for line in done["result"]["stdout"].splitlines()}
    assert WORKER_SECRET not in done["result"]["stdout"]
    assert "RAFTCRON_API_TOKEN" not in names and "RAFTCRON_WAIT_MS" not in names
    assert "APP_SECRET" not in names and "PATH" in names
    assert names >= {"RAFTCRON_JOB_ID", "RAFTCRON_TOKEN"}
