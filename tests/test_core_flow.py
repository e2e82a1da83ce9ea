"""Flow control in the pure core (DESIGN.md §8.5): queue limits, concurrency keys, uniqueness
that knows job states, debounce and bulk actions."""

from typing import Any

import pytest

from raftcron.scheduler import jobs as j
from raftcron.scheduler import limits
from raftcron.scheduler.bulk import select
from raftcron.scheduler.commands import (
    Ack,
    CancelJob,
    ClaimJobs,
    RetryJob,
    SubmitJobs,
    SubmitWorkflow,
)
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.flowcommands import BulkJobs, PauseQueue, PutQueue, ResumeQueue
from raftcron.scheduler.flowspecs import BulkFilter, QueueSpec
from raftcron.scheduler.flowviews import queue_view
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec, WorkflowSpec


@pytest.fixture
def d() -> Driver:
    return Driver()


def put_queue(d: Driver, name: str = "default", **spec: Any) -> None:
    d.ok(PutQueue(d.request_id(), name, QueueSpec.parse(spec)))


def submit(d: Driver, **fields: Any) -> dict[str, Any]:
    fields.setdefault("task", "t")
    return d.ok(SubmitJobs(d.request_id(), (JobSpec.parse(fields),)))


def keyed(d: Driver, key: str = "acct-42", max: int = 1, **fields: Any) -> int:
    return d.submit(concurrency={"key": key, "max": max}, **fields)


def running(d: Driver, key: str | None = None) -> list[int]:
    return sorted(
        job.id for job in d.state.table
        if job.status == j.RUNNING and (key is None or d.job(job.id).concurrency_key == key)
    )


def both(d: Driver, again: Driver, command: Any) -> dict[str, Any]:
    """Apply one command to a replica and to its restored copy: the same answer from both."""
    answer = d.ok(command)
    assert again.ok(command) == answer and snapshot(again.state) == snapshot(d.state)
    return answer


def restored(d: Driver) -> Driver:
    """The same cluster after a restart from a snapshot (checked byte for byte)."""
    blob = snapshot(d.state)
    again = Driver(restore(blob))
    assert snapshot(again.state) == blob and violations(again.state) == []
    return again


# -- queues ------------------------------------------------------------------------------------


def test_a_paused_queue_hands_out_nothing_and_its_leases_carry_on(d: Driver) -> None:
    d.submit_many(3)
    [(first, token)] = d.claim()
    d.ok(PauseQueue(d.request_id(), "default"))
    assert d.claim(max=10) == []
    assert d.job(first).status == j.RUNNING
    d.heartbeat(first, token)
    d.complete(first, token)
    view = queue_view(d.state, "default")
    assert (view["paused"], view["queued"], view["held"]["paused"]) == (True, 2, 2)
    d.ok(ResumeQueue(d.request_id(), "default"))
    assert len(d.claim(max=10)) == 2
    assert "default" not in d.state.queues  # back to its defaults: forgotten


def test_a_queue_never_runs_more_than_its_concurrency_max(d: Driver) -> None:
    put_queue(d, concurrency_max=2)
    d.submit_many(5)
    first = d.claim(max=5)
    assert len(first) == 2 and d.claim(max=5) == []
    assert queue_view(d.state, "default")["held"]["queue_concurrency"] == 3
    # An ack inside the claim frees its slot for that very claim.
    job_id, token = first[0]
    again = d.claim(max=5, acks=(Ack(job_id, token, "succeeded"),))
    assert len(again) == 1 and len(running(d)) == 2


def test_an_expired_lease_or_a_failure_frees_a_queue_slot(d: Driver) -> None:
    put_queue(d, concurrency_max=1)
    d.submit_many(2, max_attempts=1)
    [(job_id, token)] = d.claim(lease_ms=1_000)
    assert d.claim() == []
    d.tick(advance_ms=1_000)  # the lease ends: the job failed for good (one attempt)
    assert d.job(job_id).status == j.FAILED
    [(second, token)] = d.claim()
    d.fail(second, token, retryable=False)
    assert running(d) == []


def test_a_rate_limit_hands_out_its_burst_then_its_rate(d: Driver) -> None:
    put_queue(d, rate_limit={"max": 5, "per_ms": 1_000})
    d.submit_many(20)
    assert len(d.claim(max=20)) == 5  # the bucket starts full
    assert d.claim(max=20) == []
    assert queue_view(d.state, "default")["held"]["queue_rate"] == 15
    d.tick(advance_ms=199)
    assert d.claim(max=20) == []
    d.tick(advance_ms=1)  # 200 ms refill one token
    assert len(d.claim(max=20)) == 1
    d.tick(advance_ms=1_000)
    assert len(d.claim(max=20)) == 5
    d.tick(advance_ms=60_000)  # a full bucket holds max, however long it waited
    assert len(d.claim(max=20)) == 5


