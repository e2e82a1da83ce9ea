"""Workflows in the pure core: DAG order, cycles named, upstream failure, revival."""

import pytest

from raftcron.scheduler.commands import CancelJob, RetryJob, SubmitJobs, SubmitWorkflow
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.errors import Invalid, Rejected
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.specs import JobSpec, WorkflowSpec

DIAMOND = {
    "jobs": [
        {"name": "a", "task": "extract"},
        {"name": "b", "task": "transform", "after": ["a"]},
        {"name": "c", "task": "transform", "after": ["a"]},
        {"name": "d", "task": "load", "after": ["b", "c"]},
    ]
}


def submit_diamond(d, **extra):
    value = d.ok(SubmitWorkflow(d.request_id(), WorkflowSpec.parse({**DIAMOND, **extra})))
    return value["workflow_id"], dict(value["jobs"])


def run_one(d, expect=None, *, succeed=True):
    [(job_id, token)] = d.claim()
    if expect is not None:
        assert job_id == expect
    if succeed:
        d.complete(job_id, token)
    else:
        d.fail(job_id, token, "broken", retryable=False)
    return job_id


def test_a_diamond_runs_in_dependency_order():
    d = Driver()
    _, ids = submit_diamond(d)
    assert [d.job(ids[n]).status for n in "abcd"] == ["queued", "blocked", "blocked", "blocked"]
    run_one(d, ids["a"])
    assert d.job(ids["d"]).status == "blocked"
    finished = {run_one(d), run_one(d)}
    assert finished == {ids["b"], ids["c"]}
    run_one(d, ids["d"])
    assert d.claim() == []
    assert violations(d.state) == []


def test_a_failed_parent_cancels_its_descendants_as_upstream_failed():
    d = Driver()
    _, ids = submit_diamond(d)
    run_one(d, ids["a"])
    run_one(d, ids["b"], succeed=False)
    assert d.job(ids["d"]).status == "cancelled"
    assert d.job(ids["d"]).cancel_reason == "upstream_failed"
    assert d.job(ids["c"]).status == "queued"  # a sibling is not a descendant
    assert violations(d.state) == []


def test_cancelling_a_root_cancels_the_whole_dag():
    d = Driver()
    _, ids = submit_diamond(d)
    value = d.ok(CancelJob(d.request_id(), ids["a"]))
    assert value["cancelled_descendants"] == 3
    assert {d.job(i).status for i in ids.values()} == {"cancelled"}


def test_retrying_a_failed_parent_revives_its_upstream_failed_descendants():
    d = Driver()
    _, ids = submit_diamond(d)
    run_one(d, ids["a"])
    run_one(d, ids["b"], succeed=False)
    run_one(d, ids["c"])
    d.ok(RetryJob(d.request_id(), ids["b"]))
    assert d.job(ids["d"]).status == "blocked"
    run_one(d, ids["b"])
    run_one(d, ids["d"])
    assert violations(d.state) == []


def test_a_workflow_key_returns_the_first_workflow():
    d = Driver()
    first, _ = submit_diamond(d, key="etl-2026-11-30")
    again, _ = submit_diamond(d, key="etl-2026-11-30")
    assert first == again and len(d.state.table) == 4


@pytest.mark.parametrize(
    "jobs, message",
    [
        ([{"name": "a", "task": "t", "after": ["a"]}], "cycle: a -> a"),
        (
            [
                {"name": "a", "task": "t", "after": ["c"]},
                {"name": "b", "task": "t", "after": ["a"]},
                {"name": "c", "task": "t", "after": ["b"]},
            ],
            "cycle: a -> b -> c -> a",
        ),
        ([{"name": "a", "task": "t", "after": ["zz"]}], "no job is named 'zz'"),
        ([{"name": "a", "task": "t"}, {"name": "a", "task": "t"}], "used by more than one job"),
    ],
)
def test_a_bad_dag_is_refused_naming_the_problem(jobs, message):
    with pytest.raises(Invalid) as error:
        WorkflowSpec.parse({"jobs": jobs})
    assert message in str(error.value)


def test_a_cycle_is_rejected_with_code_cycle_and_nothing_is_created():
    d = Driver()
    raw = {
        "workflow": {
            "jobs": [
                {"name": "x", "task": "t", "after": ["y"]},
                {"name": "y", "task": "t", "after": ["x"]},
            ]
        }
    }
    from raftcron.scheduler.commands import SubmitWorkflow as SW

    with pytest.raises(Invalid) as error:
        SW.from_wire(raw)
    assert error.value.code == "cycle"
    assert len(d.state.table) == 0


def test_a_job_depending_on_a_failed_job_is_cancelled_at_submit():
    d = Driver()
    parent = d.submit()
    run_one(d, parent, succeed=False)
    value = d.ok(SubmitJobs(d.request_id(), (JobSpec(task="child", depends_on=(parent,)),)))
    child = d.job(value["jobs"][0][0])
    assert (child.status, child.cancel_reason) == ("cancelled", "upstream_failed")


def test_a_job_depending_on_a_running_job_waits_for_it():
    d = Driver()
    parent = d.submit()
    [(_, token)] = d.claim()
    value = d.ok(SubmitJobs(d.request_id(), (JobSpec(task="child", depends_on=(parent,)),)))
    child = value["jobs"][0][0]
    assert d.job(child).status == "blocked"
    d.complete(parent, token)
    assert d.job(child).status == "queued"


def test_retry_of_a_child_whose_parent_failed_is_refused():
    d = Driver()
    _, ids = submit_diamond(d)
    run_one(d, ids["a"], succeed=False)
    result = d.apply(RetryJob(None, ids["b"]))
    assert isinstance(result, Rejected) and result.code == "not_retryable"
