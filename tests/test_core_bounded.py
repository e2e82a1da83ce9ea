"""Bounded state in the pure core (DESIGN.md §9.0, §9.1): the upgrade gate, retention as
replicated settings, the memory model and the state budget."""

import itertools
from typing import Any

import pytest

from raftcron.scheduler import jobs as j
from raftcron.scheduler import limits, sizes
from raftcron.scheduler.commands import (
    Ack,
    BackfillSchedule,
    CancelJob,
    RetryJob,
    SubmitJobs,
    SubmitWorkflow,
    TriggerSchedule,
)
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.gate import LEVEL_BEFORE, RELEASE_LEVEL, PutSettings
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.settings import Budget, Retention
from raftcron.scheduler.snapshot import digest, restore, snapshot
from raftcron.scheduler.specs import JobSpec, WorkflowSpec

HOUR = limits.HOUR_MS
DAY = limits.DAY_MS


@pytest.fixture
def d() -> Driver:
    return Driver()


def run(d: Driver, count: int, *, fail: bool = False, queue: str = "default",
        payload: Any = None, result: Any = None) -> list[int]:
    """Submit, claim and finish `count` jobs (succeeded, or failed for good); their ids."""
    ids = d.submit_many(count, queue=queue, payload=payload, max_attempts=1)
    claimed = d.claim(queues=(queue,), max=count)
    assert sorted(job_id for job_id, _ in claimed) == sorted(ids)
    outcome = "failed" if fail else "succeeded"
    acks = tuple(Ack(job_id, token, outcome, result=result, error="boom" if fail else "",
                     retryable=False) for job_id, token in claimed)
    d.claim(queues=(queue,), max=0, acks=acks)
    return ids


def kept(d: Driver) -> list[int]:
    return sorted(job.id for job in d.state.table)


def fill(d: Driver) -> None:
    """Submit unfinished jobs until not even an empty one fits under the budget."""
    for size in (60_000, 6_000, 600, 60, 0):
        for _ in range(100):
            if d.apply(SubmitJobs(None, (JobSpec(task="t", payload="x" * size),))).ok is False:
                break
    assert d.apply(SubmitJobs(None, (JobSpec(task="t"),))).ok is False


def replica_of(d: Driver) -> Driver:
    """A driver of a state restored from d's snapshot, with request ids of its own."""
    replica = Driver(restore(snapshot(d.state)))
    replica._ids = itertools.count(1_000_000)
    return replica


def assert_healthy(d: Driver) -> None:
    assert violations(d.state) == []
    copy = restore(snapshot(d.state))
    assert snapshot(copy) == snapshot(d.state)
    assert copy.state_bytes() == d.state.state_bytes()


# -- the upgrade gate --------------------------------------------------------------------


def test_a_state_starts_before_the_gate_and_writes_what_the_previous_release_reads(d):
    run(d, 3)
    assert d.state.level == LEVEL_BEFORE and not d.state.finalized
    blob = snapshot(d.state)
    assert blob[1] == 2  # format 2: no section the previous release would refuse
    with pytest.raises(Refused) as refused:
        d.put_settings("budget", {"bytes": 4 << 20})
    assert refused.value.code == "not_finalized"


def test_before_the_gate_finished_jobs_are_kept_seven_days_whatever_their_number(d):
    ids = run(d, 50)
    d.tick(advance_ms=7 * DAY - 1)
    assert kept(d) == ids
    d.tick(advance_ms=1)
    assert kept(d) == []


def test_before_the_gate_nothing_is_refused_for_space(d):
    run(d, 10, payload="x" * 60_000)
    assert d.state.state_bytes() > 600_000  # well past the smallest budget a setting allows
    d.submit_many(20, payload="x" * 60_000)


def test_finalize_raises_the_level_once_and_seeds_the_settings_once(d):
    first = d.finalize(budget={"bytes": 8 << 20}, retention={"succeeded": {"max_count": 5}})
    assert first == {"level": RELEASE_LEVEL, "finalized_now": True}
    assert d.state.settings.budget.bytes == 8 << 20
    assert d.state.settings.retention.succeeded.max_count == 5
    assert d.state.settings.retention.succeeded.max_age_ms == DAY  # the default
    again = d.finalize(budget={"bytes": 2 << 20})
    assert again == {"level": RELEASE_LEVEL, "finalized_now": False}
    assert d.state.settings.budget.bytes == 8 << 20
    blob = snapshot(d.state)
    # Version 4: compact records and a settings section. The previous release reads 1-3 and
    # names the version it does not read before it meets a record it would misread.
    assert blob[1] == 4
    copy = restore(blob)
    assert copy.finalized and copy.settings == d.state.settings


