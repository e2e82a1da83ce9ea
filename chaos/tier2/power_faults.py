"""Power loss for tier 2 (CHAOS.md "Wave 2"): nodes whose disks forget what was not synced.

What it owns: `PowerCluster`, a `ChaosCluster` whose nodes' data dirs are powerfs mounts
(chaos/powerfs: a FUSE filesystem that keeps written-but-unsynced data apart and drops it on a
cut), the power faults, and the `power` scenario's plan that mixes them with kills of the main
PID mid-snapshot (chaos/tier2/storage_faults.py):

- ``power_one``, ``power_majority``, ``power_all``: the power of one node, of a majority, of
  every node goes at once: SIGKILL of each node's process group (all of them first), then a
  torn, seeded `PowerFS.cut` of each of their mounts (every change not made durable is dropped;
  the last unsynced write of each file reaches the disk in part). Sometimes a compaction is
  forced first and the cut waits for the forked snapshot writer, so cuts also land mid-snapshot.
  The nodes are started again after 1-5 s.

Every cut is recorded in the history as a ``power_cut`` event per node (what the cut dropped:
dirty files, bytes and folders, open handles, the torn writes), and every restart as a
``power_restart`` event (did the node come back, or exit, and with which code); the checker in
chaos/tier2/checkers/storage.py counts them and fails a run in which a node did not come back
after a cut. Lost writes and divergence are judged by the jobs and convergence checkers, as after
any other fault: with ``durability = "fsync"`` (the default) nothing acknowledged may be lost.

Network namespaces: `ip netns exec` gives the node a new mount namespace that is a copy of the
harness's, made when the node starts; a mount made before then is in it (checked on this
machine: writes, fsyncs and cuts through it behave as on the host), and a cut never unmounts,
so the mounts are made once, before the first start, and both transports work.
"""

from __future__ import annotations

import contextlib
import http.client
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from raftcron.chaos.powerfs.harness import PowerFS
from raftcron.chaos.tier2.nemesis import ChaosCluster, Nemesis, wait_until
from raftcron.chaos.tier2.storage_faults import _compact_and_wait_for_writer, kill_main
from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.loopback import http_request
from raftcron.cluster.dev.nodeprocesses import LocalNode

if TYPE_CHECKING:
    from raftcron.chaos.tier2.context import Context

POWER_FAULTS = ("power_one", "power_majority", "power_all")
EXIT_WAIT_S = 10.0
BACK_WAIT_S = 30.0  # a restarted node is up (answers /healthz) or has exited by then


class PowerDisks(LocalCluster):
    """A cluster whose every data dir is a powerfs mount, its disk at ``<node folder>/disk``,
    mounted before the node first starts and stopped at `close` (the chaos suite's
    `PowerCluster`; on its own, the product's loopback cluster: chaos/tier2/diskbench.py)."""

    disks: dict[str, PowerFS]

    def configure(self) -> list[LocalNode]:
        if not hasattr(self, "disks"):
            self.disks = {}
        nodes = super().configure()
        for node in nodes:
            if node.node_id in self.disks:
                continue
            backing = node.data_dir.parent / "disk"
            backing.mkdir(parents=True, exist_ok=True)
            node.data_dir.mkdir(parents=True, exist_ok=True)
            disk = PowerFS(backing, node.data_dir, log_path=node.data_dir.parent / "powerfs.log")
            self.disks[node.node_id] = disk
            disk.start()
        return nodes

    def close(self) -> None:
        try:
            super().close()  # the nodes first: nothing may hold a mount open
        finally:
            for disk in getattr(self, "disks", {}).values():
                with contextlib.suppress(Exception):
                    disk.stop()

    def powerfs_problems(self) -> list[str]:
        """Lines of a daemon's log that say powerfs itself failed."""
        return [f"{node_id}: {line}" for node_id, disk in getattr(self, "disks", {}).items()
                for line in disk.log_tail(100_000).splitlines()
                if "powerfs bug" in line or "Traceback" in line]


class PowerCluster(PowerDisks, ChaosCluster):
    """A `ChaosCluster` on powerfs mounts (`PowerDisks`)."""


def _disks(nemesis: Nemesis) -> dict[str, PowerFS]:
    cluster = nemesis.cluster
    if not isinstance(cluster, PowerCluster):
        raise TypeError("power faults need a PowerCluster (data dirs on powerfs mounts)")
    return cluster.disks


