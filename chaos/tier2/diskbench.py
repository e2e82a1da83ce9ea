"""Writes/s and leader elections of a 3-node cluster while one disk is sick (issue 27's table).

    python -m raftcron.chaos.tier2.diskbench [--phase-s 20] [--delay-s 2] [--keep DIR]

What it owns: one measurement, black-box. Three nodes with the product's default settings
(fsync durability, default Raft timings), each data dir on a powerfs mount
(chaos/powerfs), one sequential client (`raftcron.Client`, which follows the leader and
retries) submitting jobs, and these phases back to back, `--phase-s` each:

1. healthy;  2. the leader's fsync takes `--delay-s`;  3. healthy;
4. one follower's fsync takes `--delay-s`;  5. the leader's fsync fails with EIO.

A fault stays on the node it was put on, even once another leads. Per phase it prints the
submits acknowledged per second, the leader elections (a node that became leader, from the node
logs, counted by when it happened), the highest term any node answered before its start and
before its end (terms rise also with elections nobody won), the submits that failed, and the
sick node's `/readyz` at the phase's end. It must not be read as a pass or fail: the chaos
suite's sickdisk scenario judges; this is the figure to compare before and after a product
change.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from raftcron.chaos.tier2.disk_faults import readiness
from raftcron.chaos.tier2.nemesis import ADMIN, SUBMIT, TOKENS, wait_until
from raftcron.chaos.tier2.power_faults import PowerDisks
from raftcron.cluster.clients.client import Client
from raftcron.cluster.dev.loopback import http_request
from raftcron.cluster.dev.nodeprocesses import LocalNode

PHASES = ("healthy", "leader fsync slow", "healthy again", "follower fsync slow",
          "leader fsync EIO")
READY_TIMEOUT_S = 60.0
SUBMIT_TIMEOUT_S = 10.0
POLL_S = 0.25


class MountedCluster(PowerDisks):
    """The chaos suite's powerfs data dirs without its relay and its chaos Raft timings, on
    loopback, so the figures are the product's defaults'."""


class Submitter:
    """One sequential client: submit, wait for the answer, submit again; when each ended."""

    def __init__(self, urls: list[str]) -> None:
        self.client = Client(urls, token=SUBMIT, request_timeout_s=SUBMIT_TIMEOUT_S)
        self.acked_s: list[float] = []
        self.failed_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="diskbench-client", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            try:
                self.client.submit("diskbench", {"n": number})
                self.acked_s.append(time.time())
            except Exception:  # any failure is counted; the client already retried
                self.failed_s.append(time.time())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(SUBMIT_TIMEOUT_S * 4)
        self.client.close()


class TermWatch:
    """Polls every node's /v1/cluster a few times a second: the highest term seen, and when.
    Terms rise also with elections nobody wins (a candidate that times out again), which no
    log line shows (the role stays "candidate")."""

    def __init__(self, nodes: list[LocalNode]) -> None:
        self.nodes = nodes
        self.terms: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="diskbench-terms", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            for node in self.nodes:
                with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                    status, view, _ = http_request(node.http_address, "GET", "/v1/cluster",
                                                   token=ADMIN, timeout_s=POLL_S * 3)
                    if status == 200 and isinstance(view, dict):
                        self.terms.append((time.time(), int(view.get("term") or 0)))

    def highest(self, before_s: float) -> int:
        return max((term for t, term in self.terms if t < before_s), default=0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(POLL_S * 10)


def elections(nodes_dir: Path) -> list[float]:
    """When any node became leader (Unix seconds), from the node logs."""
    found = []
    for log_path in sorted(nodes_dir.glob("*/*.log")):
        for line in log_path.read_text(errors="replace").splitlines():
            if '"raft_role_changed"' in line and '"new": "leader"' in line:
                with contextlib.suppress(ValueError, KeyError):
                    stamp = json.loads(line)["ts"].replace("Z", "+00:00")
                    found.append(datetime.fromisoformat(stamp).timestamp())
    return sorted(found)


def measure(base: Path, phase_s: float, delay_s: float) -> list[dict[str, Any]]:
    cluster = MountedCluster(base / "nodes", tokens=TOKENS)
    submitter: Submitter | None = None
    watch: TermWatch | None = None
    rows: list[dict[str, Any]] = []
    try:
        cluster.start()
        cluster.wait_ready(READY_TIMEOUT_S)
        watch = TermWatch(list(cluster.nodes))
        wait_until(lambda: bool(watch and watch.terms), READY_TIMEOUT_S)  # a term before 1
        submitter = Submitter([node.url for node in cluster.nodes])
        submitter.start()
        for phase in PHASES:
            sick: LocalNode | None = None
            if not phase.startswith("healthy"):
                leader = cluster.leader(READY_TIMEOUT_S)
                sick = leader if phase.startswith("leader") else next(
                    n for n in cluster.nodes if n is not leader)
                faults = ({"fsync_errno": "EIO"} if phase.endswith("EIO")
                          else {"fsync_delay_s": delay_s})
                cluster.disks[sick.node_id].set_faults(**faults)
            started = time.time()
            time.sleep(phase_s)
            ended = time.time()
            rows.append({"phase": phase, "started": started, "ended": ended,
                         "sick": None if sick is None else sick.node_id,
                         "readyz": None if sick is None else readiness(sick)})
            for disk in cluster.disks.values():
                disk.clear_faults()
    finally:
        if submitter is not None:
            submitter.stop()
        if watch is not None:
            watch.stop()
        cluster.close()
    won = elections(base / "nodes")
    for row in rows:
        span = (row["started"], row["ended"])
        row["writes_per_s"] = _within(submitter.acked_s if submitter else [], span) / phase_s
        row["failed"] = _within(submitter.failed_s if submitter else [], span)
        row["elections"] = _within(won, span)
        row["terms"] = (watch.highest(span[0]), watch.highest(span[1])) if watch else (0, 0)
    return rows


def _within(times: list[float], span: tuple[float, float]) -> int:
    return sum(1 for t in times if span[0] <= t < span[1])


def table(rows: list[dict[str, Any]], phase_s: float, delay_s: float) -> str:
    lines = [f"3 nodes on powerfs, fsync durability, one sequential client, {phase_s:g} s per "
             f"phase, slow fsync = {delay_s:g} s",
             "| phase | sick node | writes/s | leader elections | highest term (start -> end) | "
             "failed submits | sick node's /readyz at the end |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        ready = row["readyz"]
        said = "-" if ready is None else f"{ready['status']} {json.dumps(ready['body'])[:90]}"
        lines.append(f"| {row['phase']} | {row['sick'] or '-'} | {row['writes_per_s']:.0f} | "
                     f"{row['elections']} | {row['terms'][0]} -> {row['terms'][1]} | "
                     f"{row['failed']} | {said} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="diskbench", description=__doc__.split("\n")[0])
    parser.add_argument("--phase-s", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--delay-s", type=float, default=2.0, help="a slow fsync's seconds")
    parser.add_argument("--keep", type=Path, default=None,
                        help="run in this folder and keep it (node logs); default: a temp dir")
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        rows = measure(args.keep.resolve(), args.phase_s, args.delay_s)
    else:
        with tempfile.TemporaryDirectory(prefix="diskbench-") as folder:
            rows = measure(Path(folder), args.phase_s, args.delay_s)
    print(table(rows, args.phase_s, args.delay_s), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
