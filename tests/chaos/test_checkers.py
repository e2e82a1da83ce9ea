"""Every checker of the chaos suite can fail: a good history passes it, a bad one does not.

Each test starts from `good_run()` (a small, consistent run: two schedules firing on time,
one outage longer than the grace handled exactly by each policy, submits, a diamond workflow,
a stale actor refused, a worker killed and its job re-run, equal digests) and breaks one thing.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from raftcron.chaos.tier2 import checkers
from raftcron.chaos.tier2.checkers import RunData

BASE = 1_800_000_000_000  # a multiple of every period
GRACE = 8_000
SCHEDULES = {"every2-once": [2, "fire_once"], "every3-all": [3, "fire_all"],
             "every5-skip": [5, "skip"]}
DOWN, UP = BASE + 30_500, BASE + 50_200  # the outage, in the harness's clock
FIRST_TICK_AFTER = BASE + 51_000


class Builder:
    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []
        self.jobs: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.sink: list[dict[str, Any]] = []
        self.next_id = 1
        self.seq = 0
        self.token = 0

    def event(self, kind: str, t: int, **fields: Any) -> None:
        self.history.append({"t": t, "kind": kind, **fields})

    def cluster_event(self, kind: str, time_ms: int, **fields: Any) -> None:
        self.seq += 1
        self.events.append({"seq": self.seq, "time_ms": time_ms, "kind": kind, **fields})

    def job(self, *, key: str, at: int, status: str = "succeeded", tokens: int = 1,
            worker: str = "w1", **fields: Any) -> dict[str, Any]:
        job_id = self.next_id
        self.next_id += 1
        effect_key = key or f"job-{job_id}"  # what the chaos worker uses for a job without key
        history = []
        for number in range(tokens):
            self.token += 1
            start = at + 100 + 1000 * number
            last = number == tokens - 1
            outcome = status if last and status in ("succeeded", "failed") else "lease_expired"
            history.append({"attempt": number + 1, "token": self.token, "worker": worker,
                            "start_ms": start, "end_ms": start + 200, "outcome": outcome})
            self.sink.append(self.row(job_id, effect_key, self.token, worker, "start", start))
            if outcome == "succeeded":
                self.sink.append(
                    self.row(job_id, effect_key, self.token, worker, "applied", start + 150)
                )
        job = {"id": job_id, "key": key, "task": "chaos.effect", "status": status,
               "created_ms": at, "finished_ms": at + 100 + 1000 * tokens if history else None,
               "schedule": None, "fire_time_ms": None, "workflow_id": None,
               "history": history if status != "cancelled" else [], **fields}
        self.jobs.append(job)
        return job

    def row(
        self, job_id: int, key: str, token: int, worker: str, phase: str, t: int
    ) -> dict[str, Any]:
        return {"seq": len(self.sink) + 1, "job_id": job_id, "key": key, "token": token,
                "attempt": 1, "worker": worker, "phase": phase, "t_ms": t}

    def fire(self, name: str, fire_ms: int, tick_ms: int) -> None:
        job = self.job(key=f"{name}@{fire_ms}", at=tick_ms, schedule=name, fire_time_ms=fire_ms)
        self.cluster_event("fired", tick_ms, schedule=name, fire_time_ms=fire_ms, job=job["id"])


def good_run() -> RunData:
    b = Builder()
    b.event("run", BASE, seed=1)
    counters = {}
    for name, (period_s, policy) in SCHEDULES.items():
        period = period_s * 1000
        times = checkers.nominal_times(period, BASE, BASE + 30_000)
        for fire_ms in times:
            b.fire(name, fire_ms, fire_ms + 40)
        # the outage: nothing ticks in (DOWN, UP); the first tick after it decides by policy
        due = checkers.nominal_times(period, times[-1] + 40, FIRST_TICK_AFTER)
        fire, late, skipped = checkers.expected_plan(due, FIRST_TICK_AFTER, GRACE, policy, 100)
        b.cluster_event("misfired", FIRST_TICK_AFTER, schedule=name, missed=late,
                        fired=len(fire), policy=policy)
        for fire_ms in fire:
            b.fire(name, fire_ms, FIRST_TICK_AFTER)
        for fire_ms in checkers.nominal_times(period, FIRST_TICK_AFTER, BASE + 70_000):
            b.fire(name, fire_ms, fire_ms + 40)
        counters[name] = (late, skipped)
    b.event("fault", DOWN - 10, phase="start", id="f1", fault="downtime",
            targets=["n1", "n2", "n3"], leader="n1")
    b.event("downtime", DOWN, phase="down", id="f1")
    b.event("downtime", UP, phase="up", id="f1")
    b.event("fault", UP, phase="end", id="f1", fault="downtime", targets=["n1", "n2", "n3"])
    # submits: k-1 acknowledged, retried with the same key
    submitted = b.job(key="k-1", at=BASE + 1_000)
    b.event("submit", BASE + 990, op="invoke", key="k-1", retry=False)
    b.event("submit", BASE + 1_000, op="ok", key="k-1", retry=False, job_id=submitted["id"],
            created=True)
    b.event("submit", BASE + 2_000, op="ok", key="k-1", retry=True, job_id=submitted["id"],
            created=False)
    # a diamond A -> {B, C} -> D, in order; and one whose A failed for good
    ids = {}
    for offset, name in enumerate("ABCD"):
        at = BASE + 3_000 + {"A": 0, "B": 2_000, "C": 2_000, "D": 4_000}[name]
        ids[name] = b.job(key=None, at=at, workflow_id="wf1")["id"]  # type: ignore[arg-type]
        del offset
    b.event("workflow", BASE + 3_000, op="ok", key="wf-1", fails=False, jobs=ids,
            edges={"B": ["A"], "C": ["A"], "D": ["B", "C"]})
    failed = {"A": b.job(key=None, at=BASE + 4_000, status="failed", workflow_id="wf2")["id"]}  # type: ignore[arg-type]
    for name in "BCD":
        failed[name] = b.job(key=None, at=BASE + 4_000, status="cancelled", tokens=0,  # type: ignore[arg-type]
                             workflow_id="wf2")["id"]
    b.event("workflow", BASE + 4_000, op="ok", key="wf-2", fails=True, jobs=failed,
            edges={"B": ["A"], "C": ["A"], "D": ["B", "C"]})
    # a worker killed while holding a job: re-run 6 s later under a newer token
    rerun = b.job(key="k-2", at=BASE + 60_000, tokens=2, worker="w2")
    b.event("submit", BASE + 60_000, op="ok", key="k-2", retry=False, job_id=rerun["id"],
            created=True)
    kill_at = rerun["history"][0]["start_ms"] + 50
    for row in b.sink:
        if row["job_id"] == rerun["id"] and row["token"] == rerun["history"][1]["token"]:
            row["t_ms"] = kill_at + 6_000
            row["worker"] = "w1"
    b.sink.sort(key=lambda r: r["t_ms"])
    b.event("fault", kill_at, phase="start", id="f2", fault="worker_kill", targets=["w2"])
    b.event("fault", kill_at + 2_000, phase="end", id="f2", fault="worker_kill", targets=["w2"])
    # the stale actor: an old token refused
    b.event("stale", BASE + 62_000, op="fail", job_id=rerun["id"],
            token=rerun["history"][0]["token"], newest_token=rerun["history"][1]["token"],
            action="complete", status=409)
    # the monitor's readings of state time: behind the harness's clock, and one ahead of it
    # within the bound (a Tick a little ahead of the reading's moment is allowed)
    for t in range(BASE, DOWN, 2_000):
        b.event("state_time", t, node="n1", now_ms=t - 150)
    b.event("state_time", UP + 2_000, node="n2", now_ms=UP + 2_000 + 400)
    b.event("phase", BASE + 75_000, name="healed")
    b.event("sample", BASE + 75_500, node="n1", role="leader", term=3, has_quorum=True)
    b.event("phase", BASE + 80_000, name="drained", remaining=0, elapsed_ms=5_000)
    schedules = [{"name": n, "misfires": counters[n][0], "misfire_skipped": counters[n][1],
                  "created_ms": BASE} for n in SCHEDULES]
    return RunData(
        history=sorted(b.history, key=lambda e: e["t"]),
        jobs={"n1": b.jobs, "n2": copy.deepcopy(b.jobs), "n3": copy.deepcopy(b.jobs)},
        schedules=schedules,
        cluster_events=b.events,
        digests={"n1": [900, "abc"], "n2": [900, "abc"], "n3": [900, "abc"]},
        sink=b.sink,
        settings={"schedules": SCHEDULES, "grace_ms": GRACE, "horizon_ms": BASE + 68_000,
                  "nodes": 3, "rerun_bound_s": 10, "leader_bound_s": 5, "drain_bound_s": 60},
    )


def violations(run: RunData, checker: Any) -> list[str]:
    return checker(run).violations


def fresh(run: RunData) -> RunData:
    run._by_id = None
    return run


def test_a_good_history_passes_every_checker() -> None:
    for result in checkers.check_all(good_run()):
        assert result.ok, (result.name, result.violations)


def test_the_good_history_exercises_each_policy_after_the_outage() -> None:
    run = good_run()
    misfires = [e for e in run.cluster_events if e["kind"] == "misfired"]
    assert {e["schedule"]: (e["missed"] > 0, e["fired"]) for e in misfires} == {
        "every2-once": (True, 1),
        "every3-all": (True, 7),
        "every5-skip": (True, 2),  # the times still within the grace
    }


# -- 1. exactly-once firing ----------------------------------------------------------------


def _fired_job(run: RunData, name: str) -> dict[str, Any]:
    return next(j for j in run.jobs["n1"] if j["schedule"] == name)


def test_a_duplicate_fire_fails_exactly_once() -> None:
    run = good_run()
    original = _fired_job(run, "every2-once")
    twin = {**copy.deepcopy(original), "id": 999, "key": original["key"] + "x"}
    run.jobs["n2"].append(twin)
    found = violations(fresh(run), checkers.check_fires)
    assert any("duplicate fire" in v for v in found)
    assert checkers.check_fires(run).counts["duplicated"] == 1


def test_a_duplicate_seen_only_by_the_sink_fails_exactly_once() -> None:
    run = good_run()
    original = _fired_job(run, "every5-skip")
    run.sink.append({"seq": 10_000, "job_id": 4242, "key": original["key"], "token": 77,
                     "attempt": 1, "worker": "w3", "phase": "start", "t_ms": BASE + 90_000})
    assert any("duplicate fire" in v for v in violations(run, checkers.check_fires))


def test_a_fire_at_a_time_that_is_not_nominal_fails() -> None:
    run = good_run()
    _fired_job(run, "every3-all")["fire_time_ms"] += 1
    assert any("not a nominal time" in v for v in violations(fresh(run), checkers.check_fires))


def test_a_missed_fire_fails() -> None:
    run = good_run()
    victim = next(e for e in run.cluster_events if e["kind"] == "fired"
                  and e["schedule"] == "every2-once" and e["fire_time_ms"] == BASE + 10_000)
    run.cluster_events.remove(victim)
    for node in run.jobs:
        run.jobs[node] = [j for j in run.jobs[node] if j["id"] != victim["job"]]
    run.sink = [r for r in run.sink if r["job_id"] != victim["job"]]
    found = violations(fresh(run), checkers.check_fires)
    assert any("fired [] " in v or "missed fire" in v for v in found)


def test_fire_once_that_fires_every_missed_time_after_an_outage_fails() -> None:
    run = good_run()
    misfire = next(e for e in run.cluster_events if e["kind"] == "misfired"
                   and e["schedule"] == "every2-once")
    extra_time = BASE + 40_000  # missed during the outage: fire_once must not fire it
    run.cluster_events.append({"seq": misfire["seq"], "time_ms": FIRST_TICK_AFTER,
                               "kind": "fired", "schedule": "every2-once",
                               "fire_time_ms": extra_time, "job": 5000})
    found = violations(run, checkers.check_fires)
    assert any("expected" in v for v in found)


def test_skip_that_fires_a_late_time_fails() -> None:
    run = good_run()
    misfire = next(e for e in run.cluster_events if e["kind"] == "misfired"
                   and e["schedule"] == "every5-skip")
    run.cluster_events.append({"seq": misfire["seq"], "time_ms": FIRST_TICK_AFTER,
                               "kind": "fired", "schedule": "every5-skip",
                               "fire_time_ms": BASE + 35_000, "job": 5001})
    assert violations(run, checkers.check_fires)


def test_a_misfire_event_with_the_wrong_count_fails() -> None:
    run = good_run()
    misfire = next(e for e in run.cluster_events if e["kind"] == "misfired"
                   and e["schedule"] == "every3-all")
    misfire["missed"] += 1
    assert any("misfire at" in v for v in violations(run, checkers.check_fires))


def test_a_wrong_misfire_counter_fails() -> None:
    run = good_run()
    run.schedules[0]["misfire_skipped"] += 1
    assert any("misfire_skipped counter" in v for v in violations(run, checkers.check_fires))


def test_a_misfire_with_no_fault_to_explain_it_fails() -> None:
    run = good_run()
    run.history = [e for e in run.history if e["kind"] != "fault"]
    assert any("no fault to explain" in v for v in violations(run, checkers.check_fires))


def test_a_tick_while_every_node_was_down_fails() -> None:
    run = good_run()
    for event in run.cluster_events:
        if event["time_ms"] == FIRST_TICK_AFTER:
            event["time_ms"] = UP - 5_000
    assert any("while every node was down" in v for v in violations(run, checkers.check_fires))


def test_a_late_fire_outside_a_fault_window_fails() -> None:
    run = good_run()
    job = next(j for j in run.jobs["n1"] if j["schedule"] == "every2-once"
               and j["fire_time_ms"] == BASE + 4_000)
    job["created_ms"] = job["fire_time_ms"] + 5_000
    assert any("late fire" in v for v in violations(fresh(run), checkers.check_fires))


# -- 2. no lost job, 3. idempotent submit --------------------------------------------------


def test_an_acknowledged_job_missing_on_one_node_fails() -> None:
    run = good_run()
    acked = next(e["job_id"] for e in run.history if e["kind"] == "submit" and e["op"] == "ok")
    run.jobs["n3"] = [j for j in run.jobs["n3"] if j["id"] != acked]
    assert any("lost" in v for v in violations(fresh(run), checkers.check_lost))


def test_an_acknowledged_job_never_final_fails() -> None:
    run = good_run()
    run.jobs["n2"][-1]["status"] = "queued"
    assert any("still queued" in v for v in violations(fresh(run), checkers.check_lost))


def test_a_lost_workflow_job_fails() -> None:
    run = good_run()
    workflow = next(e for e in run.history if e["kind"] == "workflow")
    run.jobs["n1"] = [j for j in run.jobs["n1"] if j["id"] != workflow["jobs"]["D"]]
    assert any("wf-1/D" in v for v in violations(fresh(run), checkers.check_lost))


def test_one_key_acknowledged_as_two_jobs_fails() -> None:
    run = good_run()
    run.history.append({"t": BASE + 3_000, "kind": "submit", "op": "ok", "key": "k-1",
                        "retry": True, "job_id": 777, "created": True})
    found = violations(run, checkers.check_idempotent)
    assert any("different jobs" in v for v in found)
    assert any("answered as a new job" in v for v in found)


def test_a_node_holding_two_jobs_with_one_key_fails() -> None:
    run = good_run()
    twin = {**copy.deepcopy(next(j for j in run.jobs["n1"] if j["key"] == "k-1")), "id": 888}
    run.jobs["n1"].append(twin)
    assert any("jobs with key" in v for v in violations(fresh(run), checkers.check_idempotent))


# -- a state budget: refusals and evictions (CHAOS.md wave 3) -----------------------------


def _remove_job(run: RunData, job_id: int) -> None:
    """The job leaves every node (evicted), as a budget would make it."""
    for node in run.jobs:
        run.jobs[node] = [j for j in run.jobs[node] if j["id"] != job_id]
    fresh(run)


def _evictions(run: RunData, count: int) -> RunData:
    run.settings["usage"] = {"evicted": {"budget": count}, "fires_refused": 0}
    return run


def _acked_id(run: RunData, key: str) -> int:
    return next(int(e["job_id"]) for e in run.history
                if e["kind"] == "submit" and e.get("op") == "ok" and e["key"] == key)


def test_an_acknowledged_job_evicted_once_seen_final_is_not_lost() -> None:
    run = _evictions(good_run(), 3)
    job_id = _acked_id(run, "k-1")
    _remove_job(run, job_id)
    run.history.append({"t": BASE + 5_000, "kind": "final", "job_id": job_id,
                        "status": "succeeded", "source": "observer"})
    result = checkers.check_lost(run)
    assert result.ok, result.violations
    assert result.counts["evicted_acknowledged"] == 1 and result.counts["evictions"] == 3


def test_an_acknowledged_job_absent_and_never_seen_final_is_lost_despite_evictions() -> None:
    run = _evictions(good_run(), 3)
    _remove_job(run, _acked_id(run, "k-1"))
    found = violations(run, checkers.check_lost)
    assert any("lost: submit k-1" in v and "never seen final" in v for v in found)
    assert checkers.check_lost(run).counts["lost"] == 3  # on each of the three nodes


def test_without_evictions_an_absent_job_is_lost_whatever_the_evidence() -> None:
    run = good_run()  # no usage collected: the rule before budgets
    job_id = _acked_id(run, "k-1")
    _remove_job(run, job_id)
    run.history.append({"t": BASE + 5_000, "kind": "final", "job_id": job_id,
                        "status": "succeeded", "source": "observer"})
    assert any("lost: submit k-1" in v for v in violations(run, checkers.check_lost))
    assert any("lost: submit k-1" in v
               for v in violations(_evictions(run, 0), checkers.check_lost))


def test_more_absent_final_jobs_than_evictions_counted_fail() -> None:
    run = _evictions(good_run(), 1)
    for key in ("k-1", "k-2"):
        job_id = _acked_id(run, key)
        _remove_job(run, job_id)
        run.history.append({"t": BASE + 90_000, "kind": "final", "job_id": job_id,
                            "status": "succeeded", "source": "ack"})
    found = violations(run, checkers.check_lost)
    assert any("2 acknowledged jobs absent once final" in v and "only 1 evictions" in v
               for v in found)


def test_a_worker_s_accepted_ack_a_dead_letter_and_a_failed_parent_are_evidence() -> None:
    run = _evictions(good_run(), 10)
    submitted = _acked_id(run, "k-1")
    failed = next(e for e in run.history if e["kind"] == "workflow" and e["key"] == "wf-2")
    run.sink.append({"seq": 99_999, "job_id": submitted, "key": "k-1", "token": 1,
                     "attempt": 1, "worker": "w1", "phase": "acked_succeeded",
                     "t_ms": BASE + 1_500})
    run.cluster_events.append({"seq": 10_000, "time_ms": BASE + 4_500,
                               "kind": "dead_lettered", "job": failed["jobs"]["A"]})
    for job_id in (submitted, *failed["jobs"].values()):
        _remove_job(run, job_id)
    result = checkers.check_lost(run)
    assert result.ok, result.violations
    assert result.counts["evicted_acknowledged"] == 5
    run.cluster_events.pop()  # without the dead letter, nothing says the workflow ended
    found = violations(fresh(run), checkers.check_lost)
    assert {v.split(" (")[0] for v in found if "never seen final" in v} == {
        f"lost: workflow wf-2/{name}" for name in "ABCD"}


def test_a_worker_s_retryable_failure_is_no_evidence_of_an_end() -> None:
    run = _evictions(good_run(), 3)
    job_id = _acked_id(run, "k-1")
    _remove_job(run, job_id)
    run.sink.append({"seq": 99_999, "job_id": job_id, "key": "k-1", "token": 1,
                     "attempt": 1, "worker": "w1", "phase": "failed", "t_ms": BASE + 1_500})
    assert any("never seen final" in v for v in violations(run, checkers.check_lost))


# -- the archive: evicted jobs read back (DESIGN.md §9.2, CHAOS.md wave 3) ---------------


def _archiving(run: RunData, *, archived: tuple[str, ...] = ("k-1", "k-2")) -> RunData:
    """Every member keeps an archive, the scenario evicts, and the jobs of the `archived`
    keys are read back from every node's archive (evictions counted for them)."""
    run.settings.update(archive=True, evicting=True)
    _evictions(run, len(archived))
    for jobs in run.jobs.values():
        for job in jobs:
            if job["key"] in archived:
                job["archived"] = True
    return fresh(run)


