"""The scenarios' plans: which faults, in what order, for how long.

What it owns: the plans (`plan_smoke`, `plan_partitions`, `plan_crash`, `plan_pause`,
`plan_clock`, `plan_downtime`, `plan_mixed`, `plan_budget`, `plan_five`), each of which
injects faults through a `Context` (chaos/tier2/context.py) until its deadline, drawn from a
seeded RNG so a seed replays the same choices; and the worker names and readiness bound the
run shares (`WORKERS`, `READY_TIMEOUT_S`). The scenarios that use the plans, and the run, are
in chaos/tier2/scenarios.py.

Rules: one fault at a time (a fault is held for a planned time, then healed); every wait on
the cluster is a bounded poll of a condition; a node that exits by itself is recorded (the
liveness checker fails the run) and started again so the run can go on.
"""

from __future__ import annotations

from raftcron.chaos.tier2 import storage_faults, workload
from raftcron.chaos.tier2.context import Context

WORKERS = ["w1", "w2", "w3"]
READY_TIMEOUT_S = 60
DAY_S = 86_400


def plan_smoke(ctx: Context) -> None:
    """Kill the leader, kill its main PID mid-snapshot, damage a follower's log, pause the
    leader, isolate the leader, stop the whole cluster."""
    nemesis = ctx.nemesis
    leader = ctx.leader() or "n1"
    fault = nemesis.kill([leader])
    ctx.hold(2.0)
    nemesis.restart(fault, [leader])
    ctx.wait_ready()
    ctx.hold(3.0)
    leader = ctx.leader() or "n1"
    fault = storage_faults.kill_main(nemesis, leader)
    ctx.hold(1.5)
    nemesis.restart(fault, [leader])
    ctx.wait_ready()
    follower = next(n for n in ctx.node_ids() if n != (ctx.leader() or "n1"))
    storage_faults.damage(nemesis, follower, "flip_segment")
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
    """Clock leaps (DESIGN.md §8.2): a node 10 days ahead made leader, then a node a day behind
    made leader; both set right; then a third stepped by 5 minutes either way (an NTP step) and
    made leader; clocks reset; again until the deadline. At most a minority is off from the
    harness's clock at once (two of three are off in opposite directions, so the middle clock
    is the true one): the state's time must keep to the majority's (checkers/statetime.py)
    and every other promise hold."""
    nemesis, rng = ctx.nemesis, ctx.rng
    while ctx.left_s() > 30:
        ahead, behind, stepped = rng.sample(ctx.node_ids(), 3)
        nemesis.set_clock(ahead, +10 * DAY_S)
        ctx.wait_ready()
        ctx.move_leadership_to(ahead)
        ctx.hold(rng.uniform(6.0, 10.0))
        nemesis.set_clock(behind, -DAY_S)
        ctx.wait_ready()
        ctx.move_leadership_to(behind)
        ctx.hold(rng.uniform(6.0, 10.0))
        for node_id in (ahead, behind):
            nemesis.set_clock(node_id, 0)
            ctx.wait_ready()
        nemesis.set_clock(stepped, rng.choice((-300, +300)))
        ctx.wait_ready()
        ctx.move_leadership_to(stepped)
        ctx.hold(rng.uniform(4.0, 6.0))
        nemesis.set_clock(stepped, 0)
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


def plan_budget(ctx: Context) -> None:
    """The leader killed first, then plan_mixed's draw (partitions, kills, pauses, workers
    killed, frozen and cut off) until the deadline, while the flood (chaos/tier2/flood.py)
    keeps the state at its budget: refusals and evictions meet every fault."""
    nemesis, rng = ctx.nemesis, ctx.rng
    ctx.hold(rng.uniform(2.0, 4.0))
    leader = ctx.leader() or rng.choice(ctx.node_ids())
    fault = nemesis.kill([leader])
    ctx.hold(rng.uniform(1.0, 4.0))
    nemesis.restart(fault, [leader])
    ctx.wait_ready(READY_TIMEOUT_S)
    ctx.hold(rng.uniform(1.0, 2.5))
    plan_mixed(ctx)


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
