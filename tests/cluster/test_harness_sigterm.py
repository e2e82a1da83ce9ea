"""A test run ended by SIGTERM (a CI timeout) still removes the nodes its tests started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftcron.cluster.dev.nodeprocesses import REPO_ROOT

pytestmark = pytest.mark.processes  # starts processes: make integration

INNER = '''
import os, time
import pytest
from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster

pytestmark = pytest.mark.processes  # the copied conftest refuses processes without it

def test_holds_a_node(tmp_path):
    cluster = LocalCluster(tmp_path / "c", nodes=1, raft=FAST_RAFT)
    try:
        cluster.start()
        cluster.wait_ready()
        with open(os.environ["NODE_PID_FILE"], "w") as out:
            out.write(str(cluster.nodes[0].pid))
        time.sleep(120)
    finally:
        cluster.close()
'''


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone for our purpose
        return stat.read().split(") ", 1)[1][0] != "Z"


def test_a_sigterm_to_pytest_kills_the_nodes_its_test_started(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "conftest.py").write_text((REPO_ROOT / "tests" / "conftest.py").read_text())
    pid_file = tmp_path / "node.pid"
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--basetemp={tmp_path / 'inner'}", str(tmp_path / "test_inner.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "NODE_PID_FILE": str(pid_file)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    node_pid = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and run.poll() is None:
            if pid_file.exists() and pid_file.read_text():
                node_pid = int(pid_file.read_text())
                break
            time.sleep(0.1)
        assert node_pid is not None, run.communicate(timeout=30)[0].decode()[-2000:]
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
        deadline = time.monotonic() + 15
        while alive(node_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(node_pid), "the node outlived the run that SIGTERM ended"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=10)
        if node_pid is not None and alive(node_pid):
            os.killpg(node_pid, signal.SIGKILL)  # the node this test caused, by its own PID