def test_acknowledged_jobs_read_back_from_every_archive_pass_and_are_counted() -> None:
    result = checkers.check_lost(_archiving(good_run()))
    assert result.ok, result.violations
    assert result.counts["archived_acknowledged"] == 2 and result.counts["lost"] == 0


def test_an_acknowledged_job_missing_from_live_and_archive_fails_despite_its_evidence() -> None:
    run = _archiving(good_run())
    job_id = _acked_id(run, "k-1")
    run.jobs["n3"] = [j for j in run.jobs["n3"] if j["id"] != job_id]  # in no archive of n3
    run.history.append({"t": BASE + 5_000, "kind": "final", "job_id": job_id,
                        "status": "succeeded", "source": "observer"})
    result = checkers.check_lost(fresh(run))
    assert result.violations == [f"lost: submit k-1 (job {job_id}) acknowledged, absent on n3, "
                                 "live and archived"]
    assert result.counts["lost"] == 1


def test_a_node_that_installed_a_snapshot_and_lacks_a_job_has_lost_it() -> None:
    """It fills what it skipped from a peer, and the final read waits for that: a job it still
    lacks is lost, even when another node holds it."""
    run = _archiving(good_run())
    job_id = _acked_id(run, "k-1")
    run.jobs["n3"] = [j for j in run.jobs["n3"] if j["id"] != job_id]
    run.settings["snapshots_installed"] = {"n3": 1}
    result = checkers.check_lost(fresh(run))
    assert result.counts["lost"] == 1, result.violations
    assert result.violations == [f"lost: submit k-1 (job {job_id}) acknowledged, absent on n3, "
                                 "live and archived"]


