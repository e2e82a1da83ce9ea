"""`raftcron bench --quick` runs every measure on a local cluster and reports each figure.

A smoke test of the benchmark, not a benchmark: it checks that the measures run, that their
figures are present and sane, and that nothing is left running. Speed is never asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from raftcron.cluster.localcluster import REPO_ROOT

MEASURES = "submit_single,submit_batched,drain,claim,fire,failover,scale"


def raftcron_processes() -> dict[int, str]:
    """pid -> command line of every running process of ours."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue  # not a process, or gone meanwhile
        if entry.name.isdigit() and ("raftcron" in line or "raftcron.cluster.cli" in line):
            found[int(entry.name)] = line
    return found


def test_the_quick_bench_runs_every_measure_and_reports_its_figures() -> None:
    before = raftcron_processes()
    finished = subprocess.run(
        [sys.executable, "-m", "raftcron.cluster.cli", "bench", "--quick", "--json",
         "--only", MEASURES],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    figures = json.loads(finished.stdout.strip().splitlines()[-1])
    assert figures["measured"] == MEASURES.split(",")
    for name in ("submit_single_jobs_per_s", "submit_batched_jobs_per_s", "drain_jobs_per_s"):
        assert figures[name] > 0, name
    assert 0 < figures["claim_p50_ms"] <= figures["claim_p99_ms"] <= figures["claim_max_ms"]
    assert figures["fires_seen"] > 0 and figures["fire_lateness_p99_ms"] >= 0
    assert figures["failover_kills"] == 1 and figures["failover_s"] > 0
    assert (figures["scale_schedules"], figures["scale_jobs"]) == (1_000, 20_000)
    assert figures["snapshot_bytes"] > 0 and figures["restart_to_ready_s"] > 0
    assert len(figures["rss_mb_per_node"]) == 3
    leftovers = {pid: line for pid, line in raftcron_processes().items() if pid not in before}
    assert leftovers == {}, f"the bench left processes running: {leftovers}"


def test_an_unknown_measure_is_refused_by_name() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "raftcron.cluster.cli", "bench", "--only", "claim,nope"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert finished.returncode == 2 and "unknown measure 'nope'" in finished.stderr, finished.stderr
