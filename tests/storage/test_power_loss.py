"""Power loss of all three nodes, and of a majority, loses no acknowledged job (CHAOS.md "Wave
2", issue 11 "Prove it"; docs/concepts/durability.md).

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

The cluster, the cut and the read-back are tests/storage/powered.py's.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

from .harness import Lab, api, poll, submit_keyed
from .powered import (
    READY_DEADLINE_S,
    Powered,
    cut_summary,
    every_acknowledged_job_problems,
    failure,
    power_cut,
    powered_cluster,
    restart,
)

KEYED = 100
BATCHES, BATCH_SIZE = 3, 50
STREAMED_BEFORE_CUT = 20  # acknowledged by the background stream before the power goes
FSYNC_ROUNDS = 3  # cuts in a row on one cluster (each after more acknowledged jobs)

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("needs_fuse")]


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
    assert not refused and not problems, failure(powered, refused, problems)


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
