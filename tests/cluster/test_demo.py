"""`raftcron demo` starts a cluster and a worker, fires a schedule, and stops cleanly."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raftcron.cluster.dev.localcluster import REPO_ROOT, LocalCluster

pytestmark = pytest.mark.processes  # starts processes: make integration


def test_the_demo_starts_runs_a_fire_and_stops_cleanly(tmp_path: Path) -> None:
    configs = LocalCluster(tmp_path).configure()  # free ports; nothing started by the harness
    command = [sys.executable, "-m", "raftcron.cluster.cli", "demo", "--duration", "9"]
    for node in configs:
        command += ["--config", str(node.config_path)]
    finished = subprocess.run(
        command,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "dashboard" in finished.stdout and finished.stdout.rstrip().endswith(
        "raftcron demo: stopped"
    )
    logs = tmp_path / "logs"
    fired = [
        json.loads(line)
        for line in (logs / "worker.log").read_text().splitlines()
        if '"job_succeeded"' in line
    ]
    assert fired, "no demo job ran"
    assert '"worker_stopped"' in (logs / "worker.log").read_text()
    for pid in map(int, re.findall(r"pid (\d+)", finished.stdout)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"process {pid} outlived the demo")
