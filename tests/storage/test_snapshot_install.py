"""A follower that restarts behind its leader's compaction gets a large snapshot, and installs it.

A snapshot goes to a follower in chunks; PySyncObj's follower answers only the last one, and a
leader that reads nothing from a connection for `raft.connection_timeout_s` drops it, with the
chunks still in its buffer. So a snapshot that takes longer than that to send never arrived:
the follower refused the joined remains, the leader sent it again, for good (480 s to restart a
node holding a million jobs, on a busy machine). Here the snapshot is made big and poorly
compressible (random payloads) so that sending it takes longer than the test cluster's 1 s
timeout, and the follower is killed as a crash does (its main PID only), the way a real
restart meets a compacted leader.
"""

from __future__ import annotations

import os
import time

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

from .harness import ADMIN_TOKEN, Lab, api, kill_main_pid, poll, ready

BATCHES = 200
PER_BATCH = 8  # one batch is one command: 8 x 60 KB stays under its 512 KiB
BLOB_BYTES = 30_000  # hex: 60 KB per payload (the limit is 64 KiB); ~96 MB of state in all
CATCH_UP_DEADLINE_S = 180  # installs in about 10-20 s on 2 busy cores


def applied_index(cluster: LocalCluster, node: LocalNode) -> int:
    status, view, _ = api(cluster, node, "GET", "/v1/cluster")
    return int(view["applied_index"]) if status == 200 else -1


def fill_poorly_compressible(cluster: LocalCluster) -> dict[int, str]:
    """Jobs with random payloads, acknowledged: {job id: key}."""
    acked = {}
    for batch in range(BATCHES):
        keys = [f"big-{batch}-{n}" for n in range(PER_BATCH)]
        jobs = [{"task": "t", "key": key, "payload": {"blob": os.urandom(BLOB_BYTES).hex()}}
                for key in keys]
        status, body, _ = cluster.call("POST", "/v1/jobs/batch",
                                       {"jobs": jobs, "request_id": f"big-{batch}"},
                                       token=ADMIN_TOKEN, timeout_s=60)
        assert status == 201, f"batch {batch}: {status} {str(body)[:200]}"
        acked |= {view["id"]: key for view, key in zip(body["jobs"], keys, strict=True)}
    return acked


def test_a_large_snapshot_reaches_a_follower_that_restarted_behind_the_compaction(
        lab: Lab) -> None:
    cluster = lab.cluster("install", nodes=3)
    cluster.start()
    leader = cluster.wait_ready(60)
    follower = next(node for node in cluster.nodes if node is not leader)
    kill_main_pid(follower)
    acked = fill_poorly_compressible(cluster)
    # Both live members compact: whichever leads when the follower is back (leadership may
    # move on a busy machine during the fill) has no log to send it, only its snapshot.
    live = [node for node in cluster.nodes if node is not follower]
    for node in live:
        snapshot = node.data_dir / "snapshot"
        before = snapshot.stat().st_mtime if snapshot.exists() else 0.0
        status, body, _ = api(cluster, node, "POST", "/v1/cluster/compact")
        assert status == 202, body
        poll(lambda: snapshot.exists() and snapshot.stat().st_mtime > before,  # noqa: B023
             120, f"{node.node_id}'s snapshot after its compaction")
    size = min((node.data_dir / "snapshot").stat().st_size for node in live)
    assert size > 30_000_000, f"the snapshot is {size} bytes: too small to outlast the timeout"
    target = max(applied_index(cluster, node) for node in live)
    started = time.monotonic()
    cluster.start_node(follower)
    try:
        poll(lambda: ready(follower) and applied_index(cluster, follower) >= target,
             CATCH_UP_DEADLINE_S, "the restarted follower caught up")
    finally:
        lines = cluster.log_lines(follower)
        refused = [line for line in lines if "snapshot_install_refused" in line]
    caught_up_s = time.monotonic() - started
    assert any("installed the leader's snapshot" in line for line in lines), lines[-20:]
    assert len(refused) <= 1, refused  # a transfer cut by a slow start, at most, not a loop
    for job_id, key in list(acked.items())[:: len(acked) // 10]:
        status, job, _ = api(cluster, follower, "GET", f"/v1/jobs/{job_id}")
        assert status == 200 and job["key"] == key, (job_id, status)
    print(f"snapshot {size:,} bytes; follower caught up {caught_up_s:.1f} s after its restart")
