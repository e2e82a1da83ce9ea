"""Schedules in the pure core: firing once per time, misfire and overlap policies, controls."""

import pytest

from raftcron.scheduler import limits
from raftcron.scheduler.commands import (
    BackfillSchedule,
    DeleteSchedule,
    PauseSchedule,
    ResumeSchedule,
    TriggerSchedule,
)
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.errors import Invalid, Rejected
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.jobs import unpack
from raftcron.scheduler.schedulespec import ScheduleSpec

T0 = 1_800_000_000_000  # a whole minute: 2027-01-15T08:00:00Z


def fired(d, name):
    """(fire_time_ms, key) of every job the schedule created, in creation order."""
    return [(job.fire_time_ms, job.key) for job in d.state.table if job.schedule == name]


def start(**fields):
    d = Driver(now_ms=T0)
    d.put_schedule("s", **fields)
    d.tick(T0)  # a schedule starts at the Tick after it was created
    return d


def test_an_every_schedule_fires_each_time_once_with_its_key():
    d = start(every="1s")
    for step in range(1, 6):
        d.tick(T0 + step * 1_000)
    assert fired(d, "s") == [(T0 + k * 1_000, f"s@{T0 + k * 1_000}") for k in range(1, 6)]
    d.tick(T0 + 5_000)  # a repeated tick fires nothing more
    assert len(fired(d, "s")) == 5
    assert violations(d.state) == []


def test_a_fire_creates_a_job_from_the_template():
    d = start(
        every="10s",
        job={"task": "report", "queue": "reports", "payload": {"x": 1}, "max_attempts": 7},
    )
    d.tick(T0 + 10_000)
    [job] = [job for job in d.state.table if job.schedule == "s"]
    assert (job.task, job.queue, unpack(job.payload), job.max_attempts, job.status) == (
        "report",
        "reports",
        {"x": 1},
        7,
        "queued",
    )


def test_a_cron_schedule_fires_on_its_minutes():
    d = start(cron="*/15 * * * *")
    d.tick(T0 + 3_600_000)  # one hour in one tick: within the grace? no -> a misfire policy
    assert d.state.schedules["s"].misfires == 3
    d2 = start(cron="*/15 * * * *")
    for minute in range(1, 61):
        d2.tick(T0 + minute * 60_000)
    assert [t for t, _ in fired(d2, "s")] == [T0 + m * 60_000 for m in (15, 30, 45, 60)]


def test_jitter_delays_the_run_but_not_the_fire_time():
    d = start(every="1m", jitter_ms=30_000)
    d.tick(T0 + 60_000)
    [job] = [job for job in d.state.table if job.schedule == "s"]
    assert job.fire_time_ms == T0 + 60_000
    assert T0 + 60_000 <= job.run_at_ms <= T0 + 90_000


def outage(policy, *, grace_ms=5_000, down_ms=20_500, **fields):
    """Every-2s schedule, fired up to T0+10s, then nothing applied for `down_ms`."""
    d = start(every="2s", misfire=policy, misfire_grace_ms=grace_ms, **fields)
    for step in range(1, 11):
        d.tick(T0 + step * 1_000)
    d.tick(T0 + 10_000 + down_ms)
    return d


def test_fire_once_runs_the_latest_missed_time_once():
    d = outage("fire_once")
    times = [t for t, _ in fired(d, "s")]
    assert times[:5] == [T0 + k * 2_000 for k in range(1, 6)]
    assert times[5:] == [T0 + 30_000]  # due: 12..30 s (10 times), late: 12..24 s (7)
    s = d.state.schedules["s"]
    assert (s.misfires, s.misfire_skipped) == (7, 9)


def test_fire_all_runs_every_missed_time_newest_first_capped():
    d = outage("fire_all", max_catchup=4)
    times = [t for t, _ in fired(d, "s")][5:]
    assert times == [T0 + k * 2_000 for k in (12, 13, 14, 15)]  # the newest 4 of 10, in order
    assert d.state.schedules["s"].misfire_skipped == 6


