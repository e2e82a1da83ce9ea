"""One tier-1 seed from start to verdict, and the command line.

Owns ``SeedRun`` (the cluster, the actors and the timeline of one seed: `step` advances everything
by one simulated step), the two phases (safety: faults, clients, dishonest workers; then
liveness: healed, a probe job whose worker dies holding its lease, schedules paused, the store
drained), ``run_seed`` (deterministic: the same seed gives the same trace digest and result)
and ``main`` (``python -m raftcron.chaos.tier1 SEED [COUNT] [--durability fsync|os]``). Clients and
workers start with the cluster, before any leader or Tick: their first requests are refused
``not_ready`` and retried. With a durability the nodes keep their log on raftcron's storage
and the nemesis cuts power too; a node that refuses to start after that is a failure.
"""

from __future__ import annotations

import argparse
import gc
import logging
import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from raftcron.chaos.sim.checks import settle
from raftcron.chaos.sim.cluster import Proposal
from raftcron.chaos.tier1.checks import LeaseProbe, Replay, audit, check_probe, replay
from raftcron.chaos.tier1.clocks import (
    CLOCK_FAULTS_SPREAD_MS,
    SAMPLE_S,
    SimClocks,
    TimeChecker,
    sample,
)
from raftcron.chaos.tier1.faults import Profile, SimNemesis
from raftcron.chaos.tier1.machine import (
    LogRecorder,
    RecordingCluster,
    ReplicaMachine,
    replica_bugs_raise,
)
from raftcron.chaos.tier1.requests import REQUEST_DEADLINE_S, Outbox, Request
from raftcron.chaos.tier1.workload import KEPT, NOMINAL, SimClient, SimTicker, SimWorker
from raftcron.cluster.consensus.replica import encode_batch
from raftcron.cluster.storage.node import DURABILITY_MODES
from raftcron.scheduler import codec
from raftcron.scheduler.commands import Command, PauseSchedule, SubmitJobs
from raftcron.scheduler.errors import Ok, Rejected, Result
from raftcron.scheduler.specs import JobSpec
from raftcron.scheduler.state import SchedulerState

WALL0_MS = 1_800_000_000_000  # every node's wall clock at the start, before its offset


