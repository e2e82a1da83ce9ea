"""The checks of a settled tier-1 run: the replayed log, the replicas, the answers, the probe.

Owns ``replay`` (the committed log folded through a fresh core under
``chaos.model.HistoryChecker`` with the ticker's rules: one job per fire time over the whole
run, triggers' keys new and their answers true, too-old backfills refused, nothing applied
before the first Tick, no lease between a new leader's BeginLeadership and its first Tick,
tokens, fencing, DAG order, time), ``audit`` (every check of a run) and the ``check_*``
functions it calls. They read plain data (requests, states, digests), so that
tests/chaos/test_tier1_sim.py can show each of them failing on a bad history. They never
change the run.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Protocol

from raftcron.chaos.model import HistoryChecker, StepFacts, events_of
from raftcron.chaos.sim.checks import check_replicas
from raftcron.chaos.tier1.faults import Profile
from raftcron.chaos.tier1.requests import Request
from raftcron.chaos.tier1.workload import KEPT, POLL_S
from raftcron.chaos.tier1.world import SimWorld
from raftcron.cluster.consensus.replica import decode_batch
from raftcron.scheduler import codec
from raftcron.scheduler import jobs as j
from raftcron.scheduler.commands import (
    Ack,
    ClaimJobs,
    CompleteJob,
    FailJob,
    Heartbeat,
    SubmitJobs,
    SubmitWorkflow,
)
from raftcron.scheduler.errors import Invalid, Ok, Rejected, Result
from raftcron.scheduler.frozen import readable
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.requests import plain_heartbeat
from raftcron.scheduler.schedules import fire_times_between
from raftcron.scheduler.snapshot import digest
from raftcron.scheduler.state import SchedulerState


class AuditRun(SimWorld, Protocol):
    """What the audit needs of the run beyond the `SimWorld` (the `SeedRun` of chaos.tier1.run
    implements both; this module does not import it)."""

    all_requests: list[Request]


@dataclass
class LeaseProbe:
    """The liveness phase's lease probe: its worker dies holding the job's lease."""

    job_id: int | None = None
    token: int | None = None
    died_s: float | None = None
    rerun_s: float | None = None
    leaders_changed: bool = False
    stall_s: float = 0.0  # how far the state's clock was ahead of the leader's when it died

BACKFILLED = (KEPT,)  # schedules whose times may fire out of order, and whose runs `retain` cuts


@dataclass
class Replay:
    """The committed log folded through a fresh core, under the history checker."""

    state: SchedulerState
    checker: HistoryChecker
    results: dict[bytes, list[Result]]  # frame -> every result it got, in log order
    schedule_of: dict[int, str | None]  # every job ever created -> the schedule that made it


def replay(payloads: Iterator[tuple[int, bytes]]) -> Replay:
    state, checker = SchedulerState(), HistoryChecker(ticker_rules=True)
    results: dict[bytes, list[Result]] = {}
    schedule_of: dict[int, str | None] = {}
    for _index, payload in payloads:
        frames = decode_batch(payload)
        if isinstance(frames, Rejected):
            continue
        for frame in frames:
            try:
                command = codec.decode(frame)
            except Invalid as error:
                results.setdefault(frame, []).append(Rejected.from_invalid(error))
                continue
            facts = StepFacts.capture(state, command)
            result = state.apply(command)
            checker.feed_all(events_of(facts, command, result, state))
            results.setdefault(frame, []).append(result)
            for job_id in range(facts.next_job_id, state.next_job_id):
                job = state.table.get(job_id)
                schedule_of[job_id] = None if job is None else job.schedule
    return Replay(state, checker, results, schedule_of)


def audit(run: AuditRun, folded: Replay) -> list[str]:
    """Every check of a settled run (`folded`: its recorded log replayed); [] is a pass."""
    recorder = run.cluster.recorder
    replicas = {node_id: run.machine.state(node) for node_id, node in run.cluster.nodes.items()}
    problems = run.problems + recorder.problems
    gaps = recorder.gaps()
    if gaps:
        problems.append(f"harness: the recorded log misses indexes {gaps[:10]}")
    problems += [f"history: {problem}" for problem in folded.checker.problems]
    problems += [f"fires: {name} fired an older nominal time after a newer one"
                 for name in folded.checker.out_of_order if name not in BACKFILLED]
    # A plain heartbeat leaves no entry in the table (scheduler/requests.py `dedupe_id`):
    # that its answer came from the log, and the log's fold is every replica's state, is
    # what says it was kept (check_answers, check_digests below).
    ok_keys = [r.request_id for r in run.all_requests if isinstance(r.acknowledged(), Ok)
               and not plain_heartbeat(r.command)]
    report = check_replicas(ok_keys, run.cluster.nodes, run.machine)
    if report.lost or report.divergent:
        problems.append(f"replicas: lost {report.lost[:10]}, divergent {report.divergent}")
    problems += check_digests(digest(folded.state), {k: digest(s) for k, s in replicas.items()})
    problems += check_answers(run.all_requests, folded.results)
    problems += check_fencing(run.all_requests)
    retained = {job_id for job_id, name in folded.schedule_of.items() if name in BACKFILLED}
    for node_id, state in replicas.items():
        problems += [f"{node_id}: invariant: {v}" for v in violations(state)[:5]]
        problems += [f"{node_id}: {p}" for p in check_final_state(
            state, run.all_requests, exempt=BACKFILLED, retained=retained)]
        problems += [f"{node_id}: {p}" for p in check_leases_kept(state, run.all_requests)]
    return problems


def check_leases_kept(state: SchedulerState, requests: list[Request]) -> list[str]:
    """What an acknowledged plain heartbeat promised stands (it leaves no entry in the request
    table to look for): the lease of its attempt ended no earlier than the answer said, or
    still runs at least that long (a job retention took is not looked at)."""
    promised: dict[tuple[int, int], int] = {}
    for request in requests:
        command, answer = request.command, request.acknowledged()
        if plain_heartbeat(command) and isinstance(answer, Ok):
            assert isinstance(command, Heartbeat)
            attempt = (command.job_id, command.token)
            promised[attempt] = max(promised.get(attempt, 0), answer.value["lease_until_ms"])
    problems = []
    for (job_id, token), until_ms in sorted(promised.items()):
        record = state.table.get(job_id)
        if record is None:
            continue
        job = readable(record)
        if job.status == j.RUNNING and job.token == token:
            ends_ms = job.lease_until_ms or 0
        else:
            ended = [a.end_ms for a in job.history if a.token == token
                     and a.outcome == j.OUTCOME_LEASE_EXPIRED]
            if not ended:
                continue  # completed, failed or cancelled: its lease no longer matters
            ends_ms = ended[0] or 0
        if ends_ms < until_ms:
            problems.append(f"lost heartbeat: job {job_id} token {token}'s lease was answered to "
                            f"last until {until_ms} and ends at {ends_ms}")
    return problems


def check_probe(probe: LeaseProbe, profile: Profile, tick_s: float) -> list[str]:
    """A job whose worker died is claimed again within its lease, one tick, one poll and a
    second; plus, if leadership moved meanwhile, the new leader's grace (one lease), the
    clock spread and an election; plus however long the state's clock stood still. And not
    before its lease could have ended: a lease lasts `lease_ms` of the leader's clock, less
    the lag of the state's time behind it (a tick) and a commit."""
    if probe.died_s is None or probe.rerun_s is None:
        return []
    lease_s = profile.lease_ms / 1000
    bound_s = lease_s + probe.stall_s + tick_s + POLL_S + 1.0
    if probe.leaders_changed:
        bound_s += lease_s + profile.clock_spread_ms / 1000
        bound_s += profile.tuning.election_timeout_max_s
    delay_s = probe.rerun_s - probe.died_s
    if delay_s > bound_s:
        return [f"liveness: the probe job re-ran {delay_s:.2f} s after its worker died "
                f"(bound {bound_s:.2f} s)"]
    earliest_s = lease_s - tick_s - 0.2
    if delay_s < earliest_s:
        return [f"lease: the probe job re-ran {delay_s:.2f} s after it was claimed, its lease "
                f"is {lease_s:.2f} s"]
    return []


