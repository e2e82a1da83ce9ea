"""Jobs in the pure core: submit, claim, leases, fencing, retries, cancel, retention."""

import pytest

from raftcron.scheduler import jobs as j
from raftcron.scheduler import limits
from raftcron.scheduler.commands import (
    Ack,
    BeginLeadership,
    CancelJob,
    ClaimJobs,
    CompleteJob,
    RetryJob,
    SubmitJobs,
)
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.errors import Rejected
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.snapshot import snapshot
from raftcron.scheduler.specs import BackoffSpec, JobSpec


@pytest.fixture
def d():
    return Driver()


def test_a_submitted_job_is_queued_and_claimed_with_a_lease_and_token(d):
    job_id = d.submit(payload={"n": 1})
    assert d.job(job_id).status == "queued"
    [(claimed, token)] = d.claim(lease_ms=5_000)
    job = d.job(claimed)
    assert (claimed, job.status, job.attempts, job.token) == (job_id, "running", 1, token)
    assert job.lease_until_ms == d.now_ms + 5_000
    d.complete(job_id, token, {"ok": True})
    assert (job.status, j.unpack(job.result), job.finished_ms) == (
        "succeeded",
        {"ok": True},
        d.now_ms,
    )
    assert violations(d.state) == []


def test_fencing_tokens_strictly_increase_across_claims(d):
    d.submit_many(5)
    tokens = [token for _ in range(5) for _, token in d.claim()]
    assert tokens == sorted(tokens) and len(set(tokens)) == 5


def test_claims_follow_priority_then_due_time_then_id(d):
    low = d.submit(priority=0)
    high = d.submit(priority=5)
    later = d.submit(priority=5)
    order = [job_id for job_id, _ in d.claim(max=3)]
    assert order == [high, later, low]


def test_claim_only_takes_from_the_named_queues(d):
    other = d.submit(queue="emails")
    assert d.claim(queues=("default",)) == []
    assert [job_id for job_id, _ in d.claim(queues=("emails", "default"))] == [other]


def test_a_delayed_job_waits_until_a_tick_reaches_its_time(d):
    job_id = d.submit(delay_ms=1_000)
    assert d.job(job_id).status == "scheduled"
    assert d.claim() == []
    d.tick(advance_ms=999)
    assert d.claim() == []
    d.tick(advance_ms=1)
    assert [job_id for job_id, _ in d.claim()] == [job_id]


def test_a_stale_token_cannot_complete_a_job_and_changes_nothing(d):
    job_id = d.submit()
    [(_, token)] = d.claim(lease_ms=1_000)
    d.tick(advance_ms=1_000)  # lease expires; retried after backoff
    d.tick(advance_ms=10_000)
    [(_, token2)] = d.claim()
    assert token2 > token
    before = snapshot(d.state)
    result = d.apply(CompleteJob(None, job_id, token, "late"))
    assert (
        isinstance(result, Rejected) and result.code == "stale_token" and result.http_status == 409
    )
    assert snapshot(d.state) == before
    d.complete(job_id, token2)
    assert d.job(job_id).status == "succeeded"


def test_heartbeat_extends_the_lease_and_a_stale_one_is_refused(d):
    job_id = d.submit()
    [(_, token)] = d.claim(lease_ms=2_000)
    d.tick(advance_ms=1_500)
    assert d.heartbeat(job_id, token)["lease_until_ms"] == d.now_ms + 2_000
    d.tick(advance_ms=1_500)
    assert d.job(job_id).status == "running"
    with pytest.raises(Refused) as refused:
        d.heartbeat(job_id, token + 99)
    assert refused.value.code == "stale_token"


def test_an_expired_lease_counts_as_an_attempt_and_backs_off(d):
    job_id = d.submit(backoff={"initial_ms": 1_000, "factor": 2, "max_ms": 60_000, "jitter": 0})
    d.claim(lease_ms=1_000)
    d.tick(advance_ms=1_000)
    job = d.job(job_id)
    assert (job.status, job.attempts, job.run_at_ms) == ("scheduled", 1, d.now_ms + 1_000)
    assert job.history[-1].outcome == "lease_expired"
    assert d.state.events.entries[-1][2] == "lease_expired"


