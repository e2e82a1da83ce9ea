"""The soak measure: no-op jobs submitted and run for N minutes, the cluster read every minute.

Steady (the default): worker processes run jobs submitted in batches of 1,000 at `--rate`
jobs/s, or, without it, at 0.9x the highest rate the ramp found the cluster to sustain with a
flat backlog (cluster/dev/bench/soakload.py). Flood (`--flood`): producers outrun one worker,
submitting as fast as they are accepted (or one client sending 8 jobs of `--payload-kb` KB at
a time), so the state reaches its budget: the records then show evictions and `state_full`
refusals. Every `report_s` (a minute) and at the end, one record (cluster/dev/bench/
soakrecord.py) is printed on stderr and kept. After the load: each node's snapshot after a
forced compaction, and a follower's restart-to-ready, timed as the scale measure times them
(cluster/dev/bench/scale.py), when the bench started the cluster.

It asserts nothing about the figures: a soak reports. It stops with an error when a worker, a
producer or a node stops by itself. Every process it starts is stopped in a `finally`.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raftcron.cluster.dev.bench import cpu, scale, scrape, soakrecord
from raftcron.cluster.dev.bench.soakload import (
    HOLD_SHARE,
    RAMP_START_PER_S,
    Evictions,
    Probe,
    Producer,
    fill,
    find_rate,
    settle,
)
from raftcron.cluster.dev.bench.soakrecord import CLAIM_LATENCY_SOURCE, Reading
from raftcron.cluster.dev.bench.target import BenchTarget
from raftcron.cluster.dev.bench.workers import (
    exited,
    logged_actions,
    start_workers,
    stop_workers,
    until_waiting,
)
from raftcron.cluster.dev.nodeprocesses import ClusterError
from raftcron.scheduler.settings import BUDGET_BYTES_MAX, BUDGET_BYTES_MIN

MINUTES_MAX = 24 * 60
RATE_MAX_PER_S = 1_000_000
PAYLOAD_KB_MAX = 63  # a job's payload is at most 64 KiB (scheduler/limits.py)
STEADY_WORKERS, STEADY_CONCURRENCY = 2, 128  # the drain's fastest shape on 2 cores
FLOOD_WORKERS, FLOOD_CONCURRENCY = 1, 32
WORKERS_READY_S = 60.0
CHECK_S = 1.0  # how often the soak looks at its workers, producer and nodes between records
CLEANUP_ROUNDS_MAX = 1_000  # bulk cancels of 1,000 jobs, --connect only

Say = Callable[[str], None]  # a line of progress


def arguments_problem(args: argparse.Namespace, *, minutes: float) -> str | None:
    """What is wrong with the soak's flags (`raftcron bench`'s) together, or None."""
    if not 0 < minutes <= MINUTES_MAX:
        return f"--minutes must be more than 0 and at most {MINUTES_MAX}"
    if args.rate is not None and not 0 < args.rate <= RATE_MAX_PER_S:
        return f"--rate must be more than 0 and at most {RATE_MAX_PER_S:,}"
    if args.workers is not None and not 1 <= args.workers <= 64:
        return "--workers must be from 1 to 64"
    if args.flood and args.rate is not None:
        return "--flood submits as fast as accepted: it takes no --rate"
    if args.payload_kb and not args.flood:
        return "--payload-kb is a --flood mode"
    if not 0 <= args.payload_kb <= PAYLOAD_KB_MAX:
        return f"--payload-kb must be from 1 to {PAYLOAD_KB_MAX}"
    if args.budget_bytes is not None and args.connect:
        return "--budget-bytes sets the local cluster's [settings]: not with --connect"
    budget = args.budget_bytes
    if budget is not None and not BUDGET_BYTES_MIN <= budget <= BUDGET_BYTES_MAX:
        return f"--budget-bytes must be from {BUDGET_BYTES_MIN:,} to {BUDGET_BYTES_MAX:,}"
    if not 1 <= args.report_s <= 3_600:
        return "--report-s must be from 1 to 3600"
    return None


async def measure(
    target: BenchTarget,
    *,
    minutes: float,
    rate: float | None,
    flood: bool,
    payload_kb: int,
    workers: int | None,
    report_s: float,
    folder: Path,
    empty_state: bool = False,
) -> dict[str, Any]:
    """`empty_state`: ramp (or hold `rate`) from the empty state rather than fill it first
    until it evicts (`--soak-empty`)."""
    queue = f"bench-soak-{uuid.uuid4().hex[:8]}"
    workers = workers or (FLOOD_WORKERS if flood else STEADY_WORKERS)
    concurrency = FLOOD_CONCURRENCY if flood else STEADY_CONCURRENCY
    figures: dict[str, Any] = {
        "soak_mode": "flood" if flood else "steady",
        "soak_minutes": minutes,
        "soak_workers": workers,
        "soak_concurrency": concurrency,
        "soak_payload_kb": payload_kb,
        "soak_claim_latency_source": CLAIM_LATENCY_SOURCE,
    }
    say = _say(target)
    # The workers' logs go to files in the bench's folder (kept with --keep): what they warn
    # of is counted, and the bench's own output stays readable.
    log_dir = folder / "workers"
    processes = start_workers(target, queues=[queue], workers=workers, concurrency=concurrency,
                              log_dir=log_dir)
    producer: Producer | None = None
    task: asyncio.Task[None] | None = None
    try:
        await until_waiting(target, workers, processes, time.monotonic() + WORKERS_READY_S)
        # Paused (rate 0) until the ramp sets a rate; the ramp's own bound (RAMP_WINDOWS_MAX
        # windows, then SETTLE_S_MAX) comes before the soak's minutes.
        producer = Producer(target, queue, rate=None if flood else rate or 0.0,
                            payload_kb=payload_kb, until=time.monotonic() + 3_600 + minutes * 60)
        task = asyncio.create_task(producer.run())
        if not flood and not empty_state:
            filled_s = await fill(producer, _evictions(target),
                                  rate=rate or RAMP_START_PER_S, say=say)
            figures["soak_fill_s"] = round(filled_s, 1)
            if rate is None:
                producer.rate = 0.0
        if not flood and rate is None:
            found, windows = await find_rate(producer, _probe(target, queue), say=say)
            rate = HOLD_SHARE * (found or windows[-1]["rate_per_s"])
            producer.rate = rate
            settled_s = await settle(producer, _probe(target, queue))
            say(f"rate found {f'{found:,}/s' if found else 'none'}, held {round(rate):,}/s; "
                f"the ramp's backlog drained in {settled_s:.1f} s")
            figures |= {"soak_rate_found_per_s": found, "soak_ramp": windows,
                        "soak_ramp_drained_s": round(settled_s, 1)}
        figures["soak_rate_held_per_s"] = None if rate is None else round(rate)
        records, elapsed_s, spent = await _soak(target, queue, producer, task, processes,
                                                minutes=minutes, report_s=report_s, say=say)
    finally:
        if producer is not None:
            producer.stop()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        stop_workers(processes)
    figures["soak_worker_warnings"] = logged_actions(log_dir)
    figures |= _totals(records, elapsed_s)
    figures["soak_kept_up"] = soakrecord.kept_up(figures)
    figures["soak_cpu_us_per_job"] = spent
    figures["soak_records"] = records
    figures |= await _end(target, queue, say)
    return figures


async def _soak(
    target: BenchTarget,
    queue: str,
    producer: Producer,
    task: asyncio.Task[None],
    processes: list[subprocess.Popen[bytes]],
    *,
    minutes: float,
    report_s: float,
    say: Say,
) -> tuple[list[dict[str, Any]], float, dict[str, Any] | None]:
    """One record each `report_s` and one at the end; the records, the seconds soaked and
    the CPU per job by role over them (cluster/dev/bench/cpu.py; None: not a local cluster)."""
    started = time.monotonic()
    ends = started + minutes * 60
    first = previous = await soakrecord.read(target, queue, producer.counts())
    known_leader = first.leader
    cpu_before = await _cpu(target, processes)
    records: list[dict[str, Any]] = []
    say(soakrecord.header())
    for index in range(int(minutes * 60 / report_s) + 1):
        due = min(started + (index + 1) * report_s, ends)
        while (now := time.monotonic()) < due:
            _check(target, task, processes)
            await asyncio.sleep(min(CHECK_S, due - now))
        _check(target, task, processes)
        reading: Reading = await soakrecord.read(target, queue, producer.counts())
        records.append(soakrecord.record(first, previous, reading, known_leader))
        say(soakrecord.line(records[-1]))
        previous = reading
        known_leader = reading.leader or known_leader
        if due >= ends:
            break
    elapsed_s = time.monotonic() - started
    cpu_after = await _cpu(target, processes)
    spent = (None if cpu_before is None or cpu_after is None
             else cpu.per_job(cpu_before, cpu_after, records[-1]["succeeded"]))
    return records, elapsed_s, spent


async def _cpu(
    target: BenchTarget, processes: list[subprocess.Popen[bytes]]
) -> cpu.CpuReading | None:
    """Every process's CPU time now, with who leads (a local cluster only: None otherwise)."""
    cluster = target.cluster
    if cluster is None:
        return None
    try:
        leader: str | None = (await asyncio.to_thread(cluster.leader, 10)).node_id
    except ClusterError:  # no leader now: the figure will say so
        leader = None
    nodes = {node.node_id: node.pid for node in cluster.nodes if node.pid is not None}
    return cpu.CpuReading.take(leader, nodes, [process.pid for process in processes])


