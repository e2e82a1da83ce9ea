"""A 3-node `raftcron node` cluster whose data dirs are powerfs mounts, and what the power-loss
tests do to it: cut the power of some or all nodes (SIGKILL of each process group, then a
torn, seeded `PowerFS.cut` of each mount), start them again, and read back every acknowledged
job on every node (tests/storage/test_power_loss.py, test_power_loss_archive.py).

Only processes these helpers start are signalled; every mount is stopped and unmounted in a
`finally`, also when a test fails.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from raftcron.chaos.powerfs.harness import PowerFS, mounted
from raftcron.cluster.dev.localcluster import LocalCluster

from .harness import Lab, api, job_problems, poll, ready

READY_DEADLINE_S = 60


@dataclass
class Powered:
    """A configured 3-node cluster whose data dirs are powerfs mounts."""

    cluster: LocalCluster
    disks: dict[str, PowerFS]
    cuts: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def powered_cluster(lab: Lab, name: str, durability: str) -> Iterator[Powered]:
    """Mount a powerfs at each node's data dir (the disk under `<name>-disks/`), start the
    nodes; afterwards kill them and unmount, whatever happened."""
    cluster = lab.cluster(name, nodes=3, storage={"durability": durability})
    disks: dict[str, PowerFS] = {}
    try:
        for node in cluster.configure():
            backing = lab.base_dir / f"{name}-disks" / node.node_id
            backing.mkdir(parents=True)
            node.data_dir.mkdir(parents=True)
            disk = PowerFS(backing, node.data_dir, log_path=backing.parent / f"{node.node_id}.log")
            disks[node.node_id] = disk
            disk.start()
        cluster.start()
        yield Powered(cluster, disks)
    finally:
        try:
            cluster.close()  # the nodes first: nothing may hold the mounts open
        finally:
            for disk in disks.values():
                with contextlib.suppress(Exception):
                    disk.stop()
    for node_id, disk in disks.items():
        assert not mounted(disk.mountpoint), f"{node_id}'s powerfs is still mounted"
        log = disk.log_tail(100_000)
        assert "powerfs bug" not in log and "Traceback" not in log, f"{node_id}: {log}"


def power_cut(powered: Powered, node_ids: list[str], seed: int,
              others: Sequence[subprocess.Popen[Any]] = ()) -> None:
    """SIGKILL every chosen node's process group (all first, as one power failure) and the
    `others` (processes of the test's own that use the mounts: they go with the power), reap
    them, then cut each mount torn; what each cut dropped is kept in `powered.cuts`."""
    cluster = powered.cluster
    nodes = [cluster.node(node_id) for node_id in node_ids]
    for node in nodes:
        node.expected_exit = True
        cluster.send_signal(node, signal.SIGKILL)
    for process in others:
        process.kill()
    for node in nodes:
        assert node.process is not None
        node.process.wait(10)
    for process in others:
        process.wait(10)
    for number, node in enumerate(nodes):
        report = powered.disks[node.node_id].cut(torn=True, seed=seed + number)
        report.pop("paths", None)
        powered.cuts.append({"node": node.node_id, **report})


def restart(powered: Powered, node_ids: list[str]) -> dict[str, tuple[int, str]]:
    """Start the nodes; wait until each is ready or has exited. {node_id: (exit code, log)}
    of those that exited (empty: every node is ready)."""
    cluster = powered.cluster
    nodes = [cluster.node(node_id) for node_id in node_ids]
    for node in nodes:
        cluster.start_node(node)
    poll(lambda: all(not node.running or ready(node) for node in nodes), READY_DEADLINE_S,
         "every restarted node is ready or has exited")
    exited = {}
    for node in nodes:
        if not node.running:
            assert node.process is not None
            node.expected_exit = True
            exited[node.node_id] = (node.process.returncode,
                                    node.log_path.read_text(errors="replace"))
    return exited


def every_acknowledged_job_problems(
    powered: Powered, acked: dict[int, dict[str, Any]], *, ended: dict[int, str] | None = None
) -> list[str]:
    """What differs from "every acknowledged job on every node, its key deduped, one state".
    `ended`: {id: status} of the jobs whose end was acknowledged too; each must be found in
    that status (live, or archived once it left the state)."""
    cluster = powered.cluster
    cluster.wait_ready(timeout_s=READY_DEADLINE_S)
    digests = cluster.audit(timeout_s=60)  # every node has applied everything before it
    ended = ended or {}
    expected = {job_id: sent | ({"status": ended[job_id]} if job_id in ended else {})
                for job_id, sent in acked.items()}
    problems = [p for node in cluster.nodes for p in job_problems(cluster, node, expected)]
    if len(set(digests.values())) != 1:
        problems.append(f"the replicas diverged: audit digests {digests}")
    leader = cluster.leader()
    # every key streamed just before a cut (the writes most at risk), every 10th of the rest
    resubmitted = [(job_id, sent) for number, (job_id, sent) in enumerate(acked.items())
                   if "-stream-" in sent["key"] or number % 10 == 0]
    for job_id, sent in resubmitted:
        status, body, _ = api(cluster, leader, "POST", "/v1/jobs", sent)
        if status != 200 or body.get("id") != job_id:
            problems.append(f"re-submitting key {sent['key']} (job {job_id}) answered {status} "
                            f"{body if not isinstance(body, dict) else body.get('id')}")
            break
    return problems


def cut_summary(powered: Powered) -> str:
    """What each cut dropped: dirty bytes and files, torn writes (path: kept/written bytes)."""
    return "; ".join(
        f"{cut['node']}: {cut['dirty_bytes']} B in {cut['dirty_files']} files, "
        f"{cut['dirty_dirs']} dirs, torn "
        + (", ".join(f"{t['path']} {t['kept_bytes']}/{t['bytes']}" for t in cut["torn_writes"])
           or "none")
        for cut in powered.cuts)


def failure(powered: Powered, refused: dict[str, tuple[int, str]], problems: list[str]) -> str:
    """Problems found, nodes that refused to start (their last log line), and every cut."""
    lines = [*problems]
    for node_id, (code, log) in refused.items():
        lines.append(f"{node_id} refused to start (exit {code}): {log.strip().splitlines()[-1]}")
    lines += [f"cut: {cut}" for cut in powered.cuts]
    return "\n".join(lines)
