"""Flow control with real workers against a real 3-node cluster (DESIGN.md §8.5): a queue's
cap, a key's max, a rate, a pause, and a bulk cancel from the CLI, measured from what the
workers did (each `hold` job writes its wall-clock start and end) and from the jobs' attempts.

The cluster is the worker tests' shared one; each test has a queue of its own.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster.clients.client import Client
from raftcron.cluster.commandline import main as cli
from raftcron.cluster.dev.localcluster import LocalCluster

from .conftest import StartWorker


def held_intervals(folder: Path) -> list[tuple[float, float]]:
    """(start, end) of every `hold` run in the folder, by start."""
    found = []
    for path in folder.glob("*.held"):
        start, end = path.read_text().split()
        found.append((float(start), float(end)))
    return sorted(found)


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals that overlap at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        running += step
        peak = max(peak, running)
    return peak


def hold_jobs(queue: str, folder: Path, count: int, ms: int, **fields: Any) -> list[dict[str, Any]]:
    return [{"task": "hold", "queue": queue, "payload": {"dir": str(folder), "ms": ms}, **fields}
            for _ in range(count)]


def wait_all(client: Client, jobs: list[dict[str, Any]], timeout_s: float = 60) -> list[Any]:
    return [client.wait(job["id"], timeout_s=timeout_s) for job in jobs]


def test_a_queue_limited_to_2_never_runs_3_at_once(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    client.request("PUT", f"/v1/queues/{queue}", {"concurrency_max": 2}, write=True)
    jobs = client.submit_batch(hold_jobs(queue, tmp_path, 8, 300))
    for name in ("w-cap-1", "w-cap-2"):
        start_worker(queue, name, concurrency=4)
    assert all(job["status"] == "succeeded" for job in wait_all(client, jobs))
    intervals = held_intervals(tmp_path)
    assert len(intervals) == 8
    assert most_at_once(intervals) == 2, intervals  # the cap, reached and never passed


def test_a_key_limited_to_1_never_overlaps_and_blocks_no_other_job(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    keyed_dir, free_dir = tmp_path / "keyed", tmp_path / "free"
    keyed_dir.mkdir()
    free_dir.mkdir()
    other = f"{queue}-other"
    key = {"concurrency": {"key": f"acct-{queue}", "max": 1}}
    keyed = client.submit_batch(
        hold_jobs(queue, keyed_dir, 3, 300, **key) + hold_jobs(other, keyed_dir, 3, 300, **key)
    )
    free = client.submit_batch(hold_jobs(queue, free_dir, 4, 300))
    start_worker(f"{queue},{other}", "w-key", concurrency=6)
    # The unrelated jobs behind the key's are not held up by them: all done while the keyed
    # ones still take their turns (six of 300 ms, one at a time).
    assert all(job["status"] == "succeeded" for job in wait_all(client, free))
    assert len(held_intervals(keyed_dir)) < 6
    assert all(job["status"] == "succeeded" for job in wait_all(client, keyed))
    assert most_at_once(held_intervals(keyed_dir)) == 1


def test_5_per_second_means_5_per_second(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    rate = {"max": 5, "per_ms": 1_000}
    client.request("PUT", f"/v1/queues/{queue}", {"rate_limit": rate}, write=True)
    view = client.request("GET", f"/v1/queues/{queue}")
    assert view["rate_rule"] == "window"  # the cluster is finalized: the exact window
    jobs = client.submit_batch(hold_jobs(queue, tmp_path, 15, 0))
    for name in ("w-rate-1", "w-rate-2"):
        start_worker(queue, name, concurrency=8)
    done = wait_all(client, jobs)
    # The attempts' starts, in the cluster's time: never more than 5 in any window of 1 s
    # (a bucket would allow 5 at once and 5 refilled within the second after: 9 or 10).
    starts = sorted(job["history"][0]["start_ms"] for job in done)
    for first, start_ms in enumerate(starts):
        in_window = [s for s in starts[first:] if s - start_ms < 1_000]
        assert len(in_window) <= 5, (starts, start_ms)
    assert starts[-1] - starts[0] >= 2_000, starts
    # And as the workers saw them: 15 starts over about 2 s, not in one burst.
    seen = [start for start, _ in held_intervals(tmp_path)]
    assert len(seen) == 15
    assert 1.9 <= seen[-1] - seen[0] <= 6.0, seen


def test_a_paused_queue_hands_out_nothing_and_resumes(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path,
    cluster: LocalCluster,
) -> None:
    client.request("POST", f"/v1/queues/{queue}/pause", {}, write=True)
    jobs = client.submit_batch(hold_jobs(queue, tmp_path, 3, 0))
    worker = start_worker(queue, "w-paused-queue", concurrency=2, wait_ms=500)
    # The worker claims (long polls of 500 ms) for 1.5 s and is handed nothing.
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert worker.process.poll() is None, worker.log_tail()
        assert held_intervals(tmp_path) == []
        time.sleep(0.1)
    view = client.request("GET", f"/v1/queues/{queue}")
    assert (view["paused"], view["queued"], view["held"]["paused"]) == (True, 3, 3)
    metrics = cluster.request(cluster.nodes[0], "GET", "/metrics")[1]
    assert f'raftcron_queue_paused{{queue="{queue}"}} 1' in metrics
    assert f'raftcron_queue_held_jobs{{queue="{queue}",reason="paused"}} 3' in metrics
    client.request("POST", f"/v1/queues/{queue}/resume", {}, write=True)
    assert all(job["status"] == "succeeded" for job in wait_all(client, jobs))


def test_a_bulk_cancel_from_the_cli_touches_exactly_the_matching_jobs(
    client: Client, queue: str, cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    later = {"queue": queue, "delay_ms": 3_600_000}
    matching = client.submit_batch([{"task": "x", **later}] * 1_000)
    matching += client.submit_batch([{"task": "x", **later}] * 200)
    others = client.submit_batch([{"task": "y", **later}] * 50)
    elsewhere = client.submit_batch([{"task": "x", "queue": f"{queue}-b", "delay_ms": 3_600_000}])
    connect = ["--connect", ",".join(node.url for node in cluster.nodes)]
    filters = ["--task", "x", "--queue", queue]

    assert cli.main(["jobs", "cancel", *connect, *filters, "--dry-run"]) == 0
    assert capsys.readouterr().out == "1200 jobs match; nothing changed\n"
    assert cli.main(["jobs", "cancel", *connect, *filters]) == 2  # no terminal, no --yes
    assert "add --yes" in capsys.readouterr().err
    assert cli.main(["jobs", "cancel", *connect, *filters, "--yes", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert (answer["matched"], answer["changed"]) == (1200, 1200)
    node = cluster.nodes[0]
    for name in (queue, f"{queue}-b"):
        def ids(status: str, name: str = name) -> set[int]:
            found = cluster.list_jobs(node, queue=name, status=status, consistent=1)
            return {job["id"] for job in found}

        cancelled, kept = ids("cancelled"), ids("scheduled")
        if name == queue:
            assert cancelled == {job["id"] for job in matching}
            assert kept == {job["id"] for job in others}
        else:
            assert (cancelled, kept) == (set(), {elsewhere[0]["id"]})


def test_a_rate_key_is_kept_across_two_workers_and_holds_up_no_other_key(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path,
    cluster: LocalCluster,
) -> None:
    limited = {"key": f"{queue}-cust-42", "max": 3, "per_ms": 1_000}
    jobs = client.submit_batch(hold_jobs(queue, tmp_path, 9, 0, rate=limited))
    other = {**limited, "key": f"{queue}-cust-7"}
    others = client.submit_batch(hold_jobs(queue, tmp_path, 6, 0, rate=other))
    view = client.request("GET", f"/v1/queues/{queue}")
    assert view["held"]["key_rate"] == 6 + 3, view  # 3 of each key in line, the rest held
    metrics = cluster.request(cluster.nodes[0], "GET", "/metrics")[1]
    assert f'raftcron_queue_held_jobs{{queue="{queue}",reason="key_rate"}}' in metrics
    for name in ("w-key-rate-1", "w-key-rate-2"):
        start_worker(queue, name, concurrency=8)
    done = wait_all(client, jobs)
    assert done[0]["rate"] == limited
    starts = sorted(job["history"][0]["start_ms"] for job in done)
    for first, start_ms in enumerate(starts):
        assert len([s for s in starts[first:] if s - start_ms < 1_000]) <= 3, starts
    assert starts[-1] - starts[0] >= 2_000, starts
    # The other key's jobs went at their own rate beside them, not after them.
    other_starts = sorted(job["history"][0]["start_ms"] for job in wait_all(client, others))
    assert other_starts[0] - starts[0] < 1_000, (starts, other_starts)


def test_a_small_customer_is_not_kept_behind_a_big_customers_burst(
    client: Client, queue: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    burst = client.submit_batch(hold_jobs(queue, tmp_path, 300, 5,
                                          fairness={"key": f"{queue}-A"}))
    small = client.submit_batch(hold_jobs(queue, tmp_path, 10, 5,
                                          fairness={"key": f"{queue}-B"}))  # after all of A's
    start_worker(queue, "w-fair", concurrency=4)
    small_done = wait_all(client, small)
    assert small_done[0]["fairness"] == {"key": f"{queue}-B", "weight": 1}
    b_last_ms = max(job["finished_ms"] for job in small_done)
    burst_done = wait_all(client, burst)
    # B's 10 went in turns with A's, not after A's 300: most of the burst was still to run.
    after = sum(1 for job in burst_done if job["finished_ms"] > b_last_ms)
    assert after >= 200, (after, b_last_ms)
