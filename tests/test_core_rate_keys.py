"""Keyed rate limits in the pure core (DESIGN.md §9.4, scheduler/ratekeys.py): a job's
`rate: {key, max, per_ms}` starts at most `max` jobs of the key in any window of `per_ms`,
whatever their queue; a job over its key's rate waits out of line and holds up nobody."""

import dataclasses
from typing import Any

import pytest

from raftcron.scheduler import jobs as j
from raftcron.scheduler.commands import CancelJob, ClaimJobs, PutSchedule, SubmitJobs
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.flowviews import queue_view
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec

RATE = {"key": "cust-42", "max": 2, "per_ms": 200}  # slices of 7 ms (200 / 32, rounded up)


def finalized() -> Driver:
    d = Driver()
    d.finalize()
    d.tick()
    return d


def rated(d: Driver, count: int, rate: dict[str, Any] = RATE, **fields: Any) -> list[int]:
    return d.submit_many(count, rate=rate, **fields)


def started(d: Driver, **claim: Any) -> list[int]:
    claim.setdefault("max", 50)
    return [job_id for job_id, _ in d.claim(**claim)]


def test_a_key_starts_max_in_its_window_and_the_rest_wait_out_of_line() -> None:
    d = finalized()
    keyed = rated(d, 5)
    plain = d.submit_many(3)
    first = started(d)
    # Two of the key, and the plain jobs behind it are not held up by the other three.
    assert first == keyed[:2] + plain
    view = queue_view(d.state, "default")
    assert view["held"]["key_rate"] == 3 and view["queued"] == 3
    assert d.job(keyed[2]).status == j.QUEUED
    assert started(d) == []
    opens = d.state.next_due_ms()
    assert opens is not None and d.now_ms + 200 <= opens < d.now_ms + 207
    d.tick(opens - 1)
    assert started(d) == []
    d.tick(opens)  # the Tick that reaches the wake time lets two in line
    assert started(d) == keyed[2:4]
    assert violations(d.state) == []


def test_a_key_counts_across_queues_and_other_keys_run_alongside() -> None:
    d = finalized()
    a = rated(d, 2, queue="q1") + rated(d, 2, queue="q2")
    other = rated(d, 2, rate={**RATE, "key": "cust-7"}, queue="q1")
    got = started(d, queues=("q1", "q2"))
    assert sorted(got) == sorted(a[:2] + other)
    assert started(d, queues=("q1", "q2")) == []
    assert queue_view(d.state, "q2")["held"]["key_rate"] == 2


def test_a_cancelled_job_in_line_gives_its_room_to_one_held() -> None:
    d = finalized()
    keyed = rated(d, 4)
    # Two in line (the key's room), two held.
    assert queue_view(d.state, "default")["held"]["key_rate"] == 2
    d.ok(CancelJob(d.request_id(), keyed[0]))
    assert queue_view(d.state, "default")["held"]["key_rate"] == 1
    assert started(d) == keyed[1:3]
    assert violations(d.state) == []


def test_a_held_job_cancelled_leaves_its_key_line() -> None:
    d = finalized()
    keyed = rated(d, 3)
    d.ok(CancelJob(d.request_id(), keyed[2]))
    assert queue_view(d.state, "default")["held"]["key_rate"] == 0
    assert started(d) == keyed[:2]
    d.tick(advance_ms=400)
    assert started(d) == []
    assert d.state.table.rates.held_ids() == []


def test_jobs_of_a_key_with_different_limits_are_checked_again_at_claim() -> None:
    d = finalized()
    wide = rated(d, 2, rate={**RATE, "max": 5})
    narrow = rated(d, 2, rate={**RATE, "max": 2})
    # All four went in line (each let in by its own max), the claim stops the narrow ones.
    assert started(d) == wide
    assert [d.job(i).status for i in narrow] == [j.QUEUED] * 2
    assert violations(d.state) == []


def test_the_key_is_forgotten_once_its_starts_leave_the_window() -> None:
    d = finalized()
    rated(d, 2)
    assert len(started(d)) == 2
    rates = d.state.table.rates
    assert "cust-42" in rates.keys and rates.bytes > 0
    d.tick(advance_ms=250)
    assert rates.keys == {} and rates.bytes == 0