def test_failures_back_off_exponentially_then_dead_letter(d):
    backoff = {"initial_ms": 1_000, "factor": 3, "max_ms": 5_000, "jitter": 0}
    job_id = d.submit(max_attempts=4, backoff=backoff)
    delays = []
    for _ in range(3):
        d.tick(advance_ms=60_000)
        [(_, token)] = d.claim()
        d.fail(job_id, token, "transient")
        delays.append(d.job(job_id).run_at_ms - d.now_ms)
    assert delays == [1_000, 3_000, 5_000]  # 1 s, 3 s, then capped at 5 s
    d.tick(advance_ms=60_000)
    [(_, token)] = d.claim()
    d.fail(job_id, token, "still broken")
    job = d.job(job_id)
    assert (job.status, job.attempts, job.error) == ("failed", 4, "still broken")
    assert d.state.events.entries[-1][2] == "dead_lettered"


def test_a_non_retryable_failure_dead_letters_at_once(d):
    job_id = d.submit(max_attempts=5)
    [(_, token)] = d.claim()
    d.fail(job_id, token, "bad input", retryable=False)
    assert d.job(job_id).status == "failed"


@pytest.mark.parametrize(
    "attempt, expected", [(1, 1_000), (2, 2_000), (3, 4_000), (9, 256_000), (10, 300_000)]
)
def test_default_backoff_doubles_from_one_second_up_to_five_minutes(attempt, expected):
    assert j.backoff_delay_ms(BackoffSpec(jitter=0), 7, attempt) == expected


def test_backoff_jitter_is_deterministic_and_bounded():
    spec = BackoffSpec(initial_ms=10_000, jitter=0.5)
    delays = [j.backoff_delay_ms(spec, job_id, 1) for job_id in range(1, 200)]
    assert delays == [j.backoff_delay_ms(spec, job_id, 1) for job_id in range(1, 200)]
    assert all(10_000 <= delay <= 15_000 for delay in delays)
    assert len(set(delays)) > 50  # it does spread


def test_manual_retry_brings_a_dead_job_back_with_fresh_attempts(d):
    job_id = d.submit(max_attempts=1)
    [(_, token)] = d.claim()
    d.fail(job_id, token)
    assert d.job(job_id).status == "failed"
    d.ok(RetryJob(d.request_id(), job_id))
    assert d.job(job_id).status == "queued"
    [(_, token2)] = d.claim()
    d.complete(job_id, token2)
    assert (d.job(job_id).status, d.job(job_id).attempts) == ("succeeded", 2)


def test_retry_of_a_succeeded_job_is_refused(d):
    job_id = d.submit()
    [(_, token)] = d.claim()
    d.complete(job_id, token)
    result = d.apply(RetryJob(None, job_id))
    assert isinstance(result, Rejected) and result.code == "not_retryable"


def test_cancel_of_a_running_job_makes_its_worker_stop(d):
    job_id = d.submit()
    [(_, token)] = d.claim()
    d.ok(CancelJob(d.request_id(), job_id, "operator"))
    with pytest.raises(Refused) as refused:
        d.heartbeat(job_id, token)
    assert refused.value.code == "job_cancelled"
    with pytest.raises(Refused):
        d.complete(job_id, token)
    job = d.job(job_id)
    assert (job.status, job.cancel_reason, job.history[-1].outcome) == (
        "cancelled",
        "operator",
        "cancelled",
    )


def test_an_idempotency_key_returns_the_first_job(d):
    first = d.submit(key="report-2026-11-30")
    again = d.submit(key="report-2026-11-30", payload={"different": True})
    assert again == first
    assert len(d.state.table) == 1


def test_a_key_is_forgotten_after_the_dedupe_window(d):
    first = d.submit(key="k")
    d.tick(advance_ms=limits.KEY_WINDOW_MS_DEFAULT + 1)
    assert d.submit(key="k") != first


def test_a_repeated_request_id_gets_the_first_result_and_applies_once(d):
    command = SubmitJobs("req-fixed", (JobSpec(task="noop"),))
    first = d.ok(command)
    second = d.ok(command)
    assert first == second and len(d.state.table) == 1


def test_a_request_id_reused_for_another_command_is_refused(d):
    d.ok(SubmitJobs("req-x", (JobSpec(task="noop"),)))
    result = d.apply(ClaimJobs("req-x", "w1", ("default",)))
    assert isinstance(result, Rejected) and result.code == "request_id_reused"


def test_a_repeated_claim_returns_the_same_jobs_and_tokens(d):
    d.submit_many(3)
    command = ClaimJobs("claim-1", "w1", ("default",), max=2)
    assert d.ok(command) == d.ok(command)
    assert d.state.table.count_by_status["running"] == 2


def test_acks_ride_on_the_next_claim(d):
    a, b = d.submit_many(2)
    [(first, token)] = d.claim()
    value = d.ok(
        ClaimJobs(
            d.request_id(),
            "w1",
            ("default",),
            1,
            30_000,
            (Ack(first, token, "succeeded", result=1), Ack(first, token + 50, "failed")),
        )
    )
    assert value["acks"] == [[first, "ok"], [first, "stale_token"]]
    assert d.job(a).status == "succeeded" and d.job(b).status == "running"


