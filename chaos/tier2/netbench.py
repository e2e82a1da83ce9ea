"""What network latency costs the cluster: `python -m raftcron.chaos.tier2.netbench`.

Three nodes (fsync durability, the suite's Raft timings `CHAOS_RAFT`) behind the loopback
`SickRelay`, one sequential client on a kept-alive connection to the leader: submit a job,
then claim it through `POST /v1/claims` acking the previous one, again and again, for
`--seconds` per phase. Phases: no delay, then each `--delays` entry (`50+-25` = every link
50 +- 25 ms one way). Printed per phase: writes/s (submits and claims, each a committed
entry), submit and claim p50/p99, and leader changes (from the node logs, as scenarios.py
`_leaders` reads them). Every loop is bounded by a count and a deadline; the cluster and the
relay are always closed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from raftcron.chaos.tier2.nemesis import SUBMIT, WORKER
from raftcron.chaos.tier2.netns import Relay
from raftcron.chaos.tier2.scenarios import _leaders
from raftcron.chaos.tier2.sick_network import Sickness, SickCluster
from raftcron.cluster.dev.bench.stats import percentile

OPERATIONS_MAX = 100_000  # per phase: the deadline ends it long before
REQUEST_TIMEOUT_S = 10.0


class Leader:
    """A kept-alive HTTP connection to whoever leads; found again after an error."""

    def __init__(self, cluster: SickCluster) -> None:
        self.cluster = cluster
        self.connection: http.client.HTTPConnection | None = None
        self.errors = 0

    def post(self, path: str, body: dict[str, Any], token: str) -> dict[str, Any]:
        for _ in range(20):
            try:
                if self.connection is None:
                    host, port = self.cluster.leader(30).http_address.rsplit(":", 1)
                    self.connection = http.client.HTTPConnection(
                        host, int(port), timeout=REQUEST_TIMEOUT_S)
                self.connection.request("POST", path, json.dumps(body), {
                    "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
                answer = self.connection.getresponse()
                data = json.loads(answer.read() or b"null")
                if answer.status in (200, 201):
                    return dict(data)
            except (OSError, http.client.HTTPException, ValueError):
                pass
            self.errors += 1  # not the leader any more, or no answer: find it again
            if self.connection is not None:
                self.connection.close()
            self.connection = None
        raise RuntimeError(f"POST {path}: no answer after 20 tries")


def phase(cluster: SickCluster, seconds: float) -> dict[str, Any]:
    """One phase of the sequential client; its figures."""
    leader = Leader(cluster)
    queue = f"netbench-{uuid.uuid4().hex[:8]}"
    submits: list[float] = []
    claims: list[float] = []
    acks: list[dict[str, Any]] = []
    started_ms = int(time.time() * 1000)
    started = time.monotonic()
    for index in range(OPERATIONS_MAX):
        if time.monotonic() - started >= seconds:
            break
        began = time.monotonic()
        leader.post("/v1/jobs", {"task": "noop", "queue": queue,
                                 "request_id": f"{queue}-s{index}"}, SUBMIT)
        submits.append(time.monotonic() - began)
        began = time.monotonic()
        answer = leader.post("/v1/claims", {
            "worker": "netbench", "queues": [queue], "max": 1, "lease_ms": 30_000,
            "wait_ms": 0, "acks": acks, "request_id": f"{queue}-c{index}"}, WORKER)
        claims.append(time.monotonic() - began)
        acks = [{"id": job["id"], "token": job["token"], "outcome": "succeeded"}
                for job in answer["jobs"]]
    elapsed_s = time.monotonic() - started
    if leader.connection is not None:
        leader.connection.close()
    elected = [e for e in _leaders(cluster.base_dir) if e["t"] >= started_ms]
    return {
        "writes_s": (len(submits) + len(claims)) / elapsed_s,
        "submit_p50_ms": percentile(submits, 0.5) * 1000,
        "submit_p99_ms": percentile(submits, 0.99) * 1000,
        "claim_p50_ms": percentile(claims, 0.5) * 1000,
        "claim_p99_ms": percentile(claims, 0.99) * 1000,
        "leader_changes": len(elected),
        "retries": leader.errors,
    }


def parse_delay(text: str) -> Sickness:
    delay, _, jitter = text.partition("+-")
    return Sickness(delay_ms=float(delay), jitter_ms=float(jitter or 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raftcron.chaos.tier2.netbench")
    parser.add_argument("--seconds", type=float, default=25.0, help="per phase (default 25)")
    parser.add_argument("--delays", nargs="*", default=["50+-25"],
                        help="one-way delays on every link, one phase each (default 50+-25)")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="netbench-"))
    cluster = SickCluster(folder / "nodes", Relay(), nodes=3)
    rows: list[tuple[str, dict[str, Any]]] = []
    try:
        cluster.start()
        cluster.wait_ready(60)
        ids = [node.node_id for node in cluster.nodes]
        links = [(a, b) for a in ids for b in ids if a != b]
        for label in ["none", *args.delays]:
            cluster.sick.cure()
            if label != "none":
                for sender, receiver in links:
                    cluster.sick.sicken(sender, receiver, parse_delay(label))
            cluster.wait_ready(60)
            rows.append((label, phase(cluster, args.seconds)))
            print(f"{label}: {rows[-1][1]}", file=sys.stderr, flush=True)
    finally:
        cluster.close()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"3 nodes, fsync, one sequential client, {args.seconds:.0f} s per phase")
    print(f"{'delay (ms)':12} {'writes/s':>9} {'submit p50/p99 ms':>18} "
          f"{'claim p50/p99 ms':>17} {'leader changes':>15}")
    for label, row in rows:
        print(f"{label:12} {row['writes_s']:9.0f} "
              f"{row['submit_p50_ms']:8.0f} /{row['submit_p99_ms']:6.0f}   "
              f"{row['claim_p50_ms']:7.0f} /{row['claim_p99_ms']:6.0f}   "
              f"{row['leader_changes']:15d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