class SeedRun:
    """One seed's cluster, workload and history; `step` advances all of it by one tick."""

    def __init__(self, seed: int, cluster: RecordingCluster, machine: ReplicaMachine,
                 profile: Profile, rng: random.Random) -> None:
        self.seed, self.cluster, self.machine, self.profile, self.rng = (
            seed, cluster, machine, profile, rng)
        self.start_s = cluster.now_s
        offsets = dict(zip(cluster.node_ids, profile.offsets_ms, strict=True))
        # Clock leaps only where the fixed offsets leave a majority of true clocks.
        self.clocks = SimClocks(offsets, faults=profile.clock_spread_ms <= CLOCK_FAULTS_SPREAD_MS,
                                rng=random.Random(f"{seed}/clock"))
        self.time_checker = TimeChecker()
        self.next_sample_s = 0.0
        self.tick_s = profile.tuning.tick_ms / 1000
        self.outbox = Outbox(self)
        self.nemesis = SimNemesis(self, power=machine.durability is not None)
        self.client = SimClient(self)
        self.all_requests: list[Request] = []
        self.tickers = [SimTicker(self, node_id) for node_id in cluster.node_ids]
        self.workers = [
            SimWorker(self, f"w{i}", ("default",), honest=False) for i in range(profile.workers)
        ]
        self.probe = LeaseProbe()
        self.prober = SimWorker(self, "prober", ("probe",), honest=True)
        self.rescuer = SimWorker(self, "rescuer", ("probe",), honest=True)
        self.prober.enabled = self.rescuer.enabled = False
        self.phase = "start"
        self.requests_made = 0
        self.proposals = 0
        self.later: list[tuple[float, int, Callable[[], None]]] = []
        self.scheduled = 0
        self.notes: list[str] = []
        self.problems: list[str] = []  # seen while running (the rest: audit, at the end)
        self.settled = False  # every replica applied the final barrier at the same index

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def now_s(self) -> float:
        return self.cluster.now_s

    def true_ms(self) -> int:
        """What a correct wall clock reads now."""
        return WALL0_MS + round((self.now_s - self.start_s) * 1000)

    def wall_ms(self, node_id: str) -> int:
        return self.true_ms() + self.clocks.offset_ms(node_id, self.now_s)

    def rid(self) -> str:
        self.requests_made += 1
        return f"r{self.requests_made}"

    def note(self, *fields: object) -> None:
        self.notes.append(f"{self.now_s - self.start_s:7.2f} " + " ".join(map(str, fields)))
        self.cluster.trace.record(round(self.now_s * 1e6), "note", *fields)

    def pick_node(self) -> str | None:
        live = sorted(self.cluster.nodes)
        leader = self.cluster.leader()
        if leader is not None and self.rng.random() < 0.7:
            return leader
        return self.rng.choice(live) if live else None

    def propose(self, node_id: str, key: str, payload: bytes) -> Proposal:
        consumer = self.machine.consumer(self.cluster.nodes[node_id])
        return self.cluster.propose(
            node_id, key, lambda node, callback: consumer.apply(payload, callback=callback)
        )

    def propose_entry(self, node_id: str, commands: list[Command]) -> Proposal:
        """Commands as ONE log entry (the product's Proposer.propose_together)."""
        self.proposals += 1
        key = "+".join(type(command).__name__ for command in commands)
        return self.propose(node_id, f"{key}-{self.proposals}",
                            encode_batch([codec.encode(command) for command in commands]))

    def request(self, command: Command, origin: str,
                on_answer: Callable[[Result], None] | None = None,
                on_give_up: Callable[[], None] | None = None) -> Request:
        request = Request(command, origin, self.now_s, self.now_s + REQUEST_DEADLINE_S,
                          on_answer=on_answer, on_give_up=on_give_up)
        self.all_requests.append(request)
        return self.outbox.send(request)

    def repeat(self, request: Request) -> Request:
        """The same bytes proposed again later (a client that retried on its own)."""
        return self.request(request.command, request.origin)

    def after(self, delay_s: float, action: Callable[[], None]) -> None:
        self.scheduled += 1  # ties at one instant run in the order they were scheduled
        self.later.append((self.now_s + delay_s, self.scheduled, action))

    def step(self) -> None:
        due = sorted(item for item in self.later if item[0] <= self.now_s)
        self.later = [item for item in self.later if item[0] > self.now_s]
        for _, _, action in due:
            action()
        for worker in [*self.workers, self.prober, self.rescuer]:
            worker.step()
        self.outbox.step()
        self.cluster.step()
        if self.now_s >= self.next_sample_s:
            self.next_sample_s = self.now_s + SAMPLE_S
            sample(self)
        self.time_checker.check(self)

    def tick_all(self) -> None:
        for ticker in self.tickers:
            ticker.step()

    def run_for(self, seconds: float, each: Callable[[], None] | None = None) -> None:
        end_s = self.now_s + seconds
        while self.now_s < end_s:
            if each is not None:
                each()
            self.step()

    def run_until(self, condition: Callable[[], bool], seconds: float) -> bool:
        end_s = self.now_s + seconds
        while self.now_s < end_s and not condition():
            self.step()
        return condition()

    def leader_state(self) -> SchedulerState | None:
        leader = self.cluster.leader()
        return None if leader is None else self.machine.state(self.cluster.nodes[leader])


# -- running a seed ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SeedResult:
    seed: int
    problems: tuple[str, ...]
    stats: dict[str, int] = field(hash=False)
    digest: str = ""  # of the trace: equal runs, equal digests
    notes: tuple[str, ...] = field(default=(), compare=False)  # the faults, in time order
    durability: str | None = None  # the nodes' storage: None for PySyncObj's files

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        counts = " ".join(f"{name}={value}" for name, value in self.stats.items())
        head = f"seed={self.seed} ok={self.ok} {counts} trace={self.digest[:16]}"
        if self.ok:
            return head
        replay = f"replay: python -m raftcron.chaos.tier1 {self.seed}"
        if self.durability is not None:
            replay += f" --durability {self.durability}"
        return "\n  ".join([head, *self.problems[:20], replay])