def test_an_archived_job_in_another_status_than_the_run_saw_fails() -> None:
    run = _archiving(good_run())
    job_id = _acked_id(run, "k-1")
    run.sink.append({"seq": 99_999, "job_id": job_id, "key": "k-1", "token": 1, "attempt": 1,
                     "worker": "w1", "phase": "acked_succeeded", "t_ms": BASE + 1_500})
    assert checkers.check_lost(run).ok
    next(j for j in run.jobs["n2"] if j["id"] == job_id)["status"] = "failed"
    found = violations(fresh(run), checkers.check_lost)
    assert found == [f"submit k-1 (job {job_id}) ended succeeded as the run saw it, failed on "
                     "n2 (archived)"]


def test_a_scenario_that_evicts_and_reads_nothing_back_from_an_archive_fails() -> None:
    run = _archiving(good_run(), archived=())
    assert any("nothing was read back from its archive" in v
               for v in violations(run, checkers.check_lost))
    run.settings["evicting"] = False  # a scenario that keeps every job: nothing to read back
    assert checkers.check_lost(run).ok


def _refused(run: RunData, kind: str, key: str) -> RunData:
    run.history += [{"t": BASE + 20_000, "kind": kind, "op": "invoke", "key": key},
                    {"t": BASE + 20_100, "kind": kind, "op": "fail", "key": key,
                     "status": 507, "error": "state_full"}]
    return run


