"""What the storage tests do to real `raftcron node` processes, without knowing the data dir's
layout: find the snapshot writer a node forks, kill only the main PID, wait for orphans, submit
and read back acknowledged jobs.

A process is named by its PID and its start time (from /proc), so a PID the kernel reused is
never taken for the process we saw. Only nodes the tests started, and children those nodes
forked, are ever signalled. Every wait polls a condition until a deadline.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.dev.loopback import Response, http_request
from raftcron.cluster.dev.nodeprocesses import LocalNode

T = TypeVar("T")
ADMIN_TOKEN = "storage-test-admin-token"
TOKENS = {ADMIN_TOKEN: "admin"}
POLL_S = 0.02


def poll(condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """The first truthy value of `condition`; TimeoutError at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout_s:g} s: {what}")
        time.sleep(POLL_S)


# -- processes -------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in clock ticks) of a process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rpartition(")")[2].split()  # the command name may hold spaces
    return fields[0], int(fields[1]), int(fields[19])


@dataclass(frozen=True)
class Process:
    pid: int
    started: int

    def alive(self) -> bool:
        """Still the process we saw, and not a zombie (an exited orphan nobody reaped)."""
        stat = _stat(self.pid)
        return stat is not None and stat[2] == self.started and stat[0] not in ("Z", "X")

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


def children_of(pid: int) -> set[Process]:
    """Every live process whose parent is `pid` (a scan of /proc: forks from any thread)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == pid and stat[0] not in ("Z", "X"):
                found.add(Process(int(entry.name), stat[2]))
    return found


def wait_gone(processes: list[Process], timeout_s: float) -> list[Process]:
    """Wait until every process has exited; SIGKILL the rest at the deadline (returned)."""
    with contextlib.suppress(TimeoutError):
        poll(lambda: not any(p.alive() for p in processes), timeout_s, "the processes exit")
    leftovers = [p for p in processes if p.alive()]
    for process in leftovers:
        process.signal(signal.SIGKILL)
    return leftovers


def kill_main_pid(node: LocalNode) -> None:
    """SIGKILL the node's own process only, as the OOM killer or a crash does, and reap it."""
    assert node.process is not None and node.running
    node.expected_exit = True
    os.kill(node.process.pid, signal.SIGKILL)
    node.process.wait(10)


@dataclass
class Lab:
    """Opens local clusters under one folder; `close` kills every process they started and
    every orphaned child the tests watched (also when a test failed)."""

    base_dir: Path
    clusters: list[LocalCluster] = field(default_factory=list)
    watched: list[Process] = field(default_factory=list)

    def cluster(
        self, name: str, *, nodes: int = 1, addresses: dict[str, tuple[str, str]] | None = None,
        storage: dict[str, object] | None = None,
    ) -> LocalCluster:
        """A configured, not yet started cluster (at the given (raft, http) addresses), with
        an optional [storage] table."""
        cluster = LocalCluster(self.base_dir / name, nodes=nodes, raft=FAST_RAFT, tokens=TOKENS,
                               storage=storage)
        if addresses is not None:
            cluster.base_dir.mkdir(parents=True, exist_ok=True)
            cluster.add_nodes(addresses)
        self.clusters.append(cluster)
        return cluster

    def start_snapshot(self, cluster: LocalCluster, node: LocalNode) -> Process | None:
        """Force a compaction; the child the node forks to write it (watched), or None if it
        forks none within 3 s (a node that snapshots in a thread)."""
        assert node.pid is not None
        before = children_of(node.pid)
        status, body, _ = api(cluster, node, "POST", "/v1/cluster/compact")
        assert 200 <= status < 300, f"POST /v1/cluster/compact: {status} {body}"
        with contextlib.suppress(TimeoutError):
            [child, *_] = poll(lambda: children_of(node.pid or 0) - before, 3, "a fork")
            self.watched.append(child)
            return child
        return None

    def close(self) -> None:
        try:
            for cluster in self.clusters:
                cluster.close()
        finally:
            for process in self.watched:
                process.signal(signal.SIGKILL)