def test_a_changed_rate_limit_keeps_the_tokens_left_and_grants_no_fresh_burst(d: Driver) -> None:
    put_queue(d, rate_limit={"max": 10, "per_ms": 1_000})
    d.submit_many(30)
    assert len(d.claim(max=8)) == 8
    put_queue(d, rate_limit={"max": 20, "per_ms": 1_000})  # 2 tokens were left
    assert len(d.claim(max=30)) == 2
    put_queue(d, rate_limit={"max": 20, "per_ms": 1_000}, concurrency_max=100)  # same rate
    assert d.claim(max=30) == []


def test_queue_limits_and_buckets_survive_snapshot_and_restore(d: Driver) -> None:
    put_queue(d, "q", concurrency_max=3, rate_limit={"max": 4, "per_ms": 2_000})
    d.submit_many(10, queue="q")
    assert len(d.claim(queues=("q",), max=10)) == 3
    d.tick(advance_ms=500)
    again = restored(d)
    assert both(d, again, ClaimJobs(d.request_id(), "w", ("q",), 10)) == {"jobs": [], "acks": []}
    for driver in (d, again):
        driver.tick(advance_ms=10_000)
    assert again.state.queues["q"].units == d.state.queues["q"].units
    assert queue_view(again.state, "q") == queue_view(d.state, "q")


def test_limits_on_one_queue_leave_the_others_alone(d: Driver) -> None:
    put_queue(d, "slow", paused=True)
    d.submit_many(2, queue="slow", priority=10)
    fast = d.submit_many(2, queue="fast")
    assert [job_id for job_id, _ in d.claim(queues=("slow", "fast"), max=4)] == fast


def test_a_queue_spec_is_validated_naming_the_field() -> None:
    for body, field in [
        ({"concurrency_max": 0}, "concurrency_max"),
        ({"rate_limit": {"max": 5}}, "rate_limit.per_ms"),
        ({"rate_limit": {"max": 0, "per_ms": 10}}, "rate_limit.max"),
        ({"paused": "yes"}, "paused"),
        ({"limit": 3}, "limit"),
    ]:
        with pytest.raises(Invalid) as invalid:
            QueueSpec.parse(body)
        assert invalid.value.field == field


# -- concurrency keys ----------------------------------------------------------------------------


def test_a_key_never_runs_more_than_its_max_whatever_the_queue(d: Driver) -> None:
    for queue in ("a", "b", "c"):
        keyed(d, max=2, queue=queue)
    assert len(d.claim(queues=("a", "b", "c"), max=10)) == 2
    assert d.claim(queues=("a", "b", "c"), max=10) == []
    assert len(running(d, "acct-42")) == 2


def test_a_held_job_blocks_none_of_the_jobs_behind_it(d: Driver) -> None:
    first = keyed(d, priority=5)
    held = keyed(d, priority=5)
    others = d.submit_many(3)
    claimed = [job_id for job_id, _ in d.claim(max=10)]
    assert claimed == [first, *others]
    assert d.job(held).status == j.QUEUED and d.state.table.held_ids() == [held]


@pytest.mark.parametrize("how", ["complete", "retryable failure", "lease expiry", "cancel"])
def test_a_held_job_goes_when_its_key_frees_a_slot(d: Driver, how: str) -> None:
    first = keyed(d, max_attempts=2)
    second = keyed(d)
    [(job_id, token)] = d.claim(lease_ms=1_000, max=5)
    assert job_id == first
    if how == "complete":
        d.complete(first, token)
    elif how == "retryable failure":
        d.fail(first, token)
    elif how == "lease expiry":
        d.tick(advance_ms=1_000)
    else:
        d.ok(CancelJob(d.request_id(), first, None))
    assert d.state.table.held_ids() == []
    assert [job_id for job_id, _ in d.claim(max=5)] == [second]