def test_fire_all_without_cap_pressure_runs_them_all():
    d = outage("fire_all")
    assert [t for t, _ in fired(d, "s")][5:] == [T0 + k * 2_000 for k in range(6, 16)]


def test_skip_runs_only_the_times_still_within_the_grace():
    d = outage("skip")
    assert [t for t, _ in fired(d, "s")][5:] == [T0 + k * 2_000 for k in (13, 14, 15)]  # >= 25.5 s
    s = d.state.schedules["s"]
    assert (s.misfires, s.misfire_skipped) == (7, 7)


def test_a_late_tick_within_the_grace_is_not_a_misfire():
    d = start(every="1s")
    d.tick(T0 + 3_000)
    assert len(fired(d, "s")) == 3 and d.state.schedules["s"].misfires == 0


def test_a_very_long_outage_is_counted_exactly_and_fires_only_the_newest():
    d = start(every="1s", misfire="fire_all", max_catchup=3)
    d.tick(T0 + 2 * 86_400_000)
    times = [t for t, _ in fired(d, "s")]
    end = T0 + 2 * 86_400_000
    assert times == [end - 2_000, end - 1_000, end]
    s = d.state.schedules["s"]
    # 172,800 times were due; the last 61 (end - 60 s .. end) were within the grace.
    assert (s.misfires, s.misfire_skipped, s.misfires_truncated) == (172_739, 172_797, False)


@pytest.mark.parametrize("cron", ["* * * * * *", "*/2 * * * *"])
def test_a_day_of_cron_misses_is_counted_exactly_across_a_dst_change(cron):
    spring = 1_805_007_600_000  # 2027-03-14T07:00:00Z: New York springs forward (2:00 -> 3:00)
    d = Driver(now_ms=spring - 43_200_000)
    d.put_schedule("s", cron=cron, tz="America/New_York", misfire="skip")
    d.tick(spring - 43_200_000)
    d.tick(spring + 43_200_000)  # a real-time cron counts instants: 2:00-2:59 never shows
    s = d.state.schedules["s"]
    step_s = 1 if cron.startswith("*") and cron.count(" ") == 5 else 120
    due = 86_400 // step_s
    within_grace = 60 // step_s + 1 if step_s == 1 else 1  # times >= now - 60 s
    assert (s.misfires, s.misfires_truncated) == (due - within_grace, False)
    assert len(fired(d, "s")) == within_grace


def test_an_outage_too_dense_to_count_says_its_count_is_a_lower_bound():
    # A fixed-time expression (no '*' or '/') across a DST change can only be listed.
    spring = 1_805_007_600_000
    d = Driver(now_ms=spring - 43_200_000)
    d.put_schedule(
        "s",
        cron="0-59 0-59 0-23 * * *",
        tz="America/New_York",
        misfire="fire_all",
        max_catchup=3,
    )
    d.tick(spring - 43_200_000)
    d.tick(spring + 43_200_000)
    s = d.state.schedules["s"]
    assert s.misfires_truncated and s.misfires >= limits.FIRE_SCAN_MAX
    assert len(fired(d, "s")) == 3


def test_forbid_skips_a_fire_while_the_previous_run_is_active():
    d = start(every="1s", overlap="forbid")
    d.tick(T0 + 1_000)
    [(job_id, token)] = d.claim()
    d.tick(T0 + 2_000)
    assert len(fired(d, "s")) == 1 and d.state.schedules["s"].overlap_skipped == 1
    d.complete(job_id, token)
    d.tick(T0 + 3_000)
    assert len(fired(d, "s")) == 2


def test_replace_cancels_the_active_run():
    d = start(every="1s", overlap="replace")
    d.tick(T0 + 1_000)
    [(job_id, token)] = d.claim()
    d.tick(T0 + 2_000)
    assert (d.job(job_id).status, d.job(job_id).cancel_reason) == ("cancelled", "replaced")
    with pytest.raises(Refused) as refused:
        d.heartbeat(job_id, token)
    assert refused.value.code == "job_cancelled"
    assert len(fired(d, "s")) == 2


