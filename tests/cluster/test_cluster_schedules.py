"""Schedules on a real cluster under crashes: every fire time creates exactly one job while the
leader is killed and restarted, and after the whole cluster was down for longer than the
misfire grace, each policy fires exactly what it promises; no acknowledged job is lost.

Fire times are read back with `GET /v1/jobs?schedule=NAME` (`fire_time_ms` and key
`<schedule>@<fire_time_ms>`). A fired job's `created_ms` is the state clock of the Tick that
fired it, so the Tick that caught up after the outage can be named exactly.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from raftcron.cluster.dev.localcluster import LocalCluster

INTERVAL_MS = 1_000
EVERY_SECOND = {"every": "1s", "job": {"task": "tick", "queue": "scheduled"}}


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def put_schedule(cluster: LocalCluster, name: str, **spec: Any) -> None:
    body = {**EVERY_SECOND, **spec, "request_id": f"put-{name}"}
    status, answer, _ = cluster.call("PUT", f"/v1/schedules/{name}", body)
    assert status in (200, 201), answer


def fired_jobs(cluster: LocalCluster, name: str) -> list[dict[str, Any]]:
    """The schedule's jobs, oldest fire first, as the leader holds them after a barrier."""
    leader = cluster.leader()
    jobs = cluster.list_jobs(leader, schedule=name, consistent=1)
    return sorted(jobs, key=lambda job: (job["fire_time_ms"], job["id"]))


def fire_times(jobs: list[dict[str, Any]]) -> list[int]:
    return [job["fire_time_ms"] for job in jobs]


def wait_for_fire_after(cluster: LocalCluster, names: list[str], after_ms: int) -> None:
    """Until every schedule has fired a time later than after_ms."""

    def fired() -> bool:
        try:
            return all(max(fire_times(fired_jobs(cluster, n)), default=0) > after_ms for n in names)
        except Exception:  # an election in progress: ask again
            return False

    cluster.wait_for(fired, 20, f"fires after {after_ms} of {names}")


def assert_one_job_per_time(name: str, jobs: list[dict[str, Any]]) -> None:
    duplicates = [t for t, count in Counter(fire_times(jobs)).items() if count > 1]
    assert not duplicates, f"{name}: fire times with more than one job: {duplicates}"
    for job in jobs:
        assert job["key"] == f"{name}@{job['fire_time_ms']}", job
        assert job["schedule"] == name


def every_time(first_ms: int, last_ms: int) -> list[int]:
    return list(range(first_ms, last_ms + 1, INTERVAL_MS))


def schedule_view(cluster: LocalCluster, name: str) -> dict[str, Any]:
    status, view, _ = cluster.call("GET", f"/v1/schedules/{name}?consistent=1")
    assert status == 200, view
    return dict(view)


def test_an_every_second_schedule_fires_each_time_once_across_a_leader_kill_and_restart(
    cluster: LocalCluster,
) -> None:
    policies = {"ticks-once": "fire_once", "ticks-all": "fire_all"}
    for name, policy in policies.items():
        put_schedule(cluster, name, misfire=policy)
    wait_for_fire_after(cluster, list(policies), wall_ms() + 2 * INTERVAL_MS)

    old_leader = cluster.leader()
    killed_ms = wall_ms()
    cluster.kill(old_leader)
    cluster.wait_ready(timeout_s=15)
    wait_for_fire_after(cluster, list(policies), killed_ms + 2 * INTERVAL_MS)
    cluster.start_node(old_leader)
    restarted_ms = wall_ms()
    cluster.wait_ready(timeout_s=15)
    wait_for_fire_after(cluster, list(policies), restarted_ms + 2 * INTERVAL_MS)

    for name in policies:
        jobs = fired_jobs(cluster, name)
        times = fire_times(jobs)
        assert_one_job_per_time(name, jobs)
        # The failover took far less than the default 60 s grace: nothing was late, so both
        # policies fire every time, and the run spans the kill and the restart.
        assert times == every_time(times[0], times[-1]), f"{name}: a fire time is missing"
        assert times[0] < killed_ms and times[-1] > restarted_ms
        assert schedule_view(cluster, name)["misfires"] == 0


# -- whole-cluster downtime -------------------------------------------------------------------

GRACE_MS = 2_000  # two intervals: skip fires the two times still in grace, fire_once one
DOWNTIME_MS = 4_000
MISFIRE_SCHEDULES: dict[str, dict[str, Any]] = {
    "down-once": {"misfire": "fire_once"},
    "down-skip": {"misfire": "skip"},
    "down-all": {"misfire": "fire_all"},
    "down-capped": {"misfire": "fire_all", "max_catchup": 2},
}


