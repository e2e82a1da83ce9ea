"""Results along the DAG in the core (scheduler/upstream.py): a finished job of a workflow that
still runs is sheltered from eviction once the cluster is finalized (and only then), without
holding back the jobs behind it, and a replica restored from a snapshot evicts the same jobs;
the claim's view carries the parents' results up to a cap per claim."""

from __future__ import annotations

from typing import Any

import pytest
from test_core_bounded import assert_healthy, kept, replica_of, run

from raftcron.scheduler import codec, limits, retention, upstream, views
from raftcron.scheduler.commands import Ack, PutSchedule, RetryJob, SubmitJobs, SubmitWorkflow
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec, WorkflowSpec

DAY = limits.DAY_MS


@pytest.fixture
def d() -> Driver:
    return Driver()


def workflow(d: Driver, jobs: list[dict[str, Any]], queue: str = "flow") -> dict[str, int]:
    for job in jobs:
        job.setdefault("task", "t")
        job.setdefault("queue", queue)
    value = d.ok(SubmitWorkflow(d.request_id(), WorkflowSpec.parse({"jobs": jobs})))
    return {name: job_id for name, job_id in value["jobs"]}


def finish(d: Driver, job_id: int, result: Any = None, queue: str = "flow") -> None:
    [(claimed, token)] = d.claim(queues=(queue,))
    assert claimed == job_id
    d.complete(claimed, token, result)


def two_steps(d: Driver) -> dict[str, int]:
    """extract -> load, extract finished with its result; load queued in `next`."""
    ids = workflow(d, [{"name": "extract"},
                       {"name": "load", "after": ["extract"], "queue": "next"}])
    finish(d, ids["extract"], {"rows": 3})
    return ids


def claimed_view(d: Driver, queue: str = "next", max: int = 1) -> list[dict[str, Any]]:
    claimed = [[job_id, token] for job_id, token in d.claim(queues=(queue,), max=max)]
    return upstream.attach(d.state, views.claimed_jobs(d.state, claimed))


# -- the shelter ---------------------------------------------------------------------------


def test_a_finished_parent_outlives_its_retention_until_its_workflow_ends(d):
    d.finalize(retention={"succeeded": {"max_count": 0, "max_age_ms": 3_600_000}})
    ids = two_steps(d)
    d.tick(advance_ms=2 * DAY)
    assert kept(d) == [ids["extract"], ids["load"]]  # past its count and its age: kept
    [child] = claimed_view(d)
    assert child["upstream"] == {
        "extract": {"job_id": ids["extract"], "delivered": True, "result": {"rows": 3}}}
    d.complete(child["id"], child["token"])
    d.tick(advance_ms=1)
    assert kept(d) == []  # the workflow ended: both go at the next Tick
    assert d.state.counters["evicted"] == {"age": 1, "count": 1}
    assert_healthy(d)


def test_before_the_gate_a_parent_goes_at_seven_days_as_the_previous_release_does(d):
    ids = two_steps(d)
    d.tick(advance_ms=7 * DAY)
    assert kept(d) == [ids["load"]]
    assert not d.state.finalized and violations(d.state) == []


def test_finalizing_shelters_a_parent_finished_before_it(d):
    ids = two_steps(d)
    d.tick(advance_ms=DAY)
    d.finalize(retention={"succeeded": {"max_count": 0}})
    d.tick(advance_ms=7 * DAY)
    assert kept(d) == [ids["extract"], ids["load"]]
    assert_healthy(d)


def test_a_sheltered_job_holds_back_none_of_the_jobs_behind_it(d):
    d.finalize(retention={"succeeded": {"max_count": 2}})
    ids = two_steps(d)
    plain = run(d, 5, queue="flow")  # finished after the parent, in its FIFO behind it
    d.tick(advance_ms=1)
    # The parent counts among the two kept, and the oldest plain ones go past it.
    assert kept(d) == [ids["extract"], ids["load"], plain[-1]]
    assert len(d.state.sheltered) == 1
    assert_healthy(d)
    [(job_id, token)] = d.claim(queues=("next",))
    d.complete(job_id, token)
    d.tick(advance_ms=1)
    assert kept(d) == [ids["load"], plain[-1]]  # back in its place, the oldest went first
    assert len(d.state.sheltered) == 0
    assert_healthy(d)


