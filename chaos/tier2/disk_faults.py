"""Sick disks for tier 2 (CHAOS.md "Wave 3", DESIGN.md §9.3): slow and failing, not dead.

What it owns: the disk faults, injected through the powerfs mount under a node's data dir
(`PowerFS.set_faults`, chaos/powerfs/faults.py; the cluster is a `PowerCluster`), and the
`sickdisk` scenario's plan, which injects them one at a time, holds each for seconds while the
workload runs, heals it, and waits for the cluster:

- ``fsync_stall``: every fsync of one node (the leader, or a follower) sleeps 0.5-5 s (+-25%).
  Its start event carries ``elections_max``, the bound of checkers/disk.py (0 for a follower,
  1 for the leader: DESIGN.md §9.3) and ``settle_ms``: an fsync that began before the heal still
  sleeps out its delay, so elections are counted until then and a little after.
- ``write_eio``: writes of one node fail with EIO. A failed write recovers by itself.
- ``fsync_eio``: fsyncs of one node fail with EIO and lose their data, as Linux does. The node
  must latch (never acknowledge that data; unready until restarted), so after the heal it is
  restarted, through a power cut of its disk (kill -9 of its group, then `PowerFS.cut`): what
  the failed fsyncs lost is then gone for good, so a node that went on as if a later fsync had
  saved it ("fsyncgate") shows as lost acknowledged jobs or divergence to the safety checkers.
  What its `/readyz` said during the fault and after the heal is recorded.
- ``read_eio``: reads of one node fail with EIO; the node is also restarted while the fault is
  on, so its start-up reads meet it (a running node reads little, and mostly from its cache).
  It may refuse to start, naming the damage: it is started again after the heal.
- ``read_only``: one node's disk turns read-only (EROFS); writes recover by themselves, but an
  fsync that had data to write failed too, so a node still unready after the heal with "fsync"
  in its `/readyz` is restarted.

Each fault is a ``fault`` start/end pair in the history, with ``disk_fault`` events between:
what powerfs injected (counts), the node's `/readyz` answers, and ``disk_restart`` events
(whether the node came back, its exit code, its log's last lines), which checkers/disk.py
judges; lost writes and divergence are judged by the safety checkers as after any fault.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from typing import TYPE_CHECKING, Any

from raftcron.chaos.powerfs.harness import PowerFS
from raftcron.chaos.tier2.nemesis import Nemesis, wait_until
from raftcron.chaos.tier2.power_faults import PowerCluster
from raftcron.cluster.dev.loopback import http_request
from raftcron.cluster.dev.nodeprocesses import ClusterError, LocalNode

if TYPE_CHECKING:
    from raftcron.chaos.tier2.context import Context

DISK_FAULTS = ("fsync_stall", "write_eio", "fsync_eio", "read_eio", "read_only")
ERRNO_FAULTS: dict[str, dict[str, Any]] = {
    "write_eio": {"write_errno": "EIO"},
    "fsync_eio": {"fsync_errno": "EIO"},
    "read_only": {"read_only": True},
}
STALL_JITTER = 0.25  # of the delay, either way
SETTLE_S = 2.0  # after a stall's last fsync returns: an election it caused is counted
STOP_TIMEOUT_S = 15.0
BACK_WAIT_S = 30.0  # a restarted node answers /readyz 200 by then, or is recorded as not back
EXIT_WAIT_S = 10.0  # a node started on a disk that fails reads exits, or is recorded running
QUICK_DURATION_S = 60.0  # shorter runs (the smoke) hold each fault for less and stall less


def _disk(nemesis: Nemesis, node_id: str) -> PowerFS:
    cluster = nemesis.cluster
    if not isinstance(cluster, PowerCluster):
        raise TypeError("disk faults need a PowerCluster (data dirs on powerfs mounts)")
    return cluster.disks[node_id]


def readiness(node: LocalNode) -> dict[str, Any]:
    """The node's /readyz answer: {"status": 200|503|0, "body": ...} (0: no answer)."""
    try:
        status, body, _ = http_request(node.http_address, "GET", "/readyz", timeout_s=2.0)
    except (OSError, http.client.HTTPException) as error:
        return {"status": 0, "body": repr(error)[:200]}
    return {"status": status, "body": body}


