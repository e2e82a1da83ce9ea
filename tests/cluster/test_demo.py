"""`raftcron demo` starts a cluster and a worker, fires a schedule, and stops cleanly."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import REPO_ROOT

pytestmark = pytest.mark.processes  # starts processes: make integration


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_the_demo_starts_runs_a_fire_and_stops_cleanly(tmp_path: Path, tls: bool) -> None:
    configs = LocalCluster(tmp_path).configure()  # free ports; nothing started by the harness
    command = [sys.executable, "-m", "raftcron.cluster.commandline", "demo", "--duration", "9"]
    if tls:
        command.append("--tls")
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
    scheme = "https" if tls else "http"
    urls = [f"{scheme}://{node.http_address}" for node in configs]
    assert f"API         {', '.join(urls)}" in finished.stdout
    if tls:  # the worker reached the nodes (and they each other) by verifying the demo's CA
        assert f"RAFTCRON_CA_FILE={tmp_path / 'tls' / 'ca.pem'}" in finished.stdout
        served = (tmp_path / "tls" / "n1.toml").read_text()
        assert "tls_cert_file" in served and str(tmp_path / "n1") in served
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
