"""Scenarios: which plan, on how many nodes; and the run of one scenario.

What it owns: `SCENARIOS` (each a plan of chaos/tier2/plans.py, which injects faults through a
`Context` until its deadline, with the cluster's size, its clock skew, workflow rate and
settings, and whether a flood (chaos/tier2/flood.py) keeps its state at a small budget) and
`run_scenario`, which builds everything one run needs (network, nodes, workers, client), runs
warm-up -> faults -> final heal -> drain -> collection -> checkers, and always tears
everything down.

Rules: every wait on the cluster is a bounded poll of a condition; a node that exits by itself
is recorded (the liveness checker fails the run) and started again so the run can go on (the
plans' rules are in chaos/tier2/plans.py).
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from raftcron.chaos.tier2 import checkers, clientload, workload
from raftcron.chaos.tier2.context import Context
from raftcron.chaos.tier2.disk_faults import plan_sickdisk
from raftcron.chaos.tier2.endurance import ENDURANCE_RAFT, endurance_settings, plan_endurance
from raftcron.chaos.tier2.flood import Flood
from raftcron.chaos.tier2.history import History
from raftcron.chaos.tier2.member_faults import MemberCluster, plan_members
from raftcron.chaos.tier2.memory_faults import STATE_BUDGET_BYTES, MemoryCluster, plan_memory
from raftcron.chaos.tier2.nemesis import ADMIN, ChaosCluster, Nemesis
from raftcron.chaos.tier2.net_faults import plan_sicknet
from raftcron.chaos.tier2.netns import Namespaces, Relay, namespaces_possible
from raftcron.chaos.tier2.plans import (
    READY_TIMEOUT_S,
    WORKERS,
    plan_budget,
    plan_clock,
    plan_crash,
    plan_downtime,
    plan_five,
    plan_mixed,
    plan_partitions,
    plan_pause,
    plan_smoke,
)
from raftcron.chaos.tier2.power_faults import PowerCluster, plan_power
from raftcron.chaos.tier2.sick_network import SickCluster
from raftcron.chaos.tier2.storage_faults import STORAGE_RAFT, plan_storage
from raftcron.cluster.config import ClockSettings
from raftcron.cluster.consensus import raftpatch
from raftcron.cluster.dev.loopback import HttpSession
from raftcron.cluster.dev.nodeprocesses import ClusterError

DRAIN_BOUND_S = 60
ARCHIVE_FILL_BOUND_S = 60  # for a member that installed a snapshot to fill its archive
# The budget scenario's state budget: the flood's 60 KB jobs reach it within a minute of the
# start and fill it with unfinished work a few times a minute (chaos/tier2/flood.py).
BUDGET_BYTES = 6 << 20
# The smoke's job retention: every finished job but the newest few leaves the state at the next
# Tick, so evictions (and archive writes) meet every fault, and the final read finds most
# acknowledged jobs in the archives (checkers/jobs.py: `check_lost`).
# The endurance run's state budget: above an hour of request ids at the sustained rate (about
# 16 MB), so the run never turns into one of refusals (chaos/tier2/endurance.py).
ENDURANCE_BUDGET_BYTES = 32 << 20
SMOKE_RETENTION = {"succeeded": {"max_count": 20}, "failed": {"max_count": 5},
                   "cancelled": {"max_count": 5}}


@dataclass
class Scenario:
    name: str
    description: str
    plan: Callable[[Context], None]
    nodes: int = 3
    smoke: bool = False
    clock_skew_s: int = 0
    workflow_every_s: float = 4.0
    raft: dict[str, object] | None = None  # [raft] settings other than CHAOS_RAFT
    cluster_class: type[ChaosCluster] = ChaosCluster  # PowerCluster: data dirs on powerfs
    needs_namespaces: bool = False  # the relay cannot give a node one address for everyone
    settings: dict[str, object] | None = None  # the nodes' [settings] (a new cluster's)
    flood: bool = False  # chaos/tier2/flood.py: large jobs, the observer of final jobs

    @property
    def evicts(self) -> bool:
        """Finished jobs leave the state during the run (a low retention or a small budget),
        so the final read must find acknowledged jobs in the archive."""
        return bool({"retention", "budget"} & set(self.settings or {}))


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
    tables: list[str] = field(default_factory=list)  # printed with the report (the slopes)

    @property
    def safety_ok(self) -> bool:
        return self.error is None and all(r.ok for r in self.results if r.safety)

    @property
    def ok(self) -> bool:
        return self.error is None and all(r.ok for r in self.results)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("smoke", "kill the leader, kill its main PID mid-snapshot, damage a "
                 "follower's log, pause the leader, isolate the leader, whole-cluster downtime "
                 "longer than the misfire grace; finished jobs evicted into the archive all "
                 "along", plan_smoke, smoke=True, raft=STORAGE_RAFT,
                 settings={"retention": SMOKE_RETENTION}),
        Scenario("partitions", "isolate leader/one, one-way, majorities ring, pair cut, "
                 "worker cut", plan_partitions),
        Scenario("crash", "kill -9 a node, the leader, a majority, all; a worker mid-job",
                 plan_crash),
        Scenario("pause", "SIGSTOP the leader, a follower, a worker holding a lease",
                 plan_pause),
        Scenario("clock", "a leader 10 days ahead, a leader a day behind, steps of +-5 min",
                 plan_clock, clock_skew_s=1),
        Scenario("downtime", "whole-cluster outages of grace+4, 3 and grace+12 s; rolling "
                 "restarts", plan_downtime),
        Scenario("mixed", "partitions, kills and pauses mixed; a workflow every 2 s",
                 plan_mixed, workflow_every_s=2.0),
        Scenario("budget", f"a flood of 60 KB jobs keeps the state at a {BUDGET_BYTES >> 20} MiB "
                 "budget (evictions) and fills it (507s, fires refused); the leader killed, "
                 "then partitions, kills and pauses mixed", plan_budget,
                 settings={"budget": {"bytes": BUDGET_BYTES}}, flood=True),
        Scenario("five", "5 nodes: majorities ring, bridge, isolate leader, kill two",
                 plan_five, nodes=5),
        Scenario("storage", "kill -9 of the main PID and SIGTERM of the group mid-snapshot, "
                 "damaged data dirs; snapshots every few seconds", plan_storage,
                 raft=STORAGE_RAFT),
        Scenario("power", "power loss (kill -9 of the group + torn cut of a powerfs data dir) "
                 "of one node, a majority, all; kill -9 of the main PID mid-snapshot; "
                 "snapshots every few seconds", plan_power, raft=STORAGE_RAFT,
                 cluster_class=PowerCluster),
        Scenario("members", "add and remove members (the leader too) while killing, isolating "
                 "and pausing the leader or the joining node; a second change meanwhile",
                 plan_members, nodes=5, cluster_class=MemberCluster, needs_namespaces=True),
        Scenario("sicknet", "latency 50+-25 (0 leader changes) and 150+-50 ms on every link, "
                 "stalled links, loss on the leader's links, its connections reset",
                 plan_sicknet, cluster_class=SickCluster),
        Scenario("sickdisk", "powerfs disks: fsync stalls of 0.5-5 s on the leader and on a "
                 "follower (leader elections bounded), EIO on write, fsync (restart after) "
                 "and read, a disk turned read-only", plan_sickdisk, cluster_class=PowerCluster),
        Scenario("memory", "each node in a memory cgroup: the flood under a "
                 f"{STATE_BUDGET_BYTES >> 20} MiB budget with snapshots forced (no OOM kill "
                 "allowed), then OOM kills of the main PID mid-load and mid-snapshot",
                 plan_memory, raft=STORAGE_RAFT, cluster_class=MemoryCluster,
                 settings={"budget": {"bytes": STATE_BUDGET_BYTES}}, flood=True),
        Scenario("endurance", "the mixed faults for --minutes (120 to judge memory: request "
                 "ids live an hour) at the sustained rate, node kills spaced; each node's RSS, "
                 "descriptors, threads and Raft log sampled every minute must level off",
                 plan_endurance,
                 raft=ENDURANCE_RAFT, settings=endurance_settings(ENDURANCE_BUDGET_BYTES, 20),
                 workflow_every_s=2.0),
    ]
}
FULL = ["partitions", "crash", "pause", "clock", "downtime", "mixed", "budget", "five",
        "storage", "power", "members", "sicknet", "sickdisk", "memory"]


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
    if scenario.needs_namespaces and kind != "netns":
        outcome.error = f"{scenario.name} needs network namespaces ({why})"
        _write_results(outcome)
        return outcome
    if why:
        outcome.notes.append(f"partitions use the in-process relay: {why}")
    started = time.monotonic()
    history = History(folder / "history.jsonl")
    net: Namespaces | Relay
    hosts = [f"n{i + 1}" for i in range(scenario.nodes)] + ["ctl", *WORKERS]
    net = Namespaces(hosts) if kind == "netns" else Relay()
    cluster: ChaosCluster | None = None
    pool: workload.WorkerPool | None = None
    client: clientload.ClientLoad | None = None
    flood: Flood | None = None
    try:
        if isinstance(net, Namespaces):
            net.create()
            net.enter("ctl")
        rng = random.Random(f"{seed}:{scenario.name}")
        history.record("run", seed=seed, scenario=scenario.name, transport=kind,
                       nodes=scenario.nodes, duration_s=duration_s)
        cluster = scenario.cluster_class(folder / "nodes", net, nodes=scenario.nodes,
                                         raft=scenario.raft, settings=scenario.settings)
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
        client = clientload.ClientLoad(
            {node.url: node.node_id for node in cluster.known_nodes()}, history, sink, seed,
            workflow_every_s=scenario.workflow_every_s,
        )
        client.start()
        if scenario.flood:
            flood = Flood(client.urls, history)
            flood.start()
        nemesis = Nemesis(cluster, pool, history)
        history.record("phase", name="warmup")
        _wait_effects(sink, count=5, timeout_s=30)
        history.record("phase", name="faults")
        context = Context(scenario.name, nemesis, rng, duration_s, history, progress)
        scenario.plan(context)
        history.record("phase", name="heal")
        nemesis.heal_all()
        context.wait_ready(READY_TIMEOUT_S)
        client.stop_submitting()
        if flood is not None:
            flood.stop_submitting()  # and cancels its idle jobs: every flood job can end
        client.stop()  # no submit still in flight: one acknowledged after the drain started
        _drain(cluster, history, context, sink,  # would be missed by it (seen: a smoke in CI)
               evicting=scenario.evicts)
        if flood is not None:
            flood.stop()  # its consumer and observer ran through the drain
        pool.close()
        data = _collect(cluster, history, folder, scenario, sink)
        outcome.results = checkers.check_all(data)
        outcome.tables = [t for t in [checkers.slopes_table(data.history)] if t]
    except Exception as error:  # a harness failure is a failed run, never a pass
        outcome.error = f"{type(error).__name__}: {error}"
        history.record("note", text="harness error", error=traceback.format_exc()[-3000:])
    finally:
        for closing in (
            (lambda: client.stop()) if client else None,
            (lambda: flood.stop()) if flood else None,
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


def _acknowledged(history: History) -> set[int]:
    acked: set[int] = set()
    for event in history.of("submit"):
        if event.get("op") == "ok":
            acked.add(int(event["job_id"]))
    for event in history.of("workflow"):
        if event.get("op") == "ok":
            acked.update(int(i) for i in event["jobs"].values())
    return acked


def _drain(cluster: ChaosCluster, history: History, context: Context, sink: Path, *,
           evicting: bool = False) -> None:
    """Wait until every acknowledged job is final (bounded), and record how long it took.
    Where finished jobs are evicted (`evicting`), one gone that the run saw final is done."""
    healed = time.monotonic()
    remaining = len(_acknowledged(history))
    while time.monotonic() - healed < DRAIN_BOUND_S + 5:
        acked = _acknowledged(history)
        context.tick()
        try:
            leader = cluster.leader(5)
            jobs = cluster.list_jobs(leader)
        except (ClusterError, OSError):
            time.sleep(0.5)
            continue
        final = {int(j["id"]) for j in jobs if j["status"] in checkers.FINAL}
        if evicting:
            held = {int(j["id"]) for j in jobs}
            seen = checkers.final_evidence(history.events, workload.read_sink(sink))
            final |= set(seen) - held
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
    _wait_archives_whole(cluster, history)
    # Each member's own answer (never a peer's, which a member still filling would give).
    jobs = {node.node_id: cluster.list_jobs(node, own=True) for node in cluster.live_nodes()}
    leader = cluster.leader(10)
    jobs[leader.node_id] = _details(cluster, leader, [int(j["id"]) for j in jobs[leader.node_id]])
    _, schedules, _ = cluster.request(leader, "GET", "/v1/schedules", token=ADMIN)
    _, view, _ = cluster.request(leader, "GET", "/v1/cluster", token=ADMIN)
    # After the jobs were listed: the evictions counted cover every job those lists miss.
    _, budget, _ = cluster.request(leader, "GET", "/v1/settings?consistent=1", token=ADMIN)
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
        "nodes": len(cluster.nodes),  # the members at the end (membership changes them)
        "leader_bound_s": 8 if scenario.nodes >= 5 else 5,
        "rerun_bound_s": 10,
        "drain_bound_s": DRAIN_BOUND_S,
        "clock_skew_s": scenario.clock_skew_s,
        "max_skew_ms": ClockSettings.max_skew_ms,
        "task": workload.TASK,
        "raft_alarms": _raft_alarms(folder / "nodes"),
        "leaders": _leaders(folder / "nodes"),
        "members_final": _members_final(cluster),
        "usage": budget.get("usage") if isinstance(budget, dict) else None,
        "budget": budget.get("budget") if isinstance(budget, dict) else None,
        # What the final read of acknowledged jobs holds to (checkers/jobs.py: check_lost):
        # every member keeps what left its state, and this scenario made jobs leave.
        "archive": isinstance(view, dict) and view.get("archive") is not None,
        "evicting": scenario.evicts,
        "snapshots_installed": _snapshots_installed(folder / "nodes"),
    }
    final = {"jobs": jobs, "schedules": schedule_list, "events": events, "digests": digests,
             "settings": settings}
    (folder / "final.json").write_text(json.dumps(final, default=str))
    return checkers.RunData(
        history=list(history.events), jobs=jobs, schedules=schedule_list,
        cluster_events=events, digests=digests, sink=workload.read_sink(sink),
        settings=settings,
    )


def _wait_archives_whole(cluster: ChaosCluster, history: History) -> None:
    """Until no member misses a part of its archive (a member that installed a leader's
    snapshot fills it from a peer: cluster/archive/fill.py), at most ARCHIVE_FILL_BOUND_S;
    what is still missing then is recorded, and the final read finds it lost."""
    started = time.monotonic()
    missing: dict[str, Any] = {}
    while time.monotonic() - started < ARCHIVE_FILL_BOUND_S:
        missing = {}
        for node in cluster.live_nodes():
            try:
                _, view, _ = cluster.request(node, "GET", "/v1/cluster", token=ADMIN)
                archive = view.get("archive") if isinstance(view, dict) else None
            except OSError as error:
                missing[node.node_id] = str(error)
                continue
            if archive and archive.get("missing_jobs"):
                missing[node.node_id] = archive["missing_jobs"]
        if not missing:
            break
        time.sleep(0.5)
    history.record("phase", name="archives_whole", missing=missing,
                   elapsed_ms=int((time.monotonic() - started) * 1000))


def _raft_alarms(nodes: Path) -> list[str]:
    """Every node-log line with PySyncObj's truncation alarm (the defect
    cluster/consensus/raftpatch.py fixes: a replica that logs it may have lost acknowledged writes),
    prefixed with its node."""
    found = []
    for log_path in sorted(nodes.glob("*/*.log")):
        with log_path.open(errors="replace") as lines:
            found += [f"{log_path.stem}: {line.strip()}" for line in lines
                      if raftpatch.TRUNCATION_ALARM in line]
    return found


def _snapshots_installed(nodes: Path) -> dict[str, int]:
    """How many leader's snapshots each node installed, from the node logs (such a node
    filled from a peer what the entries it skipped removed: docs/concepts/retention.md)."""
    found: Counter[str] = Counter()
    for log_path in sorted(nodes.glob("*/*.log")):
        with log_path.open(errors="replace") as lines:
            for line in lines:
                if '"snapshot_installed"' in line:
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        found[str(json.loads(line)["node"])] += 1
    return dict(found)


def _leaders(nodes: Path) -> list[dict[str, Any]]:
    """Every time a node became leader, from the node logs: {node, term, t (Unix ms)}."""
    found = []
    for log_path in sorted(nodes.glob("*/*.log")):
        with log_path.open(errors="replace") as lines:
            for line in lines:
                if '"raft_role_changed"' not in line or '"new": "leader"' not in line:
                    continue
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    record = json.loads(line)
                    at = datetime.fromisoformat(record["ts"].replace("Z", "+00:00"))
                    found.append({"node": record["node"], "term": int(record["term"]),
                                  "t": int(at.timestamp() * 1000)})
    return found


def _members_final(cluster: ChaosCluster) -> dict[str, Any] | None:
    """Each member's membership view at the end, and whom the harness counts as members."""
    if not isinstance(cluster, MemberCluster):
        return None
    views: dict[str, Any] = {}
    for node in cluster.live_nodes():
        try:
            status, view, _ = cluster.request(node, "GET", "/v1/cluster/members", token=ADMIN)
        except OSError:
            status, view = 0, None
        views[node.node_id] = view if status == 200 else None
    return {"expected": [node.node_id for node in cluster.nodes], "views": views}


def _details(cluster: ChaosCluster, node: Any, ids: list[int]) -> list[dict[str, Any]]:
    """Every job with its attempts (GET /v1/jobs/{id}), a few requests at a time, each thread
    on one kept-open connection (a connection per request ran out of ephemeral ports past
    ~28,000 jobs: cluster/dev/loopback.HttpSession)."""
    local = threading.local()
    sessions: list[HttpSession] = []

    def one(job_id: int) -> dict[str, Any]:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = cluster.session(node)
            sessions.append(session)
        for _ in range(5):
            try:
                status, body, _ = session.get(f"/v1/jobs/{job_id}", token=ADMIN)
            except OSError:
                continue
            if status == 200:
                return dict(body)
        raise ClusterError(f"GET /v1/jobs/{job_id} on {node.node_id} failed")

    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            return list(pool.map(one, ids))
    finally:
        for session in sessions:
            session.close()


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
    for disk in (outcome.folder / "nodes").glob("*/disk"):  # a powerfs mount's disk
        shutil.rmtree(disk, ignore_errors=True)


def eprint(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
