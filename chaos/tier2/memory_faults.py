"""Memory limits for tier 2 (CHAOS.md "Wave 3", DESIGN.md §9.3): nodes under a cgroup v1 memory
limit, and the OOM killer as a nemesis.

What it owns:

- `MemoryGroups`: one memory cgroup per node under
  ``/sys/fs/cgroup/memory/raftcron-chaos-<run>/<node>`` (`memory.limit_in_bytes`,
  `memory.oom_control`'s `oom_kill` count, `memory.max_usage_in_bytes`, `memory.stat`), made by
  the run and removed at its end, also when it fails (a process still in one is this run's:
  it is killed first);
- `MemoryCluster`: a `ChaosCluster` whose nodes join their cgroup before they exec (a shell
  writes its own PID to `cgroup.procs`, then execs the node command, `ip netns exec` included:
  that one remounts /sys, so the cgroup is joined outside it), so the main process and every
  child it forks, the snapshot writer among them, are charged from their first page; and
  its watcher, which records every OOM kill the kernel makes in one of them (`oom` events:
  the node, the cgroup's new `oom_kill` count, whether the main PID is still alive, the limit
  and the peak usage); a node killed where no squeeze aimed gets twice the limit at once
  (`limit_raised`), so the run can start it again and go on to judge what was lost;
- ``oom_kill``: the squeeze. Under the load, the node's limit is lowered to what its
  anonymous memory takes now plus a few MiB, then less, until the kernel OOM-kills the main
  process. Mid-snapshot, a compaction is forced first and the squeeze starts once the forked
  writer is seen; the writer is made unkillable by the OOM killer (`oom_score_adj` -1000),
  since right after a fork it maps as much as its parent and would otherwise be the victim
  half the time. Proof of a real OOM kill: the main process died of SIGKILL and the cgroup's
  `oom_kill` count moved (an `oom_fault` event says both). The node is started again under
  the scenario's limit; if the kernel kills it again before it is ready (`restart_oom`), under
  twice that, and the run's checkers judge what it lost (nothing acknowledged may be);
- `plan_memory`: first the budget phase (the state budget below the limit with room for the
  writer's copied pages; the flood keeps the state at the budget and compactions are forced
  on every node: nothing may be OOM-killed), then the squeeze phase (``oom_kill`` on the
  leader or another node, mid-load or mid-snapshot, one at a time).

chaos/tier2/checkers/memory.py judges the events. It must not decide anything else, and every
wait is bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raftcron.chaos.tier2.history import History
from raftcron.chaos.tier2.nemesis import ADMIN, ChaosCluster, Nemesis, wait_until
from raftcron.chaos.tier2.storage_faults import _alive, _compact_and_wait_for_writer
from raftcron.cluster.dev.nodeprocesses import LocalNode

if TYPE_CHECKING:
    from raftcron.chaos.tier2.context import Context

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
GROUP_PREFIX = "raftcron-chaos-"
# `sh -c JOIN <cgroup.procs> <command...>`: the shell joins the cgroup, then becomes the node.
JOIN = 'echo $$ > "$0" && exec "$@"'
MIB = 1 << 20
# The memory scenario's figures. A node of this release holds about 50-55 MiB of anonymous
# memory under the flood with its state at the budget (6 MiB, the budget scenario's, which
# the flood keeps reached); its page cache (log, archive) is charged too but reclaimable. The
# forked snapshot writer shares the node's pages, and every page either of them writes while
# it runs is copied, and it allocates the snapshot's bytes: at worst a second node.
# NODE_LIMIT_BYTES is that worst case, about twice what the node takes, rounded up.
STATE_BUDGET_BYTES = 6 * MIB
NODE_LIMIT_BYTES = 128 * MIB
RAISED_LIMIT_BYTES = 2 * NODE_LIMIT_BYTES  # for a node that cannot start again under it
RESTART_READY_S = 30.0
SQUEEZE_MARGINS_MIB = (8, 4, 2, 1, 0)  # above the anonymous memory, each tried in turn
SQUEEZE_STEP_S = 4.0  # how long each margin is held before the next one
WRITER_EXIT_S = 5.0
WATCH_EVERY_S = 0.1


def cgroups_possible() -> str | None:
    """Why memory cgroups cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "memory cgroups need root"
    if not (CGROUP_ROOT / "memory.limit_in_bytes").exists():
        return f"no cgroup v1 memory controller at {CGROUP_ROOT}"
    return None


