"""`raftcron bench`: choose the measures, start (or connect to) a cluster, print the figures."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from raftcron.cluster.dev.bench import (
    archivebench,
    measures,
    peerreport,
    peerrun,
    peers,
    scale,
    soak,
    soakrecord,
)
from raftcron.cluster.dev.bench.target import BenchTarget
from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.scheduler.limits import CLAIM_MAX

MEASURES = (
    "submit_single", "submit_batched", "drain", "claim", "fire", "failover", "scale", "soak",
    "archive",
)
ON_REQUEST = ("scale", "soak", "archive")  # long: run only when --only names them
FULL = {
    "single_jobs": 5_000,
    "batched_jobs": 100_000,
    "drain_jobs": 50_000,
    "drain_workers": 4,
    "drain_concurrency": 64,
    "claim_rounds": 500,
    "fire_schedules": 1_000,
    "fire_seconds": 60,
    "failover_kills": 10,
    "scale_schedules": 100_000,
    "scale_jobs": 1_000_000,
    "soak_minutes": 10.0,
}
QUICK = {
    "single_jobs": 300,
    "batched_jobs": 5_000,
    "drain_jobs": 2_000,
    "drain_workers": 2,
    "drain_concurrency": 32,
    "claim_rounds": 50,
    "fire_schedules": 20,
    "fire_seconds": 5,
    "failover_kills": 1,
    "scale_schedules": 1_000,
    "scale_jobs": 20_000,
    "soak_minutes": 0.5,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--connect", help="node URLs of a running cluster (default: start a local 3-node one)"
    )
    parser.add_argument("--api-token", help="bearer token for --connect")
    parser.add_argument(
        "--only", help=f"comma-separated measures ({', '.join(MEASURES)}); default all but "
        f"{' and '.join(ON_REQUEST)}"
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke run in under a minute"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object with every figure"
    )
    parser.add_argument(
        "--workers", type=int, help="drain, soak: worker processes (soak: 2, with --flood 1)"
    )
    parser.add_argument("--jobs", type=int, help="drain: jobs")
    parser.add_argument(
        "--slots", type=int,
        help=f"drain: slots of each worker process (default {FULL['drain_concurrency']}; "
        f"--quick {QUICK['drain_concurrency']}): fewer, larger claims with fewer workers of "
        "more slots",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the local cluster's folder (logs)"
    )
    parser.add_argument(
        "--durability",
        choices=("fsync", "os"),
        default="fsync",
        help="[storage] durability of the local cluster (default fsync, the nodes' default)",
    )
    parser.add_argument(
        "--no-archive", action="store_true",
        help="[storage] archive = false on the local cluster (to compare: DESIGN.md 9.2)",
    )
    parser.add_argument(
        "--minutes", type=float, help="soak: how long, fractions allowed (default 10; --quick 0.5)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        help="soak: jobs/s to hold (default: 0.9x the highest rate a ramp finds sustained)",
    )
    parser.add_argument(
        "--flood",
        action="store_true",
        help="soak: producers outrun the workers (as fast as accepted, one worker); the "
        "figures show the state at its budget, evictions and state_full refusals",
    )
    parser.add_argument(
        "--payload-kb",
        type=int,
        default=0,
        help="soak --flood: one client sending batches of 8 jobs of this many KB each",
    )
    parser.add_argument(
        "--budget-bytes",
        type=int,
        help="soak: the local cluster's state budget ([settings] budget; default the product's)",
    )
    parser.add_argument(
        "--soak-empty",
        action="store_true",
        help="soak: ramp (or hold --rate) from the empty state; by default the state is first "
        "filled until it evicts (its retention or budget reached), as after months of running",
    )
    parser.add_argument(
        "--rows",
        type=int,
        help="archive: rows of the archive searched (default 10,000,000; --quick 6,000); "
        "no cluster is started for it (cluster/dev/bench/archivebench.py)",
    )
    parser.add_argument(
        "--peers",
        metavar="DIR",
        help="drain: then run the peers' drains (BullMQ, graphile-worker) of the baselines "
        "folder DIR (e.g. ../shared/baselines) with the same jobs, and show their figures and "
        "ratios beside ours; a peer that cannot run is said, with why",
    )
    parser.add_argument(
        "--peer-repeats",
        type=int,
        help=f"--peers: runs of each peer's drain, their median reported "
        f"(default {peers.DEFAULT_REPEATS})",
    )
    # One record per minute; a smoke test asks for one every few seconds.
    parser.add_argument("--report-s", type=float, default=60.0, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    chosen = [m.strip() for m in (args.only or "").split(",") if m.strip()] or [
        m for m in MEASURES if m not in ON_REQUEST
    ]
    unknown = [m for m in chosen if m not in MEASURES]
    if unknown:
        print(
            f"raftcron bench: unknown measure {unknown[0]!r} (known: {', '.join(MEASURES)})",
            file=sys.stderr,
        )
        return 2
    problem = _peers_problem(args, chosen) or _slots_problem(args, chosen)
    if problem:
        print(f"raftcron bench: {problem}", file=sys.stderr)
        return 2
    if "archive" in chosen:  # a node's archive on this disk, no cluster
        archive = archivebench.measure(**archivebench.sizes(quick=args.quick, rows=args.rows))
        print(json.dumps({"archive": archive}) if args.json else archivebench.render(archive))
        chosen = [m for m in chosen if m != "archive"]
        if not chosen:
            return 0
    sizes = dict(QUICK if args.quick else FULL)
    if args.minutes is not None:
        sizes["soak_minutes"] = args.minutes
    if "soak" in chosen:
        problem = soak.arguments_problem(args, minutes=sizes["soak_minutes"])
        if problem:
            print(f"raftcron bench: {problem}", file=sys.stderr)
            return 2
    if args.workers:
        sizes["drain_workers"] = args.workers
    if args.jobs:
        sizes["drain_jobs"] = args.jobs
    if args.slots is not None:
        sizes["drain_concurrency"] = args.slots
    folder = Path(tempfile.mkdtemp(prefix="raftcron-bench-"))
    cluster = None
    try:
        if args.connect:
            target = BenchTarget(
                [u.strip().rstrip("/") for u in args.connect.split(",")], token=args.api_token
            )
        else:
            settings: dict[str, object] = (
                {"budget": {"bytes": args.budget_bytes}} if args.budget_bytes else {}
            )
            cluster = LocalCluster(
                folder,
                log_level="warning",
                storage={"durability": args.durability,
                         **({"archive": False} if args.no_archive else {})},
                settings=settings,
            )
            cluster.start()
            cluster.wait_ready(timeout_s=60)
            target = BenchTarget([node.url for node in cluster.nodes], cluster=cluster)
        if "submit_batched" in chosen and "drain" in chosen:
            sizes["drain_jobs"] = sizes["batched_jobs"]  # the drain takes the batched jobs
        figures = asyncio.run(_measure(target, chosen, sizes, args, folder))
    finally:
        if cluster is not None:
            cluster.close()
        if not args.keep:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    if args.peers:  # after ours, our cluster stopped: the peers get the machine to themselves
        repeats = args.peer_repeats or peers.DEFAULT_REPEATS
        found = peerrun.measure(Path(args.peers), jobs=figures["drain_jobs"], repeats=repeats)
        figures["peers"] = peerreport.compare(found["peers"], figures)
        figures |= {"peers_jobs": figures["drain_jobs"], "peers_repeats": repeats,
                    "peers_servers": found["peers_servers"]}
    figures["measured"] = chosen
    if not args.connect:
        figures["durability"] = args.durability
    if args.json:
        print(json.dumps(figures))
    else:
        for name, value in figures.items():
            if name != "measured" and not name.startswith(("soak_", "peers")):  # own tables
                print(
                    f"{name:<28} {value:,}"
                    if isinstance(value, int | float)
                    else f"{name:<28} {value}"
                )
        if "soak_records" in figures:
            print(soakrecord.table(figures))
        if "peers" in figures:
            print(peerreport.table(figures))
    return 0


def _slots_problem(args: argparse.Namespace, chosen: list[str]) -> str | None:
    if args.slots is None:
        return None
    if "drain" not in chosen:
        return "--slots sets the drain's workers: --only must include drain"
    if not 1 <= args.slots <= CLAIM_MAX:
        return f"--slots must be from 1 to {CLAIM_MAX:,} (a claim's most jobs), not {args.slots}"
    return None


def _peers_problem(args: argparse.Namespace, chosen: list[str]) -> str | None:
    """What is wrong with --peers and --peer-repeats, said before any cluster is started."""
    if args.peers is None:
        return "--peer-repeats needs --peers DIR" if args.peer_repeats is not None else None
    if args.peer_repeats is not None and args.peer_repeats < 1:
        return f"--peer-repeats must be at least 1, not {args.peer_repeats}"
    if "drain" not in chosen:
        return "--peers runs the peers' drains beside ours: --only must include drain"
    return peers.problem(Path(args.peers))


async def _measure(
    target: BenchTarget,
    chosen: list[str],
    sizes: dict[str, Any],
    args: argparse.Namespace,
    folder: Path,
) -> dict[str, Any]:
    await target.open()
    figures: dict[str, Any] = {}
    ready_queue: tuple[str, int] | None = None  # jobs submit_batched left for the drain
    try:
        for name in chosen:
            if name == "submit_single":
                figures |= await measures.submit_single(
                    target, jobs=sizes["single_jobs"], concurrency=32
                )
            elif name == "submit_batched":
                result = await measures.submit_batched(
                    target, jobs=sizes["batched_jobs"], batch=1_000, concurrency=4
                )
                ready_queue = (result.pop("queue"), sizes["batched_jobs"])
                figures |= result
            elif name == "drain":
                figures |= await measures.drain(
                    target,
                    jobs=sizes["drain_jobs"],
                    workers=sizes["drain_workers"],
                    concurrency=sizes["drain_concurrency"],
                    ready=ready_queue,
                )
                ready_queue = None
            elif name == "claim":
                figures |= await measures.claim_latency(target, rounds=sizes["claim_rounds"])
            elif name == "fire":
                figures |= await measures.fire_lateness(
                    target, schedules=sizes["fire_schedules"], seconds=sizes["fire_seconds"]
                )
            elif name == "failover":
                figures |= await measures.failover(target, kills=sizes["failover_kills"])
            elif name == "scale":
                figures |= await scale.measure(
                    target, schedules=sizes["scale_schedules"], jobs=sizes["scale_jobs"]
                )
            elif name == "soak":
                figures |= await soak.measure(
                    target,
                    minutes=sizes["soak_minutes"],
                    rate=args.rate,
                    flood=args.flood,
                    payload_kb=args.payload_kb,
                    workers=args.workers,
                    report_s=args.report_s,
                    folder=folder,
                    empty_state=args.soak_empty,
                )
    finally:
        await target.close()
    return figures