def test_a_refused_submit_that_created_nothing_passes_and_is_counted() -> None:
    run = _refused(_refused(good_run(), "submit", "k-9"), "workflow", "wf-9")
    result = checkers.check_lost(run)
    assert result.ok, result.violations
    assert result.counts["refused"] == 2 and result.counts["refused_created"] == 0


def test_a_refused_submit_that_created_a_job_fails() -> None:
    run = _refused(good_run(), "submit", "k-9")
    ghost = {**copy.deepcopy(next(j for j in run.jobs["n1"] if j["key"] == "k-1")),
             "id": 4_444, "key": "k-9"}
    run.jobs["n2"].append(ghost)
    found = violations(fresh(run), checkers.check_lost)
    assert any("refused submit created a job: 'k-9' was answered 507, job 4444" in v
               for v in found)


def test_a_refused_workflow_that_created_its_jobs_fails() -> None:
    run = _refused(good_run(), "workflow", "wf-9")
    root = {**copy.deepcopy(_workflow_job(run, "wf-1", "A")), "id": 4_445, "key": "wf-9",
            "workflow_id": "wf9"}
    run.jobs["n1"].append(root)
    assert any("'wf-9' was answered 507" in v
               for v in violations(fresh(run), checkers.check_lost))


def test_a_refused_retry_of_an_acknowledged_key_is_judged_by_idempotency() -> None:
    run = _refused(good_run(), "submit", "k-1")  # k-1 was acknowledged: its job may hold it
    assert checkers.check_lost(run).ok


