"""Finished jobs are kept frozen (packed) and behave exactly as live ones.

The representation must never show: a frozen job reads the same, a change to it goes through
`JobTable.live` (a write that skipped it fails loudly), snapshots are byte-identical whether a
job was frozen by a live replica or by a restore, and version-1 snapshots still load.
"""

import msgpack
import pytest
from snapshot_v1 import as_version_1

from raftcron.scheduler.commands import RetryJob, SubmitJobs
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.frozen import FrozenJob, readable
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec
from raftcron.scheduler.views import job_view

T0 = 1_800_000_000_000


def finished(driver: Driver, *, fail: bool = False, **fields: object) -> int:
    job_id = driver.submit(payload={"n": 1}, max_attempts=1, **fields)
    [(claimed, token)] = driver.claim()
    assert claimed == job_id
    if fail:
        driver.fail(job_id, token, "boom", retryable=False)
    else:
        driver.complete(job_id, token, {"ok": True})
    return job_id


@pytest.fixture
def driver() -> Driver:
    d = Driver()
    d.tick(T0)
    return d


def test_a_job_is_frozen_when_the_command_that_finished_it_ends(driver):
    job_id = finished(driver)
    record = driver.state.table.get(job_id)
    assert isinstance(record, FrozenJob)
    view = job_view(record)
    assert view["status"] == "succeeded"
    assert view["payload"] == {"n": 1} and view["result"] == {"ok": True}
    assert [a["outcome"] for a in view["history"]] == ["succeeded"]
    assert record.attempts == 1  # any field reads through, decoded
    assert violations(driver.state) == []


def test_a_frozen_job_refuses_writes_and_changing_methods(driver):
    record = driver.state.table.get(finished(driver))
    with pytest.raises(AttributeError):
        record.error = "changed"
    with pytest.raises(AttributeError):
        record.status = "queued"
    with pytest.raises(AttributeError, match="needs it live"):
        record.add_child(99)


def test_a_retried_job_comes_back_live_and_is_frozen_again_when_it_ends(driver):
    job_id = finished(driver, fail=True)
    assert isinstance(driver.state.table.get(job_id), FrozenJob)
    assert driver.ok(RetryJob(driver.request_id(), job_id)) == {"status": "queued"}
    record = driver.state.table.get(job_id)
    assert not isinstance(record, FrozenJob) and record.status == "queued"
    assert violations(driver.state) == []
    [(claimed, token)] = driver.claim()
    driver.complete(claimed, token)
    record = driver.state.table.get(job_id)
    assert isinstance(record, FrozenJob) and record.status == "succeeded"
    assert [a["outcome"] for a in job_view(record)["history"]] == ["failed", "succeeded"]


def test_a_child_of_a_finished_parent_is_recorded_on_the_frozen_parent(driver):
    parent = finished(driver)
    spec = JobSpec.parse({"task": "noop", "depends_on": [parent]})
    [[child, created]] = driver.ok(SubmitJobs(driver.request_id(), (spec,)))["jobs"]
    assert created
    record = driver.state.table.get(parent)
    assert isinstance(record, FrozenJob)
    assert readable(record).children == [child]
    assert driver.job(child).status == "queued"  # the parent had succeeded
    assert violations(driver.state) == []


def test_snapshots_do_not_depend_on_whether_a_job_was_frozen_live_or_by_a_restore(driver):
    for _ in range(5):
        finished(driver)
    finished(driver, fail=True)
    driver.submit()
    blob = snapshot(driver.state)
    restored = restore(blob)
    assert snapshot(restored) == blob
    live_records = list(driver.state.table)
    restored_records = list(restored.table)
    assert [type(r) for r in live_records] == [type(r) for r in restored_records]
    assert [job_view(r) for r in live_records] == [job_view(r) for r in restored_records]
    assert violations(restored) == []


def test_a_version_1_snapshot_still_loads(driver):
    for _ in range(3):
        finished(driver)
    driver.submit()
    blob = snapshot(driver.state)
    restored = restore(as_version_1(blob))
    assert snapshot(restored) == blob
    assert isinstance(restored.table.get(1), FrozenJob)
    assert violations(restored) == []