def test_buffer_one_keeps_one_fire_waiting_for_the_active_run():
    d = start(every="1s", overlap="buffer_one")
    d.tick(T0 + 1_000)
    [(job_id, token)] = d.claim()
    d.tick(T0 + 2_000)
    d.tick(T0 + 3_000)
    s = d.state.schedules["s"]
    assert len(fired(d, "s")) == 1 and s.buffered == (T0 + 2_000, 0) and s.overlap_skipped == 1
    d.complete(job_id, token)
    assert [t for t, _ in fired(d, "s")] == [T0 + 1_000, T0 + 2_000]
    assert violations(d.state) == []


def test_pause_stops_fires_and_resume_does_not_catch_up():
    d = start(every="1s")
    d.tick(T0 + 1_000)
    d.ok(PauseSchedule(d.request_id(), "s"))
    d.tick(T0 + 5_000)
    assert len(fired(d, "s")) == 1
    d.ok(ResumeSchedule(d.request_id(), "s"))
    d.tick(T0 + 5_500)
    d.tick(T0 + 6_000)
    assert [t for t, _ in fired(d, "s")] == [T0 + 1_000, T0 + 6_000]
    assert d.state.schedules["s"].misfires == 0


def test_trigger_fires_now_and_respects_forbid_unless_forced():
    d = start(every="1h", overlap="forbid")
    value = d.ok(TriggerSchedule(d.request_id(), "s"))
    job = d.job(value["job_id"])
    assert (job.fire_time_ms, job.key) == (T0, "s@manual-1")
    result = d.apply(TriggerSchedule(d.request_id(), "s"))
    assert isinstance(result, Rejected) and result.code == "overlap"
    assert d.ok(TriggerSchedule(d.request_id(), "s", force=True))["job_id"] is not None


def test_backfill_creates_one_job_per_missing_time_and_dedupes_by_key():
    d = start(every="1m")
    d.tick(T0 + 60_000)
    value = d.ok(BackfillSchedule(d.request_id(), "s", T0 - 180_000, T0 + 120_000))
    fires = value["fires"]
    assert [f[0] for f in fires] == [T0 + k * 60_000 for k in (-3, -2, -1, 0, 1)]
    assert [f[2] for f in fires] == [True, True, True, True, False]  # T0+1m had fired already


def test_backfill_of_too_many_times_is_refused():
    d = start(every="1s")
    result = d.apply(BackfillSchedule(d.request_id(), "s", T0 - 3_600_000, T0))
    assert isinstance(result, Rejected) and result.code == "too_large"


def test_a_schedule_may_fire_a_workflow():
    workflow = {"jobs": [{"name": "a", "task": "t"}, {"name": "b", "task": "t", "after": ["a"]}]}
    d = Driver(now_ms=T0)
    d.put_schedule("wf", every="1m", workflow=workflow, job=None)
    d.tick(T0)
    d.tick(T0 + 60_000)
    jobs = [job for job in d.state.table if job.schedule == "wf"]
    assert [(job.workflow_node, job.status) for job in jobs] == [("a", "queued"), ("b", "blocked")]
    assert jobs[0].key == f"wf@{T0 + 60_000}"


def test_a_replaced_schedule_with_the_same_timing_keeps_its_cursor():
    d = start(every="1s")
    d.tick(T0 + 2_000)
    d.put_schedule("s", every="1s", job={"task": "other"})
    d.tick(T0 + 3_000)
    assert [t for t, _ in fired(d, "s")] == [T0 + 1_000, T0 + 2_000, T0 + 3_000]


def test_a_schedule_created_on_a_stale_clock_starts_at_the_next_tick():
    d = Driver(now_ms=T0)
    d.put_schedule("s", every="1s", misfire="fire_all")
    d.tick(T0 + 3_600_000)  # the state's clock was an hour old when the schedule was created
    assert fired(d, "s") == [] and d.state.schedules["s"].misfires == 0


