"""A job's `traceparent` (DESIGN.md §9.5): the W3C trace context of its submitter, kept with
the job so the worker's spans continue the submitter's trace. A replicated field under the
upgrade gate, carried in both record formats, counted in the state budget."""

import pytest

from raftcron.scheduler import limits, sizes
from raftcron.scheduler.commands import SubmitJobs, SubmitWorkflow
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.frozen import FrozenJob, job_from_list, job_to_compact_list, job_to_list
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.views import claimed_job_view, job_view

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def finalized() -> Driver:
    d = Driver()
    d.finalize()
    d.tick()
    return d


@pytest.mark.parametrize(
    "value",
    [
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # a version we do not know
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # no trace
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # no parent
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        "",
        42,
    ],
)
def test_a_traceparent_not_of_the_w3c_format_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(Invalid) as invalid:
        JobSpec.parse({"task": "t", "traceparent": value})
    assert invalid.value.field == "traceparent"
    assert len(TRACEPARENT) == limits.TRACEPARENT_CHARS


def test_a_schedule_template_takes_no_traceparent_each_fire_starts_its_own_trace() -> None:
    with pytest.raises(Invalid) as invalid:
        ScheduleSpec.parse({"every": "1m", "job": {"task": "t", "traceparent": TRACEPARENT}})
    assert invalid.value.field == "job.traceparent"


def test_a_traceparent_is_refused_before_finalize_in_jobs_and_workflows() -> None:
    d = Driver()
    with pytest.raises(Refused) as refused:
        d.submit(traceparent=TRACEPARENT)
    assert (refused.value.rejected.code, refused.value.rejected.field) == (
        "not_finalized", "jobs[0].traceparent")
    workflow = WorkflowSpec.parse({"jobs": [{"name": "a", "task": "t",
                                             "traceparent": TRACEPARENT}]})
    with pytest.raises(Refused) as refused:
        d.ok(SubmitWorkflow(d.request_id(), workflow))
    assert refused.value.rejected.field == "workflow.jobs[0].traceparent"
    assert d.state.table.jobs == {}


def test_the_job_view_and_the_claim_give_the_traceparent() -> None:
    d = finalized()
    job_id = d.submit(traceparent=TRACEPARENT)
    assert job_view(d.job(job_id))["traceparent"] == TRACEPARENT
    [(claimed, token)] = d.claim()
    assert claimed_job_view(d.job(claimed), token)["traceparent"] == TRACEPARENT
    plain = d.submit()
    assert job_view(d.job(plain))["traceparent"] is None
    [(claimed, token)] = d.claim()
    assert "traceparent" not in claimed_job_view(d.job(claimed), token)


@pytest.mark.parametrize("compact", [False, True])
def test_both_record_formats_carry_the_traceparent(compact: bool) -> None:
    d = finalized()
    job_id = d.submit(traceparent=TRACEPARENT)
    [(_, token)] = d.claim()
    d.complete(job_id, token)
    record = d.state.table.jobs[job_id]
    job = record.thawed() if isinstance(record, FrozenJob) else record
    fields = job_to_compact_list(job) if compact else job_to_list(job)
    assert job_from_list(fields).traceparent == TRACEPARENT
    # A job without one packs as before it existed: nothing appended.
    plain = d.submit()
    [(_, token)] = d.claim()
    d.complete(plain, token)
    record = d.state.table.jobs[plain]
    job = record.thawed() if isinstance(record, FrozenJob) else record
    assert TRACEPARENT not in str(job_to_list(job)) and job_from_list(
        job_to_list(job)).traceparent is None


def test_a_snapshot_keeps_the_traceparent_of_live_and_finished_jobs() -> None:
    d = finalized()
    live = d.submit(traceparent=TRACEPARENT)
    done = d.submit(traceparent=TRACEPARENT)
    d.claim(max=1)
    [(_, token)] = d.claim(max=1)
    d.complete(done, token)
    copy = restore(snapshot(d.state))
    assert job_view(copy.table.jobs[live])["traceparent"] == TRACEPARENT
    assert job_view(copy.table.jobs[done])["traceparent"] == TRACEPARENT
    assert copy.state_bytes() == d.state.state_bytes()


def test_a_live_jobs_traceparent_counts_in_the_state_budget() -> None:
    d = finalized()
    plain = d.submit()
    traced = d.submit(traceparent=TRACEPARENT)
    assert sizes.live_job_bytes(d.job(traced)) - sizes.live_job_bytes(d.job(plain)) == len(
        TRACEPARENT)
    assert d.job(traced).counted == sizes.live_job_bytes(d.job(traced))
    assert sizes.new_job_bytes(None, None, TRACEPARENT) - sizes.new_job_bytes(None, None) == len(
        TRACEPARENT)


def test_a_retry_under_the_same_request_id_from_another_span_is_the_same_request() -> None:
    d = finalized()
    other = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b8-01"
    first = d.ok(SubmitJobs("r1", (JobSpec.parse({"task": "t", "traceparent": TRACEPARENT}),)))
    again = d.ok(SubmitJobs("r1", (JobSpec.parse({"task": "t", "traceparent": other}),)))
    assert again == first and len(d.state.table.jobs) == 1
    workflow = {"jobs": [{"name": "a", "task": "t", "traceparent": TRACEPARENT}]}
    first = d.ok(SubmitWorkflow("r2", WorkflowSpec.parse(workflow)))
    workflow["jobs"][0]["traceparent"] = other
    assert d.ok(SubmitWorkflow("r2", WorkflowSpec.parse(workflow))) == first
    with pytest.raises(Refused) as refused:  # what it asks for still counts
        d.ok(SubmitJobs("r1", (JobSpec.parse({"task": "u", "traceparent": TRACEPARENT}),)))
    assert refused.value.code == "request_id_reused"