class MemoryGroups:
    """The run's memory cgroups: ``<root>/<node>`` each, with their files read and written."""

    def __init__(self, run: str, base: Path = CGROUP_ROOT) -> None:
        self.root = base / f"{GROUP_PREFIX}{run}"

    def path(self, node_id: str) -> Path:
        return self.root / node_id

    def procs_file(self, node_id: str) -> Path:
        return self.path(node_id) / "cgroup.procs"

    def create(self, node_ids: list[str], limit_bytes: int) -> None:
        self.root.mkdir(exist_ok=True)
        for node_id in node_ids:
            self.path(node_id).mkdir(exist_ok=True)
            self.set_limit(node_id, limit_bytes)

    def set_limit(self, node_id: str, limit_bytes: int) -> bool:
        """Whether the kernel took it (it answers EBUSY to a limit below what it cannot
        reclaim)."""
        try:
            (self.path(node_id) / "memory.limit_in_bytes").write_text(str(limit_bytes))
        except OSError:
            return False
        return True

    def _read(self, node_id: str, name: str) -> str:
        return (self.path(node_id) / name).read_text()

    def limit(self, node_id: str) -> int:
        return int(self._read(node_id, "memory.limit_in_bytes"))

    def oom_kills(self, node_id: str) -> int:
        fields = dict(line.split() for line in self._read(node_id, "memory.oom_control")
                      .splitlines() if line.strip())
        return int(fields.get("oom_kill", 0))

    def max_usage(self, node_id: str) -> int:
        return int(self._read(node_id, "memory.max_usage_in_bytes"))

    def anonymous(self, node_id: str) -> int:
        """The cgroup's anonymous memory (what cannot be reclaimed: there is no swap)."""
        stat = dict(line.split() for line in self._read(node_id, "memory.stat").splitlines()
                    if line.strip())
        return int(stat.get("total_rss", stat.get("rss", 0)))

    def pids(self, node_id: str) -> list[int]:
        with contextlib.suppress(FileNotFoundError):
            return [int(p) for p in (self.path(node_id) / "cgroup.procs").read_text().split()]
        return []

    def remove(self) -> list[str]:
        """Remove every node's cgroup and the run's (bounded). A process still in one is this
        run's own (nothing else joins them): it is killed first. What could not be removed."""
        left: list[str] = []
        if not self.root.exists():
            return left
        for group in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for pid in self.pids(group.name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_until(lambda g=group.name: not self.pids(g), 10.0, 0.05)
            try:
                group.rmdir()
            except OSError as error:
                left.append(f"{group}: {error}")
        try:
            self.root.rmdir()
        except OSError as error:
            left.append(f"{self.root}: {error}")
        return left


def leftover_groups(base: Path = CGROUP_ROOT) -> list[Path]:
    """The suite's cgroup folders whose run is gone (named after the harness's PID)."""
    if not base.exists():
        return []
    found = []
    for path in sorted(base.iterdir()):
        if not path.is_dir() or not path.name.startswith(GROUP_PREFIX):
            continue
        pid = path.name[len(GROUP_PREFIX):].split("-", 1)[0]
        if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            found.append(path)
    return found


def remove_leftover_groups(base: Path = CGROUP_ROOT) -> list[str]:
    """Remove what a crashed run left (its processes in them first); the folders removed."""
    removed = []
    for path in leftover_groups(base):
        if not MemoryGroups(path.name[len(GROUP_PREFIX):], base).remove():
            removed.append(str(path))
    return removed


class MemoryCluster(ChaosCluster):
    """A `ChaosCluster` whose every node runs in a memory cgroup of its own, limited to
    `limit_bytes` (the scenario's `NODE_LIMIT_BYTES` unless set before `configure`)."""

    limit_bytes = NODE_LIMIT_BYTES
    groups: MemoryGroups
    _watch: threading.Thread | None = None
    _watch_stop: threading.Event | None = None
    anonymous_peaks: dict[str, int]  # node -> bytes, sampled by the watcher
    squeezing: set[str]  # nodes under a squeeze now: an OOM kill there is the nemesis's

    def configure(self) -> list[LocalNode]:
        if hasattr(self, "groups"):
            return super().configure()
        why = cgroups_possible()
        if why is not None:
            raise RuntimeError(f"the memory scenario cannot run: {why}")
        self.groups = MemoryGroups(f"{os.getpid()}-{time.strftime('%H%M%S')}")
        self.squeezing = set()
        nodes = super().configure()
        self.groups.create([node.node_id for node in nodes], self.limit_bytes)
        return nodes

    def command(self, node: LocalNode) -> list[str]:
        procs = str(self.groups.procs_file(node.node_id))
        return ["sh", "-c", JOIN, procs, *super().command(node)]

    def watch(self, history: History) -> None:
        """Record every OOM kill in any node's cgroup (`oom` events) until `close`."""
        if self._watch is not None:
            return
        self._watch_stop = threading.Event()
        self.anonymous_peaks = {}
        self._watch = threading.Thread(target=self._watch_loop, args=(history,),
                                       name="chaos-oom-watch", daemon=True)
        self._watch.start()

    def take_peaks(self) -> dict[str, int]:
        """Each node's peak anonymous memory (the node and its writer) since the last call."""
        peaks, self.anonymous_peaks = self.anonymous_peaks, {}
        return peaks

    def _watch_loop(self, history: History) -> None:
        seen = {node.node_id: self.groups.oom_kills(node.node_id) for node in self.nodes}
        assert self._watch_stop is not None
        while not self._watch_stop.wait(WATCH_EVERY_S):
            for node in self.nodes:
                with contextlib.suppress(OSError, ValueError):
                    anonymous = self.groups.anonymous(node.node_id)
                    if anonymous > self.anonymous_peaks.get(node.node_id, 0):
                        self.anonymous_peaks[node.node_id] = anonymous
                    count = self.groups.oom_kills(node.node_id)
                    if count > seen[node.node_id]:
                        seen[node.node_id] = count
                        limit = self.groups.limit(node.node_id)
                        history.record(
                            "oom", node=node.node_id, oom_kills=count, main_pid=node.pid,
                            main_alive=node.pid is not None and _alive(node.pid),
                            limit_bytes=limit,
                            max_usage_bytes=self.groups.max_usage(node.node_id))
                        if node.node_id not in self.squeezing and limit < RAISED_LIMIT_BYTES:
                            # Killed where no squeeze aimed (the checker fails that): raised,
                            # so the run's restart of it can come back and the run go on.
                            self.groups.set_limit(node.node_id, RAISED_LIMIT_BYTES)
                            history.record("limit_raised", node=node.node_id,
                                           limit_bytes=RAISED_LIMIT_BYTES, was_bytes=limit)

    def close(self) -> None:
        try:
            super().close()  # the nodes first: a cgroup with a process in it cannot go
        finally:
            if self._watch_stop is not None:
                self._watch_stop.set()
            if self._watch is not None:
                self._watch.join(timeout=5)
            if hasattr(self, "groups"):
                left = self.groups.remove()
                if left:
                    raise RuntimeError(f"cgroups left behind: {left}")


def _cluster(nemesis: Nemesis) -> MemoryCluster:
    cluster = nemesis.cluster
    if not isinstance(cluster, MemoryCluster):
        raise TypeError("memory faults need a MemoryCluster (nodes in memory cgroups)")
    return cluster


def _groups(nemesis: Nemesis) -> MemoryGroups:
    return _cluster(nemesis).groups


def _protect(pid: int) -> None:
    """Keep the OOM killer off a process (a snapshot writer): the squeeze aims at its parent."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/oom_score_adj").write_text("-1000")


def oom_kill(nemesis: Nemesis, node_id: str, *, mid_snapshot: bool) -> str:
    """Squeeze a node's cgroup until the kernel OOM-kills its main process (see the module
    docstring); the node stays down, its limit as low as the squeeze left it."""
    groups = _groups(nemesis)
    node = nemesis.node(node_id)
    _cluster(nemesis).squeezing.add(node_id)  # until oom_restart brought it back
    return _squeeze(nemesis, groups, node, mid_snapshot=mid_snapshot)


def _squeeze(nemesis: Nemesis, groups: MemoryGroups, node: LocalNode, *,
             mid_snapshot: bool) -> str:
    node_id = node.node_id
    writers = _compact_and_wait_for_writer(nemesis, node_id) if mid_snapshot else []
    for writer in writers:
        _protect(writer)
    before = groups.oom_kills(node_id)
    anonymous = groups.anonymous(node_id)
    fault_id = nemesis._start("oom", [node_id], mid_snapshot=mid_snapshot,
                              writer_seen=bool(writers), anonymous_bytes=anonymous)
    node.expected_exit = True  # the kernel kills it, on the harness's behalf
    started = time.monotonic()
    limit = groups.limit(node_id)
    writer_alive = False
    for margin_mib in SQUEEZE_MARGINS_MIB:
        if not node.running:
            break
        target = groups.anonymous(node_id) + margin_mib * MIB
        if target < limit and groups.set_limit(node_id, target):
            limit = target
        writer_alive = any(_alive(w) for w in writers)
        wait_until(lambda: not node.running, SQUEEZE_STEP_S, 0.02)
    code = None
    if node.process is not None:
        with contextlib.suppress(Exception):
            code = node.process.wait(timeout=5)
    outlived = [w for w in writers if not wait_until(lambda w=w: not _alive(w), WRITER_EXIT_S,
                                                     0.02)]
    for writer in outlived:  # never leave one behind: it is this run's process
        with contextlib.suppress(ProcessLookupError):
            os.kill(writer, signal.SIGKILL)
    if code is None:  # never killed: stop it, so the fault ends as every other one does
        nemesis.cluster.kill(node)
    nemesis.history.record(
        "oom_fault", id=fault_id, node=node_id, mid_snapshot=mid_snapshot,
        writer_seen=bool(writers), writer_alive_at_kill=writer_alive,
        writer_outlived=bool(outlived), exit_code=code,
        killed_by_sigkill=code == -signal.SIGKILL,
        oom_kills_moved=groups.oom_kills(node_id) - before, limit_bytes=limit,
        anonymous_before_bytes=anonymous, max_usage_bytes=groups.max_usage(node_id),
        elapsed_ms=int((time.monotonic() - started) * 1000))
    return fault_id


def oom_restart(nemesis: Nemesis, fault_id: str, node_id: str, limit_bytes: int,
                raised_bytes: int) -> None:
    """Start the node again under `limit_bytes`, the limit its budget was sized for; when the
    kernel OOM-kills it before it is ready (a `restart_oom` event), start it under
    `raised_bytes`, which it keeps until the next squeeze. The `oom_restart` event says which
    limit it came back under and its peak usage while it started."""
    groups = _groups(nemesis)
    node = nemesis.node(node_id)
    for limit in (limit_bytes, raised_bytes):
        groups.set_limit(node_id, limit)
        with contextlib.suppress(OSError):
            (groups.path(node_id) / "memory.max_usage_in_bytes").write_text("0")
        before = groups.oom_kills(node_id)
        if not node.running:
            nemesis.cluster.start_node(node)
        wait_until(lambda: not node.running or _ready(nemesis, node), RESTART_READY_S, 0.1)
        if node.running or groups.oom_kills(node_id) == before:
            break
        node.expected_exit = True  # the harness starts it again now, not the run's tick
        nemesis.history.record("restart_oom", id=fault_id, node=node_id, limit_bytes=limit,
                               exit_code=node.process.returncode if node.process else None,
                               max_usage_bytes=groups.max_usage(node_id))
    nemesis.history.record("oom_restart", id=fault_id, node=node_id, limit_bytes=limit,
                           came_back=node.running, max_usage_bytes=groups.max_usage(node_id))
    _cluster(nemesis).squeezing.discard(node_id)
    nemesis._end(fault_id, limit_bytes=limit)


def _ready(nemesis: Nemesis, node: LocalNode) -> bool:
    try:
        status = nemesis.cluster.request(node, "GET", "/readyz", timeout_s=1.0)[0]
    except (OSError, http.client.HTTPException):
        return False
    return status == 200


def record_usage(ctx: Context, phase: str) -> None:
    """Each node's peak memory and OOM kills so far (`memory_usage`), and the state's size."""
    groups = _groups(ctx.nemesis)
    cluster = ctx.cluster
    peaks = cluster.take_peaks() if isinstance(cluster, MemoryCluster) else {}
    budget: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        _, body, _ = ctx.cluster.call("GET", "/v1/settings", token=ADMIN, timeout_s=5)
        budget = (body.get("usage") or {}) if isinstance(body, dict) else {}
    for node_id in ctx.node_ids():
        with contextlib.suppress(OSError, ValueError):
            ctx.history.record(
                "memory_usage", phase=phase, node=node_id, limit_bytes=groups.limit(node_id),
                max_usage_bytes=groups.max_usage(node_id), oom_kills=groups.oom_kills(node_id),
                anonymous_bytes=groups.anonymous(node_id),
                anonymous_peak_bytes=peaks.get(node_id),
                state_bytes=budget.get("state_bytes"), budget_bytes=budget.get("budget_bytes"))


def plan_memory(ctx: Context) -> None:
    """The budget phase (the first half: compactions forced under the flood, nothing may be
    OOM-killed), then the squeeze phase (OOM kills mid-load and mid-snapshot)."""
    cluster, nemesis, rng = ctx.cluster, ctx.nemesis, ctx.rng
    if not isinstance(cluster, MemoryCluster):
        raise TypeError("plan_memory needs a MemoryCluster")
    cluster.watch(ctx.history)
    ctx.history.record("memory_phase", name="budget", limit_bytes=cluster.limit_bytes,
                       budget_bytes=STATE_BUDGET_BYTES)
    squeeze_at = ctx.left_s() / 2
    while ctx.left_s() > squeeze_at:
        target = rng.choice(ctx.node_ids())
        with contextlib.suppress(Exception):  # a busy node snapshots anyway
            nemesis.cluster.request(nemesis.node(target), "POST", "/v1/cluster/compact", {},
                                    token=ADMIN)
        ctx.hold(rng.uniform(2.0, 5.0))
    record_usage(ctx, "budget")
    ctx.history.record("memory_phase", name="squeeze")
    round_number = 0
    while ctx.left_s() > 15:
        leader = ctx.leader()
        running = [n for n in ctx.node_ids() if nemesis.node(n).running]
        if not running:
            ctx.wait_ready()
            continue
        target = leader if leader in running and rng.random() < 0.4 else rng.choice(running)
        fault = oom_kill(nemesis, target, mid_snapshot=round_number % 2 == 0)
        round_number += 1
        ctx.hold(rng.uniform(1.0, 3.0))
        oom_restart(nemesis, fault, target, cluster.limit_bytes, RAISED_LIMIT_BYTES)
        ctx.wait_ready()
        ctx.hold(rng.uniform(2.0, 4.0))
    record_usage(ctx, "squeeze")
    # The drain's and the final read's pages of archived 60 KB jobs are the harness's load,
    # not the scenario's: a node must not die of them (one did, at 256 MiB).
    for node_id in ctx.node_ids():
        cluster.groups.set_limit(node_id, -1)
    ctx.history.record("memory_phase", name="unlimited", limit_bytes=None)
