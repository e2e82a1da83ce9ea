"""Faults: the cluster's processes, the network between them, and their clocks.

What it owns: `ChaosCluster` (a `LocalCluster` whose nodes live in network namespaces or
behind the loopback relay, optionally with a wall-clock offset each) and `Nemesis`, which
injects one fault at a time and records its start and end in the history:

- processes: `kill -9` (restart later), `SIGSTOP`/`SIGCONT`, whole-cluster downtime;
- network: isolate a host, drop one way, cut a pair; heal all;
- clocks: restart a node with its wall clock offset (`CLOCK_HOOK`: wall time only, monotonic
  untouched, so Raft timeouts are unaffected); reset to real time;
- workers: the same signals on worker processes, and cutting a worker off the cluster.

It never decides when: scenarios do. It never judges: checkers do. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raftcron.chaos.tier2.history import History
from raftcron.chaos.tier2.netns import Namespaces, Relay, pick_ports
from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import ClusterError, LocalNode
from raftcron.cluster.dev.tomlwrite import toml_value

# The per-node clock offset: a `sitecustomize` module the harness writes into the run folder
# and puts first on the node's PYTHONPATH. Python runs it at start-up, before any product code,
# so `time.time()` and `time.time_ns()` (what cluster/clock/ticker.py's wall_ms reads) are offset,
# while `time.monotonic()` (every Raft timeout) is untouched. libfaketime cannot do this here:
# with it, Python 3.11's time.sleep fails with EINVAL (clock_nanosleep with TIMER_ABSTIME), and
# PySyncObj's tick thread dies.
CLOCK_HOOK = """\
import os as _os
import time as _time

_OFFSET_NS = int(_os.environ.get("CHAOS_CLOCK_OFFSET_MS", "0")) * 1_000_000
if _OFFSET_NS:
    _real_time_ns, _real_time = _time.time_ns, _time.time
    _time.time_ns = lambda: _real_time_ns() + _OFFSET_NS
    _time.time = lambda: _real_time() + _OFFSET_NS / 1e9