# -- jobs ------------------------------------------------------------------------------------


def api(
    cluster: LocalCluster, node: LocalNode, method: str, path: str, body: Any = None
) -> Response:
    return cluster.request(node, method, path, body, token=ADMIN_TOKEN, timeout_s=15)


def fill(cluster: LocalCluster, batches: int) -> None:
    """Put in `batches` x 1,000 jobs with 400-character random payloads (slow to snapshot)."""
    for batch in range(batches):
        jobs = [{"task": "bulk", "payload": {"blob": os.urandom(200).hex()}}] * 1_000
        body = {"jobs": jobs, "request_id": f"fill-{batch}"}
        status, answer, _ = cluster.call(
            "POST", "/v1/jobs/batch", body, token=ADMIN_TOKEN, timeout_s=60
        )
        assert status == 201, f"batch {batch}: {status} {answer}"


def submit_keyed(
    cluster: LocalCluster, node: LocalNode, prefix: str, count: int, *, blob_bytes: int = 0
) -> dict[int, dict[str, Any]]:
    """`count` jobs submitted one by one to `node`, each acknowledged 201: {id: job sent}.
    Each payload holds a random blob of 2 x `blob_bytes` hex characters."""
    acked = {}
    for number in range(count):
        payload = {"n": number, "blob": os.urandom(blob_bytes).hex()}
        job = {"task": "invoice", "key": f"{prefix}-{number}", "payload": payload}
        status, body, _ = api(cluster, node, "POST", "/v1/jobs", job)
        assert status == 201, f"submit {job['key']}: {status} {body}"
        acked[int(body["id"])] = job
    return acked


def job_problems(
    cluster: LocalCluster, node: LocalNode, acked: dict[int, dict[str, Any]]
) -> list[str]:
    """How the jobs `node` holds differ from the acknowledged ones, {id: fields they must
    have} (empty: it holds them all)."""
    missing, altered = [], []
    for job_id, sent in acked.items():
        status, body, _ = api(cluster, node, "GET", f"/v1/jobs/{job_id}")
        if status == 404:
            missing.append(job_id)
        elif status != 200:
            altered.append(f"{job_id}: {status} {_short(body)}")
        elif changed := [name for name, value in sent.items() if body.get(name) != value]:
            altered.append(f"{job_id}: {', '.join(changed)} changed")
    problems = []
    if missing:
        problems.append(
            f"{node.node_id}: {len(missing)} of {len(acked)} acknowledged jobs missing "
            f"(ids {min(missing)}..{max(missing)})"
        )
    if altered:
        problems.append(f"{node.node_id}: {len(altered)} jobs altered: {altered[:3]}")
    return problems


def resubmit_problems(
    cluster: LocalCluster, node: LocalNode, acked: dict[int, dict[str, Any]]
) -> list[str]:
    """Re-submitting an acknowledged key must answer 200 with the job's own id."""
    job_id, sent = next(iter(acked.items()))
    status, body, _ = api(cluster, node, "POST", "/v1/jobs", sent)
    if status == 200 and body.get("id") == job_id:
        return []
    return [
        f"re-submitting key {sent['key']} (acknowledged as job {job_id}) gave "
        f"{status} id {_short(body).get('id')} created {_short(body).get('created')}"
    ]


def ready(node: LocalNode) -> bool:
    """The node answers /readyz with 200 now (False when it refuses or cannot be reached)."""
    try:
        answer = http_request(node.http_address, "GET", "/readyz", token=ADMIN_TOKEN, timeout_s=2)
        return answer[0] == 200
    except (OSError, http.client.HTTPException):
        return False


def _short(body: Any) -> dict[str, Any]:
    return body if isinstance(body, dict) else {"body": str(body)[:200]}