def run_seed(seed: int, *, patched: bool = True, durability: str | None = None) -> SeedResult:
    """One deterministic run: the same seed gives the same trace digest and the same result.

    `patched=False` runs PySyncObj 0.3.17 without cluster/consensus/raftpatch.py. A `durability`
    ("fsync" or "os") puts the nodes on raftcron's storage and adds power losses (another run
    of the same seed number: its own trace).
    """
    rng = random.Random(f"{seed}/tier1")
    profile = Profile.draw(rng, storage=durability is not None)
    machine = ReplicaMachine(profile.tuning, durability=durability,
                             slow_sync_ticks=profile.slow_sync_ticks, seed=seed)
    node_ids = [f"n{i}" for i in range(1, profile.nodes + 1)]
    try:
        cluster = RecordingCluster(
            node_ids, machine.build, seed=f"tier1/{seed}", conf_factory=machine.conf,
            faults=profile.faults, patched=patched,
        )
        cluster.recorder = LogRecorder()
        with replica_bugs_raise() as bug_log, cluster:
            run = SeedRun(seed, cluster, machine, profile, rng)
            cluster.background = run.tick_all
            try:
                problems = _phases(run)
            except Exception as error:  # a bug or a harness failure: report, keep going
                where = traceback.extract_tb(error.__traceback__)[-1]
                problems = [f"error: {error!r} at {where.filename}:{where.lineno}", *bug_log[-1:]]
            folded = replay(cluster.recorder.payloads())
            problems = [f"storage: {node_id} refused to start: {why}"
                        for node_id, why in sorted(cluster.refused.items())] + problems
            problems += run.time_checker.violations
            if run.settled:  # the replicas agree on an index: the history can be judged
                problems += audit(run, folded)
            return SeedResult(seed, tuple(problems), stats(run, folded), cluster.trace.digest,
                              tuple(run.notes), durability)
    finally:
        gc.unfreeze()  # _deserialize froze what was alive; let the next seed's garbage go
        gc.collect()


def _phases(run: SeedRun) -> list[str]:
    # The clients and workers start with the cluster: before a leader, before its first Tick.
    schedules = run.client.put_schedules()
    if not run.run_until(lambda: all(r.acknowledged() for r in schedules), 12.0):
        return ["liveness: the schedules were not acknowledged within 12 s without faults"]
    # Safety: faults, clients, workers that fail, stall and crash.
    run.phase = "safety"
    next_fault_s = [run.now_s + run.rng.uniform(0.3, 1.0)]

    def chaos() -> None:
        run.client.step()
        run.clocks.strike(run)
        if run.now_s >= next_fault_s[0]:
            run.nemesis.strike()
            next_fault_s[0] = run.now_s + run.rng.uniform(0.3, 1.5)

    run.run_for(run.profile.safety_s, chaos)
    # Heal: restart and reconnect everything, commit a barrier everywhere.
    run.nemesis.heal()
    run.clocks.heal()
    if not settle(run.cluster, run.machine, timeout_s=15.0, barrier_key="barrier-heal"):
        return ["liveness: the cluster did not converge within 15 s of the heal"]
    # Healed includes the clocks: every node has read every peer's clock again (a majority's
    # time can rise as the nodes that were down are heard from, and the probe's lease must not
    # straddle that).
    members = set(run.cluster.node_ids)
    if not run.run_until(lambda: all(set(t.book.view(wall_ms=run.wall_ms(t.node_id),
                                                     mono_s=run.now_s).offsets_ms) == members
                                     for t in run.tickers), 5.0):
        return ["liveness: the nodes did not read each other's clocks within 5 s of the heal"]
    run.run_for(run.tick_s * 2)  # and a Tick at the majority's time that follows
    run.phase = "liveness"
    return _liveness(run)


def _liveness(run: SeedRun) -> list[str]:
    problems: list[str] = []
    for worker in run.workers:
        worker.honest, worker.dead_until_s = True, min(worker.dead_until_s, run.now_s + 1.0)
    probe = run.probe
    run.prober.enabled = True
    spec = JobSpec.parse({"task": "probe", "queue": "probe", "max_attempts": 5,
                          "backoff": {"initial_ms": 0, "max_ms": 0}})
    submitted = run.request(SubmitJobs(run.rid(), (spec,)), "client")
    leases_begun = _leaderships(run)

    def probe_step() -> None:
        if probe.died_s is None and run.prober.held:
            [(job_id, held)] = run.prober.held.items()
            probe.job_id, probe.token, probe.died_s = job_id, held.token, run.now_s
            probe.stall_s = _stall_s(run)
            run.prober.crash()
            run.prober.enabled, run.rescuer.enabled = False, True
        if probe.died_s is not None and probe.rerun_s is None and run.rescuer.held:
            [(job_id, held)] = run.rescuer.held.items()
            if job_id == probe.job_id and held.token != probe.token:
                probe.rerun_s = run.now_s

    def clients_and_probe() -> None:
        run.client.step()
        probe_step()

    run.run_for(3.0, clients_and_probe)
    run.run_for(3.0, probe_step)
    pauses = [run.request(PauseSchedule(run.rid(), name), "client")
              for name in (*NOMINAL, KEPT)]
    stall_s = run.profile.clock_spread_ms / 1000

    def drained() -> bool:
        probe_step()
        state = run.leader_state()
        return (
            all(r.acknowledged() for r in pauses) and submitted.done and state is not None
            and all(job.final for job in state.table) and probe.rerun_s is not None
        )

    if not run.run_until(drained, 30.0 + stall_s):
        state = run.leader_state()
        left = [] if state is None else [(j.id, j.status) for j in state.table if not j.final]
        problems.append(f"liveness: jobs not final 30 s (+{stall_s:.0f} s of clock spread) "
                        f"after the schedules paused: {left[:10]}, probe {probe}")
    probe.leaders_changed = _leaderships(run) != leases_begun
    problems += check_probe(probe, run.profile, run.tick_s)
    run.settled = settle(run.cluster, run.machine, timeout_s=15.0, barrier_key="barrier-end")
    if not run.settled:
        problems.append("liveness: the replicas did not converge at the end")
    return problems