def check_digests(replayed: str, replicas: dict[str, str]) -> list[str]:
    return [f"{node_id}: digest {value[:12]} is not the replayed log's {replayed[:12]}"
            for node_id, value in replicas.items() if value != replayed]


def check_answers(requests: list[Request], results: dict[bytes, list[Result]]) -> list[str]:
    """Every answer (a `not_ready` too) came from the log; one Ok answer per request id (a
    plain heartbeat's repeat is applied again, scheduler/requests.py `dedupe_id`: its Ok
    answers may differ, but a lease never ends earlier than one answered before); one job per
    idempotency key across all acknowledged submits."""
    problems: list[str] = []
    ok_by_id: dict[str, Ok] = {}
    job_by_key: dict[str, int] = {}
    for request in requests:
        for _at_s, answer in request.answers:
            if answer not in results.get(request.frame, []):
                problems.append(f"acknowledged but not in the log: {request.command} -> {answer}")
            if not isinstance(answer, Ok):
                continue
            first = ok_by_id.setdefault(request.request_id, answer)
            if plain_heartbeat(request.command):
                if answer.value["lease_until_ms"] < first.value["lease_until_ms"]:
                    problems.append(f"{request.request_id}: a lease answered to end at "
                                    f"{first.value['lease_until_ms']} and then earlier, at "
                                    f"{answer.value['lease_until_ms']}")
                ok_by_id[request.request_id] = answer
            elif first != answer:
                problems.append(f"{request.request_id} answered {first} and then {answer}")
            if isinstance(request.command, SubmitJobs):
                for spec, (job_id, _created) in zip(
                    request.command.jobs, answer.value["jobs"], strict=True
                ):
                    if spec.key is not None and job_by_key.setdefault(spec.key, job_id) != job_id:
                        problems.append(f"key {spec.key!r}: jobs {job_by_key[spec.key]} and "
                                        f"{job_id} acknowledged")
    return problems