def test_a_claim_never_looks_at_the_jobs_held_behind_a_full_key(d: Driver) -> None:
    """100k jobs of one key: they wait in the key's heap, none in the queue's, so a claim pays
    for the ready heap of other jobs only (and what it hands out)."""
    spec = JobSpec.parse({"task": "t", "concurrency": {"key": "hot", "max": 1}})
    for _ in range(100):  # straight to the state: the codec would triple the test's time
        d.state.apply(SubmitJobs(d.request_id(), (spec,) * 1_000))
    other = d.submit()
    ready = d.state.table.ready["default"]
    assert len(ready) == 2 and len(ready.heap) <= 2
    assert len(d.claim(max=10)) == 2
    assert d.claim(max=10) == [] and len(d.state.table.held["hot"]) == 99_999
    assert d.job(other).status == j.RUNNING


def test_held_jobs_stay_where_they_were_after_a_restore(d: Driver) -> None:
    first, early, urgent = keyed(d), keyed(d), keyed(d, priority=5)
    [(job_id, token)] = d.claim()
    d.complete(job_id, token)  # the slot goes to the best held job: the urgent one
    assert job_id == first and d.state.table.held_ids() == [early]
    again = restored(d)
    assert again.state.table.held_ids() == [early]
    # Deciding afresh in id order would put the early one in line instead.
    claimed = both(d, again, ClaimJobs(d.request_id(), "w", ("default",), 5))["jobs"]
    assert [job_id for job_id, _ in claimed] == [urgent]


def test_jobs_of_one_key_with_different_maxes_each_keep_their_own(d: Driver) -> None:
    wide = [keyed(d, max=3) for _ in range(2)]
    narrow = keyed(d, max=1)
    claimed = [job_id for job_id, _ in d.claim(max=5)]
    assert claimed == wide  # the narrow one would be the third running: it waits
    assert d.job(narrow).status == j.QUEUED and violations(d.state) == []


def test_a_schedule_template_may_carry_a_concurrency_key(d: Driver) -> None:
    spec = ScheduleSpec.parse(
        {"every": "1s", "overlap": "allow", "job": {"task": "t", "concurrency": {"key": "s"}}}
    )
    d.put_schedule("s", **spec.to_wire())
    d.tick()
    for _ in range(3):
        d.tick(advance_ms=1_000)
    assert len(d.claim(max=10)) == 1 and len(d.state.table.held_ids()) == 2


def test_a_workflow_job_may_carry_a_concurrency_key(d: Driver) -> None:
    nodes = [{"name": n, "task": "t", "concurrency": {"key": "w"}} for n in ("a", "b")]
    d.ok(SubmitWorkflow(d.request_id(), WorkflowSpec.parse({"jobs": nodes})))
    assert len(d.claim(max=5)) == 1


# -- uniqueness and debounce -------------------------------------------------------------------


def test_a_plain_key_stays_first_wins_whatever_the_state(d: Driver) -> None:
    first = submit(d, key="k")["jobs"][0][0]
    [(job_id, token)] = d.claim()
    d.complete(job_id, token)
    assert submit(d, key="k") == {"jobs": [[first, False]]}


def test_unique_answers_the_holder_while_it_is_in_a_listed_state(d: Driver) -> None:
    unique = {"states": ["scheduled", "queued"]}
    first = submit(d, key="k", unique=unique)["jobs"][0][0]
    assert submit(d, key="k", unique=unique) == {"jobs": [[first, False]]}
    d.claim()  # running is not listed: a new one may queue while the first runs
    second = submit(d, key="k", unique=unique)["jobs"][0]
    assert second[1] is True and second[0] != first
    assert d.state.table.job_for_key("k").id == second[0]


def test_unique_lets_a_new_job_in_once_the_holder_is_older_than_the_period(d: Driver) -> None:
    unique = {"period_ms": 60_000}
    first = submit(d, key="k", unique=unique)["jobs"][0][0]
    d.tick(advance_ms=59_999)
    assert submit(d, key="k", unique=unique)["jobs"][0] == [first, False]
    d.tick(advance_ms=1)
    assert submit(d, key="k", unique=unique)["jobs"][0][1] is True


def test_unique_replace_cancels_the_holder_and_a_new_job_takes_the_key(d: Driver) -> None:
    unique = {"on_conflict": "replace"}
    first = submit(d, key="k", unique=unique, payload=1)["jobs"][0][0]
    [(_, token)] = d.claim()
    answer = submit(d, key="k", unique=unique, payload=2)
    second = answer["jobs"][0][0]
    assert answer == {"jobs": [[second, True]], "replaced": [[0, first]]}
    assert (d.job(first).status, d.job(first).cancel_reason) == (j.CANCELLED, j.REPLACED)
    with pytest.raises(Refused) as refused:
        d.heartbeat(first, token)  # the running holder's worker hears of it
    assert refused.value.code == "job_cancelled"
    assert j.unpack(d.job(second).payload) == 2