"""


# Raft timings for chaos: a 2-core machine running 3-5 nodes, 3 workers and the harness must
# not hold elections from CPU starvation alone; the election bound the checkers use is 2.5 s.
CHAOS_RAFT: dict[str, object] = {
    "tick_ms": 100,
    "heartbeat_s": 0.1,
    "election_timeout_min_s": 0.6,
    "election_timeout_max_s": 1.5,
    "leader_fallback_s": 1.5,
    "connection_timeout_s": 2.0,
    "connection_retry_s": 0.25,
    "commit_timeout_s": 3.0,
}
TOKENS = {
    "chaos-admin-token": "admin",
    "chaos-worker-token": "worker",
    "chaos-submit-token": "submit",
}
ADMIN, WORKER, SUBMIT = "chaos-admin-token", "chaos-worker-token", "chaos-submit-token"


class ChaosCluster(LocalCluster):
    """Nodes placed by the network (`Namespaces` or `Relay`), each with an optional clock
    offset applied at its next start."""

    def __init__(self, base_dir: Path, net: Namespaces | Relay, *, nodes: int = 3,
                 raft: dict[str, object] | None = None,
                 settings: dict[str, object] | None = None) -> None:
        # settings: the nodes' [settings] (a small state budget), which the first leader
        # finalizes the new cluster with
        super().__init__(
            base_dir, nodes=nodes, tokens=TOKENS, raft=raft or CHAOS_RAFT, python=sys.executable,
            settings=settings,
        )
        self.net = net
        self.clock_offsets_s: dict[str, int] = {}
        self.relay_peers: dict[tuple[str, str], str] = {}  # (node, peer) -> address to dial
        self._starting: LocalNode | None = None

    def configure(self) -> list[LocalNode]:
        if self.nodes:
            return self.nodes
        self.base_dir.mkdir(parents=True, exist_ok=True)
        ids = [f"n{index + 1}" for index in range(self.size)]
        if isinstance(self.net, Namespaces):
            raft = {i: f"{self.net.address(i)}:7000" for i in ids}
            http = {i: f"{self.net.address(i)}:8000" for i in ids}
        else:
            taken: set[int] = set()
            raft_ports = pick_ports(self.size, 20_000, 29_999, taken)  # ascending: n1 < n2 < ...
            http_ports = pick_ports(self.size, 20_000, 29_999, taken)
            relay_ports = pick_ports(self.size * self.size, 10_000, 19_999, taken)
            raft = {i: f"127.0.0.1:{p}" for i, p in zip(ids, raft_ports, strict=True)}
            http = {i: f"127.0.0.1:{p}" for i, p in zip(ids, http_ports, strict=True)}
            for a_index, a in enumerate(ids):
                for b_index, b in enumerate(ids[:a_index]):
                    # a (the higher address) dials b: through the relay.
                    port = relay_ports[a_index * self.size + b_index]
                    self.net.add(a, b, ("127.0.0.1", raft_ports[b_index]), port)
                    self.relay_peers[(a, b)] = f"127.0.0.1:{port}"
            self.net.start()
        return self.add_nodes({i: (raft[i], http[i]) for i in ids})

    def config_text(self, node: LocalNode, peers: list[LocalNode] | None = None) -> str:
        text = super().config_text(node, peers)
        for peer in self.nodes:
            dial = self.relay_peers.get((node.node_id, peer.node_id))
            if dial is not None:
                text = text.replace(
                    f"raft_address = {toml_value(peer.raft_address)}",
                    f"raft_address = {toml_value(dial)}",
                )
        return text

    def command(self, node: LocalNode) -> list[str]:
        command = super().command(node)
        if isinstance(self.net, Namespaces):
            return [*self.net.exec_prefix(node.node_id), *command]
        return command

    def start_node(self, node: LocalNode) -> None:
        self._starting = node
        try:
            super().start_node(node)
        finally:
            self._starting = None

    def _environment(self) -> dict[str, str]:
        env = super()._environment()
        node = self._starting
        offset_s = 0 if node is None else self.clock_offsets_s.get(node.node_id, 0)
        env.pop("CHAOS_CLOCK_OFFSET_MS", None)
        if offset_s:
            hook = self.base_dir / "clockhook"
            hook.mkdir(parents=True, exist_ok=True)
            (hook / "sitecustomize.py").write_text(CLOCK_HOOK)
            env["PYTHONPATH"] = str(hook) + os.pathsep + env["PYTHONPATH"]
            env["CHAOS_CLOCK_OFFSET_MS"] = str(offset_s * 1000)
        return env

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.configure()]

    def known_nodes(self) -> list[LocalNode]:
        """Every node clients may be sent to: the members (more in member_faults)."""
        return list(self.configure())

    def leader_or_none(self, timeout_s: float = 3.0) -> LocalNode | None:
        try:
            return self.leader(timeout_s)
        except ClusterError:
            return None


class Nemesis:
    """Injects faults into a `ChaosCluster` and its workers and writes each into the history."""

    def __init__(
        self, cluster: ChaosCluster, workers: Any, history: History, *, restart_s: float = 30
    ) -> None:
        self.cluster = cluster
        self.workers = workers  # chaos.workload.WorkerPool
        self.history = history
        self.net = cluster.net
        self.restart_s = restart_s
        self.faults = 0
        self.active: dict[str, dict[str, Any]] = {}  # fault id -> its start event

    # -- bookkeeping ------------------------------------------------------------------------

    def _start(self, fault: str, targets: Sequence[str], **fields: Any) -> str:
        leader = self.cluster.leader_or_none(1.0)
        self.faults += 1
        fault_id = f"f{self.faults}"
        event = self.history.record(
            "fault",
            phase="start",
            id=fault_id,
            fault=fault,
            targets=list(targets),
            leader=None if leader is None else leader.node_id,
            **fields,
        )
        self.active[fault_id] = event
        return fault_id

    def _end(self, fault_id: str, **fields: Any) -> None:
        start = self.active.pop(fault_id, None)
        self.history.record(
            "fault",
            phase="end",
            id=fault_id,
            fault=None if start is None else start["fault"],
            targets=None if start is None else start["targets"],
            **fields,
        )

    def node(self, node_id: str) -> LocalNode:
        return self.cluster.node(node_id)

    def pick_leader(self) -> str | None:
        leader = self.cluster.leader_or_none(5.0)
        return None if leader is None else leader.node_id

    # -- node processes ---------------------------------------------------------------------

    def kill(self, node_ids: Sequence[str], *, fault: str = "kill") -> str:
        fault_id = self._start(fault, node_ids)
        for node_id in node_ids:
            self.cluster.kill(self.node(node_id))
        return fault_id

    def restart(self, fault_id: str, node_ids: Sequence[str]) -> None:
        for node_id in node_ids:
            node = self.node(node_id)
            if not node.running:
                self.cluster.start_node(node)
        self._end(fault_id)

    def pause(self, node_ids: Sequence[str], *, fault: str = "pause") -> str:
        fault_id = self._start(fault, node_ids)
        for node_id in node_ids:
            self.cluster.pause(self.node(node_id))
        return fault_id

    def resume(self, fault_id: str, node_ids: Sequence[str]) -> None:
        for node_id in node_ids:
            node = self.node(node_id)
            if node.running and node.paused:
                self.cluster.resume(node)
        self._end(fault_id)

    def downtime_start(self) -> str:
        fault_id = self._start("downtime", [node.node_id for node in self.cluster.nodes])
        self.cluster.kill_all()
        self.active[fault_id]["down_ms"] = self.history.record(
            "downtime", phase="down", id=fault_id
        )["t"]
        return fault_id

    def downtime_end(self, fault_id: str) -> None:
        for node in self.cluster.nodes:  # all at once (the PySyncObj #201 pattern)
            if not node.running:
                self.cluster.start_node(node)
        self.history.record("downtime", phase="up", id=fault_id)
        self._end(fault_id)

    # -- network ----------------------------------------------------------------------------

    def isolate(self, hosts: Sequence[str], *, fault: str = "partition") -> str:
        fault_id = self._start(fault, hosts, how="isolate")
        for host in hosts:
            self.net.isolate(host)
        return fault_id

    def drop(
        self, pairs: Sequence[tuple[str, str]], *, fault: str = "partition", how: str = "drop"
    ) -> str:
        """Each (receiver, sender): nothing sender sends arrives at receiver."""
        fault_id = self._start(
            fault, sorted({h for pair in pairs for h in pair}), how=how, pairs=list(pairs)
        )
        for receiver, sender in pairs:
            self.net.drop(receiver, sender)
        return fault_id

    def heal(self, fault_id: str) -> None:
        self.net.heal()
        self._end(fault_id)

    # -- clocks -----------------------------------------------------------------------------

    def set_clock(self, node_id: str, offset_s: int) -> str:
        """Restart a node with its wall clock offset by offset_s (0 = real time)."""
        fault_id = self._start("clock", [node_id], offset_s=offset_s)
        self.cluster.clock_offsets_s[node_id] = offset_s
        self.cluster.restart(self.node(node_id))
        self._end(fault_id, offset_s=offset_s)
        return fault_id

    # -- workers ----------------------------------------------------------------------------

    def kill_worker(self, name: str) -> str:
        fault_id = self._start("worker_kill", [name])
        self.workers.kill(name)
        return fault_id

    def restart_worker(self, fault_id: str, name: str) -> None:
        self.workers.start(name)
        self._end(fault_id)

    def pause_worker(self, name: str) -> str:
        fault_id = self._start("worker_pause", [name])
        self.workers.pause(name)
        return fault_id

    def resume_worker(self, fault_id: str, name: str) -> None:
        self.workers.resume(name)
        self._end(fault_id)

    # -- ending -----------------------------------------------------------------------------

    def heal_all(self) -> None:
        """Undo everything: network healed, paused processes continued, dead ones started,
        clocks real. Each open fault gets its end event."""
        with contextlib.suppress(Exception):
            self.net.heal()
        for node in self.cluster.nodes:
            if node.running and node.paused:
                self.cluster.resume(node)
        for name in self.workers.names:
            self.workers.resume(name)
        reset = [n for n, offset in self.cluster.clock_offsets_s.items() if offset]
        for node_id in reset:
            self.cluster.clock_offsets_s[node_id] = 0
            self.cluster.kill(self.node(node_id))
        for node in self.cluster.nodes:
            if not node.running:
                self.cluster.start_node(node)
        for name in self.workers.names:
            if not self.workers.running(name):
                self.workers.start(name)
        for fault_id in list(self.active):
            self._end(fault_id, healed_by="final_heal")
        self.history.record("phase", name="healed")


def signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def wait_until(condition: Any, timeout_s: float, poll_s: float = 0.1) -> bool:
    """Poll `condition` until true or timeout_s; whether it became true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return bool(condition())


SIGNALS = {"stop": signal.SIGSTOP, "cont": signal.SIGCONT, "kill": signal.SIGKILL}