def test_a_batch_with_an_unknown_dependency_is_refused_whole(d):
    result = d.apply(SubmitJobs(None, (JobSpec(task="a"), JobSpec(task="b", depends_on=(999,)))))
    assert (
        isinstance(result, Rejected)
        and result.code == "invalid"
        and "depends_on" in result.message
    )
    assert len(d.state.table) == 0


def test_a_new_leader_gives_running_leases_a_grace_period(d):
    job_id = d.submit()
    d.claim(lease_ms=10_000)
    d.tick(advance_ms=9_000)
    d.ok(BeginLeadership(d.now_ms, "n2", 7))
    d.tick(advance_ms=5_000)  # past the original lease end
    assert d.job(job_id).status == "running"
    d.tick(advance_ms=5_000)
    assert d.job(job_id).status == "scheduled"
    assert d.state.leader == ("n2", 7)


def test_time_never_goes_backwards(d):
    now = d.now_ms
    d.tick(now - 60_000)
    assert d.now_ms == now


def test_finished_jobs_are_removed_after_retention(d):
    job_id = d.submit()
    [(_, token)] = d.claim()
    d.complete(job_id, token)
    d.tick(advance_ms=limits.RETENTION_MS_DEFAULT - 1)
    assert d.state.table.get(job_id) is not None
    d.tick(advance_ms=1)
    assert d.state.table.get(job_id) is None
    assert violations(d.state) == []


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"task": ""}, "task"),
        ({"task": "a b"}, "task"),
        ({"task": "t", "priority": "high"}, "priority"),
        ({"task": "t", "max_attempts": 0}, "max_attempts"),
        ({"task": "t", "delay_ms": -1}, "delay_ms"),
        ({"task": "t", "delay_ms": 1, "run_at_ms": 5}, "delay_ms"),
        ({"task": "t", "backoff": {"factor": 0.5}}, "backoff.factor"),
        ({"task": "t", "backoff": {"initial_ms": 10, "max_ms": 5}}, "backoff.max_ms"),
        ({"task": "t", "payload": "x" * (limits.PAYLOAD_BYTES_MAX + 1)}, "payload"),
        ({"task": "t", "payload": {"n": float("nan")}}, "payload"),
        ({"task": "t", "colour": "red"}, "colour"),
        ({"task": "t", "depends_on": [1, 1]}, "depends_on"),
    ],
)
def test_invalid_job_specs_name_the_field(fields, field):
    from raftcron.scheduler.errors import Invalid

    with pytest.raises(Invalid) as error:
        JobSpec.parse(fields)
    assert error.value.field == field


def test_only_the_recorded_leaders_ticks_move_time(d):
    from raftcron.scheduler.commands import Tick

    d.ok(BeginLeadership(d.now_ms, "n1", 3))
    now = d.now_ms
    assert "ignored" in d.ok(Tick(now + 5_000, "n2"))
    assert d.now_ms == now
    d.ok(Tick(now + 5_000, "n1"))
    assert d.now_ms == now + 5_000


def test_a_deposed_leaders_late_begin_is_ignored(d):
    d.ok(BeginLeadership(d.now_ms, "n2", 7))
    assert "ignored" in d.ok(BeginLeadership(d.now_ms, "n1", 6))
    assert d.state.leader == ("n2", 7)


def test_a_request_id_reused_for_a_different_body_is_refused(d):
    d.ok(SubmitJobs("req-y", (JobSpec(task="noop"),)))
    result = d.apply(SubmitJobs("req-y", (JobSpec(task="other"),)))
    assert isinstance(result, Rejected) and result.code == "request_id_reused"
    assert len(d.state.table) == 1


def test_a_claim_retried_through_another_node_is_the_same_request(d):
    d.submit()
    first = d.ok(ClaimJobs("claim-x", "w1", ("default",), 1, 30_000, (), "n1"))
    again = d.ok(ClaimJobs("claim-x", "w1", ("default",), 1, 30_000, (), "n2"))
    assert first == again


def test_client_commands_wait_for_the_first_tick():
    from raftcron.scheduler.state import SchedulerState

    state = SchedulerState()
    result = state.apply(SubmitJobs("early", (JobSpec(task="noop"),)))
    assert isinstance(result, Rejected) and result.code == "not_ready" and result.http_status == 503
    assert len(state.table) == 0 and len(state.requests) == 0