def _check(
    target: BenchTarget, task: asyncio.Task[None], processes: list[subprocess.Popen[bytes]]
) -> None:
    """Stop the soak when something it runs on stopped by itself."""
    if task.done():
        task.result()  # raises what stopped the producer
        raise RuntimeError("the soak's producer stopped before the soak's end")
    if exited(processes):
        raise RuntimeError("a bench worker exited during the soak")
    if target.cluster is not None and (crashed := target.cluster.crashed_nodes()):
        node = crashed[0]
        raise RuntimeError(f"node {node.node_id} exited during the soak (log: {node.log_path})")


def _totals(records: list[dict[str, Any]], elapsed_s: float) -> dict[str, Any]:
    last = records[-1]
    return {
        "soak_elapsed_s": round(elapsed_s, 1),
        "soak_submitted": last["submitted"],
        "soak_succeeded": last["succeeded"],
        "soak_submit_per_s": round(last["submitted"] / elapsed_s),
        "soak_succeeded_per_s": round(last["succeeded"] / elapsed_s),
        "soak_refused": last["refused"],
        "soak_refused_jobs": last["refused_jobs"],
        "soak_backlog_at_end": last["backlog"],
        "soak_state_bytes_at_end": last["state_bytes"],
        "soak_budget_bytes": last["budget_bytes"],
        "soak_rss_mb_max": max(
            (mb for rec in records for mb in (rec["rss_mb"] or {}).values()), default=None
        ),
    }