def test_deleting_a_schedule_stops_it():
    d = start(every="1s")
    d.ok(DeleteSchedule(d.request_id(), "s"))
    d.tick(T0 + 5_000)
    assert fired(d, "s") == []
    result = d.apply(DeleteSchedule(None, "s"))
    assert isinstance(result, Rejected) and result.code == "not_found"


def test_retain_caps_the_finished_jobs_kept_per_schedule():
    d = start(every="1s", retain=3)
    for step in range(1, 8):
        d.tick(T0 + step * 1_000)
        [(job_id, token)] = d.claim()
        d.complete(job_id, token)
    assert len(fired(d, "s")) == 3


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"job": {"task": "t"}}, "cron"),
        ({"cron": "* * * * *", "every": "1s", "job": {"task": "t"}}, "cron"),
        ({"cron": "61 * * * *", "job": {"task": "t"}}, "cron"),
        ({"every": "soon", "job": {"task": "t"}}, "every"),
        ({"every": "1s", "tz": "Mars/Olympus", "job": {"task": "t"}}, "tz"),
        ({"every": "1s", "misfire": "panic", "job": {"task": "t"}}, "misfire"),
        ({"every": "1s", "overlap": "sometimes", "job": {"task": "t"}}, "overlap"),
        ({"every": "1s"}, "job"),
        ({"every": "1s", "job": {"task": "t", "key": "k"}}, "job.key"),
        ({"every": "1s", "job": {"task": "t"}, "misfire_grace_ms": 10}, "misfire_grace_ms"),
        (
            {
                "every": "1s",
                "job": {"task": "t"},
                "start_at": "2027-01-01T00:00:00Z",
                "end_at": "2026-01-01T00:00:00Z",
            },
            "end_at",
        ),
    ],
)
def test_invalid_schedules_name_the_field(fields, field):
    with pytest.raises(Invalid) as error:
        ScheduleSpec.parse(fields)
    assert error.value.field == field


def test_a_time_whose_job_retention_removed_is_not_fired_again_by_a_backfill():
    d = start(every="1s", retain=1)
    for step in range(1, 4):
        d.tick(T0 + step * 1_000)
        [(job_id, token)] = d.claim()
        d.complete(job_id, token)
    assert [t for t, _ in fired(d, "s")] == [T0 + 3_000]  # the older two were removed
    value = d.ok(BackfillSchedule(d.request_id(), "s", T0 + 1_000, T0 + 4_000))
    assert [f[2] for f in value["fires"]] == [False, False, False]
    assert [t for t, _ in fired(d, "s")] == [T0 + 3_000]


def test_a_backfill_reaching_back_past_the_retention_is_refused():
    d = start(every="1h")
    d.tick(T0 + 8 * 86_400_000)
    result = d.apply(BackfillSchedule(d.request_id(), "s", T0, T0 + 3_600_000 * 3))
    assert isinstance(result, Rejected) and result.field == "from_ms" and "7 days" in result.message


def test_a_recreated_schedules_trigger_gets_a_key_of_its_own():
    d = start(every="1h")
    first = d.job(d.ok(TriggerSchedule(d.request_id(), "s"))["job_id"])
    d.ok(DeleteSchedule(d.request_id(), "s"))
    d.put_schedule("s", every="1h")
    value = d.ok(TriggerSchedule(d.request_id(), "s"))
    second = d.job(value["job_id"])
    assert value["buffered"] is False and second.key != first.key
    assert {first.key, second.key} == {f"s@manual-{first.id}", f"s@manual-{second.id}"}


