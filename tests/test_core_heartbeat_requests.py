"""Heartbeats and the request-id table (scheduler/requests.py `dedupe_id`): once the cluster is
finalized, a heartbeat without a progress report takes no entry, so running jobs by the
thousands no longer fill the table; its repeat is applied again, which extends the lease or
tells the worker its lease has gone. Before finalize the previous release's rule holds (every
heartbeat remembered), so a mixed cluster reaches one state; a heartbeat carrying a report stays
remembered."""

from __future__ import annotations

from raftcron.scheduler import limits
from raftcron.scheduler.commands import ClaimJobs, Heartbeat, SubmitJobs, Tick
from raftcron.scheduler.errors import Ok, Rejected
from raftcron.scheduler.gate import Finalize
from raftcron.scheduler.progress import ProgressReport
from raftcron.scheduler.requests import RequestLog
from raftcron.scheduler.specs import JobSpec
from raftcron.scheduler.state import SchedulerState

T0 = 1_800_000_000_000
LEASE_MS = 30_000


def started(*, finalized: bool, requests: RequestLog | None = None) -> SchedulerState:
    state = SchedulerState()
    if requests is not None:
        state.requests = requests
    state.apply(Tick(T0))
    if finalized:
        assert isinstance(state.apply(Finalize(None)), Ok)
    return state


def running(state: SchedulerState, count: int = 1, tag: str = "") -> dict[int, int]:
    """`count` jobs submitted and claimed: {job id: token}."""
    submitted = state.apply(SubmitJobs(f"s{tag}", tuple(JobSpec(task="long")
                                                        for _ in range(count))))
    assert isinstance(submitted, Ok), submitted
    claimed = state.apply(ClaimJobs(f"c{tag}", "w1", ("default",), count, LEASE_MS))
    assert isinstance(claimed, Ok) and len(claimed.value["jobs"]) == count, claimed
    return {job_id: token for job_id, token in claimed.value["jobs"]}


def test_a_finalized_cluster_keeps_no_entry_for_a_plain_heartbeat():
    state = started(finalized=True)
    [(job_id, token)] = running(state).items()
    entries = len(state.requests)
    assert state.apply(Heartbeat("hb-1", job_id, token)) == Ok(
        {"lease_until_ms": T0 + LEASE_MS})
    assert len(state.requests) == entries and state.requests.get("hb-1") is None


def test_a_repeated_plain_heartbeat_extends_the_lease_again_from_now():
    state = started(finalized=True)
    [(job_id, token)] = running(state).items()
    state.apply(Heartbeat("hb-1", job_id, token))
    state.apply(Tick(T0 + 5_000))
    assert state.apply(Heartbeat("hb-1", job_id, token)) == Ok(
        {"lease_until_ms": T0 + 5_000 + LEASE_MS})


def test_a_plain_heartbeat_repeated_after_its_lease_went_to_another_attempt_is_refused():
    """The repeat tells the worker the truth: remembered, it answered the first Ok, a lease
    that no longer holds."""
    state = started(finalized=True)
    [(job_id, token)] = running(state).items()
    assert isinstance(state.apply(Heartbeat("hb-1", job_id, token)), Ok)
    state.apply(Tick(T0 + LEASE_MS + 1))  # the lease runs out: a retry, after its backoff
    retry_at_ms = state.table.live(job_id).run_at_ms
    assert retry_at_ms - T0 < limits.REQUEST_RETRY_MS  # well within the table's window
    state.apply(Tick(retry_at_ms))
    again = state.apply(ClaimJobs("c2", "w2", ("default",), 1, LEASE_MS))
    assert isinstance(again, Ok) and again.value["jobs"][0][0] == job_id
    repeat = state.apply(Heartbeat("hb-1", job_id, token))
    assert isinstance(repeat, Rejected) and repeat.http_status == 409


def test_before_finalize_every_heartbeat_is_remembered_as_the_previous_release_does():
    state = started(finalized=False)
    [(job_id, token)] = running(state).items()
    first = state.apply(Heartbeat("hb-1", job_id, token))
    assert state.requests.get("hb-1") is not None
    state.apply(Tick(T0 + 5_000))
    assert state.apply(Heartbeat("hb-1", job_id, token)) == first  # answered from the table


def test_a_heartbeat_with_a_progress_report_stays_remembered():
    """Applied again late, an older report would replace a newer one."""
    state = started(finalized=True)
    [(job_id, token)] = running(state).items()
    report = ProgressReport.parse({"value": 0.5})
    first = state.apply(Heartbeat("hb-1", job_id, token, progress=report))
    assert isinstance(first, Ok) and state.requests.get("hb-1") is not None
    state.apply(Tick(T0 + 5_000))
    assert state.apply(Heartbeat("hb-1", job_id, token, progress=report)) == first


def test_running_jobs_beating_for_the_retry_window_leave_room_for_new_requests():
    """The scale defect, shrunk: 2,000 running jobs beating every 10 s into a table of 256 KiB.
    Each beat took about 200 bytes for the retry window, so the table filled within minutes and
    refused every new request busy, the beats themselves included; the leases then ran out."""
    state = started(finalized=True,
                    requests=RequestLog(bytes_max=64 << 10, hard_bytes_max=256 << 10))
    leases = {}
    for batch in range(4):
        leases.update(running(state, 500, tag=str(batch)))
    entries = len(state.requests)
    beat = 0
    for second in range(1, limits.REQUEST_RETRY_MS // 1_000 + 1):
        state.apply(Tick(T0 + second * 1_000))
        for job_id, token in list(leases.items())[second % 10::10]:
            beat += 1
            answer = state.apply(Heartbeat(f"hb-{beat}-0123456789abcdef", job_id, token))
            assert isinstance(answer, Ok), (second, answer)
    assert beat == 2_000 * limits.REQUEST_RETRY_MS // 10_000
    assert len(state.requests) == entries and not state.requests.full()
    assert isinstance(state.apply(SubmitJobs("after", (JobSpec(task="t"),))), Ok)
