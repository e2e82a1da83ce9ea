"""Power loss of all three nodes, and of a majority, loses no acknowledged job (CHAOS.md "Wave
2", issue 11 "Prove it"; README "Durability").

Each node of a real 3-node `raftcron node` cluster on loopback keeps its data dir on its own
powerfs mount (chaos/powerfs: a FUSE filesystem that keeps written-but-unsynced data apart and
drops it on a cut). Jobs are acknowledged (one by one with keys, in batches, and a stream still
running when the power goes); then the power of the chosen nodes is cut: SIGKILL of each node's
process group, all of them first, then a torn, seeded `PowerFS.cut` of each mount (every
unsynced change is dropped, the last unsynced write of each file reaches the disk in part).
After a restart every acknowledged job must be on every node with its key, a re-submit of its
key must answer 200 with its id (every job streamed just before a cut, every 10th of the
rest), and the replicas' audit digests must agree. The fsync tests cut three times in a row.

The self-test shows the test can fail: with ``durability = "os"`` (nothing fsynced) the same cut
of all three loses acknowledged jobs, or a node refuses to start naming a damaged file.

Only processes these tests start are signalled; every mount is stopped and unmounted in a
`finally`, also when a test fails.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from raftcron.chaos.powerfs.harness import PowerFS, fuse_unavailable_reason, mounted
from raftcron.cluster.dev.localcluster import LocalCluster, LocalNode

from .harness import Lab, api, job_problems, poll, ready, submit_keyed

KEYED = 100
BATCHES, BATCH_SIZE = 3, 50
STREAMED_BEFORE_CUT = 20  # acknowledged by the background stream before the power goes
READY_DEADLINE_S = 60
FSYNC_ROUNDS = 3  # cuts in a row on one cluster (each after more acknowledged jobs)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _needs_fuse() -> None:
    reason = fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(f"FUSE cannot be mounted here: {reason}")


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


class Stream:
    """Keyed submits one after another from a thread until stopped or the cluster stops
    answering; what was acknowledged with 201 is kept."""

    def __init__(self, cluster: LocalCluster, node: LocalNode, prefix: str) -> None:
        self.cluster, self.node, self.prefix = cluster, node, prefix
        self.acked: dict[int, dict[str, Any]] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        number = 0
        while not self.stopping.is_set():
            job = {"task": "invoice", "key": f"{self.prefix}-{number}", "payload": {"n": number}}
            try:
                status, body, _ = api(self.cluster, self.node, "POST", "/v1/jobs", job)
            except OSError:
                return  # the power went: this one was never acknowledged
            if status != 201:
                return
            self.acked[int(body["id"])] = job
            number += 1

    def __enter__(self) -> Stream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(30)


def acknowledge(powered: Powered, prefix: str) -> tuple[dict[int, dict[str, Any]], Stream]:
    """Keyed jobs one by one, then batches, all acknowledged; and a stream still running
    (the caller cuts the power while it is)."""
    cluster = powered.cluster
    leader = cluster.wait_ready(timeout_s=READY_DEADLINE_S)
    acked = submit_keyed(cluster, leader, prefix, KEYED)
    for batch in range(BATCHES):
        jobs = [{"task": "invoice", "key": f"{prefix}-batch{batch}-{i}", "payload": {"i": i}}
                for i in range(BATCH_SIZE)]
        body = {"jobs": jobs, "request_id": f"{prefix}-batch-{batch}"}
        status, answer, _ = api(cluster, leader, "POST", "/v1/jobs/batch", body)
        assert status == 201, f"batch {batch}: {status} {answer}"
        acked |= {int(got["id"]): sent for sent, got in zip(jobs, answer["jobs"], strict=True)}
    return acked, Stream(cluster, leader, f"{prefix}-stream")


def power_cut(powered: Powered, node_ids: list[str], seed: int) -> None:
    """SIGKILL every chosen node's process group (all first, as one power failure), reap
    them, then cut each mount torn; what each cut dropped is kept in `powered.cuts`."""
    cluster = powered.cluster
    nodes = [cluster.node(node_id) for node_id in node_ids]
    for node in nodes:
        node.expected_exit = True
        cluster.send_signal(node, signal.SIGKILL)
    for node in nodes:
        assert node.process is not None
        node.process.wait(10)
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
    powered: Powered, acked: dict[int, dict[str, Any]]
) -> list[str]:
    """What differs from "every acknowledged job on every node, its key deduped, one state"."""
    cluster = powered.cluster
    cluster.wait_ready(timeout_s=READY_DEADLINE_S)
    digests = cluster.audit(timeout_s=60)  # every node has applied everything before it
    problems = [p for node in cluster.nodes for p in job_problems(cluster, node, acked)]
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


def cut_and_check(lab: Lab, name: str, durability: str, cut: str, rounds: int) -> tuple[
        Powered, dict[int, dict[str, Any]], dict[str, tuple[int, str]], list[str]]:
    """The whole experiment, `rounds` times on one cluster (acknowledge, cut, restart, check
    everything acknowledged so far), until something is wrong; (the cluster, acknowledged
    jobs, nodes that refused to start, problems found on a cluster that started)."""
    acked: dict[int, dict[str, Any]] = {}
    refused: dict[str, tuple[int, str]] = {}
    problems: list[str] = []
    with powered_cluster(lab, name, durability) as powered:
        cluster = powered.cluster
        for round_ in range(rounds):
            prefix = f"{name}-round{round_}"
            more, stream = acknowledge(powered, prefix)
            acked |= more
            leader = cluster.leader()
            others = [node.node_id for node in cluster.nodes if node is not leader]
            victims = [leader.node_id, *others] if cut == "all" else [leader.node_id, others[0]]
            with stream:
                poll(lambda: len(stream.acked) >= STREAMED_BEFORE_CUT or  # noqa: B023
                     not stream.thread.is_alive(), 60, "the stream acknowledges jobs")  # noqa: B023
                power_cut(powered, victims, seed=sum(map(ord, prefix)))
            assert len(stream.acked) >= STREAMED_BEFORE_CUT, "the stream stopped before the cut"
            acked |= stream.acked
            refused = restart(powered, victims)
            problems = [] if refused else every_acknowledged_job_problems(powered, acked)
            if refused or problems:
                break
        return powered, acked, refused, problems


def cut_summary(powered: Powered) -> str:
    """What each cut dropped: dirty bytes and files, torn writes (path: kept/written bytes)."""
    return "; ".join(
        f"{cut['node']}: {cut['dirty_bytes']} B in {cut['dirty_files']} files, "
        f"{cut['dirty_dirs']} dirs, torn "
        + (", ".join(f"{t['path']} {t['kept_bytes']}/{t['bytes']}" for t in cut["torn_writes"])
           or "none")
        for cut in powered.cuts)


def _failure(powered: Powered, refused: dict[str, tuple[int, str]], problems: list[str]) -> str:
    lines = [*problems]
    for node_id, (code, log) in refused.items():
        lines.append(f"{node_id} refused to start (exit {code}): {log.strip().splitlines()[-1]}")
    lines += [f"cut: {cut}" for cut in powered.cuts]
    return "\n".join(lines)


@pytest.mark.parametrize("cut", ["all", "majority"])
def test_power_loss_loses_no_acknowledged_job_with_fsync(
    lab: Lab, cut: str, capsys: pytest.CaptureFixture[str]
) -> None:
    powered, acked, refused, problems = cut_and_check(lab, f"fsync-{cut}", "fsync", cut,
                                                      FSYNC_ROUNDS)
    with capsys.disabled():
        print(f"\nfsync, {FSYNC_ROUNDS} power cuts of {cut}: {len(acked)} acks; cuts dropped: "
              f"{cut_summary(powered)}")
    assert len(acked) >= FSYNC_ROUNDS * (KEYED + BATCHES * BATCH_SIZE + STREAMED_BEFORE_CUT)
    assert not refused and not problems, _failure(powered, refused, problems)


DAMAGE_NAMED = re.compile(r"(log-\d{8}\.seg|snapshot|raftcron\.storage|log\.clean)")


def test_power_loss_of_all_with_os_durability_loses_acknowledged_jobs(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    """The self-test: without fsync the same cut must lose acknowledged jobs (or leave a node
    that refuses to start, naming the damaged file). Says which happened."""
    powered, acked, refused, problems = cut_and_check(lab, "os-all", "os", "all", 1)
    for node_id, (code, log) in refused.items():
        assert code != 0, f"{node_id} exited 0 after the cut"
        assert DAMAGE_NAMED.search(log), f"{node_id} exited {code} naming no file: {log[-800:]}"
    lost = [p for p in problems if "acknowledged jobs missing" in p]
    with capsys.disabled():
        print(f"\nos durability, power cut of all 3 nodes after {len(acked)} acks "
              f"(cuts dropped: {cut_summary(powered)}): refused to start: "
              f"{sorted(refused) or 'none'}; {'; '.join(problems) or 'none'}")
    assert refused or lost, "os durability lost nothing: this test could not fail"
