"""Tier 0: the core model of tests/test_core_model.py, extended with leaders, clocks, duplicates.

`ChaosCoreModel` keeps every rule and check of `CoreModel` (all core commands, a replica
compared byte for byte, snapshot/restore mid-run) and adds the rules of
`chaos.model.LeadersClocksDuplicates`: a new cluster whose first requests come before its first
Tick (refused `not_ready`, then retried), leadership moving between five nodes with newer and
stale terms and claims right after it, ticks from the leader and from deposed ones, clock jumps
of hours and days forward and backwards, a leader 30 s ahead handing over to one 30 s behind,
schedules that keep only a few finished runs or are deleted, created again and triggered,
backfills of retained-away, long-ago and too-old times, and the same command applied twice in a
row or re-proposed later. After every command the history checker holds (one job per fire time
over the whole run, a trigger's key is new and its answer true, too-old backfills refused,
nothing applied before the first Tick, tokens strictly increase, accepted completions carried
the current token, DAG order, time never goes back).

The checker is shown to fail on bad histories, and the whole model on broken state machines.
The product bugs it found are guarded by plain tests below; open ones by strict xfails.
Scale with RAFTCRON_TIER0_EXAMPLES (default 500 runs of up to 100 steps, about a minute).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

# tests/ is on sys.path (pytest's default "prepend" import mode puts the folder of the rootdir
# conftest there), and test_core_model is already imported under this name by collection.
from test_core_model import T0, CoreModel

from raftcron.chaos.model import (
    RETENTION_MS,
    Accepted,
    Applied,
    Backfilled,
    Claimed,
    Clock,
    Event,
    Fired,
    HistoryChecker,
    Keyed,
    LeadersClocksDuplicates,
    Led,
    RetentionSet,
    StepFacts,
    TriggerAnswered,
    Triggered,
    events_of,
)
from raftcron.scheduler import jobs as j
from raftcron.scheduler import limits
from raftcron.scheduler.commands import (
    BackfillSchedule,
    Barrier,
    BeginLeadership,
    CancelJob,
    ClaimJobs,
    Command,
    CompleteJob,
    DeleteSchedule,
    PauseSchedule,
    SubmitJobs,
    Tick,
    TriggerSchedule,
)
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.errors import Invalid, Ok, Rejected, Result
from raftcron.scheduler.requests import RequestLog
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.state import SchedulerState
from raftcron.scheduler.store import JobTable

EXAMPLES = int(os.environ.get("RAFTCRON_TIER0_EXAMPLES", "500"))


class ChaosCoreModel(LeadersClocksDuplicates, CoreModel):  # type: ignore[misc]  # untyped base
    start_ms = T0

    def __init__(self) -> None:
        super().__init__()
        # CoreModel starts ticked at T0; a new cluster starts before any Tick, and the rule
        # a_new_cluster_starts takes it from there (to T0).
        self.state, self.replica = SchedulerState(), SchedulerState()
        self.history = HistoryChecker()
        self.sent.clear()
        self.last_command = None


ChaosCoreModel.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_core_keeps_its_rules_through_leaders_clocks_and_duplicates = ChaosCoreModel.TestCase


# -- the checker fails on bad histories ------------------------------------------------------


def checked(*events: Event, ticker_rules: bool = False) -> list[str]:
    return HistoryChecker(ticker_rules=ticker_rules).feed_all(events).problems


def test_a_clean_history_passes() -> None:
    assert checked(
        Applied("Barrier", False, None),
        Applied("SubmitJobs", False, "not_ready"),
        Led("n1", 1),
        Clock(10, ticked=True),
        Fired("s", 1_000, 1),
        Fired("s", 2_000, 2),
        Keyed("k", 3),
        Triggered("s", "s@manual-4", 4),
        TriggerAnswered("s", 4, buffered=False, created=True, waiting=False),
        TriggerAnswered("s", None, buffered=True, created=False, waiting=True),
        Backfilled("s", 11 - RETENTION_MS, 10, accepted=True, refused_for_age=False),
        Backfilled("s", 10 - RETENTION_MS, 10, accepted=False, refused_for_age=True),
        Claimed(1, 1),
        Accepted(1, 1, 1, j.RUNNING, "heartbeat"),
        Accepted(1, 1, 1, j.RUNNING, "succeeded"),
        Claimed(3, 2, parents=(1,)),
        Clock(10),
        Clock(11),
        ticker_rules=True,
    ) == []


def test_a_fire_time_with_two_jobs_is_reported() -> None:
    assert checked(Fired("s", 1_000, 1), Fired("s", 1_000, 7)) == [
        "event 2: s@1000 fired twice: job 1, then job 7"
    ]


def test_a_trigger_that_takes_an_earlier_jobs_key_is_reported() -> None:
    assert checked(Triggered("s", "s@manual-1", 1), Triggered("s", "s@manual-1", 2)) == [
        "event 2: a trigger of s created job 2 with key 's@manual-1', which job 1 held before"
    ]
    assert "which job 5 held before" in checked(Keyed("s@manual-6", 5),
                                                Triggered("s", "s@manual-6", 6))[0]


def test_a_trigger_answer_that_is_not_true_is_reported() -> None:
    assert "no manual fire waits" in checked(TriggerAnswered("s", None, True, False, False))[0]
    assert "created no job" in checked(TriggerAnswered("s", None, False, False, False))[0]
    assert "created no job" in checked(TriggerAnswered("s", 3, False, False, False))[0]


def test_a_backfill_older_than_the_retention_accepted_is_reported() -> None:
    now_ms = T0 + RETENTION_MS
    assert checked(Backfilled("s", T0 - 1, now_ms, accepted=True, refused_for_age=False)) == [
        f"event 1: a backfill of s from {T0 - 1} was accepted, older than the retention "
        f"(after {T0} only)"
    ]
    assert "older than the retention" in checked(
        Backfilled("s", T0, now_ms, accepted=True, refused_for_age=False)
    )[0]
    assert "refused for its age, within the retention" in checked(
        Backfilled("s", T0 + 1, now_ms, accepted=False, refused_for_age=True)
    )[0]


def test_a_backfill_past_what_the_retention_setting_keeps_is_reported() -> None:
    """Once finalized, fire keys go as far as the longest retention reaches, at each Tick,
    and a longer retention set later does not bring them back."""
    day = limits.DAY_MS
    finalized = (RetentionSet(day, T0, finalized_now=True), Clock(T0 + 3 * day, ticked=True),
                 RetentionSet(30 * day, T0 + 3 * day, finalized_now=False))
    reach = T0 + 2 * day  # the cutoff of the Tick three days on, with one day kept
    assert checked(*finalized, Backfilled("s", reach + 1, T0 + 3 * day, True, False)) == []
    assert "older than the retention (after" in checked(
        *finalized, Backfilled("s", reach, T0 + 3 * day, accepted=True, refused_for_age=False))[0]
    assert "refused for its age, within the retention" in checked(
        *finalized, Backfilled("s", reach + 1, T0 + 3 * day, accepted=False,
                               refused_for_age=True))[0]
    # A PutSettings before any Finalize changes nothing: the 7-day constant still holds.
    assert checked(RetentionSet(day, T0, finalized_now=False),
                   Clock(T0 + 8 * day, ticked=True),
                   Backfilled("s", T0 + 2 * day, T0 + 8 * day, True, False)) == []


def test_a_request_applied_before_the_first_tick_is_reported() -> None:
    assert checked(Applied("ClaimJobs", False, None)) == [
        "event 1: ClaimJobs was applied before the first Tick (None)"
    ]
    assert "applied before the first Tick (not_found)" in checked(
        Applied("CompleteJob", False, "not_found")
    )[0]
    assert "refused not_ready after the first Tick" in checked(
        Applied("ClaimJobs", True, "not_ready")
    )[0]


def test_a_lease_granted_between_a_new_leader_and_its_first_tick_is_reported() -> None:
    events = (Clock(10, ticked=True), Led("n2", 4), Clock(10), Claimed(1, 1))
    assert checked(*events) == []  # the model applies any order: only tier 1 checks it
    assert checked(*events, ticker_rules=True) == [
        "event 4: job 1 leased after n2 began term 4 and before its first Tick: the lease "
        "counts from an old time"
    ]


def test_a_token_that_does_not_increase_is_reported() -> None:
    assert "not above the last token 5" in checked(Claimed(1, 5), Claimed(2, 5))[0]


def test_a_completion_with_a_stale_token_is_reported() -> None:
    assert "accepted while the job was running with token 4" in checked(
        Claimed(1, 3), Claimed(1, 4), Accepted(1, 3, 4, j.RUNNING, "succeeded")
    )[0]


def test_a_completion_of_a_job_that_no_longer_runs_is_reported() -> None:
    assert "while the job was queued" in checked(Accepted(1, 3, 3, j.QUEUED, "succeeded"))[0]


def test_a_job_completed_twice_is_reported() -> None:
    done = Accepted(1, 3, 3, j.RUNNING, "succeeded")
    assert "completed twice" in checked(done, done)[0]


def test_a_child_run_before_its_parent_succeeded_is_reported() -> None:
    assert "ran before its parents [1] succeeded" in checked(
        Claimed(1, 1), Accepted(1, 1, 1, j.RUNNING, "failed"), Claimed(2, 2, parents=(1,))
    )[0]


def test_time_going_back_is_reported() -> None:
    assert checked(Clock(10), Clock(9)) == ["event 2: time went back from 10 to 9"]


def test_nominal_times_out_of_order_are_noted_for_tier_1() -> None:
    checker = HistoryChecker().feed_all([Fired("s", 2_000, 1), Fired("s", 1_000, 2)])
    assert list(checker.out_of_order) == ["s"] and checker.problems == []


# -- events read from real commands ------------------------------------------------------------


def events_applying(driver: Driver, command: Command) -> list[Event]:
    facts = StepFacts.capture(driver.state, command)
    return events_of(facts, command, driver.apply(command), driver.state)


def test_a_repeated_request_tells_the_checker_nothing_but_the_time() -> None:
    driver = Driver()
    job_id = driver.submit()
    [(_, token)] = driver.claim()
    command = CompleteJob(driver.request_id(), job_id, token, None)
    assert events_applying(driver, command)[1] == Accepted(
        job_id, token, token, j.RUNNING, "succeeded"
    )
    assert StepFacts.capture(driver.state, command).remembered == {"status": "succeeded"}
    assert events_applying(driver, command) == [
        Applied("CompleteJob", True, None), Clock(driver.now_ms)
    ]


def test_a_repeat_of_a_request_refused_for_space_is_answered_as_it_was_first() -> None:
    """The request table keeps a refusal for space (state_full, 507) as well as successes: the
    model's check of a repeat answered from the table (the refusal again, the state as it was)
    holds for it, where it took every remembered answer for a success."""
    machine = ChaosCoreModel()
    machine.a_new_cluster_starts(early=[], node="n1", barrier_first=False)
    machine.finalize(budget=1 << 20, retention={})
    spec = JobSpec.parse({"task": "big", "payload": "p" * 60_000})
    for _ in range(20):  # 16 fit in 1 MiB
        command = SubmitJobs(machine.rid(), (spec,) * 2)
        first = machine.apply(command)
        if isinstance(first, Rejected):
            break
    assert isinstance(first, Rejected) and first.code == "state_full"
    machine.apply(Tick(machine.state.now_ms + 1_000))
    again = machine.apply(command)
    assert isinstance(again, Rejected)
    assert (again.code, again.message) == (first.code, first.message)
    assert machine.history.problems == []


def test_a_schedule_fire_is_an_event() -> None:
    driver = Driver(now_ms=T0)
    driver.put_schedule("s", every="1s")
    driver.tick()
    assert events_applying(driver, Tick(driver.now_ms + 1_000)) == [
        Applied("Tick", True, None), Fired("s", T0 + 1_000, 1), Clock(T0 + 1_000, ticked=True)
    ]


def test_triggers_backfills_and_leaders_are_events() -> None:
    driver = Driver(now_ms=T0)
    driver.put_schedule("s", cron="0 0 1 1 *")
    assert events_applying(driver, BeginLeadership(T0, "n1", 3))[1] == Led("n1", 3)
    assert events_applying(driver, TriggerSchedule(driver.request_id(), "s"))[1:3] == [
        TriggerAnswered("s", 1, buffered=False, created=True, waiting=False),
        Triggered("s", "s@manual-1", 1),
    ]
    command = BackfillSchedule(driver.request_id(), "s", T0 - RETENTION_MS - 1, T0)
    assert events_applying(driver, command)[1] == Backfilled(
        "s", T0 - RETENTION_MS - 1, T0, accepted=False, refused_for_age=True
    )


def test_a_request_before_the_first_tick_is_an_event() -> None:
    state = SchedulerState()
    command = SubmitJobs("r1", (JobSpec.parse({"task": "t", "key": "k"}),))
    facts = StepFacts.capture(state, command)
    assert events_of(facts, command, state.apply(command), state) == [
        Applied("SubmitJobs", False, "not_ready"), Clock(0)
    ]


# -- the whole model fails on broken state machines -------------------------------------------


class ForgetfulState(SchedulerState):
    """Answers no request from memory: a retried completion is evaluated again."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = ForgetfulLog()