def test_a_snapshot_whose_version_and_settings_section_disagree_is_refused(d):
    run(d, 2)
    d.state.table.keyed_seen = True  # a section, so version 3 of 15 fields
    unfinalized = bytearray(snapshot(d.state))
    assert unfinalized[1] == 3
    unfinalized[1] = 4  # claims the finalized format, without the settings section
    with pytest.raises(ValueError, match="version 4 has no settings section"):
        restore(bytes(unfinalized))
    d.finalize()
    finalized = bytearray(snapshot(d.state))
    finalized[1] = 3
    with pytest.raises(ValueError, match="version 3 has a settings section"):
        restore(bytes(finalized))


def test_settings_are_replaced_a_section_at_a_time_once_finalized(d):
    d.finalize()
    audit = {"succeeded": {"max_age_ms": DAY * 30}}
    value = d.put_settings("retention", {"failed": {"max_count": 10}, "queues": {"audit": audit}})
    settings = value["settings"]
    assert settings["retention"]["failed"] == {"max_age_ms": 7 * DAY, "max_count": 10}
    assert settings["retention"]["queues"] == {
        "audit": {"succeeded": {"max_age_ms": 30 * DAY, "max_count": 1_000_000}}}
    assert settings["budget"] == {"bytes": Budget().bytes}


@pytest.mark.parametrize(
    ("section", "value", "field"),
    [
        ("retention", {"succeeded": {"max_age_ms": -1}}, "value.succeeded.max_age_ms"),
        ("retention", {"succeeded": {"max_age_ms": 31 * DAY}}, "value.succeeded.max_age_ms"),
        ("retention", {"failed": {"max_count": "5"}}, "value.failed.max_count"),
        ("retention", {"failed": {"max": 5}}, "value.failed.max"),
        ("retention", {"done": {}}, "value.done"),
        ("retention", {"queues": {"a b": {"failed": {}}}}, "value.queues"),
        ("retention", {"queues": {"q": {}}}, "value.queues.q"),
        ("budget", {"bytes": 1000}, "value.bytes"),
        ("budget", {"bytes": True}, "value.bytes"),
        ("budget", {"size": 5}, "value.size"),
    ],
)
def test_settings_are_validated_naming_the_field(d, section, value, field):
    from raftcron.scheduler.errors import Invalid

    with pytest.raises(Invalid) as invalid:
        PutSettings.from_wire({"section": section, "value": value})
    assert invalid.value.field == field


# -- retention ---------------------------------------------------------------------------


def test_finished_jobs_go_by_age_per_outcome(d):
    d.finalize(retention={"succeeded": {"max_age_ms": HOUR}, "failed": {"max_age_ms": 2 * HOUR}})
    succeeded = run(d, 5)
    failed = run(d, 5, fail=True)
    d.tick(advance_ms=HOUR - 1)
    assert kept(d) == succeeded + failed
    d.tick(advance_ms=1)
    assert kept(d) == failed
    d.tick(advance_ms=HOUR)
    assert kept(d) == []
    assert d.state.counters["evicted"] == {"age": 10}
    assert_healthy(d)


def test_finished_jobs_go_by_count_oldest_first(d):
    d.finalize(retention={"succeeded": {"max_count": 3}})
    first = run(d, 4)
    d.tick(advance_ms=10)
    second = run(d, 2)
    d.tick(advance_ms=10)
    assert kept(d) == first[3:] + second
    assert d.state.counters["evicted"] == {"count": 3}
    assert_healthy(d)


@pytest.mark.parametrize("queues", [1, 3])
@pytest.mark.parametrize("by", ["count", "budget"])
def test_what_eviction_keeps_to_find_the_oldest_stays_bounded_however_many_jobs_pass(
        d, queues, by):
    """The filings of FIFO fronts (finished.py) are dropped as fronts move on, also where
    one busy queue never needs the merge: a 30-minute soak grew every node by ~100 bytes per
    job through them, the state's own size flat."""
    if by == "count":
        d.finalize(retention={"succeeded": {"max_count": 50}})
    else:
        d.finalize(budget={"bytes": 1 << 20})
    for round_number in range(60):
        run(d, 100, queue=f"q{round_number % queues}")
        d.tick(advance_ms=1)
    finished = d.state.table.finished
    filed = sum(len(heap) for heap in finished._heaps.values())
    assert filed <= 2 * len(finished.fifos) + 64, filed
    assert_healthy(d)


