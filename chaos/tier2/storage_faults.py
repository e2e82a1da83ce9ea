"""Storage faults for tier 2 (CHAOS.md "Wave 2"): what real machines do to a node's disk.

What it owns: the faults that aim at a node's storage, and the plan that mixes them:

- ``kill_main``: SIGKILL of the node's main PID only (what the OOM killer and a crash do), while
  its snapshot writer runs: compaction is forced first and the kill waits until the forked
  writer is seen. The writer must not outlive its node (it would rename a stale snapshot).
- ``term_group``: SIGTERM to the node's whole process group mid-snapshot (systemd's
  ``KillMode=control-group`` restart); a clean stop is required within the bound.
- ``damage``: the node is stopped, one file of its data dir is damaged (a bit flipped in the
  newest segment or the snapshot, a segment or the snapshot deleted) and the node started: it
  must refuse, exit non-zero and name the file; then the file is put back and the node rejoins.

Every fault is recorded in the history with what was seen (``writer_seen``, ``writer_outlived``,
``exit_code``, ``named``) as ``storage_fault`` events, which
`chaos.checkers.storage` judges. Compaction runs often in
the scenario that uses these (`STORAGE_RAFT`), so plain kills also land around snapshots.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from raftcron.chaos.tier2.nemesis import ADMIN, CHAOS_RAFT, Nemesis, wait_until

if TYPE_CHECKING:
    from raftcron.chaos.tier2.context import Context

STORAGE_RAFT: dict[str, object] = {
    **CHAOS_RAFT,
    "compaction_min_entries": 400,  # a snapshot every few seconds under the workload
    "compaction_min_time_s": 5.0,
}
WRITER_WAIT_S = 5.0
EXIT_WAIT_S = 15.0


def snapshot_writers(pid: int) -> list[int]:
    """Children of any thread of process `pid` (the fork happens on PySyncObj's thread)."""
    children: list[int] = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as listing:
                children += [int(child) for child in listing.read().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return children


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _compact_and_wait_for_writer(nemesis: Nemesis, node_id: str) -> list[int]:
    node = nemesis.node(node_id)
    if node.pid is None:
        return []
    with contextlib.suppress(Exception):  # a busy node may snapshot anyway: look for it
        nemesis.cluster.request(node, "POST", "/v1/cluster/compact", {}, token=ADMIN)
    found: list[int] = []

    def writer_seen() -> bool:
        found.extend(snapshot_writers(node.pid or 0))
        return bool(found)

    wait_until(writer_seen, WRITER_WAIT_S, poll_s=0.005)
    return sorted(set(found))


def kill_main(nemesis: Nemesis, node_id: str, *, group_sigterm: bool = False) -> str:
    """Kill a node mid-snapshot (see the module docstring); the node stays down."""
    kind = "term_group" if group_sigterm else "kill_main"
    node = nemesis.node(node_id)
    writers = _compact_and_wait_for_writer(nemesis, node_id)
    fault_id = nemesis._start(kind, [node_id], writer_seen=bool(writers))
    node.expected_exit = True
    pid = node.pid
    if pid is not None and node.process is not None:
        if group_sigterm:
            os.killpg(pid, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGKILL)
        try:
            node.process.wait(timeout=EXIT_WAIT_S)
        except Exception:
            os.killpg(pid, signal.SIGKILL)
            node.process.wait(timeout=EXIT_WAIT_S)
            nemesis.history.record("note", text=f"{node_id} ignored SIGTERM for {EXIT_WAIT_S} s")
    outlived = [w for w in writers if not wait_until(lambda w=w: not _alive(w), 5.0, 0.02)]
    for writer in outlived:  # never leave one behind: it is this run's process
        os.kill(writer, signal.SIGKILL)
    nemesis.history.record("storage_fault", id=fault_id, fault=kind, writer_seen=bool(writers),
                           writer_outlived=bool(outlived),
                           exit_code=node.process.returncode if node.process else None)
    return fault_id


def damage(nemesis: Nemesis, node_id: str, kind: str) -> str:
    """Stop a node, damage one file, start it: it must refuse. Then undo and restart."""
    node = nemesis.node(node_id)
    nemesis.cluster.stop(node)
    backup = Path(str(node.data_dir) + ".before-damage")
    shutil.rmtree(backup, ignore_errors=True)
    shutil.copytree(node.data_dir, backup, ignore=shutil.ignore_patterns("LOCK"))
    target = _damage_target(node.data_dir, kind)
    fault_id = nemesis._start("damage", [node_id], how=kind,
                              file=None if target is None else target.name)
    if target is None:
        nemesis.history.record("storage_fault", id=fault_id, fault="damage", how=kind,
                               skipped="no such file")
        nemesis._end(fault_id)
        shutil.rmtree(backup, ignore_errors=True)
        nemesis.cluster.start_node(node)
        return fault_id
    if kind.startswith("delete"):
        target.unlink()
    else:
        with target.open("r+b") as file:
            file.seek(target.stat().st_size // 2)
            byte = file.read(1)
            file.seek(-1, os.SEEK_CUR)
            file.write(bytes([byte[0] ^ 0x10]))
    nemesis.cluster.start_node(node)
    exited = wait_until(lambda: node.process is not None and node.process.poll() is not None,
                        EXIT_WAIT_S)
    code = node.process.returncode if node.process is not None else None
    named = any(target.name in line for line in nemesis.cluster.log_lines(node)[-20:])
    if not exited:
        node.expected_exit = True
        nemesis.cluster.kill(node)
    node.expected_exit = True
    nemesis.history.record("storage_fault", id=fault_id, fault="damage", how=kind,
                           file=target.name, exit_code=code if exited else None, named=named)
    shutil.rmtree(node.data_dir)
    shutil.move(str(backup), node.data_dir)
    nemesis.cluster.start_node(node)
    nemesis._end(fault_id)
    return fault_id


def _damage_target(data_dir: Path, kind: str) -> Path | None:
    segments = sorted(data_dir.glob("log-*.seg"))
    if kind in ("flip_segment", "delete_segment"):
        return segments[-1] if segments else None
    snapshot = data_dir / "snapshot"
    return snapshot if snapshot.exists() else None


def plan_storage(ctx: Context) -> None:
    """Kills of the main PID and group SIGTERMs mid-snapshot, damaged files, plain kills."""
    nemesis, rng = ctx.nemesis, ctx.rng
    while ctx.left_s() > 10:
        nodes = ctx.node_ids()
        roll = rng.random()
        target = ctx.leader() if rng.random() < 0.4 else None
        target = target or rng.choice(nodes)
        if roll < 0.5:
            fault = kill_main(nemesis, target)
        elif roll < 0.75:
            fault = kill_main(nemesis, target, group_sigterm=True)
        elif roll < 0.9:
            damage(nemesis, target, rng.choice(
                ["flip_segment", "delete_segment", "flip_snapshot", "delete_snapshot"]))
            ctx.wait_ready()
            ctx.hold(rng.uniform(1.0, 2.0))
            continue
        else:
            fault = nemesis.kill([target])
        ctx.hold(rng.uniform(1.0, 3.0))
        nemesis.restart(fault, [target])
        ctx.wait_ready()
        ctx.hold(rng.uniform(1.0, 3.0))