def inject(nemesis: Nemesis, kind: str, node_id: str, faults: dict[str, Any],
           **fields: Any) -> tuple[str, dict[str, int]]:
    """Start a disk fault on one node: a `fault` start event, then powerfs makes it so.
    (fault id, what the disk had injected before: `heal` counts from there)."""
    fault_id = nemesis._start(kind, [node_id], disk=faults, **fields)
    reply = _disk(nemesis, node_id).set_faults(**faults)
    nemesis.history.record("disk_fault", id=fault_id, fault=kind, node=node_id, op="set",
                           faults=reply.get("faults"))
    return fault_id, dict(reply.get("injected") or {})


def heal(nemesis: Nemesis, fault_id: str, node_id: str, before: dict[str, int]) -> None:
    """Make the disk healthy again; record what powerfs injected meanwhile. Not the end of
    the fault yet: the plan may restart the node first."""
    disk = _disk(nemesis, node_id)
    reply = disk.clear_faults()
    injected = {what: count - before.get(what, 0)
                for what, count in (reply.get("injected") or {}).items()
                if count > before.get(what, 0)}
    nemesis.history.record("disk_fault", id=fault_id, node=node_id, op="healed",
                           injected=injected, readyz=readiness(nemesis.node(node_id)))


def restart(nemesis: Nemesis, fault_id: str, node_id: str, why: str, *,
            power_cut: bool = False) -> bool:
    """Stop the node (SIGTERM, SIGKILL past the bound; with `power_cut`, SIGKILL of its group
    and a cut of its disk) if it runs, start it, and wait until it is ready; a `disk_restart`
    event says how that went. Whether it came back."""
    node = nemesis.node(node_id)
    started = time.monotonic()
    exit_code: int | None = None
    clean_stop = not power_cut
    cut: dict[str, Any] = {}
    if power_cut:
        nemesis.cluster.kill(node)
        report = _disk(nemesis, node_id).cut()
        cut = {k: report.get(k) for k in ("dirty_files", "dirty_bytes", "lost_files",
                                         "lost_bytes")}
    elif node.running:
        try:
            exit_code = nemesis.cluster.stop(node, timeout_s=STOP_TIMEOUT_S)
        except ClusterError:
            clean_stop = False  # killed by stop(); its stacks are in its log
    elif node.process is not None:
        exit_code = node.process.returncode
    nemesis.cluster.start_node(node)
    came_back = wait_until(lambda: readiness(node)["status"] == 200, BACK_WAIT_S, poll_s=0.2)
    tail = "" if came_back else " | ".join(nemesis.cluster.log_lines(node)[-4:])[-800:]
    nemesis.history.record("disk_restart", id=fault_id, node=node_id, why=why,
                           clean_stop=clean_stop, exit_code=exit_code, came_back=came_back,
                           power_cut=cut or None,
                           readyz=readiness(node), log_tail=tail,
                           after_ms=int((time.monotonic() - started) * 1000))
    return came_back


def fsync_stall(ctx: Context, node_id: str, *, on_leader: bool, delay_s: float,
                hold_s: float) -> None:
    jitter_s = round(delay_s * STALL_JITTER, 3)
    settle_ms = int((delay_s + jitter_s + SETTLE_S) * 1000)
    fault_id, before = inject(
        ctx.nemesis, "fsync_stall", node_id, {"fsync_delay_s": delay_s, "fsync_jitter_s": jitter_s},
        role="leader" if on_leader else "follower", elections_max=1 if on_leader else 0,
        settle_ms=settle_ms)
    ctx.hold(hold_s)
    heal(ctx.nemesis, fault_id, node_id, before)
    ctx.nemesis._end(fault_id, settle_ms=settle_ms)
    ctx.hold(settle_ms / 1000)  # the next fault starts after this one's elections counted
    ctx.wait_ready()