async def _end(target: BenchTarget, queue: str, say: Say) -> dict[str, Any]:
    """With the load stopped: snapshots and a restart (a local cluster), or a clean-up of the
    soak's queue (a running cluster: the bench leaves none of its jobs queued there)."""
    cluster = target.cluster
    if cluster is None:
        cancelled = await _cancel_queued(target, queue)
        return {"soak_end_note": "snapshot and restart need a cluster started by the bench",
                "soak_end_cancelled_jobs": cancelled}
    leader = cluster.leader(timeout_s=30)
    ends = {"leader": await scale.snapshot(target, leader)}
    for node in cluster.nodes:
        if node is not leader:
            ends[node.node_id] = await scale.snapshot(target, node)
    restart = await scale.restart_to_ready(target)
    figures = {
        "soak_end_snapshot_s": ends["leader"].get("snapshot_s"),
        "soak_end_snapshot_bytes": ends["leader"].get("snapshot_bytes"),
        "soak_end_snapshot_s_max": max(
            (end.get("snapshot_s") or 0.0 for end in ends.values()), default=None
        ),
        "soak_end_restart_to_ready_s": restart["restart_to_ready_s"],
        "soak_end_rss_mb_after_restart": restart["rss_mb_after_restart"],
    }
    notes = [end["snapshot_note"] for end in ends.values() if "snapshot_note" in end]
    if notes:
        figures["soak_end_note"] = "; ".join(notes)
    say(f"end: snapshot {figures['soak_end_snapshot_s']} s "
        f"({figures['soak_end_snapshot_bytes']} bytes, the leader's; slowest "
        f"{figures['soak_end_snapshot_s_max']} s), restart-to-ready "
        f"{figures['soak_end_restart_to_ready_s']} s")
    return figures


async def _cancel_queued(target: BenchTarget, queue: str) -> int:
    """Cancel the soak's queued jobs in bulk (a part per command, bounded); how many."""
    cancelled, cursor = 0, 0
    for _ in range(CLEANUP_ROUNDS_MAX):
        body = {"action": "cancel", "filter": {"queue": queue, "status": "queued"},
                "cursor": cursor}
        status, answer = await target.call("POST", "/v1/jobs/bulk", body)
        if status != 200:
            break
        cancelled += int(answer.get("changed", 0))
        cursor = int(answer.get("next_cursor", 0))
        if not answer.get("more"):
            break
    return cancelled


def _evictions(target: BenchTarget) -> Evictions:
    """Finished jobs evicted so far (GET /v1/settings, its usage), from the leader."""

    async def evictions() -> int:
        status, view = await target.call("GET", "/v1/settings")
        if status != 200:
            raise RuntimeError(f"GET /v1/settings answered {status}: {view}")
        return int(sum(view.get("usage", {}).get("evicted", {}).values()))

    return evictions


def _probe(target: BenchTarget, queue: str) -> Probe:
    """The ramp's reading: the soak queue's backlog and jobs succeeded, from the leader."""

    async def probe() -> tuple[float, float]:
        texts = await soakrecord.pages(target)
        if not texts:
            raise RuntimeError("no node answered GET /metrics")
        text = soakrecord.leader_page(texts)
        return (scrape.sample(text, "raftcron_queue_depth", f'queue="{queue}"'),
                scrape.sample(text, "raftcron_jobs_succeeded_total", f'queue="{queue}"'))

    return probe


def _say(target: BenchTarget) -> Say:
    def say(text: str) -> None:
        if not target.quiet:
            sys.stderr.write(f"soak  {text}\n")
            sys.stderr.flush()

    return say