def test_a_state_without_flow_control_is_written_as_the_previous_release_wrote_it(driver):
    """Format 2, which a node of the previous release reads: a rolling upgrade stays possible
    until queue limits or concurrency keys are used (format 3 from then on, for good)."""
    for _ in range(3):
        finished(driver)
    driver.submit(key="k", unique={"states": ["queued"]}, debounce_ms=5)  # leave no trace
    blob = snapshot(driver.state)
    assert msgpack.unpackb(blob)[0] == 2 and len(msgpack.unpackb(blob)) == 14
    assert snapshot(restore(blob)) == blob
    finished(driver, concurrency={"key": "acct", "max": 1})
    assert msgpack.unpackb(snapshot(driver.state))[0] == 3  # its record has the new fields
    restored = restore(snapshot(driver.state))
    assert msgpack.unpackb(snapshot(restored))[-1] == {"keyed": True}
    assert violations(restored) == []


def test_a_packed_record_holds_every_field_of_a_job(driver):
    from raftcron.scheduler.frozen import job_from_list, job_to_list
    from raftcron.scheduler.jobs import Job

    driver.finalize()  # progress and a job's rate are taken once finalized
    driver.submit(concurrency={"key": "acct-1", "max": 2},
                  rate={"key": "cust-1", "max": 5, "per_ms": 1_000},
                  fairness={"key": "cust-1", "weight": 2},
                  traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    [(job_id, token)] = driver.claim()
    driver.heartbeat(job_id, token, progress={"value": 0.5})
    driver.complete(job_id, token)
    job = driver.job(job_id)
    fields = job_to_list(job)
    # Every slot but `counted` (the memory model's count, which the table derives).
    assert len(fields) == len(Job.__slots__) - 1
    copy = job_from_list(fields)
    assert all(hasattr(copy, name) for name in Job.__slots__)  # no field left unset
    assert job_to_list(copy) == fields
    assert (copy.concurrency_key, copy.concurrency_max) == ("acct-1", 2)
    assert copy.progress == job.progress is not None
    assert copy.rate == job.rate is not None
    assert copy.fairness == job.fairness is not None
    assert copy.traceparent == job.traceparent is not None


def test_a_job_without_a_concurrency_key_packs_as_the_first_record_format(driver):
    """The fields added since leave no trace when unset: older records read as unset, and
    a store of plain jobs keeps its bytes (and its snapshots' digests) across the upgrade."""
    from raftcron.scheduler.frozen import job_from_list, job_to_list
    from raftcron.scheduler.jobs import Job

    fields = job_to_list(driver.job(finished(driver)))
    # No concurrency key (2 fields), progress, rate, fairness, traceparent; and `counted`.
    assert len(fields) == len(Job.__slots__) - 7
    copy = job_from_list(fields)
    assert (copy.concurrency_key, copy.concurrency_max, copy.progress, copy.rate,
            copy.fairness, copy.traceparent) == (None, 0, None, None, None, None)


# -- the compact record format, once finalized (scheduler/gate.py) ------------------------------


def test_a_finalized_cluster_freezes_jobs_in_the_compact_format_holding_every_field(driver):
    from raftcron.scheduler.frozen import (
        COMPACT_MARK,
        job_from_list,
        job_to_compact_list,
        job_to_list,
    )

    before = finished(driver)
    old_bytes = driver.state.table.jobs[before]._packed
    driver.finalize()
    assert driver.state.table.jobs[before]._packed == old_bytes  # a record is never rewritten
    driver.submit(concurrency={"key": "acct-1", "max": 2}, payload={"n": 1}, key="k-9",
                  backoff={"initial_ms": 7}, timeout_ms=900)
    [(job_id, token)] = driver.claim()
    driver.fail(job_id, token, "first")
    driver.tick(advance_ms=10_000)
    [(job_id, token)] = driver.claim()
    driver.complete(job_id, token, result={"ok": True})
    record = driver.state.table.jobs[job_id]._packed
    fields = msgpack.unpackb(record, raw=False)
    assert fields[0] == COMPACT_MARK
    job = job_from_list(fields)
    assert job_to_list(job) == job_to_list(driver.job(job_id))  # every field, as it was
    assert job_to_compact_list(job) == fields
    assert len(record) < len(msgpack.packb(job_to_list(job)))
    # Restored, the records are kept as their bytes, and live jobs are written compact too.
    restored = restore(snapshot(driver.state))
    assert snapshot(restored) == snapshot(driver.state)
    assert restored.table.compact_records and violations(restored) == []


def test_a_plain_finished_job_record_shrinks_by_a_third_in_the_compact_format(driver):
    from raftcron.scheduler.frozen import pack

    job_id = finished(driver)
    frozen = driver.state.table.jobs[job_id]
    assert len(pack(frozen.thawed(), compact=True)) <= len(frozen._packed) * 2 // 3
