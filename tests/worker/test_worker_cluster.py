"""The worker against a real 3-node cluster on loopback: jobs run and land, dead and paused
workers are fenced out, failed jobs back off into the dead letter, SIGTERM drains.

Handlers live in `sample_tasks.py`; each writes `<job>.<token>.<event>` markers into the
test's folder, so a test sees which attempt ran where even when a worker died mid-job.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from raftcron.cluster.clients.client import ApiError, Client

from .conftest import StartWorker, eventually, markers, request_table_bytes


def payload(folder: Path, **extra: object) -> dict[str, object]:
    return {"dir": str(folder), "release": str(folder / "release"), **extra}


def outcomes(job: dict[str, object]) -> list[tuple[object, object, object]]:
    history = job["history"]
    assert isinstance(history, list)
    return [(a["worker"], a["token"], a["outcome"]) for a in history]


def test_a_python_handler_job_and_a_shell_job_succeed_with_their_results_stored(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(queue, "w-basic")
    echo = client.submit("echo", {"n": 1}, queue=queue, key=f"{queue}-echo")
    script = 'echo "job=$RAFTCRON_JOB_ID key=$RAFTCRON_JOB_KEY attempt=$RAFTCRON_ATTEMPT"; cat'
    shell_payload = {"argv": ["sh", "-c", script], "env": {"UNUSED": "1"}}
    shell = client.submit("shell", shell_payload, queue=queue, key=f"{queue}-shell")
    broken = client.submit("shell", {"argv": ["sh", "-c", "exit 3"]}, queue=queue, max_attempts=1)

    done = client.wait(echo["id"], timeout_s=30)
    assert done["status"] == "succeeded"
    assert done["result"] == {
        "echo": {"n": 1},
        "worker": "w-basic",
        "token": done["history"][0]["token"],
        "attempt": 1,
        "key": f"{queue}-echo",
    }
    done = client.wait(shell["id"], timeout_s=30)
    assert done["status"] == "succeeded", done
    result = done["result"]
    first_line, stdin = result["stdout"].split("\n", 1)
    assert first_line == f"job={shell['id']} key={queue}-shell attempt=1"
    assert json.loads(stdin) == shell_payload
    assert result["exit_code"] == 0 and result["stderr"] == ""
    assert outcomes(done) == [("w-basic", done["history"][0]["token"], "succeeded")]
    done = client.wait(broken["id"], timeout_s=30)
    assert done["status"] == "failed" and done["error"] == "exit code 3"


def test_a_worker_killed_mid_job_is_replaced_after_its_lease_expires(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    # One slot: no long poll in flight that could claim for the dead worker.
    first = start_worker(queue, "w-killed", concurrency=1, lease_ms=1000)
    job = client.submit(
        "block", payload(tmp_path), queue=queue, backoff={"initial_ms": 100, "jitter": 0}
    )
    [token_killed] = eventually(lambda: markers(tmp_path, job["id"], "started"))
    first.kill()
    start_worker(queue, "w-second", concurrency=1)
    token_second = eventually(
        lambda: [t for t in markers(tmp_path, job["id"], "started") if t != token_killed],
        what="the second worker starting the job",
    )[0]
    assert token_second > token_killed
    (tmp_path / "release").touch()

    done = client.wait(job["id"], timeout_s=30)
    assert done["status"] == "succeeded"
    assert done["result"]["worker"] == "w-second" and done["result"]["token"] == token_second
    assert outcomes(done) == [
        ("w-killed", token_killed, "lease_expired"),
        ("w-second", token_second, "succeeded"),
    ]
    # Exactly one completion is accepted: the dead worker's token can no longer complete it.
    with pytest.raises(ApiError) as late:
        client.complete(job["id"], token_killed, {"late": True})
    assert late.value.status == 409 and late.value.code == "stale_token"
    assert client.job(job["id"])["result"]["worker"] == "w-second"


def test_a_paused_worker_resumed_after_its_lease_expired_reports_nothing(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    paused = start_worker(queue, "w-paused", concurrency=1, lease_ms=1000)
    job = client.submit(
        "block", payload(tmp_path), queue=queue, backoff={"initial_ms": 100, "jitter": 0}
    )
    [token_paused] = eventually(lambda: markers(tmp_path, job["id"], "started"))
    paused.pause()
    eventually(
        lambda: client.job(job["id"])["history"][0]["outcome"] == "lease_expired",
        what="the paused worker's lease to expire",
    )
    start_worker(queue, "w-other", concurrency=1)
    eventually(lambda: len(markers(tmp_path, job["id"], "started")) == 2)
    (tmp_path / "release").touch()
    done = client.wait(job["id"], timeout_s=30)
    assert done["status"] == "succeeded" and done["result"]["worker"] == "w-other"

    paused.resume()
    abandoned = paused.wait_for_event("job_abandoned", job["id"])
    assert abandoned["token"] == token_paused
    assert abandoned["reason"] == "lease_lost"
    for action in ("job_succeeded", "job_failed", "ack_refused"):
        assert paused.events(action, job["id"]) == [], paused.log_tail()
    with pytest.raises(ApiError) as late:
        client.complete(job["id"], token_paused, {"late": True})
    assert late.value.status == 409 and late.value.code == "stale_token"
    after = client.job(job["id"])
    assert after["result"]["worker"] == "w-other" and outcomes(after) == outcomes(done)
    assert paused.process.poll() is None  # it lost a job, not its life


def test_a_failing_job_backs_off_then_lands_in_the_dead_letter(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(queue, "w-retry")
    backoff = {"initial_ms": 200, "factor": 2, "max_ms": 10_000, "jitter": 0}
    job = client.submit("boom", payload(tmp_path), queue=queue, max_attempts=3, backoff=backoff)
    hopeless = client.submit("permanent", {}, queue=queue, max_attempts=3)

    done = client.wait(job["id"], timeout_s=30)
    assert done["status"] == "failed" and done["attempts"] == 3
    assert done["error"].startswith("RuntimeError: boom on attempt 3")
    history = done["history"]
    assert [a["outcome"] for a in history] == ["failed"] * 3
    assert history[1]["start_ms"] - history[0]["end_ms"] >= 200
    assert history[2]["start_ms"] - history[1]["end_ms"] >= 400
    dead = client.jobs(status="failed", queue=queue)["jobs"]
    assert job["id"] in [j["id"] for j in dead]

    done = client.wait(hopeless["id"], timeout_s=30)
    assert done["status"] == "failed" and done["attempts"] == 1
    assert done["error"] == "this input can never work"

    # A manual retry brings it back for another round of attempts.
    assert client.retry(job["id"])["status"] in ("queued", "scheduled")
    again = eventually(
        lambda: (j := client.job(job["id"]))["status"] == "failed" and j["attempts"] == 6 and j,
        what="the retried job to fail three more times",
    )
    assert again["error"].startswith("RuntimeError: boom on attempt 6")


def test_cancelling_a_running_job_stops_its_handler_and_nothing_is_reported(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    worker = start_worker(queue, "w-cancel")
    job = client.submit("block-async", payload(tmp_path), queue=queue)
    [token] = eventually(lambda: markers(tmp_path, job["id"], "started"))
    client.cancel(job["id"], reason="changed my mind")
    abandoned = worker.wait_for_event("job_abandoned", job["id"])
    assert abandoned["reason"] == "job_cancelled"
    assert markers(tmp_path, job["id"], "cancelled") == [token]
    done = client.job(job["id"])
    assert done["status"] == "cancelled" and outcomes(done) == [("w-cancel", token, "cancelled")]
    assert worker.events("ack_refused") == []


def test_a_shell_job_over_its_timeout_is_killed_and_failed(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker(queue, "w-timeout")
    pid_file = tmp_path / "sleep.pid"
    argv = ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]
    job = client.submit("shell", {"argv": argv}, queue=queue, timeout_ms=500, max_attempts=1)
    done = client.wait(job["id"], timeout_s=30)
    assert done["status"] == "failed" and done["error"] == "timed out after 500 ms"
    pid = int(pid_file.read_text())
    eventually(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 10, "sleep to die")


def test_sigterm_lets_running_jobs_finish_and_claims_nothing_more(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    worker = start_worker(queue, "w-drain", concurrency=2)
    jobs = [client.submit("block", payload(tmp_path), queue=queue) for _ in range(2)]
    eventually(lambda: all(markers(tmp_path, job["id"], "started") for job in jobs))
    worker.signal(signal.SIGTERM)
    worker.wait_for_event("drain_started")
    assert worker.process.poll() is None
    late = client.submit("echo", {}, queue=queue)
    (tmp_path / "release").touch()
    assert worker.wait(30) == 0
    for job in jobs:
        done = client.job(job["id"])
        assert done["status"] == "succeeded" and done["result"]["worker"] == "w-drain"
    assert worker.events("drained") and worker.events("worker_stopped")
    assert client.job(late["id"])["status"] == "queued"
    client.cancel(late["id"])


def test_a_drain_that_runs_out_of_time_fails_the_job_for_a_retry(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    worker = start_worker(queue, "w-short-drain", concurrency=1, drain_timeout_ms=300)
    job = client.submit("block", payload(tmp_path), queue=queue)
    [token] = eventually(lambda: markers(tmp_path, job["id"], "started"))
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert markers(tmp_path, job["id"], "cancelled") == [token]
    done = client.job(job["id"])
    assert done["status"] in ("queued", "scheduled")
    assert outcomes(done) == [("w-short-drain", token, "failed")]
    assert done["history"][0]["error"] == "worker w-short-drain stopped before the job finished"
    client.cancel(job["id"])


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def test_running_jobs_heartbeats_take_no_room_in_the_request_table(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    """A new cluster is finalized: a heartbeat without a progress report leaves no entry in the
    request table (scheduler/requests.py `dedupe_id`), so the jobs running at once do not fill
    it. 20 jobs on a 1 s lease beat three times a second each."""
    start_worker(queue, "w-beats", concurrency=20, lease_ms=1000)
    jobs = [client.submit("block", payload(tmp_path), queue=queue)["id"] for _ in range(20)]
    eventually(lambda: all(markers(tmp_path, job_id, "started") for job_id in jobs), 30,
               "every job started")

    def lease_ends() -> list[int]:
        return [int(client.job(job_id)["lease_until_ms"] or 0) for job_id in jobs]

    before, first_ends = request_table_bytes(client), lease_ends()
    # Four seconds of leases moved on: about 12 heartbeats a job, 240 in all, which took ~200
    # bytes each of the table (48 KB) when they were remembered.
    eventually(lambda: min(e - f for e, f in zip(lease_ends(), first_ends, strict=True)) >= 4000,
               30, "every lease extended by 4 s")
    grown = request_table_bytes(client) - before
    assert grown < 10_000, f"the request table grew {grown} bytes while the jobs only beat"
    (tmp_path / "release").write_text("")
    for job_id in jobs:
        assert client.wait(job_id, timeout_s=30)["status"] == "succeeded"