def test_an_evicted_job_of_a_worker_that_died_is_not_judged_for_re_runs() -> None:
    run = _evictions(good_run(), 3)
    job = _rerun_job(run)
    _remove_job(run, job["id"])
    run.sink = [r for r in run.sink
                if not (r["job_id"] == job["id"] and r["token"] == job["history"][1]["token"])]
    assert any("never claimed again" in v for v in violations(run, checkers.check_rerun))
    run.history.append({"t": BASE + 70_000, "kind": "final", "job_id": job["id"],
                        "status": "succeeded", "source": "observer"})
    assert checkers.check_rerun(fresh(run)).ok


def _refused_fire_run(*, keep_job: bool = False) -> RunData:
    run = good_run()
    name, fire_ms = "every2-once", BASE + 10_000
    event = next(e for e in run.cluster_events if e["kind"] == "fired"
                 and e["schedule"] == name and e["fire_time_ms"] == fire_ms)
    seq, time_ms, job_id = event["seq"], event["time_ms"], int(event["job"])
    run.cluster_events[run.cluster_events.index(event)] = {
        "seq": seq, "time_ms": time_ms, "kind": "misfired", "schedule": name, "missed": 1,
        "fired": 0, "policy": "fire_once", "reason": "state_full", "fire_time_ms": fire_ms}
    if not keep_job:
        _remove_job(run, job_id)
        run.sink = [r for r in run.sink if r["job_id"] != job_id]
    next(v for v in run.schedules if v["name"] == name)["misfires_state_full"] = 1
    return run


def test_a_time_refused_for_space_has_no_job_and_is_not_a_missed_fire() -> None:
    result = checkers.check_fires(_refused_fire_run())
    assert result.ok, result.violations
    assert result.counts["refused"] == 1 and result.counts["missed"] == 0


def test_a_time_refused_for_space_that_has_a_job_fails() -> None:
    found = violations(_refused_fire_run(keep_job=True), checkers.check_fires)
    assert any("every2-once@1800000010000 was refused for space but has job(s)" in v
               for v in found)


def test_a_time_both_fired_and_refused_by_one_tick_fails() -> None:
    run = good_run()
    fired = next(e for e in run.cluster_events if e["kind"] == "fired"
                 and e["schedule"] == "every3-all" and e["fire_time_ms"] == BASE + 9_000)
    run.cluster_events.append({"seq": fired["seq"], "time_ms": fired["time_ms"],
                               "kind": "misfired", "schedule": "every3-all", "missed": 1,
                               "fired": 0, "policy": "fire_all", "reason": "state_full",
                               "fire_time_ms": BASE + 9_000})
    next(v for v in run.schedules if v["name"] == "every3-all")["misfires_state_full"] = 1
    found = violations(run, checkers.check_fires)
    assert any("every3-all@1800000009000 both fired and refused" in v for v in found)
    assert any("refused for space but has job(s)" in v for v in found)


def test_two_jobs_for_a_time_refused_for_space_are_still_a_duplicate() -> None:
    run = _refused_fire_run()
    original = _fired_job(run, "every2-once")
    for job_id in (998, 999):
        run.jobs["n2"].append({**copy.deepcopy(original), "id": job_id,
                               "key": f"every2-once@{BASE + 10_000}",
                               "fire_time_ms": BASE + 10_000})
    result = checkers.check_fires(fresh(run))
    assert result.counts["duplicated"] == 1
    assert any("duplicate fire: every2-once@1800000010000" in v for v in result.violations)


def test_a_misfires_state_full_counter_that_disagrees_with_the_log_fails() -> None:
    run = _refused_fire_run()
    next(v for v in run.schedules if v["name"] == "every2-once")["misfires_state_full"] = 0
    assert any("misfires_state_full counter 0, expected 1" in v
               for v in violations(run, checkers.check_fires))


# -- 4. fenced completion and effects ------------------------------------------------------


def test_a_stale_completion_accepted_fails() -> None:
    run = good_run()
    stale = next(e for e in run.history if e["kind"] == "stale")
    stale["op"] = "ok"
    result = checkers.check_fencing(run)
    assert any("stale complete accepted" in v for v in result.violations)
    assert result.counts["stale_accepted"] == 1


def test_two_accepted_completions_of_one_job_fail() -> None:
    run = good_run()
    job = next(j for j in run.jobs["n1"] if j["key"] == "k-2")
    job["history"][0]["outcome"] = "succeeded"
    assert any("completed 2 times" in v for v in violations(fresh(run), checkers.check_fencing))


def test_a_completion_with_an_old_token_fails() -> None:
    run = good_run()
    job = next(j for j in run.jobs["n1"] if j["key"] == "k-2")
    job["history"][0]["outcome"], job["history"][1]["outcome"] = "succeeded", "lease_expired"
    assert any("newest is" in v for v in violations(fresh(run), checkers.check_fencing))


def test_an_effect_applied_twice_fails() -> None:
    run = good_run()
    applied = next(r for r in run.sink if r["phase"] == "applied")
    run.sink.append({**applied, "seq": 99_999, "token": applied["token"] + 1000})
    assert any("applied 2 times" in v for v in violations(run, checkers.check_fencing))