def test_a_unique_key_is_remembered_for_its_whole_period(d: Driver) -> None:
    unique = {"period_ms": 3 * limits.DAY_MS, "states": ["succeeded"]}
    first = submit(d, key="k", unique=unique)["jobs"][0][0]
    [(job_id, token)] = d.claim()
    d.complete(job_id, token)
    d.tick(advance_ms=2 * limits.DAY_MS)  # past the key window of a plain key
    assert submit(d, key="k", unique=unique)["jobs"][0] == [first, False]


def test_debounce_moves_the_waiting_job_and_the_latest_payload_wins(d: Driver) -> None:
    fields = {"key": "reindex", "debounce_ms": 1_000, "debounce_max_ms": 2_500}
    first = submit(d, payload=1, **fields)["jobs"][0][0]
    created_ms = d.now_ms
    assert d.job(first).run_at_ms == created_ms + 1_000
    d.tick(advance_ms=900)
    assert submit(d, payload=2, **fields) == {"jobs": [[first, False]], "debounced": [0]}
    assert d.job(first).run_at_ms == created_ms + 1_900
    d.tick(advance_ms=900)
    submit(d, payload=3, **fields)
    assert d.job(first).run_at_ms == created_ms + 2_500  # never past debounce_max_ms
    assert j.unpack(d.job(first).payload) == 3
    d.tick(created_ms + 2_500)
    assert d.job(first).status == j.QUEUED
    # Due now: the next submit starts a new quiet period, with a new job.
    assert submit(d, payload=4, **fields)["jobs"][0][1] is True


