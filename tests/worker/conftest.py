"""Fixtures of the worker tests: a real 3-node cluster on loopback (`cluster.localcluster`),
worker processes started with `python -m raftcron.cluster.worker`, and bounded waits.

Every process started here is killed at teardown, also when a test fails: workers by their
own fixture (continued first if paused), nodes by `LocalCluster.close()`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from raftcron.cluster.clients.client import Client
from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
POLL_S = 0.05


def eventually(condition: Callable[[], T], timeout_s: float = 20.0, what: str = "") -> T:
    """Poll `condition` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what or condition}")
        time.sleep(POLL_S)


def request_table_bytes(client: Client) -> int:
    """The request-id table's bytes in the cluster's state (GET /v1/settings, its usage)."""
    return int(client.request("GET", "/v1/settings")["usage"]["parts"]["requests"])


def markers(folder: Path, job_id: int, what: str) -> list[int]:
    """Tokens of the attempts of `job_id` that wrote marker `what` (see sample_tasks)."""
    return sorted(int(p.name.split(".")[1]) for p in folder.glob(f"{job_id}.*.{what}"))


class WorkerProcess:
    def __init__(self, name: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.process = process
        self.log_path = log_path
        self.paused = False

    def lines(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    entries.append(entry)
        return entries

    def events(self, action: str, job: int | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.lines()
            if e.get("action") == action and (job is None or e.get("job") == job)
        ]

    def wait_for_event(
        self, action: str, job: int | None = None, timeout_s: float = 20.0
    ) -> dict[str, Any]:
        found = eventually(
            lambda: self.events(action, job) or self._exited(),
            timeout_s,
            f"{self.name}: {action} job={job}",
        )
        assert isinstance(found, list), f"{self.name} exited: {self.log_tail()}"
        return found[0]

    def _exited(self) -> bool:
        return self.process.poll() is not None

    def log_tail(self, count: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-count:])

    def signal(self, sig: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        if self.paused:
            self.resume()
        self.signal(signal.SIGKILL)
        self.process.wait(10)

    def wait(self, timeout_s: float = 30.0) -> int:
        return self.process.wait(timeout_s)


StartWorker = Callable[..., WorkerProcess]


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the worker tests (each test uses its own queue)."""
    with LocalCluster(tmp_path_factory.mktemp("cluster"), raft=FAST_RAFT) as local:
        local.start()
        local.wait_ready(30)
        yield local


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client([node.url for node in cluster.nodes], retry_deadline_s=20) as api:
        yield api


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    """A queue of this test alone, so workers of different tests never share jobs."""
    return re.sub(r"[^A-Za-z0-9_.:\-]", "-", request.node.name)[:100]


@pytest.fixture
def start_worker(cluster: LocalCluster, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(
        queue: str, name: str, *, urls: list[str] | None = None, allow_shell: bool = True,
        extra_env: dict[str, str] | None = None, **flags: Any
    ) -> WorkerProcess:
        flags.setdefault("lease_ms", 3000)  # tests that wait for an expiry pass 1000
        flags.setdefault("wait_ms", 1000)
        argv = [
            sys.executable,
            "-m",
            "raftcron.cluster.worker",
            "--connect",
            ",".join(urls or [node.url for node in cluster.nodes]),
            "--queues",
            queue,
            "--name",
            name,
            "--import",
            "sample_tasks",
            "--path",
            str(HERE),
        ]
        if allow_shell:  # the tests' workers serve the shell task unless a test says not
            argv.append("--allow-shell")
        for flag, value in flags.items():
            argv += [f"--{flag.replace('_', '-')}", str(value)]
        log_path = tmp_path / f"{name}.log"
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1", **(extra_env or {}))
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stderr=log_file,
                stdout=log_file,
            )
        worker = WorkerProcess(name, process, log_path)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.process.pid, signal.SIGCONT)
                os.kill(worker.process.pid, signal.SIGKILL)
            worker.process.wait(10)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """`raftcron worker` configures the root logger: undo it after an in-process run."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