def test_a_sink_that_accepts_an_older_token_fails() -> None:
    run = good_run()
    job = next(j for j in run.jobs["n1"] if j["key"] == "k-2")
    old = job["history"][0]["token"]
    run.sink.append({"seq": 99_999, "job_id": job["id"], "key": "k-2", "token": old,
                     "attempt": 1, "worker": "w2", "phase": "duplicate", "t_ms": BASE + 99_000})
    assert any("after seeing" in v for v in violations(run, checkers.check_fencing))


def test_an_execution_under_a_token_no_committed_claim_gave_fails() -> None:
    run = good_run()
    job = next(j for j in run.jobs["n1"] if j["key"] == "k-1")
    run.sink.append({"seq": 99_999, "job_id": job["id"], "key": "k-1", "token": 4_000,
                     "attempt": 2, "worker": "w3", "phase": "start", "t_ms": BASE + 99_000})
    assert any("no committed claim" in v for v in violations(run, checkers.check_fencing))


def test_a_completed_job_without_its_effect_fails() -> None:
    run = good_run()
    run.sink = [r for r in run.sink if not (r["key"] == "k-1" and r["phase"] == "applied")]
    assert any("without an applied effect" in v for v in violations(run, checkers.check_fencing))


# -- 5. lease re-run bound -----------------------------------------------------------------


def test_a_job_re_run_too_late_after_its_worker_died_fails() -> None:
    run = good_run()
    job = next(j for j in run.jobs["n1"] if j["key"] == "k-2")
    for row in run.sink:
        if row["job_id"] == job["id"] and row["token"] == job["history"][1]["token"]:
            row["t_ms"] += 9_000
    result = checkers.check_rerun(run)
    assert any("re-run" in v for v in result.violations)
    assert result.counts["worst_rerun_ms"] == 15_000


def _rerun_job(run: RunData) -> dict[str, Any]:
    return next(j for j in run.jobs["n1"] if j["key"] == "k-2")


def test_a_leader_change_restarts_the_re_run_clock() -> None:
    run = good_run()
    job = _rerun_job(run)
    kill_at = job["history"][0]["start_ms"] + 50
    for row in run.sink:
        if row["job_id"] == job["id"] and row["token"] == job["history"][1]["token"]:
            row["t_ms"] = kill_at + 14_000  # late from the kill...
    run.cluster_events.append({"seq": 10_000, "time_ms": kill_at + 8_000,
                               "kind": "leader_changed", "node": "n2", "term": 9})
    result = checkers.check_rerun(fresh(run))
    assert result.ok  # ...but 6 s after the last leader change, which extended the lease
    assert result.counts["worst_rerun_ms"] == 14_000
    for row in run.sink:
        if row["job_id"] == job["id"] and row["token"] == job["history"][1]["token"]:
            row["t_ms"] = kill_at + 19_000  # 11 s after the last leader change: too late
    assert not checkers.check_rerun(fresh(run)).ok


def test_a_fault_on_the_worker_that_claimed_the_job_again_restarts_the_re_run_clock() -> None:
    """The 120-minute run's case: the killed worker, restarted, claimed the job again 5 s
    after the kill and was paused before it started it; a third worker ran it after that
    lease too, 10.1 s after the kill, 5.2 s after the pause."""
    run = good_run()
    job = _rerun_job(run)
    first, last = job["history"]
    kill_at = first["start_ms"] + 50
    middle = {**first, "attempt": 2, "token": last["token"], "worker": "w2",
              "start_ms": kill_at + 5_000, "end_ms": kill_at + 10_000,
              "outcome": "lease_expired"}
    last = {**last, "attempt": 3, "token": last["token"] + 1}
    for node in run.jobs.values():
        for j in node:
            if j["id"] == job["id"]:
                j["history"] = [first, middle, last]
    for row in run.sink:
        if row["job_id"] == job["id"] and row["token"] == middle["token"]:
            row["token"], row["t_ms"] = last["token"], kill_at + 10_100
    assert not checkers.check_rerun(fresh(run)).ok  # from the kill alone: 10.1 s
    run.history.append({"kind": "fault", "t": kill_at + 4_990, "phase": "start", "id": "f-p",
                        "fault": "worker_pause", "targets": ["w2"]})
    run.history.append({"kind": "fault", "t": kill_at + 11_000, "phase": "end", "id": "f-p",
                        "fault": "worker_pause", "targets": ["w2"]})
    result = checkers.check_rerun(fresh(run))
    assert result.ok, result.violations  # 5.1 s after the pause of the worker holding it
    assert result.counts["worst_after_last_leader_change_ms"] == 5_110
    for row in run.sink:
        if row["job_id"] == job["id"] and row["token"] == last["token"]:
            row["t_ms"] = kill_at + 16_000  # 11 s after that pause: too late still
    assert not checkers.check_rerun(fresh(run)).ok


def test_a_job_never_claimed_again_after_its_worker_died_fails() -> None:
    run = good_run()
    job = next(j for j in run.jobs["n1"] if j["key"] == "k-2")
    run.sink = [r for r in run.sink
                if not (r["job_id"] == job["id"] and r["token"] == job["history"][1]["token"])]
    for node in run.jobs.values():
        for j in node:
            if j["id"] == job["id"]:
                j["status"], j["history"] = "running", j["history"][:1]
    assert any("never claimed again" in v for v in violations(fresh(run), checkers.check_rerun))


# -- 6. DAG order --------------------------------------------------------------------------


def _workflow_job(run: RunData, key: str, name: str) -> dict[str, Any]:
    workflow = next(e for e in run.history if e["kind"] == "workflow" and e["key"] == key)
    return next(j for j in run.jobs["n1"] if j["id"] == workflow["jobs"][name])


def test_a_child_claimed_before_its_parent_completed_fails() -> None:
    run = good_run()
    child = _workflow_job(run, "wf-1", "D")
    child["history"][0]["start_ms"] = _workflow_job(run, "wf-1", "B")["finished_ms"] - 500
    assert any("before its parent completed" in v for v in violations(run, checkers.check_dag))


def test_a_child_started_before_its_parent_ran_fails() -> None:
    run = good_run()
    child = _workflow_job(run, "wf-1", "B")
    for row in run.sink:
        if row["job_id"] == child["id"] and row["phase"] == "start":
            row["t_ms"] = BASE
    assert any("before the parent" in v for v in violations(run, checkers.check_dag))


