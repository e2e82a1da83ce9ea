"""The sicknet smoke: real nodes and workers under latency, stalled links, one-way loss and
resets (chaos/tier2/net_faults.py) keep every safety promise, and every kind of sickness is in
the history (`raftcron chaos run --scenario sicknet --minutes 0.75`, about a minute).

As root with `ip`, the nodes live in network namespaces with the sick relay in the harness's
namespace (loss is then real packet loss by iptables); elsewhere everything is on loopback.
The leader-change bound under latency is a liveness figure: printed here, gated in the full run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftcron.chaos.tier2.checkers.network import SICK_FAULTS
from raftcron.chaos.tier2.netns import leftover_namespaces

pytestmark = pytest.mark.processes  # starts nodes and workers: make integration

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 150


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 30)
def test_the_sicknet_smoke_keeps_every_safety_promise_under_each_sickness(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "raftcron.chaos", "run", "--scenario", "sicknet",
         "--minutes", "0.75", "--seed", "27", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False,
    )
    elapsed = time.monotonic() - started
    print(done.stdout)
    print(done.stderr[-3000:], file=sys.stderr)
    assert done.returncode in (0, 2), f"sicknet failed (exit {done.returncode}):\n{done.stdout}"
    [results_path] = tmp_path.glob("*/sicknet/results.json")
    results = json.loads(results_path.read_text())
    assert results["error"] is None
    assert [r["name"] for r in results["results"] if r["safety"] and not r["ok"]] == []
    assert set(results["faults"]) == SICK_FAULTS
    history = [json.loads(line) for line in
               (results_path.parent / "history.jsonl").read_text().splitlines()]
    guard = [e for e in history if e["kind"] == "fault" and e.get("phase") == "start"
             and e.get("leader_changes_max") == 0]
    assert guard and guard[0]["delay_ms"] == 50 and guard[0]["jitter_ms"] == 25
    assert elapsed < SMOKE_TIMEOUT_S
    if os.geteuid() == 0 and shutil.which("ip"):
        assert leftover_namespaces() == []
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", "processes of the sicknet run are still alive"