def test_jobs_that_finish_in_one_millisecond_go_in_id_order_whatever_order_they_finished(d):
    d.finalize(retention={"succeeded": {"max_count": 2}})
    ids = d.submit_many(4)
    claimed = dict(d.claim(max=4))
    for job_id in reversed(ids):  # finished newest first, all at one state time
        d.complete(job_id, claimed[job_id])
    other = replica_of(d)
    d.tick(advance_ms=1)
    assert kept(d) == ids[2:]
    other.tick(d.now_ms)
    assert digest(other.state) == digest(d.state)


def test_a_queue_with_its_own_rule_is_kept_and_counted_apart(d):
    d.finalize(retention={"succeeded": {"max_count": 2, "max_age_ms": HOUR},
                          "queues": {"audit": {"succeeded": {"max_age_ms": 30 * DAY,
                                                             "max_count": 10}}}})
    audit = run(d, 3, queue="audit")
    d.tick(advance_ms=1)
    plain = run(d, 3)
    d.tick(advance_ms=1)
    # The default group keeps its newest 2; audit's 3 older jobs neither count nor go.
    assert kept(d) == audit + plain[1:]
    d.tick(advance_ms=2 * HOUR)
    assert kept(d) == audit
    assert_healthy(d)


def test_a_queue_rule_takes_what_it_leaves_out_from_the_cluster_wide_rule(d):
    d.finalize(retention={"succeeded": {"max_count": 2},
                          "queues": {"audit": {"succeeded": {"max_age_ms": 30 * DAY}}}})
    audit = run(d, 3, queue="audit")
    d.tick(advance_ms=1)
    assert kept(d) == audit[1:]  # its own count of 2, the cluster-wide max_count


def test_failed_jobs_of_a_queue_overriding_only_succeeded_follow_the_cluster_rule(d):
    d.finalize(retention={"failed": {"max_count": 1},
                          "queues": {"audit": {"succeeded": {"max_count": 10}}}})
    run(d, 2, fail=True, queue="audit")
    later = run(d, 1, fail=True)
    d.tick(advance_ms=1)
    assert kept(d) == later


def test_a_lowered_retention_is_spread_over_ticks_and_the_ticker_is_asked_at_once(
        d, monkeypatch):
    from raftcron.scheduler import retention

    monkeypatch.setattr(retention, "RETENTION_WORK_PER_TICK", 40)
    d.finalize()
    run(d, 100)
    d.tick(advance_ms=1)
    reference = replica_of(d)
    d.put_settings("retention", {"succeeded": {"max_count": 10}})
    assert d.state.next_due_ms() == d.now_ms
    removed = [d.tick()["removed"] for _ in range(3)]
    assert removed == [40, 40, 10]
    assert d.state.next_due_ms() != d.now_ms
    assert len(kept(d)) == 10
    # A replica restored midway evicts the same jobs.
    reference.put_settings("retention", {"succeeded": {"max_count": 10}})
    reference.tick()
    halfway = replica_of(reference)
    halfway.tick()
    halfway.tick()
    assert kept(halfway) == kept(d)


def test_a_retried_job_leaves_its_old_place_in_retention_order(d):
    d.finalize(retention={"failed": {"max_count": 1}})
    [old] = run(d, 1, fail=True)
    d.tick(advance_ms=10)
    d.ok(RetryJob(d.request_id(), old))
    [(job_id, token)] = d.claim()
    d.tick(advance_ms=10)
    [newer] = run(d, 1, fail=True)  # newer finished before `old` finishes again
    d.tick(advance_ms=10)
    d.fail(job_id, token, retryable=False)
    d.tick(advance_ms=1)
    assert kept(d) == [old]  # it finished last: newer goes
    assert newer not in kept(d)
    assert_healthy(d)


def test_backfill_reaches_back_as_far_as_the_longest_retention(d):
    d.finalize(retention={"succeeded": {"max_age_ms": 2 * DAY}, "failed": {"max_age_ms": DAY},
                          "cancelled": {"max_age_ms": DAY}})
    d.put_schedule("s", every="1h")
    d.tick(advance_ms=3 * DAY)
    now = d.now_ms
    with pytest.raises(Refused) as refused:
        d.ok(BackfillSchedule(d.request_id(), "s", now - 2 * DAY, now - 2 * DAY + HOUR))
    assert "48 hours" in refused.value.rejected.message
    d.ok(BackfillSchedule(d.request_id(), "s", now - 2 * DAY + 1, now - 2 * DAY + 2 * HOUR))


