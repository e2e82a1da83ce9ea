"""A deterministic in-process cluster of real PySyncObj nodes: ``SimCluster``.

Owns the nodes' lifecycle and the simulated time: it builds N real ``SyncObj`` objects
(``autoTick=False``, journal and full dump in a private temp dir, or raftcron's storage on the
node's ``SimDisk``) through a caller-supplied factory, so any replicated state machine can be
plugged in; it steps the fake clock, delivers due messages and ticks every live node in a
fixed order; it crashes a node (the object and everything in flight to or from it are gone,
its files stay) and restarts it from its files; it cuts a node's power (a crash, and its disk
keeps only what was durable), and keeps a node that refuses to start down, with the reason;
it records every proposal and its answer, and hashes a trace of everything that happened, so
the same seed must give the same digest. It never sleeps and never reads a real clock.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import shutil
import tempfile
import zlib
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.node import Node

from raftcron.chaos.sim.clock import FakeClock, simulated_pysyncobj
from raftcron.chaos.sim.disk import PowerCut, SimDisk
from raftcron.chaos.sim.network import LinkFaults, SimNetwork, SimTransport
from raftcron.cluster.consensus import prevote, raftpatch
from raftcron.cluster.membership.raftconfig import Callback
from raftcron.cluster.storage.hooks import storage_of
from raftcron.cluster.storage.raftlog import StorageError


class SimNode(Node):  # type: ignore[misc]  # pysyncobj is untyped
    """A Node whose hash does not depend on PYTHONHASHSEED.

    pysyncobj iterates sets of nodes (sending, electing) and reads the clock inside those
    loops; with str hashes the order, hence the trace, would change from process to process.
    Never mix with plain ``Node`` objects of the same id as dict keys: equal, other hash.
    """

    def __hash__(self) -> int:
        return zlib.crc32(str(self.id).encode())


@dataclass(frozen=True)
class NodeSpec:
    """Everything a node factory needs to build one node of the cluster."""

    node_id: str
    self_node: Node
    other_nodes: list[Node]
    conf: SyncObjConf
    transport: SimTransport
    disk: SimDisk  # the node's own disk: survives its crashes; a factory may keep storage on it


NodeFactory = Callable[[NodeSpec], SyncObj]
ConfFactory = Callable[[str, str, str], SyncObjConf]  # (node_id, journal_file, dump_file)


def default_conf(journal_file: str, dump_file: str, **overrides: Any) -> SyncObjConf:
    """Library defaults, except what a simulation needs: manual ticks, files, no fork."""
    settings: dict[str, Any] = {"autoTick": False, "journalFile": journal_file,
                                "fullDumpFile": dump_file, "useFork": False}
    settings.update(overrides)
    return SyncObjConf(**settings)


@dataclass
class Proposal:
    """One client command and how the cluster answered it (outcome is a FAIL_REASON)."""

    key: str
    node_id: str
    proposed_at_s: float
    outcome: int | None = None
    result: Any = None
    answered_at_s: float | None = None

    @property
    def acknowledged(self) -> bool:
        return bool(self.outcome == FAIL_REASON.SUCCESS)


class Trace:
    """A running sha256 of the events of a run; equal digests mean equal runs."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.events = 0

    def record(self, *fields: Any) -> None:
        self._hash.update(repr(fields).encode())
        self._hash.update(b"\n")
        self.events += 1

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()


class TruncationLog(logging.Handler):
    """Counts pysyncobj CRITICAL lines; the truncation one means applied state was deleted."""

    def __init__(self) -> None:
        super().__init__(level=logging.CRITICAL)
        self.critical = 0
        self.truncated_applied = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.critical += 1
        if raftpatch.TRUNCATION_ALARM in record.getMessage():
            self.truncated_applied += 1


def _summary(message: Any) -> tuple[Any, ...]:
    if not isinstance(message, dict):
        return (repr(message),)
    return (message.get("type"), message.get("term"), message.get("prevLogIdx"),
            len(message.get("entries", ())), message.get("commit_index"),
            message.get("next_node_idx"), message.get("success"), message.get("reset"))