def test_debounce_with_unique_ignores_while_the_first_runs(d: Driver) -> None:
    fields = {"key": "k", "debounce_ms": 100, "unique": {"states": ["queued", "running"]}}
    first = submit(d, **fields)["jobs"][0][0]
    d.tick(advance_ms=100)
    d.claim()
    assert submit(d, **fields) == {"jobs": [[first, False]]}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"unique": {}}, "unique"),
        ({"debounce_ms": 5}, "debounce_ms"),
        ({"key": "k", "debounce_ms": 5, "delay_ms": 5}, "delay_ms"),
        ({"key": "k", "debounce_max_ms": 5}, "debounce_max_ms"),
        ({"key": "k", "debounce_ms": 5, "debounce_max_ms": 4}, "debounce_max_ms"),
        ({"key": "k", "unique": {"states": []}}, "unique.states"),
        ({"key": "k", "unique": {"states": ["done"]}}, "unique.states[0]"),
        ({"key": "k", "unique": {"on_conflict": "keep"}}, "unique.on_conflict"),
        ({"key": "k", "unique": {"period_ms": limits.UNIQUE_PERIOD_PARSE_MS_MAX + 1}},
         "unique.period_ms"),
        ({"concurrency": {"max": 1}}, "concurrency.key"),
        ({"concurrency": {"key": "a", "max": 0}}, "concurrency.max"),
    ],
)
def test_flow_fields_of_a_job_are_validated_naming_the_field(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(Invalid) as invalid:
        JobSpec.parse({"task": "t", **fields})
    assert invalid.value.field == field


def test_a_schedule_template_or_a_workflow_job_has_no_uniqueness() -> None:
    with pytest.raises(Invalid) as invalid:
        ScheduleSpec.parse({"every": "1s", "job": {"task": "t", "debounce_ms": 5}})
    assert invalid.value.field == "job.debounce_ms"
    with pytest.raises(Invalid) as invalid:
        WorkflowSpec.parse({"jobs": [{"name": "a", "task": "t", "unique": {}}]})
    assert invalid.value.field == "jobs[0].unique"


# -- bulk actions --------------------------------------------------------------------------------


def bulk(d: Driver, action: str, max: int = limits.BULK_MAX, cursor: int = 0,
         **where: Any) -> dict[str, Any]:
    return d.ok(BulkJobs(d.request_id(), action, BulkFilter.parse(where), max, cursor))


def statuses(d: Driver) -> dict[int, str]:
    return {job.id: job.status for job in d.state.table}


def test_bulk_cancel_changes_exactly_the_matching_jobs(d: Driver) -> None:
    xs = d.submit_many(4, task="x", queue="q")
    ys = d.submit_many(2, task="y", queue="q")
    other_queue = d.submit_many(2, task="x", queue="r")
    before = statuses(d)
    answer = bulk(d, "cancel", task="x", queue="q")
    assert answer == {"matched": 4, "changed": 4, "more": False, "next_cursor": other_queue[-1]}
    after = statuses(d)
    assert {job_id for job_id in after if after[job_id] != before[job_id]} == set(xs)
    assert all(after[job_id] == j.QUEUED for job_id in ys + other_queue)


def test_a_bulk_in_parts_continues_from_its_next_cursor(d: Driver) -> None:
    ids = d.submit_many(10)
    first = bulk(d, "cancel", max=4)
    assert first == {"matched": 4, "changed": 4, "more": True, "next_cursor": ids[3]}
    second = bulk(d, "cancel", max=4, cursor=first["next_cursor"])
    third = bulk(d, "cancel", max=4, cursor=second["next_cursor"])
    assert (second["changed"], third["changed"], third["more"]) == (4, 2, False)
    assert set(statuses(d).values()) == {j.CANCELLED}


def test_a_bulk_command_looks_at_no_more_than_its_scan_bound(d: Driver) -> None:
    d.submit_many(50, task="other")
    wanted = d.submit_many(5, task="x")
    part = select(d.state, "cancel", BulkFilter(task="x"), cursor=0, max_jobs=10, scan_max=20)
    assert (part.ids, part.next_cursor, part.more) == ([], 20, True)
    found: list[int] = []
    cursor, more = 0, True
    while more:
        part = select(d.state, "cancel", BulkFilter(task="x"), cursor=cursor, max_jobs=10,
                      scan_max=20)
        found += part.ids
        cursor, more = part.next_cursor, part.more
    assert found == wanted


def test_bulk_retry_retries_failed_jobs_and_skips_those_whose_parent_still_failed(
    d: Driver,
) -> None:
    parent = d.submit(max_attempts=1, task="p")
    child = d.submit(depends_on=[parent], task="c")
    lone = d.submit(max_attempts=1, task="c")
    for job_id, token in d.claim(max=5):
        d.fail(job_id, token, retryable=False)
    assert (d.job(child).status, d.job(lone).status) == (j.CANCELLED, j.FAILED)
    answer = bulk(d, "retry", task="c")
    assert (answer["matched"], answer["changed"]) == (2, 1)
    assert (d.job(child).status, d.job(lone).status) == (j.CANCELLED, j.QUEUED)
    assert bulk(d, "retry", task="p")["changed"] == 1
    assert d.job(child).status == j.BLOCKED  # revived with its parent


def test_bulk_delete_removes_jobs_but_never_a_running_one(d: Driver) -> None:
    done, run, wait = d.submit_many(3, key=None)
    [(job_id, token)] = d.claim()
    d.complete(job_id, token)
    d.claim()
    answer = bulk(d, "delete")
    assert (answer["matched"], answer["changed"]) == (2, 2)
    assert sorted(statuses(d)) == [run] and violations(d.state) == []
    assert done == job_id and wait not in statuses(d)


def test_bulk_delete_keeps_a_parent_that_did_not_succeed_while_a_dependent_remains(
    d: Driver,
) -> None:
    """Were the parent gone, a retry of its dependent would run it as if the parent had
    succeeded (found by the model: 'job ran before its parents succeeded')."""
    parent = d.submit(task="p")
    child = d.submit(task="c", depends_on=[parent])
    d.ok(CancelJob(d.request_id(), parent, None))
    assert bulk(d, "delete", task="p") == {
        "matched": 1, "changed": 0, "more": False, "next_cursor": child
    }
    refused = d.apply(RetryJob(d.request_id(), child))
    assert getattr(refused, "code", None) == "not_retryable"
    # Both matching: the dependent goes first, then its parent, in one command.
    assert bulk(d, "delete")["changed"] == 2 and statuses(d) == {}


def test_a_bulk_of_a_status_the_action_does_not_apply_to_matches_nothing(d: Driver) -> None:
    d.submit_many(3)
    assert bulk(d, "retry", status="queued") == {
        "matched": 0, "changed": 0, "more": False, "next_cursor": 0
    }
    with pytest.raises(Invalid) as invalid:
        BulkJobs.from_wire({"action": "purge"})
    assert invalid.value.field == "action"


def test_a_bulk_filter_is_validated_naming_the_field() -> None:
    with pytest.raises(Invalid) as invalid:
        BulkFilter.parse({"created_from_ms": 10, "created_to_ms": 10})
    assert invalid.value.field == "filter.created_to_ms"
    with pytest.raises(Invalid) as invalid:
        BulkFilter.parse({"state": "failed"})
    assert invalid.value.field == "filter.state"