@pytest.mark.parametrize("work", [retention.RETENTION_WORK_PER_TICK, 1])
def test_a_restored_replica_evicts_exactly_what_the_one_that_set_jobs_aside_evicts(
        d, monkeypatch, work):
    # With a work bound of 1 eviction a Tick, the replica that still has to set the parents
    # aside must stop at the same job as the one that did it before the snapshot.
    monkeypatch.setattr(retention, "RETENTION_WORK_PER_TICK", work)
    d.finalize(retention={"succeeded": {"max_count": 3}})
    flows = [two_steps(d) for _ in range(3)]
    run(d, 6, queue="flow")
    d.tick(advance_ms=1)  # the parents are set aside here, not on the replica below
    replica = replica_of(d)
    assert len(d.state.sheltered) == 3 and len(replica.state.sheltered) == 0
    applied = len(d.log)

    def replicate() -> None:  # the same entries, applied by the restored replica
        nonlocal applied
        for command in d.log[applied:]:
            replica.state.apply(codec.decode(command))
        applied = len(d.log)
        assert snapshot(replica.state) == snapshot(d.state)

    for _ in range(2):
        [(job_id, token)] = d.claim(queues=("next",))
        d.complete(job_id, token)
        replicate()
    run(d, 4, queue="flow")
    replicate()
    for _ in range(20):  # a Tick each, through every step of a bounded eviction
        d.tick(advance_ms=1)
        replicate()
    assert violations(d.state) == violations(replica.state) == []
    left = {flow["extract"] for flow in flows} & set(kept(d))
    assert left == {flows[2]["extract"]}  # the only workflow still running keeps its parent


def test_past_the_budget_sheltered_jobs_go_last_oldest_first(d):
    d.finalize(budget={"bytes": 1 << 20})
    first = two_steps(d)["extract"]
    late = workflow(d, [{"name": "a"}, {"name": "b", "after": ["a"], "queue": "next"}],
                    queue="late")
    finish(d, late["a"], "r" * 60_000, queue="late")
    plain = run(d, 2, queue="flow", result="p" * 60_000)
    watched = [*plain, first, late["a"]]
    gone_at: dict[int, int] = {}
    for step in range(40):  # unfinished jobs (never evicted) until nothing more fits
        if d.apply(SubmitJobs(None, (JobSpec(task="t", queue="other", payload="q" * 60_000),))
                   ).ok is False:
            break
        assert d.state.state_bytes() <= 1 << 20
        for job_id in watched:
            if job_id not in gone_at and d.state.table.get(job_id) is None:
                gone_at[job_id] = step
    assert list(gone_at) == watched  # plain ones first, then the sheltered, oldest first
    assert gone_at[plain[1]] < gone_at[first]
    assert d.state.counters["evicted"] == {"budget": 4}
    assert_healthy(d)


def test_a_schedules_retain_leaves_a_sheltered_parent_to_retention(d):
    d.finalize()
    d.ok(PutSchedule(d.request_id(), "nightly", ScheduleSpec.parse({
        "every": "1h", "retain": 1, "workflow": {"jobs": [
            {"name": "a", "task": "t"}, {"name": "b", "task": "t", "after": ["a"]},
            {"name": "c", "task": "t", "after": ["a"], "queue": "next"}]}})))
    d.tick(advance_ms=1)
    d.tick(advance_ms=3_600_000)
    [(a, token)] = d.claim()
    d.complete(a, token)
    [(b, token)] = d.claim()
    d.complete(b, token)  # past retain 1: `a` would go, but `c` has not run yet
    assert d.state.table.get(a) is not None
    [child] = claimed_view(d)
    assert child["upstream"]["a"]["delivered"] is True
    assert_healthy(d)


def test_the_unfinished_count_of_a_workflow_is_checked_and_rebuilt_on_restore(d):
    ids = workflow(d, [{"name": "a"}, {"name": "b", "after": ["a"]}, {"name": "c"}])
    finish(d, ids["a"])
    [record] = d.state.workflows.values()
    assert record.unfinished == 2
    [copy] = restore(snapshot(d.state)).workflows.values()
    assert copy.unfinished == 2
    record.unfinished = 5
    assert violations(d.state) == [
        "workflow 1: counts 5 unfinished jobs, the records say 2"]


