"""A finished job's view read straight from its packed record is the thawed job's view.

Every member writes the view's JSON as the job's archive row, and archive retention counts
its bytes on every member alike: `frozen_view` must give `job_view(thawed)` byte for byte
(keys in the same order), for both record formats and every field a record may carry.
"""

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftcron.scheduler import jobs as j
from raftcron.scheduler import packing
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.flowspecs import FairnessSpec, RateKeySpec
from raftcron.scheduler.frozen import FrozenJob, freezer
from raftcron.scheduler.jobs import Attempt, Job
from raftcron.scheduler.recordview import frozen_view
from raftcron.scheduler.specs import BackoffSpec
from raftcron.scheduler.views import job_view

T0 = 1_800_000_000_000

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                max_size=12)
maybe_name = st.none() | names
times = st.integers(T0, T0 + 10**9)
small = st.integers(0, 1_000)
plain = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | names,
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(names, inner, max_size=3), max_leaves=8)
outcomes = st.sampled_from((None, j.OUTCOME_SUCCEEDED, j.OUTCOME_FAILED,
                            j.OUTCOME_LEASE_EXPIRED, j.OUTCOME_CANCELLED))


@st.composite
def attempts(draw: st.DrawFn, created_ms: int) -> Attempt:
    start = draw(st.integers(created_ms, created_ms + 10**6))
    end = draw(st.none() | st.integers(start, start + 10**6))
    return Attempt(draw(st.integers(1, 50)), draw(st.integers(1, 10**12)), draw(names),
                   draw(maybe_name), start, end, draw(outcomes), draw(maybe_name))


@st.composite
def finished_jobs(draw: st.DrawFn) -> Job:
    created = draw(times)
    job = Job(draw(st.integers(1, 10**12)), draw(names), created)
    job.key = draw(maybe_name)
    job.queue = draw(names)
    job.payload = draw(st.none() | plain.map(packing.to_msgpack))
    job.priority = draw(st.integers(-100, 100))
    job.status = draw(st.sampled_from(sorted(j.FINAL)))
    job.attempts = draw(small)
    job.max_attempts = draw(st.integers(1, 100))
    job.attempt_limit = job.max_attempts + draw(small)
    job.run_at_ms = created + draw(st.integers(0, 10**6))
    job.backoff = draw(st.sampled_from((job.backoff, BackoffSpec.parse({"initial_ms": 7}))))
    job.timeout_ms = draw(st.none() | st.integers(1, 10**6))
    job.schedule = draw(maybe_name)
    job.fire_time_ms = draw(st.none() | st.integers(created, created + 10**6))
    job.workflow_id = draw(maybe_name)
    job.workflow_node = draw(maybe_name)
    job.depends_on = tuple(draw(st.lists(st.integers(1, 10**6), max_size=3)))
    job.result = draw(st.none() | plain.map(packing.to_msgpack))
    job.error = draw(maybe_name)
    job.cancel_reason = draw(maybe_name)
    job.finished_ms = draw(st.integers(created, created + 10**7))
    job.token = draw(st.integers(0, 10**12))
    job.lease_until_ms = draw(st.none() | st.integers(created, created + 10**7))
    job.lease_ms = draw(st.integers(1, 10**6))
    job.worker = draw(maybe_name)
    job.history = tuple(draw(st.lists(attempts(created), max_size=4)))
    if draw(st.booleans()):
        job.concurrency_key, job.concurrency_max = draw(names), draw(st.integers(1, 100))
    job.progress = draw(st.none() | st.tuples(st.none() | st.floats(0, 1), maybe_name, plain,
                                              times, st.integers(1, 9)).map(
        lambda p: packing.to_msgpack(list(p))))
    job.rate = draw(st.none() | st.builds(lambda k, m, p: RateKeySpec.parse(
        {"key": k, "max": m, "per_ms": p}), names, st.integers(1, 100), st.integers(1, 10**6)))
    job.fairness = draw(st.none() | st.builds(lambda k, w: FairnessSpec.parse(
        {"key": k, "weight": w}), names, st.integers(1, 1_000)))
    job.traceparent = draw(maybe_name)
    return job


def same_view(record: FrozenJob) -> None:
    thawed = record.thawed()  # a `Job`: its view is read off its fields
    for history in (True, False):  # a job's own view, and a listing's
        expected = job_view(thawed, history=history)
        got = frozen_view(record, history=history)
        assert got == expected
        assert orjson.dumps(got) == orjson.dumps(expected)  # the keys in the same order too


@settings(max_examples=300, deadline=None)
@given(job=finished_jobs(), compact=st.booleans())
def test_a_frozen_jobs_view_is_its_thawed_jobs_view_in_both_record_formats(job, compact):
    same_view(freezer(compact=compact)(job))


@pytest.mark.parametrize("finalize", [False, True], ids=["first format", "compact"])
def test_the_view_of_a_job_that_ran_through_the_core_is_read_from_its_record(finalize):
    driver = Driver()
    driver.tick(T0)
    flow = {}
    if finalize:
        driver.finalize()  # records compact, and the fields taken only once finalized
        flow = {"fairness": {"key": "cust", "weight": 3},
                "rate": {"key": "cust", "max": 5, "per_ms": 1_000},
                "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    driver.submit(payload={"n": 1}, key="k-1", concurrency={"key": "acct", "max": 2}, **flow)
    [(job_id, token)] = driver.claim()
    driver.fail(job_id, token, "first")
    driver.tick(advance_ms=60_000)
    [(job_id, token)] = driver.claim()
    if finalize:
        driver.heartbeat(job_id, token, progress={"value": 0.5, "message": "half"})
    driver.complete(job_id, token, {"ok": True})
    record = driver.state.table.get(job_id)
    assert isinstance(record, FrozenJob)
    same_view(record)
    assert job_view(record) == frozen_view(record)  # the API's view takes this path
    assert [a["outcome"] for a in job_view(record)["history"]] == ["failed", "succeeded"]