def test_a_raised_retention_does_not_bring_back_keys_already_forgotten(d):
    d.finalize(retention={"succeeded": {"max_age_ms": DAY}, "failed": {"max_age_ms": DAY},
                          "cancelled": {"max_age_ms": DAY}})
    d.put_schedule("s", every="1h")
    d.tick(advance_ms=3 * DAY)
    d.put_settings("retention", {"succeeded": {"max_age_ms": 30 * DAY}})
    now = d.now_ms
    with pytest.raises(Refused):  # the fire keys of two days ago are gone: not re-fired
        d.ok(BackfillSchedule(d.request_id(), "s", now - 2 * DAY, now - DAY - HOUR))


def test_a_unique_period_reaches_no_further_than_the_keys_are_kept(d):
    spec = JobSpec.parse({"task": "t", "key": "k", "unique": {"period_ms": 8 * DAY}})
    before = d.apply(SubmitJobs(d.request_id(), (spec,)))
    assert before.code == "invalid"  # the previous release's parser refused over 7 days
    d.finalize(retention={"failed": {"max_age_ms": 10 * DAY}})
    d.ok(SubmitJobs(d.request_id(), (spec,)))
    longer = JobSpec.parse({"task": "t", "key": "k2", "unique": {"period_ms": 11 * DAY}})
    refused = d.apply(SubmitJobs(d.request_id(), (longer,)))
    assert refused.code == "invalid" and refused.field == "jobs[0].unique.period_ms"


# -- the memory model and the budget -------------------------------------------------------


def test_the_state_counts_payloads_results_keys_and_records(d):
    base = d.state.state_bytes()
    d.ok(SubmitJobs(None, (JobSpec.parse({"task": "t", "payload": "x" * 1000, "key": "k-1"}),)))
    added = d.state.state_bytes() - base
    assert added == sizes.JOB_BYTES + len(j.pack("x" * 1000)) + 2 * len("k-1") + sizes.KEY_BYTES
    [(job_id, token)] = d.claim()
    d.complete(job_id, token, result="y" * 500)
    frozen = d.state.table.jobs[job_id]
    assert d.state.table.finished_bytes == sizes.FROZEN_JOB_BYTES + len(frozen._packed)
    assert_healthy(d)


def test_past_the_budget_the_oldest_finished_jobs_go_dead_letters_last(d):
    d.finalize(budget={"bytes": 1 << 20})
    failed = run(d, 2, fail=True, payload="f" * 20_000)
    d.tick(advance_ms=1)
    succeeded = [job_id for _ in range(6) for job_id in run(d, 10, payload="s" * 20_000)]
    d.tick(advance_ms=1)
    assert d.state.state_bytes() <= 1 << 20
    survivors = kept(d)
    assert set(failed) <= set(survivors)  # dead letters last
    gone = [job_id for job_id in succeeded if job_id not in survivors]
    assert gone == succeeded[: len(gone)] and gone  # oldest first
    assert d.state.counters["evicted"]["budget"] == len(gone)
    assert_healthy(d)


def test_a_submit_that_cannot_fit_is_refused_whole_and_changes_nothing(d):
    d.finalize(budget={"bytes": 1 << 20})
    d.submit_many(16, payload="q" * 60_000)  # unfinished: never evicted
    before = snapshot(d.state)
    spec = JobSpec.parse({"task": "t", "payload": "z" * 60_000})
    refused = d.apply(SubmitJobs(None, (spec,) * 2))
    assert refused.code == "state_full" and refused.http_status == 507
    details = refused.details
    assert details["budget_bytes"] == 1 << 20
    assert details["state_bytes"] == d.state.state_bytes()
    assert details["queues"] == [{"queue": "default",
                                  "bytes": d.state.table.bytes_by_queue["default"]}]
    assert "budget" in refused.message and "default" in refused.message
    assert snapshot(d.state) == before  # (no request id: nothing to remember)
    d.submit(payload="small")  # what fits is still taken