def _accepted_acks(request: Request) -> list[Ack]:
    """Acks (completions and failures) acknowledged as accepted by this request."""
    answer = request.acknowledged()
    if not isinstance(answer, Ok):
        return []
    command = request.command
    if isinstance(command, CompleteJob):
        return [Ack(command.job_id, command.token, "succeeded")]
    if isinstance(command, FailJob):
        return [Ack(command.job_id, command.token, "failed")]
    if isinstance(command, ClaimJobs):
        outcome = dict((job_id, code) for job_id, code in answer.value["acks"])
        return [ack for ack in command.acks if outcome.get(ack.job_id) == "ok"]
    return []


def check_fencing(requests: list[Request]) -> list[str]:
    """No ack is accepted after a newer token for its job was handed out (real-time order)."""
    issued: list[tuple[float, int, int]] = []  # (answered at, job, token) of every claim
    for request in requests:
        final = request.final_answer()
        if isinstance(request.command, ClaimJobs) and final and isinstance(final[1], Ok):
            issued += [(final[0], job_id, token) for job_id, token in final[1].value["jobs"]]
    problems = []
    for request in requests:
        for ack in _accepted_acks(request):
            newer = [token for at_s, job_id, token in issued
                     if job_id == ack.job_id and token > ack.token and at_s < request.sent_s]
            if newer:
                problems.append(f"stale ack accepted: job {ack.job_id} token {ack.token}, "
                                f"token {newer[0]} was handed out before it was sent")
    return problems


def check_final_state(
    state: SchedulerState, requests: list[Request], *, exempt: Collection[str] = (),
    retained: Collection[int] = (),
) -> list[str]:
    """Acknowledged submits exist, acknowledged acks stand (but on `retained` jobs, which a
    schedule's `retain` may delete), fire times are one job each and every nominal time not
    fired is counted as skipped (but in `exempt` schedules)."""
    problems = []
    for request in requests:
        answer, command = request.acknowledged(), request.command
        if isinstance(answer, Ok) and isinstance(command, SubmitJobs | SubmitWorkflow):
            pairs = answer.value["jobs"]
            ids = [pair[0] if isinstance(command, SubmitJobs) else pair[1] for pair in pairs]
            missing = [job_id for job_id in ids if job_id not in state.table.jobs]
            problems += [f"acknowledged job {job_id} is missing" for job_id in missing]
        for ack in _accepted_acks(request):
            job = state.table.get(ack.job_id)
            if job is None and ack.job_id in retained:
                continue
            attempts = [] if job is None else [a for a in job.history if a.token == ack.token]
            if not attempts or attempts[-1].outcome != ack.outcome:
                problems.append(f"acknowledged {ack.outcome} of job {ack.job_id} with token "
                                f"{ack.token} does not stand")
            elif ack.outcome == "succeeded" and job is not None and job.status != "succeeded":
                problems.append(f"job {ack.job_id} acknowledged succeeded, now {job.status}")
    problems += check_fires(state, exempt=exempt)
    return problems


def check_fires(state: SchedulerState, *, exempt: Collection[str] = ()) -> list[str]:
    problems = []
    fired: dict[str, list[int]] = {}
    keys: dict[str, int] = {}
    for job in state.table:
        if job.key is not None and keys.setdefault(job.key, job.id) != job.id:
            problems.append(f"key {job.key!r} has jobs {keys[job.key]} and {job.id}")
        if job.schedule is not None and job.key == f"{job.schedule}@{job.fire_time_ms}":
            assert job.fire_time_ms is not None
            fired.setdefault(job.schedule, []).append(job.fire_time_ms)
    for name, schedule in state.schedules.items():
        times = sorted(fired.get(name, []))
        if not times or name in exempt:
            continue
        nominal = fire_times_between(schedule.spec, times[0] - 1, schedule.cursor_ms, 100_000)
        unfired = len(set(nominal) - set(times))
        if unfired > schedule.misfire_skipped:
            problems.append(f"{name}: {unfired} nominal times never fired, "
                            f"{schedule.misfire_skipped} counted as skipped")
        if schedule.spec.misfire == "fire_all" and schedule.misfire_skipped and (
            not schedule.misfires_truncated and schedule.spec.max_catchup >= 100
        ):  # no outage here is 100 fire times long: fire_all must have fired every one
            problems.append(f"{name}: fire_all skipped {schedule.misfire_skipped} times")
    return problems
