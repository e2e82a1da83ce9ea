"""Scenarios: which faults, in what order, for how long; and the run of one scenario.

What it owns: `SCENARIOS` (each a plan that injects faults through a `Context` until its
deadline, drawn from a seeded RNG so a seed replays the same choices) and `run_scenario`,
which builds everything one run needs (network, nodes, workers, client), runs warm-up ->
faults -> final heal -> drain -> collection -> checkers, and always tears everything down.

Rules: one fault at a time (a fault is held for a planned time, then healed); every wait on
the cluster is a bounded poll of a condition; a node that exits by itself is recorded (the
liveness checker fails the run) and started again so the run can go on.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos import checkers, workload
from chaos.history import History
from chaos.nemesis import ADMIN, ChaosCluster, Nemesis
from chaos.netns import Namespaces, Relay, namespaces_possible
from cluster.localcluster import ClusterError

WORKERS = ["w1", "w2", "w3"]
READY_TIMEOUT_S = 60
DRAIN_BOUND_S = 60


@dataclass
class Scenario:
    name: str
    description: str
    plan: Callable[[Context], None]
    nodes: int = 3
    smoke: bool = False
    clock_skew_s: int = 0
    workflow_every_s: float = 4.0


@dataclass
class Outcome:
    scenario: str
    seed: int
    folder: Path
    transport: str
    faults: Counter[str] = field(default_factory=Counter)
    results: list[checkers.CheckResult] = field(default_factory=list)
    error: str | None = None
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def safety_ok(self) -> bool:
        return self.error is None and all(r.ok for r in self.results if r.safety)

    @property
    def ok(self) -> bool:
        return self.error is None and all(r.ok for r in self.results)


class Context:
    """What a plan uses: the nemesis, a seeded RNG, the clock of the fault phase, progress."""

    def __init__(
        self, scenario: Scenario, nemesis: Nemesis, rng: random.Random, duration_s: float,
        history: History, progress: Callable[[str], None],
    ) -> None:
        self.scenario = scenario
        self.nemesis = nemesis
        self.cluster = nemesis.cluster
        self.workers = nemesis.workers
        self.rng = rng
        self.history = history
        self.started = time.monotonic()
        self.deadline = self.started + duration_s
        self.duration_s = duration_s
        self.progress = progress
        self._last_progress = 0.0

    @property
    def namespaces(self) -> bool:
        return isinstance(self.cluster.net, Namespaces)

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def hold(self, seconds: float) -> None:
        """Keep the current fault (or the quiet) for `seconds`, reporting progress."""
        end = time.monotonic() + seconds
        while True:
            self.tick()
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(0.25, remaining))

    def tick(self) -> None:
        for node in self.cluster.crashed_nodes():
            if not node.crash_reported:
                node.crash_reported = True
                tail = " | ".join(self.cluster.log_lines(node)[-5:])
                self.history.record(
                    "note", crash=True, node=node.node_id,
                    text=f"{node.node_id} exited by itself: {tail[-600:]}",
                )
                self.cluster.start_node(node)
        now = time.monotonic()
        if now - self._last_progress >= 2.0:
            self._last_progress = now
            elapsed = now - self.started
            self.progress(
                f"{self.scenario.name}: {elapsed:5.0f}/{self.duration_s:.0f} s, "
                f"{self.nemesis.faults} faults"
            )

    def leader(self) -> str | None:
        try:
            return self.nemesis.pick_leader()
        except ClusterError:
            return None

    def wait_ready(self, timeout_s: float = 30) -> bool:
        # never far past the plan's deadline: a cluster that does not recover must not stall
        # the run (the final heal and the liveness checker then judge it)
        timeout_s = min(timeout_s, max(5.0, self.left_s() + 20))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.tick()
            try:
                self.cluster.wait_ready(min(5.0, max(0.5, deadline - time.monotonic())))
                return True
            except ClusterError:
                continue
        self.history.record("note", text=f"cluster not ready within {timeout_s} s")
        return False

    def node_ids(self) -> list[str]:
        return [node.node_id for node in self.cluster.nodes]

    def move_leadership_to(self, target: str, attempts: int = 6) -> bool:
        """Pause whoever leads (a fault) until `target` leads; bounded attempts."""
        for _ in range(attempts):
            if self.left_s() <= 0:
                break
            leader = self.leader()
            if leader == target:
                return True
            if leader is None:
                self.wait_ready(15)
                continue
            fault = self.nemesis.pause([leader], fault="force_leader")
            self.hold(2.5)
            self.nemesis.resume(fault, [leader])
            self.wait_ready(15)
        return self.leader() == target


# -- plans ---------------------------------------------------------------------------------


def plan_smoke(ctx: Context) -> None:
    """Kill the leader, pause the leader, isolate the leader, stop the whole cluster."""
    nemesis = ctx.nemesis
    leader = ctx.leader() or "n1"
    fault = nemesis.kill([leader])
    ctx.hold(2.0)
    nemesis.restart(fault, [leader])
    ctx.wait_ready()
    ctx.hold(3.0)
    leader = ctx.leader() or "n1"
    fault = nemesis.pause([leader])
    ctx.hold(3.0)
    nemesis.resume(fault, [leader])
    ctx.wait_ready()
    ctx.hold(3.0)
    leader = ctx.leader() or "n1"
    fault = nemesis.isolate([leader])
    ctx.hold(5.0)
    nemesis.heal(fault)
    ctx.wait_ready()
    ctx.hold(3.0)
    fault = nemesis.downtime_start()
    ctx.hold(workload.GRACE_MS / 1000 + 4)
    nemesis.downtime_end(fault)
    ctx.wait_ready(READY_TIMEOUT_S)
    ctx.hold(4.0)


def _partition_once(ctx: Context, choice: str) -> None:
    nemesis, rng = ctx.nemesis, ctx.rng
    nodes = ctx.node_ids()
    leader = ctx.leader() or rng.choice(nodes)
    if choice == "isolate_leader":
        fault = nemesis.isolate([leader])
    elif choice == "isolate_one":
        fault = nemesis.isolate([rng.choice(nodes)])
    elif choice == "one_way":  # the leader's messages go out, nothing comes back to it
        fault = nemesis.drop([(leader, other) for other in nodes if other != leader],
                             how="one_way")
    elif choice == "ring":  # every node hears a majority, no two the same one
        size = len(nodes)
        pairs = [(nodes[i], nodes[(i + 1) % size]) for i in range(size)]
        if size >= 5:
            pairs = [(nodes[i], nodes[(i + k) % size]) for i in range(size) for k in (2, 3)]
        fault = nemesis.drop(pairs, how="ring")
    elif choice == "cut_pair":
        a, b = rng.sample(nodes, 2)
        fault = nemesis.drop([(a, b), (b, a)], how="cut_pair")
    elif choice == "bridge":  # {n1, n2} | n3 | {n4, n5}: the middle one hears both halves
        shuffled = rng.sample(nodes, len(nodes))
        half = len(nodes) // 2
        left, right = shuffled[:half], shuffled[half + 1:]
        pairs = [(a, b) for a in left for b in right] + [(b, a) for a in left for b in right]
        fault = nemesis.drop(pairs, how="bridge")
    elif choice == "worker_cut" and ctx.namespaces:
        worker = ctx.workers.busy_worker(rng) or rng.choice(WORKERS)
        fault = nemesis.isolate([worker], fault="worker_cut")
        ctx.hold(rng.uniform(6.5, 9.0))  # longer than the lease
        nemesis.heal(fault)
        return
    else:
        fault = nemesis.isolate([leader])
    ctx.hold(rng.uniform(2.0, 7.0))
    nemesis.heal(fault)


def plan_partitions(ctx: Context) -> None:
    choices = ["isolate_leader", "isolate_one", "one_way", "ring", "cut_pair", "worker_cut"]
    if len(ctx.node_ids()) >= 5:
        choices += ["bridge", "ring"]
    while ctx.left_s() > 8:
        _partition_once(ctx, ctx.rng.choice(choices))
        ctx.wait_ready()
        ctx.hold(ctx.rng.uniform(1.0, 3.0))


def _crash_once(ctx: Context) -> None:
    nemesis, rng = ctx.nemesis, ctx.rng
    nodes = ctx.node_ids()
    roll = rng.random()
    if roll < 0.2:
        worker = ctx.workers.busy_worker(rng)
        if worker is not None:
            fault = nemesis.kill_worker(worker)
            ctx.hold(rng.uniform(1.0, 3.0))
            nemesis.restart_worker(fault, worker)
            return
    if roll < 0.5:
        targets = [rng.choice(nodes)]
    elif roll < 0.75:
        targets = [ctx.leader() or rng.choice(nodes)]
    elif roll < 0.92:
        targets = rng.sample(nodes, (len(nodes) - 1) // 2 + (1 if len(nodes) == 3 else 0))
    else:
        targets = list(nodes)
    fault = nemesis.kill(targets)
    ctx.hold(rng.uniform(1.0, 5.0))
    nemesis.restart(fault, targets)


def plan_crash(ctx: Context) -> None:
    while ctx.left_s() > 8:
        _crash_once(ctx)
        ctx.wait_ready(READY_TIMEOUT_S)
        ctx.hold(ctx.rng.uniform(1.0, 3.0))


def _pause_once(ctx: Context) -> None:
    nemesis, rng = ctx.nemesis, ctx.rng
    roll = rng.random()
    if roll < 0.3:
        worker = ctx.workers.busy_worker(rng)
        if worker is not None:
            fault = nemesis.pause_worker(worker)
            ctx.hold(rng.uniform(6.0, 8.5))  # longer than the 5 s lease
            nemesis.resume_worker(fault, worker)
            return
    leader = ctx.leader() or "n1"
    target = leader if roll < 0.75 else rng.choice([n for n in ctx.node_ids() if n != leader])
    fault = nemesis.pause([target])
    ctx.hold(rng.uniform(2.0, 5.0))
    nemesis.resume(fault, [target])


def plan_pause(ctx: Context) -> None:
    while ctx.left_s() > 10:
        _pause_once(ctx)
        ctx.wait_ready()
        ctx.hold(ctx.rng.uniform(1.0, 3.0))


def plan_clock(ctx: Context) -> None:
    """A leader 30 s ahead, then leadership moved to a node 30 s behind; clocks reset;
    again until the deadline. Duplicate fires must stay zero whatever the clocks do."""
    nemesis, rng = ctx.nemesis, ctx.rng
    while ctx.left_s() > 30:
        nodes = ctx.node_ids()
        ahead, behind = rng.sample(nodes, 2)
        nemesis.set_clock(ahead, +30)
        ctx.wait_ready()
        ctx.move_leadership_to(ahead)
        ctx.hold(rng.uniform(6.0, 10.0))
        nemesis.set_clock(behind, -30)
        ctx.wait_ready()
        ctx.move_leadership_to(behind)
        ctx.hold(rng.uniform(6.0, 10.0))
        for node_id in (ahead, behind):
            nemesis.set_clock(node_id, 0)
            ctx.wait_ready()
        ctx.hold(rng.uniform(2.0, 4.0))


def plan_downtime(ctx: Context) -> None:
    """Whole-cluster outages longer and shorter than the misfire grace, restarted all at once;
    between them a rolling restart (one node at a time)."""
    nemesis, rng = ctx.nemesis, ctx.rng
    grace_s = workload.GRACE_MS / 1000
    lengths = [grace_s + 4, 3.0, grace_s + 12]
    round_number = 0
    ctx.hold(8.0)  # every schedule fires before the first outage: none may fire again
    while ctx.left_s() > 25:
        down_s = lengths[round_number % len(lengths)]
        round_number += 1
        fault = nemesis.downtime_start()
        ctx.hold(down_s)
        nemesis.downtime_end(fault)
        ctx.wait_ready(READY_TIMEOUT_S)
        ctx.hold(rng.uniform(4.0, 6.0))
        if round_number % 2 == 0 and ctx.left_s() > 25:
            for node_id in ctx.node_ids():
                fault = nemesis.kill([node_id], fault="kill")
                ctx.hold(rng.uniform(1.0, 2.0))
                nemesis.restart(fault, [node_id])
                ctx.wait_ready()
            ctx.hold(3.0)


def plan_mixed(ctx: Context) -> None:
    choices = ["isolate_leader", "isolate_one", "one_way", "ring", "cut_pair", "worker_cut"]
    while ctx.left_s() > 10:
        roll = ctx.rng.random()
        if roll < 0.4:
            _partition_once(ctx, ctx.rng.choice(choices))
        elif roll < 0.7:
            _crash_once(ctx)
        else:
            _pause_once(ctx)
        ctx.wait_ready(READY_TIMEOUT_S)
        ctx.hold(ctx.rng.uniform(1.0, 2.5))


def plan_five(ctx: Context) -> None:
    while ctx.left_s() > 10:
        roll = ctx.rng.random()
        if roll < 0.25:
            _partition_once(ctx, "ring")
        elif roll < 0.45:
            _partition_once(ctx, "bridge")
        elif roll < 0.7:
            _partition_once(ctx, "isolate_leader")
        else:
            nodes = ctx.node_ids()
            targets = ctx.rng.sample(nodes, 2)
            fault = ctx.nemesis.kill(targets)
            ctx.hold(ctx.rng.uniform(1.0, 5.0))
            ctx.nemesis.restart(fault, targets)
        ctx.wait_ready(READY_TIMEOUT_S)
        ctx.hold(ctx.rng.uniform(1.0, 3.0))


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("smoke", "kill the leader, pause the leader, isolate the leader, whole-cluster "
                 "downtime longer than the misfire grace", plan_smoke, smoke=True),
        Scenario("partitions", "isolate leader/one, one-way, majorities ring, pair cut, "
                 "worker cut", plan_partitions),
        Scenario("crash", "kill -9 a node, the leader, a majority, all; a worker mid-job",
                 plan_crash),
        Scenario("pause", "SIGSTOP the leader, a follower, a worker holding a lease",
                 plan_pause),
        Scenario("clock", "a leader 30 s ahead, then one 30 s behind", plan_clock,
                 clock_skew_s=30),
        Scenario("downtime", "whole-cluster outages of grace+4, 3 and grace+12 s; rolling "
                 "restarts", plan_downtime),
        Scenario("mixed", "partitions, kills and pauses mixed; a workflow every 2 s",
                 plan_mixed, workflow_every_s=2.0),
        Scenario("five", "5 nodes: majorities ring, bridge, isolate leader, kill two",
                 plan_five, nodes=5),
    ]
}
FULL = ["partitions", "crash", "pause", "clock", "downtime", "mixed", "five"]


# -- one run -------------------------------------------------------------------------------


def choose_transport(wanted: str) -> tuple[str, str | None]:
    """("netns" | "relay", why netns is not used)."""
    why = namespaces_possible() if wanted in ("auto", "netns") else "relay asked for"
    if wanted == "netns" and why is not None:
        raise SystemExit(f"network namespaces unavailable: {why}")
    return ("netns", None) if why is None else ("relay", why)


def run_scenario(
    scenario: Scenario, *, seed: int, duration_s: float, folder: Path, transport: str,
    progress: Callable[[str], None],
) -> Outcome:
    folder.mkdir(parents=True, exist_ok=True)
    kind, why = choose_transport(transport)
    outcome = Outcome(scenario.name, seed, folder, kind)
    if why:
        outcome.notes.append(f"partitions use the in-process relay: {why}")
    started = time.monotonic()
    history = History(folder / "history.jsonl")
    net: Namespaces | Relay
    hosts = [f"n{i + 1}" for i in range(scenario.nodes)] + ["ctl", *WORKERS]
    net = Namespaces(hosts) if kind == "netns" else Relay()
    cluster: ChaosCluster | None = None
    pool: workload.WorkerPool | None = None
    client: workload.ClientLoad | None = None
    try:
        if isinstance(net, Namespaces):
            net.create()
            net.enter("ctl")
        rng = random.Random(f"{seed}:{scenario.name}")
        history.record("run", seed=seed, scenario=scenario.name, transport=kind,
                       nodes=scenario.nodes, duration_s=duration_s)
        cluster = ChaosCluster(folder / "nodes", net, nodes=scenario.nodes)
        cluster.start()
        cluster.wait_ready(READY_TIMEOUT_S)
        for name, (period_s, policy) in workload.SCHEDULES.items():
            status, body, _ = cluster.call(
                "PUT", f"/v1/schedules/{name}", workload.schedule_body(period_s, policy),
                token=ADMIN,
            )
            if status not in (200, 201):
                raise RuntimeError(f"PUT schedule {name}: {status} {body}")
        sink = folder / "sink.sqlite"
        workload.Sink(sink).close()
        pool = workload.WorkerPool(WORKERS, cluster.urls, folder / "workers", sink, net, history)
        for name in WORKERS:
            pool.start(name)
        client = workload.ClientLoad(
            {node.url: node.node_id for node in cluster.nodes}, history, sink, seed,
            workflow_every_s=scenario.workflow_every_s,
        )
        client.start()
        nemesis = Nemesis(cluster, pool, history)
        history.record("phase", name="warmup")
        _wait_effects(sink, count=5, timeout_s=30)
        history.record("phase", name="faults")
        context = Context(scenario, nemesis, rng, duration_s, history, progress)
        scenario.plan(context)
        history.record("phase", name="heal")
        nemesis.heal_all()
        context.wait_ready(READY_TIMEOUT_S)
        client.stop_submitting()
        _drain(cluster, history, context)
        client.stop()
        pool.close()
        data = _collect(cluster, history, folder, scenario, sink)
        outcome.results = checkers.check_all(data)
    except Exception as error:  # a harness failure is a failed run, never a pass
        outcome.error = f"{type(error).__name__}: {error}"
        history.record("note", text="harness error", error=traceback.format_exc()[-3000:])
    finally:
        for closing in (
            (lambda: client.stop()) if client else None,
            (lambda: pool.close()) if pool else None,
            (lambda: cluster.close()) if cluster else None,
            net.close,
        ):
            if closing is not None:
                with contextlib.suppress(Exception):
                    closing()
        outcome.faults = Counter(
            e["fault"] for e in history.of("fault") if e.get("phase") == "start"
        )
        history.close()
        outcome.elapsed_s = time.monotonic() - started
    _write_results(outcome)
    return outcome


def _wait_effects(sink: Path, *, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = workload.read_sink(sink)
        if sum(1 for row in rows if row["phase"] == "applied") >= count:
            return
        time.sleep(0.25)
    raise RuntimeError(f"no {count} effects within {timeout_s} s of the start: the workload "
                       "does not run")


def _drain(cluster: ChaosCluster, history: History, context: Context) -> None:
    """Wait until every acknowledged job is final (bounded), and record how long it took."""
    healed = time.monotonic()
    acked: set[int] = set()
    for event in history.events:
        if event["kind"] == "submit" and event.get("op") == "ok":
            acked.add(int(event["job_id"]))
        if event["kind"] == "workflow" and event.get("op") == "ok":
            acked.update(int(i) for i in event["jobs"].values())
    remaining = len(acked)
    while time.monotonic() - healed < DRAIN_BOUND_S + 5:
        context.tick()
        try:
            leader = cluster.leader(5)
            jobs = cluster.list_jobs(leader)
        except (ClusterError, OSError):
            time.sleep(0.5)
            continue
        final = {int(j["id"]) for j in jobs if j["status"] in checkers.FINAL}
        remaining = len(acked - final)
        if remaining == 0:
            break
        time.sleep(0.5)
    history.record("phase", name="drained", remaining=remaining,
                   elapsed_ms=int((time.monotonic() - healed) * 1000))


def _collect(
    cluster: ChaosCluster, history: History, folder: Path, scenario: Scenario, sink: Path
) -> checkers.RunData:
    history.record("phase", name="collect")
    digests: dict[str, list[Any]] = {}
    try:
        digests = {k: list(v) for k, v in cluster.audit_entries(30).items()}
    except ClusterError as error:
        history.record("note", text=f"final audit failed: {error}")
    jobs = {node.node_id: cluster.list_jobs(node) for node in cluster.live_nodes()}
    leader = cluster.leader(10)
    jobs[leader.node_id] = _details(cluster, leader, [int(j["id"]) for j in jobs[leader.node_id]])
    _, schedules, _ = cluster.request(leader, "GET", "/v1/schedules", token=ADMIN)
    _, view, _ = cluster.request(leader, "GET", "/v1/cluster", token=ADMIN)
    events: list[dict[str, Any]] = []
    cursor = 0
    for _ in range(1_000):
        _, page, _ = cluster.request(leader, "GET", f"/v1/events?cursor={cursor}&limit=1000",
                                     token=ADMIN)
        events.extend(page["events"])
        if not page["events"]:
            break
        cursor = page["next_cursor"]
    schedule_list = schedules["schedules"] if isinstance(schedules, dict) else schedules
    now_ms = int(view["state"]["now_ms"])
    settings = {
        "schedules": {k: list(v) for k, v in workload.SCHEDULES.items()},
        "grace_ms": workload.GRACE_MS,
        "lease_ms": workload.LEASE_MS,
        "horizon_ms": now_ms - 3_000,
        "nodes": scenario.nodes,
        "leader_bound_s": 8 if scenario.nodes >= 5 else 5,
        "rerun_bound_s": 10,
        "drain_bound_s": DRAIN_BOUND_S,
        "clock_skew_s": scenario.clock_skew_s,
        "task": workload.TASK,
    }
    final = {"jobs": jobs, "schedules": schedule_list, "events": events, "digests": digests,
             "settings": settings}
    (folder / "final.json").write_text(json.dumps(final, default=str))
    return checkers.RunData(
        history=list(history.events), jobs=jobs, schedules=schedule_list,
        cluster_events=events, digests=digests, sink=workload.read_sink(sink),
        settings=settings,
    )


def _details(cluster: ChaosCluster, node: Any, ids: list[int]) -> list[dict[str, Any]]:
    """Every job with its attempts (GET /v1/jobs/{id}), a few requests at a time."""

    def one(job_id: int) -> dict[str, Any]:
        for _ in range(5):
            try:
                status, body, _ = cluster.request(node, "GET", f"/v1/jobs/{job_id}",
                                                  token=ADMIN, timeout_s=10)
            except OSError:
                continue
            if status == 200:
                return dict(body)
        raise ClusterError(f"GET /v1/jobs/{job_id} on {node.node_id} failed")

    with ThreadPoolExecutor(max_workers=6) as pool:
        return list(pool.map(one, ids))


def _write_results(outcome: Outcome) -> None:
    summary = {
        "scenario": outcome.scenario,
        "seed": outcome.seed,
        "transport": outcome.transport,
        "error": outcome.error,
        "elapsed_s": round(outcome.elapsed_s, 1),
        "faults": dict(outcome.faults),
        "notes": outcome.notes,
        "results": [
            {"name": r.name, "safety": r.safety, "ok": r.ok, "counts": r.counts,
             "violations": r.violations}
            for r in outcome.results
        ],
    }
    (outcome.folder / "results.json").write_text(json.dumps(summary, indent=2, default=str))


def prune(outcome: Outcome, keep: bool) -> None:
    """A passing run keeps its history, logs and results, not the nodes' Raft data."""
    if keep or not outcome.ok:
        return
    for data in (outcome.folder / "nodes").glob("*/data"):
        shutil.rmtree(data, ignore_errors=True)


def eprint(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