def test_a_request_refused_for_space_stays_refused_when_it_comes_again(d):
    """A client told 507 takes it that nothing was created: the same request, applied again
    (the shell's retry through another node, or the first attempt re-proposed after a leader
    change), must not create it once room was freed. Found by the chaos budget scenario."""
    d.finalize(budget={"bytes": 1 << 20})
    idle = d.submit_many(16, payload="q" * 60_000)  # unfinished: never evicted
    spec = JobSpec.parse({"task": "t", "key": "k-1", "payload": "z" * 60_000})
    command = SubmitJobs(d.request_id(), (spec,) * 2)
    assert d.apply(command).code == "state_full"
    for job_id in idle[:8]:  # room again
        d.apply(CancelJob(d.request_id(), job_id, "make room"))
    d.tick(advance_ms=1)
    again = d.apply(command)
    assert again.code == "state_full" and again.http_status == 507
    assert d.state.table.job_for_key("k-1") is None
    fresh = d.apply(SubmitJobs(d.request_id(), (spec,) * 2))  # a new request: taken now
    assert fresh.ok and d.state.table.job_for_key("k-1") is not None


def test_workers_can_always_claim_and_finish_and_finishing_frees_room(d):
    d.finalize(budget={"bytes": 1 << 20})
    ids = d.submit_many(16, payload="q" * 60_000)
    with pytest.raises(Refused):
        d.submit_many(2, payload="q" * 60_000)
    claimed = d.claim(max=16)
    for job_id, token in claimed:
        d.complete(job_id, token, result="r" * 60_000)  # past the budget by what it adds
        assert violations(d.state) == []
    assert len(kept(d)) < len(ids)
    d.submit(payload="q" * 60_000)  # room again


def test_workflows_triggers_backfills_and_retries_are_refused_for_space(d):
    d.finalize(budget={"bytes": 1 << 20})
    d.put_schedule("s", every="1h")
    [dead] = run(d, 1, fail=True)
    fill(d)
    before = snapshot(d.state)
    workflow = WorkflowSpec.parse({"jobs": [{"name": "a", "task": "t", "payload": "w" * 60_000}]})
    refusals = [  # no request ids: a remembered refusal is the one change a refusal makes
        d.apply(SubmitWorkflow(None, workflow)),
        d.apply(TriggerSchedule(None, "s")),
        d.apply(BackfillSchedule(None, "s", d.now_ms - 10 * HOUR, d.now_ms)),
        d.apply(RetryJob(None, dead)),
    ]
    assert [r.code for r in refusals] == ["state_full"] * 4
    assert snapshot(d.state) == before
    remembered = d.apply(RetryJob("retry-1", dead))
    assert remembered.code == "state_full"
    assert d.state.requests.get("retry-1") is not None  # its repeats get the same answer


def test_a_fire_over_the_budget_is_counted_with_its_reason_an_event_and_a_notification(d):
    from raftcron.scheduler.notifications import NotificationSpec, PutNotification

    d.ok(PutNotification(d.request_id(), "ops", NotificationSpec.parse(
        {"url": "https://example.test/hook", "events": ["misfire"], "secret": "s" * 16})))
    d.finalize(budget={"bytes": 1 << 20})
    d.put_schedule("s", every="1s")
    d.tick(advance_ms=1)
    fill(d)
    d.tick(advance_ms=3_000)
    schedule = d.state.schedules["s"]
    assert schedule.misfires_state_full == 3
    refused = [e for e in d.state.events.entries if e[2] == "misfired"]
    assert refused and refused[-1][3]["reason"] == "state_full"
    assert any(entry[3] == "misfire" for entry in d.state.notifications.outbox)
    assert d.state.schedules["s"].cursor_ms == d.now_ms  # the cursor moved on
    assert_healthy(d)


def test_a_lowered_budget_evicts_over_ticks_never_unfinished_jobs(d):
    d.finalize()
    run(d, 40, payload="x" * 40_000)
    waiting = d.submit_many(5, payload="x" * 40_000)
    d.put_settings("budget", {"bytes": 1 << 20})
    d.tick(advance_ms=1)
    assert d.state.state_bytes() <= 1 << 20
    assert set(waiting) <= set(kept(d))
    assert_healthy(d)


def test_settings_can_be_changed_when_the_state_is_full(d):
    d.finalize(budget={"bytes": 1 << 20})
    d.submit_many(16, payload="q" * 60_000)
    d.put_settings("budget", {"bytes": 64 << 20})
    d.submit(payload="q" * 60_000)


def test_retention_and_budget_values_are_frozen_values_with_defaults():
    assert Retention().succeeded.max_count == 1_000_000
    assert Retention().failed.max_age_ms == 7 * DAY
    assert Retention.parse({}) == Retention()