def test_switching_buffer_one_to_replace_drops_the_buffered_fire_and_starts_one_run():
    # Found by the core model: the replaced run's end released the buffered trigger, and the
    # replacing trigger then created a second job under the same manual key.
    d = start(every="1h", overlap="buffer_one")
    first = d.ok(TriggerSchedule(d.request_id(), "s"))["job_id"]
    assert d.ok(TriggerSchedule(d.request_id(), "s"))["buffered"] is True
    d.put_schedule("s", every="1h", overlap="replace")
    value = d.ok(TriggerSchedule(d.request_id(), "s"))
    assert d.job(first).cancel_reason == "replaced"
    keys = [key for _, key in fired(d, "s")]
    assert keys == [f"s@manual-{first}", f"s@manual-{value['job_id']}"]
    assert d.state.schedules["s"].buffered is None
    assert violations(d.state) == []


# -- catch-up after downtime is spread over Ticks (DESIGN.md §8.2) --------------------------------

CATCHUP_SCHEDULES = 600


def _after_a_day_down(d: Driver, policy: str) -> None:
    for n in range(CATCHUP_SCHEDULES):
        d.put_schedule(f"s{n}", every="1m", misfire=policy, max_catchup=5)
    d.tick(advance_ms=1_000)  # the schedules start
    d.tick(advance_ms=limits.DAY_MS)  # the whole cluster was down for a day


@pytest.mark.parametrize("policy", ["fire_once", "fire_all", "skip"])
def test_catch_up_after_a_day_down_is_spread_over_ticks_with_exact_counts(policy, monkeypatch):
    """S8 of the wave-2 audit: one Tick did every schedule's catch-up (minutes of apply at
    100k schedules, on every replica at once). Now a Tick does a bounded amount of catch-up
    work; the Ticks after it (time standing still) do the rest, and every schedule's counts
    are the ones a single unbounded Tick gives."""
    spread = Driver()
    _after_a_day_down(spread, policy)
    ticks = 1
    while spread.state.schedule_heap and spread.state.schedule_heap[0][0] <= spread.now_ms:
        spread.tick(advance_ms=0)
        ticks += 1
        assert ticks <= CATCHUP_SCHEDULES
    assert ticks > 1
    whole = Driver()
    monkeypatch.setattr(limits, "CATCHUP_WORK_PER_TICK", 10**9)  # the old single Tick
    _after_a_day_down(whole, policy)
    assert not (whole.state.schedule_heap and whole.state.schedule_heap[0][0] <= whole.now_ms)
    counts = [
        (s.name, s.fires, s.misfires, s.misfire_skipped, s.next_fire_ms)
        for s in spread.state.schedules.values()
    ]
    assert counts == [
        (s.name, s.fires, s.misfires, s.misfire_skipped, s.next_fire_ms)
        for s in whole.state.schedules.values()
    ]
    assert len(spread.state.table) == len(whole.state.table) > 0 or policy == "skip"


@pytest.mark.parametrize("policy", ["fire_once", "fire_all"])
def test_a_tick_does_at_most_its_bound_of_catch_up_work(policy):
    d = Driver()
    _after_a_day_down(d, policy)
    late = [s for s in d.state.schedules.values() if s.misfires]
    work = sum(1 + s.fires for s in late)  # a late schedule costs 1, plus each run it fired
    one_schedule = 1 + 5  # max_catchup=5
    assert limits.CATCHUP_WORK_PER_TICK <= work < limits.CATCHUP_WORK_PER_TICK + one_schedule
    assert 0 < len(late) < CATCHUP_SCHEDULES


def test_the_state_says_when_work_is_next_due():
    d = Driver(now_ms=T0)
    assert d.state.next_due_ms() is None
    d.put_schedule("s", every="1m")
    d.tick(T0 + 1)
    assert d.state.next_due_ms() == T0 + 60_000  # the schedule's next fire
    d.submit(task="later", delay_ms=5_000)
    assert d.state.next_due_ms() == T0 + 1 + 5_000  # the delayed job
    d.submit(task="now")
    assert len(d.claim(lease_ms=2_000)) == 1
    assert d.state.next_due_ms() == T0 + 1 + 2_000  # the lease running out