def ended_by_a_dead_letter(d: Driver) -> tuple[dict[str, int], int]:
    """a -> b, a succeeded and b failed for good: the workflow ended, and a Tick passed."""
    d.finalize(retention={"succeeded": {"max_count": 0}, "failed": {"max_count": 10}})
    ids = workflow(d, [{"name": "a"}, {"name": "b", "after": ["a"], "max_attempts": 1}])
    finish(d, ids["a"], "gone")
    [(b, token)] = d.claim(queues=("flow",))
    d.fail(b, token, retryable=False)
    d.tick(advance_ms=1)
    return ids, b


def test_a_workflow_ended_by_a_dead_letter_shelters_its_parent_no_more(d):
    _, b = ended_by_a_dead_letter(d)
    assert kept(d) == [b]
    assert_healthy(d)


# -- the claim's view ----------------------------------------------------------------------


def test_a_claim_carries_parents_results_up_to_its_cap_the_rest_marked_for_reading(d):
    names = [f"p{i}" for i in range(6)]
    ids = workflow(d, [*({"name": n} for n in names),
                       {"name": "child", "after": names, "queue": "next"}])
    for name in names:
        finish(d, ids[name], "x" * 60_000 if name != "p5" else "small")
    [child] = claimed_view(d)
    parts = child["upstream"]
    assert list(parts) == names  # in `after` order
    delivered = [name for name in names if parts[name]["delivered"]]
    assert delivered == ["p0", "p1", "p2", "p3"]  # 4 x 60 KB fit in 256 KiB; not a fifth
    assert parts["p4"] == {"job_id": ids["p4"], "delivered": False}
    assert parts["p5"] == {"job_id": ids["p5"], "delivered": False}  # after the first miss
    assert parts["p0"]["result"] == "x" * 60_000


def test_the_cap_is_shared_by_the_jobs_of_one_claim(d):
    flows = [workflow(d, [{"name": "p"}, {"name": "c", "after": ["p"], "queue": "next"}])
             for _ in range(5)]
    for flow in flows:
        finish(d, flow["p"], "y" * 60_000)
    claimed = claimed_view(d, max=5)
    assert [job["upstream"]["p"]["delivered"] for job in claimed] == [True] * 4 + [False]


def test_a_job_outside_a_workflow_and_a_root_carry_no_upstream(d):
    d.submit(queue="next")
    workflow(d, [{"name": "root"}], queue="next")
    claimed = claimed_view(d, max=2)
    assert len(claimed) == 2 and all("upstream" not in job for job in claimed)


def test_a_parent_that_left_the_state_is_marked_for_reading_from_the_archive(d):
    ids, b = ended_by_a_dead_letter(d)  # `a` left for the archive
    d.ok(RetryJob(d.request_id(), b))
    [child] = claimed_view(d, queue="flow")
    assert child["upstream"] == {"a": {"job_id": ids["a"], "delivered": False}}


def test_acks_in_the_claim_that_hands_out_the_child_count_as_finished(d):
    ids = workflow(d, [{"name": "a"}, {"name": "b", "after": ["a"]}])
    [(a, token)] = d.claim(queues=("flow",))
    claimed = d.claim(queues=("flow",), acks=(Ack(a, token, "succeeded", result=[1, 2]),))
    view = upstream.attach(d.state, views.claimed_jobs(d.state, [list(claimed[0])]))
    assert view[0]["id"] == ids["b"]
    assert view[0]["upstream"]["a"]["result"] == [1, 2]


def test_setting_a_job_aside_is_no_eviction_work_so_replicas_stop_at_the_same_job(
        d, monkeypatch):
    """One eviction a Tick: the replica restored from a snapshot meets the sheltered job
    that the other set aside before it, right when its work for the Tick is done; setting it
    aside then must not count, or it would leave work pending where the other does not."""
    monkeypatch.setattr(retention, "RETENTION_WORK_PER_TICK", 1)
    d.finalize(retention={"succeeded": {"max_count": 0}, "failed": {"max_count": 0}})
    ids = workflow(d, [{"name": "broken", "max_attempts": 1}, {"name": "later", "queue": "next"}])
    [(broken, token)] = d.claim(queues=("flow",))
    d.fail(broken, token, retryable=False)
    d.tick(advance_ms=1)
    assert d.state.table.get(ids["broken"]) is not None and len(d.state.sheltered) == 1
    replica = replica_of(d)
    applied = len(d.log)
    run(d, 1, queue="plain")
    d.tick(advance_ms=1)
    for command in d.log[applied:]:
        replica.state.apply(codec.decode(command))
    assert replica.state.retention_pending is d.state.retention_pending is False
    assert snapshot(replica.state) == snapshot(d.state)
