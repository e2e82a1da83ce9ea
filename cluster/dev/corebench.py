"""Benchmark of the pure core on one core:
`python -m raftcron.cluster.dev.corebench [--quick] [--json]`.

It lives in cluster/ because it needs a clock, and scheduler/ has none. What it measures is
what every replica does per command: decode the log entry and apply it.

- job lifecycles/s (submit + claim + complete, the completion riding on the next claim) with
  batches of 1 and of 100;
- Tick cost with 100,000 schedules, idle and with 1,000 of them due;
- with `--catch-up N`: the Ticks after a day of whole-cluster downtime with N every-second
  schedules (the worst single log entry's apply, the total, how many Ticks);
- with `--flow`: the lifecycles/s of batch 1 and 100 with flow control off, and on without
  holding anything back (a queue with a concurrency cap and a rate limit, every job with a
  concurrency key, both), in interleaved rounds (the machine is shared: A and B run in the
  same minutes), medians and their ratio to off, by wall clock and by this process's CPU time
  (the steadier figure on a shared machine);
- with `--fair-claims`: the CPU per job of claims alone on a queue whose jobs have no
  fairness key, one of 2, one of 1,000 (scheduler/fairness.py), interleaved;
- snapshot bytes and seconds, and restore seconds, for 1,000,000 retained jobs; RSS.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import time
from typing import Any

from raftcron.cluster.consensus.replica import gc_paused
from raftcron.scheduler import codec
from raftcron.scheduler.commands import Ack, ClaimJobs, PutSchedule, SubmitJobs, Tick
from raftcron.scheduler.errors import Ok
from raftcron.scheduler.flowcommands import PutQueue
from raftcron.scheduler.flowspecs import ConcurrencySpec, FairnessSpec, QueueSpec, RateLimit
from raftcron.scheduler.gate import Finalize
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec
from raftcron.scheduler.state import SchedulerState

T0 = 1_800_000_000_000


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


FLOW_MODES = ("off", "queue", "keys", "both", "final", "fair", "fair_2")


def lifecycles_per_s(batch: int, total: int, flow: str = "off") -> float:
    """Lifecycles per second of wall-clock time (see `lifecycle_rates`)."""
    return lifecycle_rates(batch, total, flow)[0]


def lifecycle_rates(batch: int, total: int, flow: str = "off") -> tuple[float, float]:
    """Replica-side cost: decode + apply of submit and claim(+acks) commands, per job.

    `flow`: "queue" gives the queue a concurrency cap and a rate limit, "keys" gives every job
    one of 1,000 concurrency keys, "both" both; none of them holds a job back (the cap and the
    bucket are larger than the run, a key's max larger than its jobs at once): the cost
    measured is the bookkeeping every claim pays. "fair" gives every job one of 1,000 fairness
    keys and "fair_2" one of 2 (scheduler/fairness.py: the claims take turns across keys), in
    a finalized state (as a new cluster is); "final" is their baseline: finalized, no flow
    control (the other modes run as a cluster before finalize)."""
    state = SchedulerState()
    state.apply(Tick(T0))
    scratch = SchedulerState()
    scratch.apply(Tick(T0))
    if flow.startswith("fair") or flow == "final":
        for replica in (state, scratch):
            replica.apply(Finalize(None))
            replica.apply(Tick(T0))
    if flow in ("queue", "both"):
        limited = QueueSpec(concurrency_max=100_000, rate_limit=RateLimit(1_000_000, 1_000))
        for replica in (state, scratch):
            replica.apply(PutQueue(None, "default", limited))
    specs = [JobSpec(task="noop")] * batch
    if flow in ("keys", "both"):
        specs = [
            JobSpec(task="noop", concurrency=ConcurrencySpec(f"acct-{n % 1_000}", 1_000))
            for n in range(batch)
        ]
    if flow.startswith("fair"):
        keys = 2 if flow == "fair_2" else 1_000
        specs = [JobSpec(task="noop", fairness=FairnessSpec(f"cust-{n % keys}"))
                 for n in range(batch)]
    pending: tuple[Ack, ...] = ()
    entries: list[bytes] = []
    # Build the log first (that is the client's and leader's work), then time the replica.
    for seq in range(total // batch):
        submit = codec.encode(SubmitJobs(f"s{seq}", tuple(specs)))
        claim_cmd = ClaimJobs(f"c{seq}", "w1", ("default",), batch, 30_000, pending)
        claim = codec.encode(claim_cmd)
        scratch.apply(codec.decode(submit))
        result = scratch.apply(codec.decode(claim))
        assert isinstance(result, Ok)
        pending = tuple(Ack(job_id, token, "succeeded") for job_id, token in result.value["jobs"])
        entries += (submit, claim)
    entries.append(codec.encode(ClaimJobs("last", "w1", ("default",), 0, 30_000, pending)))
    gc.collect()
    started, started_cpu = time.perf_counter(), time.process_time()
    for data in entries:
        state.apply(*codec.decode_request(data))  # as a replica applies a log entry
    elapsed, elapsed_cpu = time.perf_counter() - started, time.process_time() - started_cpu
    assert state.table.count_by_status["succeeded"] == total
    # (wall, CPU): on a shared machine the CPU time of this process is the steadier figure.
    return total / elapsed, total / elapsed_cpu


def fair_claim_us(keys: int, total: int, batch: int = 100) -> float:
    """CPU per job of the claims alone (each with the acks of the one before), in a finalized
    state holding `total` queued jobs, every one with one of `keys` fairness keys (0: none):
    what fair turns cost a claim, the submits' own work (parsing the field) left out."""
    state = SchedulerState()
    for command in (Tick(T0), Finalize(None), Tick(T0)):
        state.apply(command)
    for seq in range(0, total, 1_000):
        specs = tuple(JobSpec(task="noop") if not keys else
                      JobSpec(task="noop", fairness=FairnessSpec(f"cust-{n % keys}"))
                      for n in range(min(1_000, total - seq)))
        state.apply(*codec.decode_request(codec.encode(SubmitJobs(f"s{seq}", specs))))
    pending: tuple[Ack, ...] = ()
    gc.collect()
    spent = 0.0
    for seq in range(total // batch + 1):
        data = codec.encode(ClaimJobs(f"c{seq}", "w1", ("default",), batch, 30_000, pending))
        started = time.process_time()
        result = state.apply(*codec.decode_request(data))
        spent += time.process_time() - started
        assert isinstance(result, Ok)
        pending = tuple(Ack(job_id, token, "succeeded") for job_id, token in result.value["jobs"])
    assert state.table.count_by_status["succeeded"] == total
    return spent / total * 1e6


def fair_claim_figures(rounds: int, scale: int) -> dict[str, Any]:
    """`fair_claim_us` with no key, 2 and 1,000, interleaved rounds: medians and ratios."""
    runs: dict[int, list[float]] = {0: [], 2: [], 1_000: []}
    for _ in range(rounds):
        for keys, values in runs.items():
            values.append(fair_claim_us(keys, 50_000 // scale))
    plain = statistics.median(runs[0])
    return {f"keys_{keys}": {"claim_us_median": round(statistics.median(values), 2),
                             "of_plain": round(statistics.median(values) / plain, 3),
                             "runs": [round(v, 2) for v in values]}
            for keys, values in runs.items()}


def flow_figures(rounds: int, scale: int) -> dict[str, Any]:
    """Lifecycles/s with flow control off and on (FLOW_MODES), interleaved: every round runs
    each mode once, so a noisy minute costs all modes alike. Medians, and each mode's median
    over the median of "off"."""
    figures: dict[str, Any] = {}
    for batch, total in ((1, 20_000 // scale), (100, 200_000 // scale)):
        wall: dict[str, list[float]] = {mode: [] for mode in FLOW_MODES}
        cpu: dict[str, list[float]] = {mode: [] for mode in FLOW_MODES}
        for _ in range(rounds):
            for mode in FLOW_MODES:
                rates = lifecycle_rates(batch, total, mode)
                wall[mode].append(rates[0])
                cpu[mode].append(rates[1])
        medians = {mode: statistics.median(values) for mode, values in wall.items()}
        cpu_medians = {mode: statistics.median(values) for mode, values in cpu.items()}
        figures[f"batch_{batch}"] = {
            mode: {"median_per_s": round(medians[mode]),
                   "of_off": round(medians[mode] / medians["off"], 3),
                   "cpu_median_per_s": round(cpu_medians[mode]),
                   "cpu_of_off": round(cpu_medians[mode] / cpu_medians["off"], 3),
                   # fair turns against their finalized baseline (`lifecycle_rates`)
                   "cpu_of_final": round(cpu_medians[mode] / cpu_medians["final"], 3),
                   "runs": [round(v) for v in wall[mode]]}
            for mode in FLOW_MODES
        }
    return figures


def tick_cost_ms(schedules: int, due: int) -> dict[str, float]:
    state = SchedulerState()
    state.apply(Tick(T0))
    job = {"task": "noop"}
    for index in range(schedules):
        # `due` of them fire every second; the rest once a day at staggered minutes.
        timing: dict[str, Any] = (
            {"every": "1s"} if index < due else {"cron": f"{index % 60} {index % 24} * * *"}
        )
        state.apply(PutSchedule(None, f"s{index}", ScheduleSpec.parse({**timing, "job": job})))
    state.apply(Tick(T0 + 1))  # starts them all (pending -> filed)
    idle = _time_ticks(state, [T0 + 1 + k for k in range(1, 201)])
    busy = _time_ticks(state, [T0 + k * 1_000 for k in range(1, 21)])
    return {"idle_tick_ms": idle, "tick_with_due_ms": busy}


def catch_up_figures(schedules: int, down_ms: int = 86_400_000) -> dict[str, float]:
    """The Ticks after whole-cluster downtime: `schedules` every-second cron schedules
    (`fire_once`), down for `down_ms`; the first Tick back and the ones after it (time standing
    still) until no schedule is overdue: the worst single apply and the total."""
    state = SchedulerState()
    state.apply(Tick(T0))
    job = {"task": "noop"}
    spec = ScheduleSpec.parse({"cron": "* * * * * *", "misfire": "fire_once", "job": job})
    for index in range(schedules):
        state.apply(PutSchedule(None, f"s{index}", spec))
    state.apply(Tick(T0 + 1_000))
    back_ms = T0 + 1_000 + down_ms
    worst_s = total_s = 0.0
    ticks = 0
    while ticks == 0 or (state.schedule_heap and state.schedule_heap[0][0] <= back_ms):
        data = codec.encode(Tick(back_ms))
        started = time.perf_counter()
        state.apply(codec.decode(data))
        spent_s = time.perf_counter() - started
        worst_s, total_s, ticks = max(worst_s, spent_s), total_s + spent_s, ticks + 1
    return {"schedules": schedules, "ticks": ticks, "worst_entry_ms": round(worst_s * 1000, 1),
            "total_s": round(total_s, 2)}


def _time_ticks(state: SchedulerState, times: list[int]) -> float:
    encoded = [codec.encode(Tick(t)) for t in times]
    started = time.perf_counter()
    for data in encoded:
        state.apply(codec.decode(data))
    return (time.perf_counter() - started) / len(times) * 1_000


def snapshot_figures(jobs: int) -> dict[str, float]:
    state = SchedulerState()
    state.apply(Tick(T0))
    spec = JobSpec(task="noop", payload={"n": 1})
    batch = 1_000
    for index in range(jobs // batch):
        state.apply(SubmitJobs(None, (spec,) * batch))
        claimed = state.apply(ClaimJobs(None, "w1", ("default",), batch, 30_000))
        assert isinstance(claimed, Ok)
        acks = tuple(
            Ack(job_id, token, "succeeded", result={"ok": True})
            for job_id, token in claimed.value["jobs"]
        )
        state.apply(ClaimJobs(None, "w1", ("default",), 0, 30_000, acks))
        if index % 100 == 0:
            state.apply(Tick(T0 + index))
    rss_loaded = rss_mb()
    gc.collect()
    started = time.perf_counter()
    with gc_paused():  # as the node does: see cluster/consensus/replica.py
        blob = snapshot(state)
    snapshot_s = time.perf_counter() - started
    del state
    gc.collect()
    started = time.perf_counter()
    with gc_paused():
        restored = restore(blob)
    restore_s = time.perf_counter() - started
    assert len(restored.table) == jobs
    return {
        "jobs": jobs,
        "snapshot_bytes": len(blob),
        "snapshot_s": round(snapshot_s, 3),
        "restore_s": round(restore_s, 3),
        "rss_after_load_mb": round(rss_loaded, 1),
        "rss_peak_mb": round(rss_mb(), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m raftcron.cluster.dev.corebench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run in seconds")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--catch-up", type=int, metavar="SCHEDULES",
                        help="only the catch-up after a day down, with this many schedules")
    parser.add_argument("--fair-claims", type=int, metavar="ROUNDS",
                        help="only the CPU of claims on a queue with fairness keys (none, 2, "
                        "1,000), interleaved ROUNDS times")
    parser.add_argument("--flow", type=int, metavar="ROUNDS",
                        help="only claim throughput with flow control off and on, interleaved "
                        "ROUNDS times")
    args = parser.parse_args(argv)
    if args.fair_claims is not None:
        if not 1 <= args.fair_claims <= 100:
            parser.error("--fair-claims must be from 1 to 100 rounds")
        scale = 100 if args.quick else 1
        print(json.dumps({"fair_claims": fair_claim_figures(args.fair_claims, scale)}))
        return 0
    if args.flow is not None:
        if not 1 <= args.flow <= 100:
            parser.error("--flow must be from 1 to 100 rounds")
        print(json.dumps({"flow": flow_figures(args.flow, 100 if args.quick else 1)}))
        return 0
    if args.catch_up is not None:
        if not 1 <= args.catch_up <= 1_000_000:
            parser.error("--catch-up must be from 1 to 1000000 schedules")
        print(json.dumps({"catch_up": catch_up_figures(args.catch_up)}))
        return 0
    scale = 100 if args.quick else 1
    figures: dict[str, Any] = {
        "lifecycles_per_s_batch_1": round(lifecycles_per_s(1, 20_000 // scale)),
        "lifecycles_per_s_batch_100": round(lifecycles_per_s(100, 200_000 // scale)),
    }
    figures.update(tick_cost_ms(100_000 // scale, 1_000 // scale))
    figures["snapshot"] = snapshot_figures(1_000_000 // scale)
    if args.json:
        json.dump(figures, sys.stdout)
        print()
    else:
        for name, value in figures.items():
            if isinstance(value, dict):
                for inner, inner_value in value.items():
                    print(f"{name}.{inner:<22} {inner_value}")
            else:
                print(
                    f"{name:<31} {value:,.3f}"
                    if isinstance(value, float)
                    else f"{name:<31} {value:,}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