class ForgetfulLog(RequestLog):
    def get(self, request_id: str) -> None:
        return None


class ObedientState(SchedulerState):
    """Lets any node's Tick move time, the deposed leader's too."""

    def apply(self, command: Command, fingerprint: int | None = None) -> Result:
        if isinstance(command, Tick):
            command = Tick(command.now_ms)
        return super().apply(command, fingerprint)


class EagerState(SchedulerState):
    """Applies requests before its first Tick (requests-before-first-tick, unfixed)."""

    def apply(self, command: Command, fingerprint: int | None = None) -> Result:
        if self.now_ms == 0 and not isinstance(command, Tick | BeginLeadership | Barrier):
            return self._dispatch(command)
        return super().apply(command, fingerprint)


class ShortMemoryTable(JobTable):
    """Forgets a fire with its job, or after the key window (backfill-refires-forgotten)."""

    def remembers_key(self, key: str) -> bool:
        return self.job_for_key(key) is not None

    def expire_keys(self, cutoff_ms: int, long_cutoff_ms: int) -> int:
        return super().expire_keys(cutoff_ms, cutoff_ms)


class ShortMemoryState(SchedulerState):
    def __init__(self) -> None:
        super().__init__()
        self.table = ShortMemoryTable()


@pytest.mark.parametrize("broken", [ForgetfulState, ObedientState, EagerState, ShortMemoryState])
def test_the_model_catches_a_broken_state_machine(broken: type[SchedulerState]) -> None:
    class BrokenModel(ChaosCoreModel):
        def __init__(self) -> None:
            super().__init__()
            self.state, self.replica = broken(), broken()

    quick = settings(
        max_examples=300,
        stateful_step_count=60,
        deadline=None,
        phases=[Phase.generate],  # no shrinking: failing at all is the point
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    with pytest.raises(AssertionError):
        run_state_machine_as_test(BrokenModel, settings=quick)


# -- product bugs found by the chaos suite, fixed: these guard the fixes ------------------------


def fire_every_second(driver: Driver, seconds: int, *, retain: int = 1_000) -> None:
    driver.put_schedule("s", every="1s", retain=retain)
    driver.tick()
    for _ in range(seconds):
        driver.tick(advance_ms=1_000)
        for job_id, token in driver.claim():
            driver.complete(job_id, token)


def backfilled(driver: Driver, from_ms: int, to_ms: int) -> list[int]:
    """The fire times a backfill of [from_ms, to_ms) created jobs for."""
    value = driver.ok(BackfillSchedule(driver.request_id(), "s", from_ms, to_ms))
    return [fire_time for fire_time, _job, created in value["fires"] if created]


def test_a_backfill_never_fires_again_a_time_whose_job_retention_deleted() -> None:
    """backfill-refires-forgotten, fixed: a fire key outlives its job (the `retain` cap)."""
    driver = Driver(now_ms=T0)
    fire_every_second(driver, 3, retain=1)
    assert [job.key for job in driver.state.table] == [f"s@{T0 + 3_000}"]  # :01, :02 deleted
    value = driver.ok(BackfillSchedule(driver.request_id(), "s", T0 + 500, T0 + 3_000))
    assert value == {"fires": [[T0 + 1_000, None, False], [T0 + 2_000, None, False]]}


def test_a_backfill_never_fires_again_a_time_fired_more_than_a_day_ago() -> None:
    """backfill-refires-forgotten, fixed: fire keys live the retention, not the key window."""
    driver = Driver(now_ms=T0)
    fire_every_second(driver, 3)
    driver.ok(PauseSchedule(driver.request_id(), "s"))
    driver.tick(advance_ms=limits.DAY_MS + 1)  # past the client keys' window
    assert len(driver.state.table) == 3
    assert backfilled(driver, T0 + 500, T0 + 3_500) == []


def test_a_backfill_older_than_the_retention_is_refused() -> None:
    driver = Driver(now_ms=T0)
    fire_every_second(driver, 3)
    driver.ok(PauseSchedule(driver.request_id(), "s"))
    driver.tick(advance_ms=RETENTION_MS - 1_500)
    oldest_ms = driver.now_ms - RETENTION_MS
    assert oldest_ms == T0 + 1_500
    refused = driver.apply(BackfillSchedule(driver.request_id(), "s", oldest_ms - 1, T0 + 3_500))
    assert isinstance(refused, Rejected) and (refused.code, refused.field) == ("invalid", "from_ms")
    assert refused.http_status == 400
    refused = driver.apply(BackfillSchedule(driver.request_id(), "s", oldest_ms, T0 + 3_500))
    assert isinstance(refused, Rejected) and refused.field == "from_ms"  # its keys may be gone
    assert backfilled(driver, oldest_ms + 1, T0 + 3_500) == []  # :02 and :03 are remembered


def test_a_trigger_of_a_recreated_schedule_creates_a_job_with_a_key_of_its_own() -> None:
    """trigger-key-reused-after-recreate, fixed: a manual key is `<schedule>@manual-<job id>`."""
    driver = Driver(now_ms=T0)
    driver.put_schedule("s", cron="0 0 1 1 *")
    driver.tick()
    assert driver.ok(TriggerSchedule(driver.request_id(), "s")) == {"job_id": 1, "buffered": False}
    driver.ok(DeleteSchedule(driver.request_id(), "s"))
    driver.put_schedule("s", cron="0 0 1 1 *")
    driver.tick()
    assert driver.ok(TriggerSchedule(driver.request_id(), "s")) == {"job_id": 2, "buffered": False}
    assert [job.key for job in driver.state.table] == ["s@manual-1", "s@manual-2"]


def test_a_trigger_answers_buffered_only_when_it_buffered() -> None:
    driver = Driver(now_ms=T0)
    driver.put_schedule("s", cron="0 0 1 1 *", overlap="buffer_one")
    driver.tick()
    trigger = TriggerSchedule(driver.request_id(), "s")
    assert driver.ok(trigger) == {"job_id": 1, "buffered": False}
    trigger = TriggerSchedule(driver.request_id(), "s")
    assert driver.ok(trigger) == {"job_id": None, "buffered": True}
    schedule = driver.state.schedules["s"]
    assert schedule.buffered == (T0, 1)
    refused = driver.apply(TriggerSchedule(driver.request_id(), "s"))
    assert isinstance(refused, Rejected) and refused.code == "overlap"
    [(job_id, token)] = driver.claim()
    driver.complete(job_id, token)  # the buffered manual fire goes now, with a key of its own
    assert schedule.buffered is None
    assert [job.key for job in driver.state.table] == ["s@manual-1", "s@manual-2"]


def test_a_request_before_the_first_tick_is_refused_and_its_retry_applied_once() -> None:
    """requests-before-first-tick, fixed: refused `not_ready` (503), so the client retries."""
    state = SchedulerState()  # a fresh cluster: now_ms is 0 until the leader's first Tick
    submit = SubmitJobs("r1", (JobSpec.parse({"task": "t", "key": "k"}),))
    refused = state.apply(submit)
    assert isinstance(refused, Rejected) and refused.code == "not_ready"
    assert refused.http_status == 503 and len(state.table) == 0 and state.requests.get("r1") is None
    assert state.apply(Barrier("b1")) == Ok({})
    assert state.apply(BeginLeadership(T0, "n1", 1)) == Ok({"extended": 0})  # moves no time
    state.apply(Tick(T0, "n1"))
    assert state.apply(submit) == Ok({"jobs": [[1, True]]})
    assert state.apply(submit) == Ok({"jobs": [[1, True]]}), "the retry was applied again"
    assert [(job.key, job.created_ms) for job in state.table] == [("k", T0)]


def test_a_backfill_at_the_retention_edge_never_fires_a_time_again() -> None:
    """backfill-at-the-retention-edge, fixed: a fire key is forgotten once created at or before
    now - retention, so a backfill must start after that, not at it."""
    driver = Driver(now_ms=T0)
    driver.put_schedule("s", every="1s")
    driver.tick()
    driver.tick(advance_ms=1_000)  # s@T0+1000 fires on time: its key is created at T0 + 1000
    [(job_id, token)] = driver.claim()
    driver.complete(job_id, token)
    driver.ok(PauseSchedule(driver.request_id(), "s"))
    driver.tick(T0 + 1_000 + RETENTION_MS)  # the key expires: created_ms <= now - retention
    refused = driver.apply(BackfillSchedule(driver.request_id(), "s", T0 + 1_000, T0 + 1_001))
    assert isinstance(refused, Rejected) and (refused.code, refused.field) == ("invalid", "from_ms")
    assert [job.key for job in driver.state.table].count(f"s@{T0 + 1_000}") <= 1
    assert backfilled(driver, T0 + 1_001, T0 + 2_001) == [T0 + 2_000]  # never fired: paused


def test_a_backfill_of_a_time_still_to_come_never_fires_it_twice() -> None:
    """Found by this model: a backfill reaching past the cluster's now fired a time before it
    came, so its fire key was created before the time itself; the key expired one retention
    after its creation while a backfill may still reach that time, which then fired again.
    A backfill covers times up to now; later ones are the clock's."""
    driver = Driver(now_ms=T0)
    driver.put_schedule("s", every="1s")
    driver.tick()
    driver.ok(PauseSchedule(driver.request_id(), "s"))
    assert backfilled(driver, T0, T0 + 1_313) == [T0]  # T0 + 1000 is still to come
    driver.tick(T0 + RETENTION_MS + 999)  # the key of T0 is forgotten, T0 + 1000 is reachable
    assert backfilled(driver, T0 + 1_000, T0 + 2_000) == [T0 + 1_000]  # fires once, now
    assert [job.key for job in driver.state.table].count(f"s@{T0 + 1_000}") == 1


def test_a_trigger_that_replaces_a_run_never_shares_a_key_with_the_buffered_fire() -> None:
    """trigger-key-taken-by-a-buffered-fire, fixed: under replace a trigger drops the fire a
    buffer_one policy left waiting, and takes its key after cancelling the run it replaces."""
    driver = Driver(now_ms=T0)
    driver.put_schedule("s", cron="0 0 1 1 *", overlap="buffer_one")
    driver.tick()
    driver.ok(TriggerSchedule(driver.request_id(), "s"))  # job 1 runs
    driver.ok(TriggerSchedule(driver.request_id(), "s"))  # a manual fire waits behind it
    driver.put_schedule("s", cron="0 0 1 1 *", overlap="replace")  # the fire still waits
    assert driver.ok(TriggerSchedule(driver.request_id(), "s")) == {"job_id": 2, "buffered": False}
    assert [(job.key, job.status) for job in driver.state.table] == [
        ("s@manual-1", j.CANCELLED), ("s@manual-2", j.QUEUED)
    ]


@pytest.mark.parametrize("key", ["s@1800000001000", "s@manual-2", "other.name:x-1@-5"])
def test_a_client_key_of_the_fire_key_shape_is_refused(key: str) -> None:
    """client-key-shadows-fire-key, fixed: one key table holds both, so a client key shaped
    like `<schedule>@<time>` or `<schedule>@manual-<id>` is refused instead of swallowing a
    nominal fire or a trigger."""
    with pytest.raises(Invalid) as invalid:
        JobSpec.parse({"task": "t", "key": key})
    assert invalid.value.field == "key" and "reserved" in str(invalid.value)
    with pytest.raises(Invalid) as invalid:
        WorkflowSpec.parse({"key": key, "jobs": [{"name": "a", "task": "t"}]})
    assert invalid.value.field == "key"


@pytest.mark.parametrize("key", ["s@manual", "s@2026-11-30", "user@example.com", "@5", "a@b@5"])
def test_a_client_key_merely_containing_an_at_sign_is_accepted(key: str) -> None:
    assert JobSpec.parse({"task": "t", "key": key}).key == key


def test_a_nominal_fire_and_a_trigger_run_beside_client_keys() -> None:
    driver = Driver(now_ms=T0)
    driver.put_schedule("s", every="1s")
    driver.tick()
    driver.submit(key="s@manual")  # job 1
    driver.tick(advance_ms=1_000)  # job 2: the fire at T0 + 1 s
    value: dict[str, Any] = driver.ok(TriggerSchedule(driver.request_id(), "s"))
    assert value == {"job_id": 3, "buffered": False}
    assert [job.key for job in driver.state.table] == ["s@manual", f"s@{T0 + 1_000}", "s@manual-3"]


def test_claims_right_after_a_leader_change_lease_from_the_new_leaders_time() -> None:
    """lease-from-stale-time, fixed in cluster/clock/ticker.py: [BeginLeadership, Tick] is one
    entry, so a claim after it counts its lease from the new leader's clock (tier 1 checks the
    log)."""
    driver = Driver(now_ms=T0)
    driver.submit()
    driver.apply(BeginLeadership(T0 + 60_000, "n2", 2))  # the old leader's last Tick was T0
    driver.apply(Tick(T0 + 60_000, "n2"))
    driver.ok(ClaimJobs(driver.request_id(), "w1", ("default",), 1, 5_000, ()))
    driver.apply(Tick(T0 + 60_100, "n2"))
    assert driver.job(1).status == j.RUNNING and driver.job(1).lease_until_ms == T0 + 65_000


def test_a_backfill_of_a_buffered_time_fires_it_once() -> None:
    """backfill-of-a-buffered-time, found by the model with flow control's rules (and there in
    the release before them): a buffer_one schedule kept a time waiting behind its active run, a
    backfill fired that time meanwhile, and the buffered fire went off again when the run ended,
    days later, after the time's key had been forgotten: two jobs for one nominal time."""
    driver = Driver(now_ms=T0)
    driver.put_schedule("s", every="1s", overlap="buffer_one")
    driver.tick()
    driver.tick(advance_ms=1_000)  # T0 + 1 s fires: job 1 runs (is active)
    driver.tick(advance_ms=1_000)  # T0 + 2 s waits behind it
    assert driver.state.schedules["s"].buffered == (T0 + 2_000, 0)
    assert backfilled(driver, T0 + 1_500, T0 + 2_500) == [T0 + 2_000]  # job 2
    assert driver.state.schedules["s"].buffered is None
    driver.ok(CancelJob(driver.request_id(), 2, None))
    driver.ok(PauseSchedule(driver.request_id(), "s"))
    driver.tick(advance_ms=8 * limits.DAY_MS)  # job 2 and the key of T0 + 2 s are forgotten
    driver.ok(CancelJob(driver.request_id(), 1, None))  # the active run ends
    assert [job.key for job in driver.state.table].count(f"s@{T0 + 2_000}") == 0