def power_cut(nemesis: Nemesis, node_ids: Sequence[str], *, seed: int,
              mid_snapshot: bool = False) -> str:
    """Cut the power of these nodes (see the module docstring); they stay down."""
    disks = _disks(nemesis)
    kind = POWER_FAULTS[0 if len(node_ids) == 1 else
                        2 if len(node_ids) == len(nemesis.cluster.nodes) else 1]
    fault_id = nemesis._start(kind, node_ids, seed=seed, mid_snapshot=mid_snapshot)
    # mid-snapshot: the cut follows the first sight of the forked writer at once
    writers = _compact_and_wait_for_writer(nemesis, node_ids[0]) if mid_snapshot else []
    nodes = [nemesis.node(node_id) for node_id in node_ids]
    for node in nodes:  # every machine at once
        node.expected_exit = True
        if node.running:
            with contextlib.suppress(Exception):
                nemesis.cluster.send_signal(node, signal.SIGKILL)
    for node in nodes:
        if node.process is not None:
            node.process.wait(timeout=EXIT_WAIT_S)
        node.paused = False
    for number, node_id in enumerate(node_ids):
        report: dict[str, Any] = disks[node_id].cut(torn=True, seed=seed + number)
        nemesis.history.record(
            "power_cut", id=fault_id, fault=kind, node=node_id, writer_seen=bool(writers),
            generation=report.get("generation"), open_handles=report.get("open_handles"),
            dirty_files=report.get("dirty_files", 0), dirty_bytes=report.get("dirty_bytes", 0),
            dirty_dirs=report.get("dirty_dirs", 0), torn_writes=report.get("torn_writes", []),
        )
    return fault_id


def power_restore(nemesis: Nemesis, fault_id: str, node_ids: Sequence[str]) -> None:
    """Start the nodes again; record whether each came back (answers) or exited."""
    started = time.monotonic()
    nodes = [nemesis.node(node_id) for node_id in node_ids]
    for node in nodes:
        if not node.running:
            nemesis.cluster.start_node(node)
    wait_until(lambda: all(not node.running or _answers(node) for node in nodes), BACK_WAIT_S,
               poll_s=0.05)
    for node in nodes:
        code = None if node.running or node.process is None else node.process.returncode
        tail = "" if code is None else " | ".join(nemesis.cluster.log_lines(node)[-3:])[-600:]
        nemesis.history.record("power_restart", id=fault_id, node=node.node_id,
                               came_back=code is None and _answers(node), exit_code=code,
                               log_tail=tail, after_ms=int((time.monotonic() - started) * 1000))
    nemesis._end(fault_id)


def _answers(node: LocalNode) -> bool:
    try:
        return http_request(node.http_address, "GET", "/healthz", timeout_s=1.0)[0] == 200
    except (OSError, http.client.HTTPException):
        return False


def plan_power(ctx: Context) -> None:
    """Power loss of one node, of a majority, of all; kills of the main PID mid-snapshot."""
    nemesis, rng = ctx.nemesis, ctx.rng
    while ctx.left_s() > 10:
        nodes = ctx.node_ids()
        leader = ctx.leader() or rng.choice(nodes)
        roll = rng.random()
        if roll < 0.15:
            fault = kill_main(nemesis, leader if rng.random() < 0.5 else rng.choice(nodes))
            targets = [n for n in nodes if not nemesis.node(n).running]
        else:
            if roll < 0.4:
                targets = [leader if rng.random() < 0.5 else rng.choice(nodes)]
            elif roll < 0.7:
                others = [n for n in nodes if n != leader]
                targets = [leader, *rng.sample(others, len(nodes) // 2)]
            else:
                targets = list(nodes)
            fault = power_cut(nemesis, targets, seed=rng.randrange(1 << 30),
                              mid_snapshot=rng.random() < 0.3)
        ctx.hold(rng.uniform(1.0, 5.0))
        if fault in nemesis.active and nemesis.active[fault]["fault"] in POWER_FAULTS:
            power_restore(nemesis, fault, targets)
        else:
            nemesis.restart(fault, targets)
        ctx.wait_ready()
        ctx.hold(rng.uniform(1.0, 3.0))