def _stall_s(run: SeedRun) -> float:
    """Time stands still while the leader's clock is behind the state's: max(state, clock)."""
    leader, state = run.cluster.leader(), run.leader_state()
    if leader is None or state is None:
        return 0.0
    return max(0, state.now_ms - run.wall_ms(leader)) / 1000


def _leaderships(run: SeedRun) -> int:
    state = run.leader_state()
    return 0 if state is None or state.leader is None else state.leader[1]


def stats(run: SeedRun, folded: Replay) -> dict[str, int]:
    """What the seed exercised, for the report: a run that exercised nothing proves nothing."""
    answers = [r.acknowledged() for r in run.all_requests]
    state = run.leader_state() or SchedulerState()
    counters = {name: sum(bucket.values()) for name, bucket in state.counters.items()}
    probe = run.probe
    refused = [a for a in answers if isinstance(a, Rejected)]
    storage = {} if run.machine.durability is None else {
        "power_cuts": sum(disk.power_cuts for disk in run.cluster.disks.values()),
        **run.machine.storage_events,
    }
    return {
        **storage,
        "nodes": run.profile.nodes,
        "faults": sum(1 for note in run.notes if " nemesis " in note),
        "terms": 0 if state.leader is None else state.leader[1],
        "log": len(run.cluster.recorder.entries),
        "requests": len(run.all_requests),
        "acknowledged": sum(answer is not None for answer in answers),
        "retried": sum(r.attempts > 1 for r in run.all_requests),
        "unknown": sum(answer is None for answer in answers),
        "not_ready": sum(r.not_ready for r in run.all_requests),
        "jobs": len(state.table),
        "fires": counters.get("fires", 0),
        "lease_expired": counters.get("lease_expired", 0),
        "misfire_skipped": sum(s.misfire_skipped for s in state.schedules.values()),
        "stale_rejected": sum(a.code == "stale_token" for a in refused),
        "backfills_known": sum(
            not created for a in answers if isinstance(a, Ok) and "fires" in a.value
            for _time, _job, created in a.value["fires"]
        ),
        "backfills_too_old": sum(a.field == "from_ms" for a in refused),
        "triggers": sum(isinstance(a, Ok) and "buffered" in a.value for a in answers),
        "leases_after_leader_change": folded.checker.leases_after_leader_change,
        "clock_faults": run.clocks.injected,
        "ahead_ms_max": run.time_checker.worst_ahead_ms,
        "probe_rerun_ms": -1 if probe.rerun_s is None or probe.died_s is None
        else round((probe.rerun_s - probe.died_s) * 1000),
    }


# -- the command line ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m raftcron.chaos.tier1",
        description="Run tier-1 simulation seeds; replay one.",
    )
    parser.add_argument("seed", type=int)
    parser.add_argument("count", type=int, nargs="?", default=1)
    parser.add_argument("-v", "--verbose", action="store_true", help="print every seed")
    parser.add_argument("--notes", action="store_true", help="print each seed's fault timeline")
    parser.add_argument("--unpatched", action="store_true",
                        help="run PySyncObj 0.3.17 without cluster/consensus/raftpatch.py")
    parser.add_argument("--durability", choices=DURABILITY_MODES,
                        help="nodes on raftcron's storage with this durability, and power "
                             "losses among the faults")
    args = parser.parse_args(argv)
    # The storage warns of what a power loss leaves (a refused stale snapshot, a torn tail);
    # the result lines say what matters.
    logging.getLogger("raftcron.storage").setLevel(logging.ERROR)
    failed = 0
    for seed in range(args.seed, args.seed + args.count):
        result = run_seed(seed, patched=not args.unpatched, durability=args.durability)
        failed += not result.ok
        if args.verbose or not result.ok:
            print(result.describe(), flush=True)
        if args.notes:
            print("\n".join(result.notes), flush=True)
    print(f"seeds={args.count} failed={failed}")
    return 1 if failed else 0