def test_a_child_of_a_failed_parent_that_ran_fails() -> None:
    run = good_run()
    child = _workflow_job(run, "wf-2", "C")
    run.sink.append({"seq": 99_999, "job_id": child["id"], "key": None, "token": 500,
                     "attempt": 1, "worker": "w1", "phase": "start", "t_ms": BASE + 9_000})
    assert any("ended failed" in v for v in violations(run, checkers.check_dag))


# -- 7. convergence, 8. liveness -----------------------------------------------------------


def test_replicas_that_differ_fail_convergence() -> None:
    run = good_run()
    run.digests["n2"] = [900, "abd"]
    assert violations(run, checkers.check_convergence)


def test_a_node_missing_from_the_final_audit_fails_convergence() -> None:
    run = good_run()
    del run.digests["n3"]
    assert violations(run, checkers.check_convergence)


def test_a_raft_alarm_in_a_node_log_fails_convergence() -> None:
    run = good_run()
    assert violations(run, checkers.check_convergence) == []
    run.settings["raft_alarms"] = ["n2: CRITICAL truncating already-applied entries 41..44"]
    assert any("Raft alarm" in v for v in violations(run, checkers.check_convergence))


def test_raft_alarms_are_read_from_every_node_log(tmp_path) -> None:
    from raftcron.chaos.tier2.scenarios import _raft_alarms

    for node, text in [("n1", "ok\n"), ("n2", "x\n[pysyncobj] truncating already-applied 7\n")]:
        (tmp_path / node).mkdir()
        (tmp_path / node / f"{node}.log").write_text(text)
    assert _raft_alarms(tmp_path) == ["n2: [pysyncobj] truncating already-applied 7"]


def test_a_state_time_ahead_of_the_majority_s_clocks_fails() -> None:
    run = good_run()
    assert violations(run, checkers.check_state_time) == []
    assert checkers.check_state_time(run).counts["worst_ahead_ms"] == 400
    run.history.append({"t": UP + 4_000, "kind": "state_time", "node": "n3",
                        "now_ms": UP + 4_000 + 10 * 86_400_000})  # a leader 10 days ahead ticked
    [violation] = violations(run, checkers.check_state_time)
    assert "n3's state time" in violation and "864000000 ms ahead" in violation
    run.history[-1]["now_ms"] = UP + 4_000 + 1_001  # just past max_skew_ms
    assert violations(run, checkers.check_state_time)


def test_no_leader_after_the_final_heal_fails_liveness() -> None:
    run = good_run()
    run.history = [e for e in run.history if e["kind"] != "sample"]
    assert any("no leader" in v for v in violations(run, checkers.check_liveness))


def test_jobs_not_drained_within_the_bound_fail_liveness() -> None:
    run = good_run()
    drained = next(e for e in run.history if e.get("name") == "drained")
    drained["remaining"] = 3
    assert any("not final" in v for v in violations(run, checkers.check_liveness))


def test_a_node_that_exited_by_itself_fails_liveness() -> None:
    run = good_run()
    run.history.append({"t": BASE + 70_000, "kind": "note", "crash": True, "text": "n2 died"})
    assert any("exited by itself" in v for v in violations(run, checkers.check_liveness))


@pytest.mark.parametrize("checker", checkers.CHECKERS, ids=lambda c: c.__name__)
def test_every_checker_reports_counts(checker: Any) -> None:
    assert checker(good_run()).counts


def test_an_outage_before_a_schedule_first_fired_is_judged_from_its_creation() -> None:
    run = good_run()
    for view in run.schedules:
        view["created_ms"] = BASE + 19_500  # as if created 11 s before the outage
    name = "every2-once"
    keep = [e for e in run.cluster_events
            if not (e.get("schedule") == name and e["time_ms"] < BASE + 20_000)]
    for seq, event in enumerate(keep, start=1):
        event["seq"] = seq
    run.cluster_events = keep
    for node in run.jobs:
        run.jobs[node] = [j for j in run.jobs[node]
                          if not (j["schedule"] == name and j["created_ms"] < BASE + 20_000)]
    run.sink = [r for r in run.sink if not str(r["key"]).startswith(f"{name}@")
                or int(str(r["key"]).split("@")[1]) > BASE + 20_000]
    run.schedules = [v for v in run.schedules if v["name"] == name]
    run.settings = {**run.settings, "schedules": {name: SCHEDULES[name]}}
    assert checkers.check_fires(fresh(run)).ok
    run.schedules[0]["created_ms"] = BASE + 29_000  # then the first tick owes fewer times
    assert not checkers.check_fires(fresh(run)).ok


def test_a_time_that_passed_before_a_new_schedule_first_ticked_is_not_owed() -> None:
    run = good_run()
    name = "every2-once"
    for view in run.schedules:
        view["created_ms"] = BASE + 1_990  # 2 000 may pass before the first tick (2 040)
    assert checkers.check_fires(fresh(run)).ok
    first = next(e for e in run.cluster_events if e.get("schedule") == name)
    run.cluster_events.remove(first)  # its job stays: a fire no decision in the log made
    for seq, event in enumerate(run.cluster_events, start=1):
        event["seq"] = seq
    found = violations(fresh(run), checkers.check_fires)
    assert any("no decision in the log fired it" in v for v in found)


def _with_storage_faults(*records: dict[str, Any]) -> RunData:
    run = good_run()
    for offset, record in enumerate(records):
        run.history.append({"t": BASE + 70_000 + offset, "kind": "storage_fault", **record})
    return run


def test_kills_mid_snapshot_whose_writer_died_and_refused_damage_pass_the_storage_checker() -> None:
    run = _with_storage_faults(
        {"id": "f8", "fault": "kill_main", "writer_seen": True, "writer_outlived": False},
        {"id": "f9", "fault": "term_group", "writer_seen": True, "writer_outlived": False},
        {"id": "f10", "fault": "damage", "how": "flip_segment", "file": "log-00000001.seg",
         "exit_code": 65, "named": True},
    )
    result = checkers.check_storage(run)
    assert result.ok, result.violations
    assert result.counts["refused"] == 1 and result.counts["writer_seen"] == 2