def test_a_bulk_retry_counts_the_retries_refused_for_space_and_leaves_those_jobs(d):
    from raftcron.scheduler.flowcommands import BulkJobs
    from raftcron.scheduler.flowspecs import BulkFilter

    d.finalize(budget={"bytes": 1 << 20})
    [dead] = run(d, 1, fail=True)
    fill(d)
    value = d.ok(BulkJobs(None, "retry", BulkFilter(status="failed")))  # no answer kept
    assert (value["matched"], value["changed"], value["state_full"]) == (1, 0, 1)
    assert d.job(dead).status == j.FAILED


def test_a_key_stays_first_wins_after_its_job_is_evicted(d):
    """Found by the chaos suite's budget scenario: a resubmit with the key of an evicted job
    made a second job (the key table was asked for the job, not whether it holds the key)."""
    d.finalize(retention={"succeeded": {"max_count": 0}})
    first = d.submit(key="k-1", queue="default")
    [(job_id, token)] = d.claim()
    d.complete(job_id, token)
    d.tick(advance_ms=1)
    assert d.state.table.get(first) is None and d.state.table.remembers_key("k-1")
    again = d.ok(SubmitJobs(d.request_id(), (JobSpec.parse({"task": "t", "key": "k-1"}),)))
    assert again["jobs"] == [[first, False]]
    assert kept(d) == []


def test_before_the_gate_a_deleted_jobs_key_makes_a_new_job_as_it_did(d):
    from raftcron.scheduler.flowcommands import BulkJobs
    from raftcron.scheduler.flowspecs import BulkFilter

    first = d.submit(key="k-1")
    d.ok(BulkJobs(d.request_id(), "delete", BulkFilter()))
    again = d.ok(SubmitJobs(d.request_id(), (JobSpec.parse({"task": "t", "key": "k-1"}),)))
    assert again["jobs"] == [[first + 1, True]]


def test_a_workflow_key_stays_taken_after_its_workflow_is_evicted(d):
    d.finalize(retention={"succeeded": {"max_count": 0}})
    spec = WorkflowSpec.parse({"key": "wf-1", "jobs": [{"name": "a", "task": "t"}]})
    d.ok(SubmitWorkflow(d.request_id(), spec))
    [(job_id, token)] = d.claim()
    d.complete(job_id, token)
    d.tick(advance_ms=1)
    assert kept(d) == [] and not d.state.workflows
    refused = d.apply(SubmitWorkflow(d.request_id(), spec))
    assert (refused.code, refused.field) == ("conflict", "key")
    assert kept(d) == []


def test_a_workflow_whose_first_job_was_evicted_still_answers_its_key(d):
    # a is sheltered while b waits (scheduler/upstream.py): only the budget's last resort
    # evicts it, when the unfinished jobs leave nothing else to evict.
    d.finalize(budget={"bytes": 1 << 20})
    spec = WorkflowSpec.parse({"key": "wf-2", "jobs": [{"name": "a", "task": "t"},
                                                      {"name": "b", "task": "t", "after": ["a"]}]})
    first = d.ok(SubmitWorkflow(d.request_id(), spec))
    [(job_id, token)] = d.claim()
    d.submit_many(17, queue="other", payload="q" * 60_000)
    d.complete(job_id, token, result="r" * 60_000)
    assert d.state.table.get(job_id) is None  # a is gone, b waits
    assert d.state.table.get(job_id + 1).status == "queued"
    again = d.ok(SubmitWorkflow(d.request_id(), spec))
    assert (again["workflow_id"], again["created"]) == (first["workflow_id"], False)


def test_refusals_remembered_for_space_stay_out_of_the_budget_and_are_bounded(d, monkeypatch):
    """They exist because the state is full: counted apart (the budget still bounds the
    state), and past their own bound a refusal for space is answered busy, not remembered."""
    d.finalize(budget={"bytes": 1 << 20})
    d.submit_many(16, payload="q" * 60_000)
    spec = JobSpec.parse({"task": "t", "payload": "z" * 60_000})
    counted = d.state.state_bytes()
    for number in range(20):
        assert d.apply(SubmitJobs(f"full-{number}", (spec,) * 2)).code == "state_full"
    assert d.state.requests.refusal_bytes > 0
    assert d.state.state_bytes() == counted
    monkeypatch.setattr(limits, "REFUSALS_BYTES_MAX", d.state.requests.refusal_bytes)
    busy = d.apply(SubmitJobs("one-more", (spec,) * 2))
    assert busy.code == "busy" and busy.http_status == 503
    assert d.state.requests.get("one-more") is None
    assert d.apply(SubmitJobs("full-3", (spec,) * 2)).code == "state_full"  # still remembered