def expected_catch_up(spec: dict[str, Any], due: list[int], tick_ms: int) -> list[int]:
    """What one Tick at tick_ms fires of the due times, by the misfire policy (DESIGN.md 3):
    a time more than the grace behind the Tick is late; fire_once fires the latest due time,
    fire_all the newest max_catchup, skip none of the late ones."""
    max_catchup = spec.get("max_catchup", 100)
    cutoff_ms = tick_ms - GRACE_MS
    if all(t >= cutoff_ms for t in due):
        return due[-max_catchup:]
    if spec["misfire"] == "fire_once":
        return due[-1:]
    if spec["misfire"] == "fire_all":
        return due[-max_catchup:]
    return [t for t in due if t >= cutoff_ms][-max_catchup:]


def submit_acknowledged_jobs(cluster: LocalCluster, count: int) -> dict[int, str]:
    """Submit jobs round-robin to every node; {id: key} of those answered 201."""
    acknowledged = {}
    for index in range(count):
        node = cluster.nodes[index % len(cluster.nodes)]
        key = f"acked-{index}"
        status, job, _ = cluster.request(node, "POST", "/v1/jobs", {"task": "t", "key": key})
        assert status == 201, job
        acknowledged[job["id"]] = key
    return acknowledged


def complete_one_job(cluster: LocalCluster) -> int:
    status, job, _ = cluster.call("POST", "/v1/jobs", {"task": "t", "queue": "done-before"})
    assert status == 201, job
    claim = {"worker": "w", "queues": ["done-before"], "max": 1, "wait_ms": 5_000}
    claimed = cluster.call("POST", "/v1/claims", claim)[1]["jobs"][0]
    done = cluster.call(
        "POST", f"/v1/jobs/{job['id']}/complete", {"token": claimed["token"], "result": 1}
    )
    assert done[0] == 200, done[1]
    return int(job["id"])


def test_after_whole_cluster_downtime_no_acknowledged_job_is_lost_and_misfires_follow_policy(
    cluster: LocalCluster,
) -> None:
    names = list(MISFIRE_SCHEDULES)
    for name, spec in MISFIRE_SCHEDULES.items():
        put_schedule(cluster, name, misfire_grace_ms=GRACE_MS, **spec)
    wait_for_fire_after(cluster, names, wall_ms() + INTERVAL_MS)
    completed_id = complete_one_job(cluster)
    before = {name: fired_jobs(cluster, name) for name in names}
    acknowledged = submit_acknowledged_jobs(cluster, 30)

    killed_ms = wall_ms()
    cluster.kill_all()
    cluster.wait_for(lambda: wall_ms() >= killed_ms + DOWNTIME_MS, 10, "the downtime to pass")
    restarted_ms = wall_ms()
    cluster.start()
    cluster.wait_ready(timeout_s=20)
    ready_ms = wall_ms()
    wait_for_fire_after(cluster, names, ready_ms + INTERVAL_MS)

    for node in cluster.nodes:
        held = {job["id"]: job["key"] for job in cluster.list_jobs(node, consistent=1)}
        lost = {i: key for i, key in acknowledged.items() if held.get(i) != key}
        assert not lost, f"{node.node_id} lost acknowledged jobs {lost}"
        done = cluster.request(node, "GET", f"/v1/jobs/{completed_id}?consistent=1")[1]
        assert done["status"] == "succeeded", done

    after = {name: fired_jobs(cluster, name) for name in names}
    catch_up_ms = min(
        job["created_ms"]
        for jobs in after.values()
        for job in jobs
        if job["created_ms"] >= restarted_ms
    )
    assert restarted_ms <= catch_up_ms <= ready_ms + 2_000, (
        "the catch-up Tick is outside the restart"
    )

    for name, spec in MISFIRE_SCHEDULES.items():
        jobs = after[name]
        assert_one_job_per_time(name, jobs)
        old = [job for job in jobs if job["created_ms"] < restarted_ms]
        new = [job for job in jobs if job["created_ms"] >= restarted_ms]
        assert {job["id"] for job in before[name]} <= {job["id"] for job in old}, "a fire was lost"
        last_before_ms = fire_times(old)[-1]
        assert fire_times(old) == every_time(fire_times(old)[0], last_before_ms)
        assert last_before_ms > killed_ms - 2 * INTERVAL_MS, "fires were late before the crash"

        due = every_time(last_before_ms + INTERVAL_MS, catch_up_ms)
        caught_up = expected_catch_up(spec, due, catch_up_ms)
        regular = every_time(
            catch_up_ms // INTERVAL_MS * INTERVAL_MS + INTERVAL_MS, fire_times(new)[-1]
        )
        assert len(due) >= DOWNTIME_MS // INTERVAL_MS, f"{name}: the outage missed too few times"
        assert fire_times(new) == caught_up + regular, (
            f"{name} ({spec}): after the outage fired {fire_times(new)}, expected the catch-up "
            f"{caught_up} at {catch_up_ms} then {regular}; due were {due}"
        )
        assert all(job["created_ms"] == catch_up_ms for job in new[: len(caught_up)])
        view = schedule_view(cluster, name)
        late = sum(1 for t in due if t < catch_up_ms - GRACE_MS)
        assert (view["misfires"], view["misfire_skipped"]) == (late, len(due) - len(caught_up)), (
            view
        )