def test_rate_is_refused_before_finalize_in_jobs_workflows_and_templates() -> None:
    d = Driver()
    with pytest.raises(Refused) as refused:
        d.submit(rate=RATE)
    assert (refused.value.rejected.code, refused.value.rejected.field) == (
        "not_finalized", "jobs[0].rate")
    template = ScheduleSpec.parse({"every": "1m", "job": {"task": "t", "rate": RATE}})
    with pytest.raises(Refused) as refused:
        d.ok(PutSchedule(d.request_id(), "s", template))
    assert refused.value.rejected.field == "spec.job.rate"
    assert d.state.table.jobs == {} and d.state.schedules == {}


def test_a_schedule_template_gives_its_jobs_the_rate() -> None:
    d = finalized()
    template = ScheduleSpec.parse({"every": "1s", "job": {"task": "t", "rate": RATE}})
    d.ok(PutSchedule(d.request_id(), "s", template))
    d.tick()  # a schedule starts at the next Tick
    d.tick(advance_ms=5_000)
    fired = [job for job in d.state.table if job.schedule == "s"]
    assert fired and all(d.job(job.id).rate is not None for job in fired)


def test_held_and_windows_survive_snapshot_and_restore_exactly() -> None:
    d = finalized()
    keyed = rated(d, 6)
    assert started(d) == keyed[:2]
    d.tick(advance_ms=50)
    again = Driver(restore(snapshot(d.state)))
    assert snapshot(again.state) == snapshot(d.state)
    assert again.state.table.rates.held_ids() == d.state.table.rates.held_ids()
    assert again.state.next_due_ms() == d.state.next_due_ms()
    claim = ClaimJobs("after-restore", "w1", ("default",), 50, 30_000, ())
    for replica in (d, again):
        replica.tick(advance_ms=200)
    answers = [replica.ok(claim) for replica in (d, again)]
    assert answers[0] == answers[1] and len(answers[0]["jobs"]) == 2
    assert snapshot(again.state) == snapshot(d.state)
    assert violations(again.state) == []


def test_a_retried_job_keeps_its_rate() -> None:
    d = finalized()
    [job_id] = rated(d, 1, max_attempts=3)
    [(claimed, token)] = d.claim()
    d.fail(claimed, token, retryable=True)
    assert d.job(job_id).rate is not None and d.job(job_id).rate.key == "cust-42"


def test_the_job_view_shows_its_rate() -> None:
    d = finalized()
    answer = d.ok(SubmitJobs(d.request_id(), (JobSpec.parse({"task": "t", "rate": RATE}),)))
    [[job_id, _]] = answer["jobs"]
    from raftcron.scheduler.views import job_view

    assert job_view(d.state.table.jobs[job_id])["rate"] == RATE
    assert dataclasses.asdict(d.job(job_id).rate) == RATE


def test_a_job_let_out_of_its_rate_line_into_a_concurrency_hold_leaves_the_room_to_others() -> None:
    """Found by the tier-0 model: the job a rate key lets go may wait on its concurrency key
    instead of going in line; the key's room is then still free for the next held job, and
    none is left held with nothing to wake it."""
    d = finalized()
    both = {"rate": {**RATE, "max": 1}, "concurrency": {"key": "acct", "max": 1}}
    keyed = rated(d, 4, **{k: v for k, v in both.items() if k != "rate"},
                  rate=both["rate"])
    [(first, token)] = d.claim(max=5)
    assert first == keyed[0]
    d.tick(advance_ms=250)  # the window opens while the first still holds the concurrency key
    assert violations(d.state) == []
    assert d.claim(max=5) == []
    d.complete(first, token)
    assert violations(d.state) == []
    [(second, _)] = d.claim(max=5)
    assert second == keyed[1]


def test_a_key_whose_last_held_job_went_to_a_concurrency_hold_is_not_kept_for_nothing() -> None:
    """Found by the core model: the last held job of a key let go into its concurrency key's
    hold leaves the key with no start, no job held and none in line: it is forgotten (and
    kept again when a job of it goes in line)."""
    d = finalized()
    blocker = d.submit(concurrency={"key": "acct", "max": 1})
    [(running, token)] = d.claim()
    assert running == blocker
    limit = {**RATE, "max": 1}
    [first] = rated(d, 1, rate=limit, concurrency={"key": "acct", "max": 2})  # in line
    [second] = rated(d, 1, rate=limit, concurrency={"key": "acct", "max": 1})  # rate-held
    assert d.state.table.rates.held_ids() == [second]
    d.ok(CancelJob(d.request_id(), first))  # the second is let go, into acct's hold
    assert violations(d.state) == []
    assert "cust-42" not in d.state.table.rates.keys
    d.complete(running, token)
    assert [job_id for job_id, _ in d.claim()] == [second]
    assert violations(d.state) == []