def errno_fault(ctx: Context, kind: str, node_id: str, hold_s: float) -> None:
    """write_eio, fsync_eio or read_only on one node, healed after hold_s."""
    faults = ERRNO_FAULTS[kind]
    role = "leader" if ctx.leader() == node_id else "follower"
    fault_id, before = inject(ctx.nemesis, kind, node_id, faults, role=role)
    ctx.hold(hold_s)
    node = ctx.nemesis.node(node_id)
    ctx.history.record("disk_fault", id=fault_id, node=node_id, op="during",
                       readyz=readiness(node))
    heal(ctx.nemesis, fault_id, node_id, before)
    if kind == "fsync_eio":
        restart(ctx.nemesis, fault_id, node_id, "fsync failed: the latch holds until a restart",
                power_cut=True)
    elif not wait_until(lambda: readiness(node)["status"] == 200, BACK_WAIT_S / 2, poll_s=0.2):
        body = json.dumps(readiness(node)["body"], default=str)
        if "fsync" in body:
            restart(ctx.nemesis, fault_id, node_id, f"unready after the heal: {body[:200]}")
        else:
            ctx.history.record("disk_fault", id=fault_id, node=node_id, op="unready",
                               readyz=body[:400])
    ctx.nemesis._end(fault_id)
    ctx.wait_ready()


def read_eio(ctx: Context, node_id: str, hold_s: float) -> None:
    """Reads fail; the node is restarted into the fault, so its start-up reads meet it."""
    nemesis = ctx.nemesis
    node = nemesis.node(node_id)
    role = "leader" if ctx.leader() == node_id else "follower"
    fault_id, before = inject(nemesis, "read_eio", node_id, {"read_errno": "EIO"}, role=role)
    node.expected_exit = True  # it may stop, naming the damage: that is allowed, not a crash
    ctx.hold(hold_s)
    if not node.running:
        code = node.process.returncode if node.process is not None else None
        nemesis.history.record("disk_fault", id=fault_id, node=node_id, op="exited_running",
                               exit_code=code,
                               log_tail=" | ".join(nemesis.cluster.log_lines(node)[-3:])[-800:])
    nemesis.cluster.kill(node)
    nemesis.cluster.start_node(node)
    node.expected_exit = True  # as above: it may refuse to start
    exited = wait_until(lambda: not node.running, EXIT_WAIT_S, poll_s=0.1)
    lines = nemesis.cluster.log_lines(node)[-20:]
    nemesis.history.record(
        "disk_fault", id=fault_id, node=node_id, op="started_on_failing_reads",
        exited=exited, exit_code=node.process.returncode if exited and node.process else None,
        named=any("Input/output error" in line or "EIO" in line for line in lines),
        readyz=None if exited else readiness(node), log_tail=" | ".join(lines[-3:])[-800:])
    heal(nemesis, fault_id, node_id, before)
    restart(nemesis, fault_id, node_id, "after failing reads")
    nemesis._end(fault_id)
    ctx.wait_ready()


def _follower(ctx: Context) -> str:
    leader = ctx.leader()
    return ctx.rng.choice([n for n in ctx.node_ids() if n != leader])


def _target(ctx: Context) -> str:
    return (ctx.leader() if ctx.rng.random() < 0.5 else None) or ctx.rng.choice(ctx.node_ids())


def plan_sickdisk(ctx: Context) -> None:
    """Every disk fault once (stalls on the leader and on a follower first), then random ones
    while time is left; a run shorter than QUICK_DURATION_S holds and stalls for less."""
    rng = ctx.rng
    quick = ctx.duration_s < QUICK_DURATION_S
    delays = (0.5, 2.5) if quick else (0.5, 5.0)
    holds = (3.0, 3.0) if quick else (4.0, 8.0)
    order = ["stall_leader", "stall_follower", "write_eio", "fsync_eio", "read_eio",
             "read_only"]
    try:
        first = True
        while first or ctx.left_s() > 10:
            kinds = order if first else [rng.choice(order)]
            first = False
            for kind in kinds:
                hold_s = rng.uniform(*holds)
                if kind.startswith("stall"):
                    delay_s = round(rng.uniform(*delays), 2)
                    on_leader = kind == "stall_leader"
                    node_id = (ctx.leader() or ctx.node_ids()[0]) if on_leader else _follower(ctx)
                    fsync_stall(ctx, node_id, on_leader=on_leader, delay_s=delay_s,
                                hold_s=max(hold_s, 2 * delay_s))
                elif kind == "read_eio":
                    read_eio(ctx, _target(ctx), hold_s)
                else:
                    errno_fault(ctx, kind, _target(ctx), hold_s)
                ctx.hold(rng.uniform(1.0, 2.0))
    finally:
        for disk in getattr(ctx.cluster, "disks", {}).values():  # never leave a disk sick
            with contextlib.suppress(Exception):
                disk.clear_faults()
