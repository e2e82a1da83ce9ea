"""`raftcron bench --quick` runs every measure on a local cluster and reports each figure; a
short soak reports its records and end figures.

A smoke test of the benchmark, not a benchmark: it checks that the measures run, that their
figures are present and sane, and that nothing is left running. Speed is never asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from raftcron.cluster.dev.nodeprocesses import REPO_ROOT

pytestmark = pytest.mark.processes  # starts processes: make integration

MEASURES = "submit_single,submit_batched,drain,claim,fire,failover,scale"


def processes_marked(mark: str) -> dict[int, str]:
    """pid -> command line of every running process whose environment carries `mark`: the
    bench and what it started (children inherit the environment), never another test's or
    another checkout's nodes running on the same machine at the same time."""
    found = {}
    needle = f"RAFTCRON_TEST_MARK={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
        found[int(entry.name)] = line
    return found


def test_the_quick_bench_runs_every_measure_and_reports_its_figures() -> None:
    mark = f"bench-quick-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    finished = subprocess.run(
        [sys.executable, "-m", "raftcron.cluster.commandline", "bench", "--quick", "--json",
         "--only", MEASURES],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAFTCRON_TEST_MARK": mark},
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    figures = json.loads(finished.stdout.strip().splitlines()[-1])
    assert figures["measured"] == MEASURES.split(",")
    for name in ("submit_single_jobs_per_s", "submit_batched_jobs_per_s", "drain_jobs_per_s"):
        assert figures[name] > 0, name
    # timed from ready workers, the drain cannot be slower than with their start-up
    assert figures["drain_ready_jobs_per_s"] >= figures["drain_jobs_per_s"]
    assert 0 < figures["claim_p50_ms"] <= figures["claim_p99_ms"] <= figures["claim_max_ms"]
    assert figures["fires_seen"] > 0 and figures["fire_lateness_p99_ms"] >= 0
    assert figures["failover_kills"] == 1 and figures["failover_s"] > 0
    assert (figures["scale_schedules"], figures["scale_jobs"]) == (1_000, 20_000)
    assert figures["snapshot_bytes"] > 0 and figures["restart_to_ready_s"] > 0
    assert len(figures["rss_mb_per_node"]) == 3
    leftovers = processes_marked(mark)
    assert leftovers == {}, f"the bench left processes running: {leftovers}"


SOAK_RECORD_FIELDS = {
    "minute", "submitted", "succeeded", "submit_per_s", "succeeded_per_s", "backlog", "running",
    "state_bytes", "budget_bytes", "state_part_bytes", "kept", "evicted", "refused",
    "refused_jobs", "refusals_counted", "claims", "claim_p50_ms", "claim_p99_ms", "slow_syncs",
    "leader", "leader_changed", "rss_mb",
}


def test_a_short_soak_reports_a_record_per_interval_and_the_end_figures() -> None:
    """0.3 minutes at 1,000 jobs/s against a 4 MB budget (so finished jobs are evicted for
    room), one record every 6 s instead of every minute: the structure of what a soak
    reports, never its speed."""
    mark = f"bench-soak-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    finished = subprocess.run(
        [sys.executable, "-m", "raftcron.cluster.commandline", "bench", "--json", "--only", "soak",
         "--minutes", "0.3", "--rate", "1000", "--budget-bytes", "4000000", "--report-s", "6"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAFTCRON_TEST_MARK": mark},
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    figures = json.loads(finished.stdout.strip().splitlines()[-1])
    assert figures["measured"] == ["soak"]
    assert (figures["soak_mode"], figures["soak_rate_held_per_s"]) == ("steady", 1_000)
    assert isinstance(figures["soak_kept_up"], bool)  # the hold's verdict, said in the table
    assert 0 < figures["soak_fill_s"] < 60  # filled until the state evicts, then measured
    records = figures["soak_records"]
    assert len(records) == 3  # at 6, 12 and 18 s: the last one is the end's
    for record in records:
        assert set(record) == SOAK_RECORD_FIELDS
        assert record["budget_bytes"] == 4_000_000
        assert set(record["rss_mb"]) == {"n1", "n2", "n3"}
        assert set(record["kept"]) == {"succeeded", "failed", "cancelled"}
        assert set(record["evicted"]) == {"age", "count", "budget"}
        assert record["leader"] in {"n1", "n2", "n3", None}  # by id (None: mid-election)
        assert type(record["slow_syncs"]) is int and record["slow_syncs"] >= 0
    assert [record["minute"] for record in records] == sorted(r["minute"] for r in records)
    assert records[-1]["minute"] == pytest.approx(0.3, abs=0.05)
    assert records[-1]["submitted"] == figures["soak_submitted"] > 0
    assert figures["soak_end_snapshot_bytes"] > 0 and figures["soak_end_snapshot_s"] > 0
    assert figures["soak_end_restart_to_ready_s"] > 0
    assert "raftcron_claim_latency_seconds" in figures["soak_claim_latency_source"]
    spent = figures["soak_cpu_us_per_job"]
    if "note" not in spent:  # a leader change in 18 s is rare, and then said, never mixed
        assert spent["leader"] > 0 and spent["workers"] > 0 and len(spent["followers"]) == 2
        assert spent["total"] > spent["leader"] + spent["workers"]
    else:
        assert spent["note"].startswith(("the leader changed", "nodes restarted")), spent
    leftovers = processes_marked(mark)
    assert leftovers == {}, f"the bench left processes running: {leftovers}"


def test_an_unknown_measure_is_refused_by_name() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "raftcron.cluster.commandline", "bench", "--only", "claim,nope"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert finished.returncode == 2 and "unknown measure 'nope'" in finished.stderr, finished.stderr


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--flood", "--rate", "100"], "it takes no --rate"),
        (["--payload-kb", "60"], "--payload-kb is a --flood mode"),
        (["--minutes", "0"], "--minutes must be more than 0"),
        (["--connect", "http://127.0.0.1:9", "--budget-bytes", "4000000"], "not with --connect"),
    ],
)
def test_soak_flags_that_contradict_each_other_are_refused(flags: list[str], said: str) -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "raftcron.cluster.commandline", "bench", "--only", "soak", *flags],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert finished.returncode == 2 and said in finished.stderr, finished.stderr
