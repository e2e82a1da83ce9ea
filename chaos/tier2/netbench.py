"""What a sick network costs the cluster: `python -m raftcron.chaos.tier2.netbench`.

Three nodes (fsync durability, the suite's Raft timings `CHAOS_RAFT`) behind the loopback
`SickRelay`, one sequential client on a kept-alive connection to the leader: submit a job,
then claim it through `POST /v1/claims` acking the previous one, again and again, for
`--seconds` per phase. Phases (`--phases`, see `PHASES`): no delay, `50+-25` (every link
50 +- 25 ms one way), and the other sicknesses of chaos/tier2/sick_network.py. Printed per
phase: writes/s (submits and claims, each a committed entry), submit and claim p50/p99, leader
changes (from the node logs, as scenarios.py `_leaders` reads them) and requests the client
had to send again (an error or no answer). Every loop is bounded by a count and a deadline;
the cluster and the relay are always closed.
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
from raftcron.chaos.tier2.sick_network import SickCluster, Sickness
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


def phase(cluster: SickCluster, seconds: float, *, reset_every_s: float | None = None,
          reset_host: str | None = None) -> dict[str, Any]:
    """One phase of the sequential client; its figures. With reset_every_s, `reset_host`'s
    connections are reset that often."""
    leader = Leader(cluster)
    queue = f"netbench-{uuid.uuid4().hex[:8]}"
    submits: list[float] = []
    claims: list[float] = []
    acks: list[dict[str, Any]] = []
    started_ms = int(time.time() * 1000)
    started = last_reset = time.monotonic()
    for index in range(OPERATIONS_MAX):
        if time.monotonic() - started >= seconds:
            break
        if reset_every_s and reset_host and time.monotonic() - last_reset >= reset_every_s:
            cluster.sick.reset(reset_host)
            last_reset = time.monotonic()
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


def sicken(cluster: SickCluster, label: str) -> dict[str, Any]:
    """Make the phase `label` sick (see `PHASES`); the arguments `phase` needs for it."""
    ids = [node.node_id for node in cluster.nodes]
    leader = cluster.leader(30).node_id
    follower = next(n for n in ids if n != leader)
    relay = cluster.sick
    relay.cure()
    if "+-" in label:
        delay, _, jitter = label.partition("+-")
        for sender in ids:
            for receiver in ids:
                if sender != receiver:
                    relay.sicken(sender, receiver, Sickness(delay_ms=float(delay),
                                                            jitter_ms=float(jitter)))
    elif label.startswith("loss-"):
        for receiver in ids:
            if receiver != leader:
                relay.sicken(leader, receiver, Sickness(loss=float(label[5:]) / 100))
    elif label.startswith("stall-"):
        pairs = {"stall-l2f": [(leader, follower)], "stall-f2l": [(follower, leader)],
                 "stall-both": [(leader, follower), (follower, leader)]}[label]
        for sender, receiver in pairs:
            relay.sicken(sender, receiver, Sickness(stalled=True))
    elif label == "reset-5s":
        return {"reset_every_s": 5.0, "reset_host": leader}
    elif label != "none":
        raise SystemExit(f"unknown phase {label!r}; known: {', '.join(PHASES)}")
    return {}


# none; latency on every link (one way, D+-J ms); the leader's outgoing links losing P %
# (chunks retransmitted after RTO); a stalled link for the whole phase (leader to a follower,
# a follower to the leader, both ways); the leader's connections reset every 5 s.
PHASES = ["none", "50+-25", "150+-50", "loss-10", "stall-l2f", "stall-f2l", "stall-both",
          "reset-5s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raftcron.chaos.tier2.netbench")
    parser.add_argument("--seconds", type=float, default=25.0, help="per phase (default 25)")
    parser.add_argument("--phases", nargs="*", default=["none", "50+-25"],
                        help=f"in order (default: none 50+-25); known: {' '.join(PHASES)}; "
                        "any D+-J and loss-P too")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="netbench-"))
    cluster = SickCluster(folder / "nodes", Relay(), nodes=3)
    rows: list[tuple[str, dict[str, Any]]] = []
    try:
        cluster.start()
        cluster.wait_ready(60)
        for label in args.phases:
            cluster.sick.cure()
            cluster.wait_ready(60)
            rows.append((label, phase(cluster, args.seconds, **sicken(cluster, label))))
            print(f"{label}: {rows[-1][1]}", file=sys.stderr, flush=True)
    finally:
        cluster.close()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"3 nodes, fsync, one sequential client, {args.seconds:.0f} s per phase")
    print(f"{'phase':12} {'writes/s':>9} {'submit p50/p99 ms':>18} "
          f"{'claim p50/p99 ms':>17} {'leader changes':>15} {'retries':>8}")
    for label, row in rows:
        print(f"{label:12} {row['writes_s']:9.0f} "
              f"{row['submit_p50_ms']:8.0f} /{row['submit_p99_ms']:6.0f}   "
              f"{row['claim_p50_ms']:7.0f} /{row['claim_p99_ms']:6.0f}   "
              f"{row['leader_changes']:15d} {row['retries']:8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
