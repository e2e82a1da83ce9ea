"""A full disk: the node stops acknowledging, says why, and recovers when space is back.

The node's data dir is a small tmpfs mounted by the test (root only), with a filler file that
the test deletes to give space back. Reproduces audit-wave2 finding 9: on 0.1.0 the node died
by SIGBUS with no log line (its journal was an mmap), and restarted on a full disk it answered
/healthz but was never ready.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

TMPFS_BYTES = 3 << 20
FILLER_BYTES = 1 << 20
BATCH = 200

pytestmark = [
    pytest.mark.processes,  # starts processes: make integration
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting a tmpfs needs root"
    ),
]


@pytest.fixture
def small_disk_node(tmp_path: Path) -> Iterator[tuple[LocalCluster, LocalNode, Path]]:
    cluster = LocalCluster(tmp_path / "c", nodes=1, raft=FAST_RAFT)
    node = cluster.configure()[0]
    node.data_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs",
                    str(node.data_dir)], check=True)
    try:
        filler = node.data_dir.parent / "data" / "filler"
        filler.write_bytes(b"\0" * FILLER_BYTES)
        cluster.start()
        cluster.wait_ready(30)
        yield cluster, node, filler
    finally:
        cluster.close()
        subprocess.run(["umount", "-l", str(node.data_dir)], check=False)


def _fill_until_refused(cluster: LocalCluster, node: LocalNode) -> list[int]:
    """Submit batches until the node stops acknowledging; the ids it acknowledged."""
    acked: list[int] = []
    payload = {"blob": "x" * 2_000}
    for number in range(TMPFS_BYTES // (BATCH * 1_000) + 20):
        jobs = [{"task": "t", "key": f"full-{number}-{i}", "payload": payload}
                for i in range(BATCH)]
        try:
            status, body, _ = cluster.request(node, "POST", "/v1/jobs/batch", {"jobs": jobs},
                                              timeout_s=10)
        except OSError:
            return acked
        if status not in (200, 201):
            return acked
        acked += [job["id"] for job in body["jobs"]]
    raise AssertionError(f"the node acknowledged {len(acked)} jobs on a {TMPFS_BYTES}-byte disk")


def test_a_full_disk_stops_acknowledgements_and_the_node_recovers_when_space_is_back(
        small_disk_node: tuple[LocalCluster, LocalNode, Path]) -> None:
    cluster, node, filler = small_disk_node
    acked = _fill_until_refused(cluster, node)
    assert acked, "nothing was acknowledged before the disk filled up"

    def says_why() -> bool:
        try:
            status, body, _ = cluster.request(node, "GET", "/readyz", timeout_s=2)
        except OSError:
            return False
        return status == 503 and body.get("storage", "ok") != "ok"

    cluster.wait_for(lambda: says_why() or None, 20, "/readyz saying the storage cannot write")
    assert node.running, f"the node died on a full disk (exit {node.process.returncode})"
    _, metrics, _ = cluster.request(node, "GET", "/metrics")
    assert 'raftcron_storage_healthy{node="n1"} 0' in metrics
    assert any("storage cannot write" in line for line in cluster.log_lines(node))

    filler.unlink()
    cluster.wait_ready(30)
    for job_id in acked[:: max(1, len(acked) // 50)] + acked[-3:]:
        status, body, _ = cluster.request(node, "GET", f"/v1/jobs/{job_id}")
        assert status == 200, f"acknowledged job {job_id} is gone after the disk filled up"
    status, body, _ = cluster.request(node, "POST", "/v1/jobs", {"task": "t", "key": "after"})
    assert status == 201 and body["id"] > max(acked)
    assert node.running