class SimCluster:
    """Real SyncObj nodes on a simulated network and clock; use as a context manager."""

    def __init__(self, node_ids: Sequence[str], node_factory: NodeFactory, *, seed: int | str,
                 conf_factory: ConfFactory | None = None, faults: LinkFaults | None = None,
                 tick_s: float = 0.01, patched: bool = True, prevote: bool = False) -> None:
        self.node_ids = sorted(node_ids)
        self.prevote = prevote  # attach cluster/consensus/prevote.py to every patched node
        self.node_factory = node_factory
        self.conf_factory = conf_factory or (lambda _id, journal, dump: default_conf(journal, dump))
        self.seed = seed
        self.tick_s = tick_s
        self.patched = patched
        self.clock = FakeClock()
        self._next_tick_s = self.clock.now_s
        self.network = SimNetwork(self.clock, seed, faults)
        self.nodes: dict[str, SyncObj] = {}
        self.disks: dict[str, SimDisk] = {node_id: SimDisk() for node_id in self.node_ids}
        self.refused: dict[str, str] = {}  # node -> why it refused to start (it stays down)
        self._mid_step: list[Callable[[], None]] = []
        self.network.on_power_lost = self._power_lost
        self.power_lost_observers: list[Callable[[str], None]] = []  # told of every armed cut
        self.proposals: list[Proposal] = []
        self.trace = Trace()
        self.log = TruncationLog()
        self.data_dir = ""
        self._stack = ExitStack()
        self._leaders: tuple[str, ...] = ()
        self.network.observers.append(self._observe)

    # --- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> SimCluster:
        try:
            # pysyncobj draws election timeouts from its own `random`; route it to our seed.
            rng = random.Random(f"{self.seed}/pysyncobj")
            self._stack.enter_context(simulated_pysyncobj(self.clock, rng))
            self.data_dir = tempfile.mkdtemp(prefix="raftsim-")
            self._stack.callback(shutil.rmtree, self.data_dir, True)
            pysyncobj_logger = logging.getLogger("pysyncobj")
            pysyncobj_logger.addHandler(self.log)
            self._stack.callback(pysyncobj_logger.removeHandler, self.log)
            self._stack.callback(self._stop_all)
            for node_id in self.node_ids:
                self.start(node_id)
        except BaseException:
            self._stack.close()  # __exit__ will not run: undo the process-wide patches now
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stack.close()

    def start(self, node_id: str, *, patched: bool | None = None) -> SyncObj | None:
        """Build a node from its files: the first start, or a restart after a crash.

        ``patched=False`` builds this node on unpatched pysyncobj (a mixed cluster, as in a
        rolling upgrade); inside ``raftpatch.uninstalled()`` every node is unpatched anyway.
        A node whose storage refuses to start (`StorageError`: damage, a lost log) stays down
        for good; `refused` says why, and None is returned.
        """
        if node_id in self.nodes:
            raise RuntimeError(f"{node_id} is already running")
        try:
            if self.patched if patched is None else patched:
                raftpatch.install()  # the handler is bound in SyncObj.__init__: patch first
                return self._build(node_id)
            with raftpatch.uninstalled():
                return self._build(node_id)
        except StorageError as error:
            self.refused[node_id] = f"{type(error).__name__}: {error}"
            self.trace.record(self._now_us(), "refused", node_id, self.refused[node_id])
            return None

    def _build(self, node_id: str) -> SyncObj:
        base = os.path.join(self.data_dir, node_id)
        self_node = SimNode(node_id)
        others = [SimNode(other) for other in self.node_ids if other != node_id]
        transport = SimTransport(self.network, self_node, others)
        conf = self.conf_factory(node_id, base + ".journal", base + ".dump")
        spec = NodeSpec(node_id, self_node, others, conf, transport, self.disks[node_id])
        node = self.node_factory(spec)
        if self.prevote and raftpatch.runs_fix(node):
            prevote.attach(node, enabled=lambda: True)
        self.nodes[node_id] = node
        self.network.attach(node_id, transport)
        self.trace.record(self._now_us(), "start", node_id)
        return node

    def crash(self, node_id: str, *, keep_sent: bool = False) -> None:
        """kill -9: the process and its in-flight messages vanish; the page cache survives."""
        node = self.nodes.pop(node_id)
        self.network.detach(node_id, keep_sent=keep_sent)
        _release_os_resources(node)
        self.disks[node_id].crash()
        self.trace.record(self._now_us(), "crash", node_id)

    def power_cut(self, node_id: str, rng: random.Random, *, tear: bool = True) -> None:
        """The node's machine loses power: the process dies (what it sent is on the wire and
        arrives), and its disk keeps only what was durable, torn if ``tear`` (SimDisk)."""
        if node_id in self.nodes:
            self.crash(node_id, keep_sent=True)
        self.disks[node_id].power_cut(rng, tear=tear)
        self.trace.record(self._now_us(), "power-cut", node_id, self.disks[node_id].used_bytes())

    def _power_lost(self, node_id: str) -> None:
        """A power cut armed on the node's disk (SimDisk.cut_power_at) fired inside one of its
        disk calls: the disk already kept what it keeps; the process is gone with it."""
        if node_id in self.nodes:
            self.crash(node_id, keep_sent=True)
        self.trace.record(self._now_us(), "power-cut", node_id, self.disks[node_id].used_bytes())
        for observer in self.power_lost_observers:
            observer(node_id)

    def mid_step(self, action: Callable[[], None]) -> None:
        """Run ``action`` once in the next step, after the messages due are delivered and
        before any node ticks: nodes have answered them, and synced nothing yet."""
        self._mid_step.append(action)

    def restart(self, node_id: str, *, patched: bool | None = None) -> SyncObj | None:
        return self.start(node_id, patched=patched)

    def down(self) -> list[str]:
        """Nodes not running that could start (not those that refused to)."""
        return [node_id for node_id in self.node_ids
                if node_id not in self.nodes and node_id not in self.refused]

    def _stop_all(self) -> None:
        for disk in self.disks.values():
            disk.disarm()  # a clean stop, not one more fault
        for node_id in sorted(self.nodes):
            node = self.nodes.pop(node_id)
            node.destroy()
            _release_os_resources(node, journal=False)

    # --- time -----------------------------------------------------------------------------
    @property
    def now_s(self) -> float:
        return self.clock.now_s

    def _now_us(self) -> int:
        return round(self.clock.now_s * 1e6)

    def step(self) -> None:
        self._next_tick_s += self.tick_s  # ticks stay on a fixed grid despite read costs
        self.clock.advance_to(self._next_tick_s)
        self.network.deliver_due()
        actions, self._mid_step = self._mid_step, []
        for action in actions:
            action()
        for node_id in sorted(self.nodes):
            try:
                self.nodes[node_id].doTick(0.0)
            except PowerCut:
                self._power_lost(node_id)
        leaders = tuple(self.leaders())
        if leaders != self._leaders:
            self._leaders = leaders
            self.trace.record(self._now_us(), "leaders", leaders)

    def run_for(self, seconds: float) -> None:
        for _ in range(round(seconds / self.tick_s)):
            self.step()

    def run_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Step until the condition holds; False if simulated time ran out first."""
        for _ in range(math.ceil(timeout_s / self.tick_s - 1e-9)):  # >= 1 step if time left
            if condition():
                return True
            self.step()
        return condition()

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        if not self.run_until(condition, timeout_s):
            raise TimeoutError(f"seed {self.seed}: no '{what}' within {timeout_s}s simulated")

    def wait_leader(self, timeout_s: float) -> str:
        """Run until some node leads (`leader`); its id."""
        self.wait_for(lambda: self.leader() is not None, timeout_s, "a leader")
        leader = self.leader()
        assert leader is not None
        return leader

    # --- roles and clients ----------------------------------------------------------------
    def leaders(self) -> list[str]:
        return [node_id for node_id in sorted(self.nodes) if self.nodes[node_id]._isLeader()]

    def leader(self) -> str | None:
        """The live leader of the highest term, if any (an old one may still believe it)."""
        leaders = self.leaders()
        if not leaders:
            return None
        return max(leaders, key=lambda node_id: self.nodes[node_id].raftCurrentTerm)

    def propose(self, node_id: str, key: str,
                invoke: Callable[[SyncObj, Callback], None]) -> Proposal:
        """Run a client call on a node; ``invoke(node, callback)`` calls a replicated method."""
        proposal = Proposal(key, node_id, self.now_s)
        self.proposals.append(proposal)

        def answered(result: Any, error: int) -> None:
            if proposal.outcome is None:
                proposal.outcome, proposal.result = error, result
                proposal.answered_at_s = self.now_s
                self.trace.record(self._now_us(), "answer", key, error)

        self.trace.record(self._now_us(), "propose", node_id, key)
        invoke(self.nodes[node_id], answered)
        return proposal

    def acknowledged(self) -> list[str]:
        return [proposal.key for proposal in self.proposals if proposal.acknowledged]

    def is_patched(self, node_id: str) -> bool:
        """Whether this node runs the carried fix (decided when it was built)."""
        return raftpatch.runs_fix(self.nodes[node_id])

    def _observe(self, event: str, src: str, dst: str, message: Any) -> None:
        if event == "deliver":
            self.trace.record(self._now_us(), src, dst, *_summary(message))


def raft_log(node: SyncObj) -> list[tuple[int, int, bytes]]:
    """(index, term, command bytes) of every entry the node holds."""
    journal = node._SyncObj__raftLog
    return [(entry[1], entry[2], entry[0]) for entry in (journal[i] for i in range(len(journal)))]


def _release_os_resources(node: SyncObj, *, journal: bool = True) -> None:
    """Close what a dead process would have closed; pysyncobj leaves these open.

    raftcron's storage is left as a killed process leaves it: nothing synced, no clean-stop
    mark; its files die with the process (SimDisk.crash)."""
    if journal and storage_of(node) is None:
        node._SyncObj__raftLog._destroy()  # flushes the mmap: the page cache survives kill -9
    notifier = getattr(node, "_SyncObj__pipeNotifier", None)
    if notifier is not None:
        for fd in (notifier._PipeNotifier__pipeR, notifier._PipeNotifier__pipeW):
            os.close(fd)
    serializer = node._SyncObj__serializer
    for transmission in list(getattr(serializer, "_Serializer__transmissions", {}).values()):
        if "file" in transmission:
            transmission["file"].close()
    incoming = getattr(serializer, "_Serializer__incomingTransmissionFile", None)
    if incoming is not None and hasattr(incoming, "close"):
        incoming.close()