def test_a_snapshot_writer_that_outlived_its_node_fails_the_storage_checker() -> None:
    run = _with_storage_faults(
        {"id": "f8", "fault": "kill_main", "writer_seen": True, "writer_outlived": True})
    assert any("outlived" in v for v in violations(run, checkers.check_storage))


@pytest.mark.parametrize("exit_code, named", [(0, True), (None, True), (65, False)])
def test_a_damaged_data_dir_that_was_not_refused_fails_the_storage_checker(
        exit_code: int | None, named: bool) -> None:
    run = _with_storage_faults(
        {"id": "f10", "fault": "damage", "how": "delete_snapshot", "file": "snapshot",
         "exit_code": exit_code, "named": named})
    assert any("damage delete_snapshot of snapshot" in v
               for v in violations(run, checkers.check_storage))


def _with_power_cuts(*records: dict[str, Any]) -> RunData:
    run = good_run()
    for offset, record in enumerate(records):
        run.history.append({"t": BASE + 70_000 + offset, **record})
    return run


POWER_CUT = {"kind": "power_cut", "id": "f11", "fault": "power_all", "node": "n1",
             "dirty_files": 1, "dirty_bytes": 4096, "dirty_dirs": 0,
             "torn_writes": [{"path": "log-00000001.seg", "offset": 9, "bytes": 256,
                              "kept_bytes": 212}]}


def test_power_cuts_after_which_the_node_came_back_pass_and_are_counted() -> None:
    run = _with_power_cuts(POWER_CUT, {"kind": "power_restart", "id": "f11", "node": "n1",
                                       "came_back": True, "exit_code": None})
    result = checkers.check_storage(run)
    assert result.ok, result.violations
    assert result.counts["power_cuts"] == 1 and result.counts["torn_writes"] == 1
    assert result.counts["dropped_bytes"] == 4096 and result.counts["came_back"] == 1


def test_a_node_that_refused_to_start_after_a_power_cut_fails_the_storage_checker() -> None:
    run = _with_power_cuts(POWER_CUT, {"kind": "power_restart", "id": "f11", "node": "n1",
                                       "came_back": False, "exit_code": 65,
                                       "log_tail": "log-00000001.seg: damaged"})
    assert any("did not come back after a power cut (exit 65)" in v
               for v in violations(run, checkers.check_storage))


# -- membership and leaders (chaos/tier2/checkers/membership.py) -------------------------------


def _with_members(*records: dict[str, Any], leaders: list[dict[str, Any]] | None = None,
                  final: dict[str, Any] | None = None) -> RunData:
    run = good_run()
    for offset, record in enumerate(records):
        run.history.append({"t": BASE + 70_000 + 100 * offset, "kind": "member", **record})
    run.settings["leaders"] = leaders or [
        {"node": "n1", "term": 1, "t": BASE}, {"node": "n2", "term": 2, "t": BASE + 1}]
    run.settings["members_final"] = final
    return run


MEMBERS_VIEW = {"members": [{"node_id": n, "state": "voter"} for n in ("n1", "n2", "n3")],
                "voters": ["n1", "n2", "n3"], "change": None}
A_GOOD_CHANGE = (
    {"op": "begin", "action": "add", "node": "n4", "status": 202, "change_id": 1},
    {"op": "conflict", "action": "add", "node": "n4", "status": 409,
     "code": "membership_change_in_progress", "first": 1, "first_ended": None},
    {"op": "end", "action": "add", "node": "n4", "outcome": "done", "reason": ""},
    {"op": "begin", "action": "remove", "node": "n4", "status": 202, "change_id": 2},
    {"op": "conflict", "action": "remove", "node": "n4", "status": 202, "code": None,
     "first": 2, "first_ended": True},
    {"op": "end", "action": "remove", "node": "n4", "outcome": "done", "reason": ""},
)


def test_changes_one_at_a_time_and_one_leader_per_term_pass_the_membership_checker() -> None:
    final = {"expected": ["n1", "n2", "n3"], "views": dict.fromkeys(("n1", "n2", "n3"),
                                                                    MEMBERS_VIEW)}
    result = checkers.check_membership(_with_members(*A_GOOD_CHANGE, final=final))
    assert result.ok, result.violations
    assert result.counts["second_refused"] == 1 and result.counts["done"] == 2


def test_two_leaders_in_one_term_fail_the_membership_checker() -> None:
    leaders = [{"node": "n1", "term": 4, "t": BASE}, {"node": "n3", "term": 4, "t": BASE + 5}]
    assert any("term 4 had 2 leaders" in v for v in violations(
        _with_members(leaders=leaders), checkers.check_membership))


@pytest.mark.parametrize("status, code, first_ended", [
    (202, None, False), (201, None, None), (409, "member_exists", None), (400, "invalid", None)])
def test_a_second_change_that_was_not_refused_fails_the_membership_checker(
        status: int, code: str | None, first_ended: bool | None) -> None:
    probe = {"op": "conflict", "action": "add", "node": "n4", "status": status, "code": code,
             "first": 1, "first_ended": first_ended}
    assert violations(_with_members(A_GOOD_CHANGE[0], probe), checkers.check_membership)


def test_a_removed_node_that_leads_again_fails_the_membership_checker() -> None:
    run = _with_members(*A_GOOD_CHANGE)
    removed_at = BASE + 70_000 + 500
    run.settings["leaders"].append({"node": "n4", "term": 9, "t": removed_at + 2_000})
    assert any("n4 became leader in term 9 after its removal" in v
               for v in violations(run, checkers.check_membership))


def test_a_change_that_never_ended_or_members_that_disagree_fail_the_membership_checker(
) -> None:
    unended = _with_members(A_GOOD_CHANGE[0], {"op": "end", "action": "add", "node": "n4",
                                                "outcome": None, "reason": None})
    assert any("did not end" in v for v in violations(unended, checkers.check_membership))
    stale = {**MEMBERS_VIEW, "voters": ["n1", "n2", "n3", "n4"]}
    final = {"expected": ["n1", "n2", "n3"], "views": {"n1": MEMBERS_VIEW, "n2": stale}}
    assert any("n2 ends with members" in v for v in violations(
        _with_members(final=final), checkers.check_membership))
