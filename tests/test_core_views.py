"""The read seam's queries (scheduler/views.py): what the API shows, as plain data that stays
true after the apply lock is let go."""

import threading

from raftcron.cluster.consensus.replica import StateMachine
from raftcron.scheduler import views
from raftcron.scheduler.driver import Driver


def test_a_claimed_job_is_handed_out_only_while_its_token_holds_the_lease():
    driver = Driver()
    job_id = driver.submit()
    [(_, token)] = driver.claim(lease_ms=1_000)
    [view] = views.claimed_jobs(driver.state, [[job_id, token]])
    assert (view["id"], view["token"]) == (job_id, token)
    driver.tick(advance_ms=2_000)  # the lease ran out: the job is retried after its backoff
    driver.tick(advance_ms=3_600_000)
    [(_, second)] = driver.claim(worker="w2")
    assert second != token
    # A replay of the first claim must not hand the job to its first worker as well.
    assert views.claimed_jobs(driver.state, [[job_id, token]]) == []
    driver.complete(job_id, second)
    assert views.claimed_jobs(driver.state, [[job_id, second]]) == []


def test_a_view_is_a_copy_not_the_record():
    driver = Driver()
    job_id = driver.submit(payload={"n": 1})
    view = views.find_job(driver.state, job_id)
    assert view is not None and view["status"] == "queued" and view["history"] == []
    [(_, token)] = driver.claim()
    driver.complete(job_id, token, {"ok": True})
    assert view["status"] == "queued"  # what was read stays as it was read
    assert views.find_job(driver.state, job_id, history=False)["status"] == "succeeded"
    assert "history" not in views.find_job(driver.state, job_id, history=False)
    assert views.find_job(driver.state, 10_000) is None


def test_created_and_fired_jobs_name_ids_that_are_gone():
    driver = Driver()
    job_id = driver.submit()
    created = views.created_jobs(driver.state, [[job_id, True], [999, False]])
    assert [(v["id"], v["created"]) for v in created] == [(job_id, True), (999, False)]
    assert created[1] == {"id": 999, "created": False}
    fired = views.fired_jobs(driver.state, [[5_000, job_id, True], [6_000, None, False]])
    assert fired[0]["fire_time_ms"] == 5_000 and fired[0]["task"] == "noop"
    assert fired[1] == {"id": None, "fire_time_ms": 6_000, "created": False}


def test_the_events_page_goes_on_from_its_cursor_and_the_tail_is_the_newest():
    driver = Driver()
    for _ in range(3):
        job_id = driver.submit(max_attempts=1)
        [(_, token)] = driver.claim()
        driver.fail(job_id, token, retryable=False)  # a dead letter is an event
    last = driver.state.events.last_seq
    assert last >= 3
    page = views.events_page(driver.state, cursor=0, limit=2, tail=None)
    assert [e["seq"] for e in page["events"]] == [1, 2] and page["next_cursor"] == 2
    rest = views.events_page(driver.state, cursor=page["next_cursor"], limit=100, tail=None)
    assert rest["events"][-1]["seq"] == last
    tail = views.events_page(driver.state, cursor=0, limit=100, tail=1)
    assert [e["seq"] for e in tail["events"]] == [last]
    beyond = views.events_page(driver.state, cursor=last + 50, limit=10, tail=None)
    assert beyond == {"events": [], "next_cursor": last}


def test_schedule_queries():
    driver = Driver()
    driver.put_schedule("b", every="1m")
    driver.put_schedule("a", cron="*/5 * * * *")
    assert [s["name"] for s in views.all_schedules(driver.state)] == ["a", "b"]
    assert views.find_schedule(driver.state, "a")["spec"]["cron"] == "*/5 * * * *"
    assert views.find_schedule(driver.state, "zzz") is None
    assert views.schedule_spec(driver.state, "b") is driver.state.schedules["b"].spec
    assert views.schedule_spec(driver.state, "zzz") is None
    summary = views.summary(driver.state)
    assert summary["schedules"] == 2 and summary["now_ms"] == driver.now_ms


def test_answered_knows_the_request_ids_applied():
    driver = Driver()
    driver.submit()
    assert views.answered(driver.state, "req-1")
    assert not views.answered(driver.state, "req-unknown")


def test_the_replica_runs_a_query_between_two_applied_entries():
    machine = StateMachine()
    seen = []
    started, release = threading.Event(), threading.Event()

    def slow_apply() -> None:
        with machine.lock:  # what apply holds while it runs an entry
            started.set()
            release.wait(5)
            seen.append("applied")

    applier = threading.Thread(target=slow_apply)
    applier.start()
    assert started.wait(5)
    reader = threading.Thread(target=lambda: seen.append(machine.read(views.now_ms)))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive()  # the query waits for the entry being applied
    release.set()
    applier.join(5)
    reader.join(5)
    assert seen == ["applied", 0]
