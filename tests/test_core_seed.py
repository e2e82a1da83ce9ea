"""The seed's own scenario (../shared/seed) replayed on the core.

The seed drained 200 jobs with 4 threads over SQLite, every tenth job failing its first try, and
replayed a crash on a fake clock. The same story here runs on the replicated state machine:
claims are Raft commands, the owner check is a fencing token, the effect table is keyed by the
job's idempotency key.
"""

from raftcron.scheduler.commands import CompleteJob
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.errors import Rejected
from raftcron.scheduler.jobs import unpack
from raftcron.scheduler.snapshot import snapshot

SECOND = 1_000


def test_four_workers_drain_200_jobs_with_every_tenth_failing_once():
    d = Driver()
    backoff = {"initial_ms": 10, "factor": 2, "max_ms": 1_000, "jitter": 0}
    ids = [d.submit(key=f"report-{i}", backoff=backoff) for i in range(1, 201)]
    claims: list[tuple[int, int]] = []  # (job, attempt) as the seed's claims table
    effects: dict[str, str] = {}  # key -> worker, INSERT OR IGNORE
    workers = [f"w{i}" for i in range(4)]
    for _ in range(1_000):  # bounded; ends when every job succeeded
        if d.state.table.count_by_status["succeeded"] == 200:
            break
        progressed = False
        for worker in workers:
            got = d.claim(worker)
            if not got:
                continue
            progressed = True
            [(job_id, token)] = got
            job = d.job(job_id)
            claims.append((job_id, job.attempts))
            if job_id % 10 == 0 and job.attempts == 1:
                d.fail(job_id, token, "transient")
                continue
            effects.setdefault(job.key, worker)
            d.complete(job_id, token)
        if not progressed:
            d.tick(advance_ms=20)  # the fake clock moves only when nobody can work
    assert len(claims) == 220
    assert len(claims) - len(set(claims)) == 0  # no (job, attempt) claimed twice
    assert sum(1 for job_id in ids if d.job(job_id).attempts == 2) == 20
    assert len(effects) == 200 and set(effects) == {f"report-{i}" for i in range(1, 201)}


def test_a_crashed_worker_loses_its_lease_and_its_late_completion_is_rejected():
    d = Driver(now_ms=100 * SECOND)
    job_id = d.submit(key="invoice-42", backoff={"initial_ms": 0, "jitter": 0})
    effects: dict[str, str] = {}

    [(_, token_a)] = d.claim("A", lease_ms=2 * SECOND)  # t=100
    d.tick(101 * SECOND)
    assert d.heartbeat(job_id, token_a)["lease_until_ms"] == 103 * SECOND
    effects.setdefault("invoice-42", "A")  # A did the work, then died before acking

    d.tick(102 * SECOND)
    assert d.claim("B", lease_ms=2 * SECOND) == []  # the heartbeat holds the lease to 103
    d.tick(104 * SECOND)
    [(claimed, token_b)] = d.claim("B", lease_ms=2 * SECOND)
    assert claimed == job_id and token_b > token_a and d.job(job_id).attempts == 2
    effects.setdefault("invoice-42", "B")  # the duplicate effect is ignored by its key

    before = snapshot(d.state)
    late = d.apply(CompleteJob(None, job_id, token_a, "A's result"))
    assert isinstance(late, Rejected) and late.code == "stale_token"
    assert snapshot(d.state) == before  # the stale completion changed nothing

    d.complete(job_id, token_b, "B's result")
    job = d.job(job_id)
    assert (job.status, unpack(job.result)) == ("succeeded", "B's result")
    assert effects == {"invoice-42": "A"}
    assert [a.outcome for a in job.history] == ["lease_expired", "succeeded"]
