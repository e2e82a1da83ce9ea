"""The product's replica inside the simulator, and the history it writes.

Owns how tier 1 plugs ``cluster.consensus.replica.StateMachine`` (in a plain ``SyncObj``, with the
conf
``cluster.consensus.replica.sync_conf`` builds) into ``chaos.sim`` as a ``SimMachine``, on
PySyncObj's own files or, given a durability, on the product's storage
(``cluster.storage.RaftStorage``, no fork, on the node's ``SimDisk``, as
``cluster.consensus.replica.RaftNode`` builds it); how a bug in the replica's ``apply`` fails the
seed instead of ending the test process; and ``LogRecorder``, which reads after every step the
entries each node applied since (one entry per index: an index applied with two different entries is
a fork). The recorded log is the history the checks replay. It never decides what to propose: that
is chaos.tier1.workload's.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.config import SERIALIZER_STATE

from raftcron.chaos.sim.cluster import NodeSpec, SimCluster
from raftcron.chaos.sim.machines import sim_monotonic
from raftcron.cluster.config import NodeConfig, RaftTuning
from raftcron.cluster.consensus import prevote, raftpatch
from raftcron.cluster.consensus import replica as product_replica
from raftcron.cluster.consensus.replica import AUDIT_PREFIX, StateMachine, encode_batch, sync_conf
from raftcron.cluster.storage.node import RaftStorage
from raftcron.scheduler import codec
from raftcron.scheduler.commands import Barrier
from raftcron.scheduler.snapshot import digest
from raftcron.scheduler.state import SchedulerState

DATA_DIR = "/data"  # every node's data dir, on its own SimDisk
SEGMENT_BYTES_MAX = 16 << 10  # small: segments rotate and dead ones are deleted during a run



class ReplicaMachine:
    """`chaos.sim.SimMachine` for `cluster.consensus.replica.StateMachine` in a plain `SyncObj`;
    with a
    ``durability`` ("fsync" or "os") on raftcron's storage, else on PySyncObj's files."""

    def __init__(self, tuning: RaftTuning, *, durability: str | None = None,
                 segment_bytes_max: int = SEGMENT_BYTES_MAX, prevote: bool = True,
                 slow_sync_ticks: int = 0, seed: int | str = 0) -> None:
        self.tuning = tuning
        self.prevote = prevote  # cluster/consensus/prevote.py, as a finalized cluster runs it
        self.slow_sync_ticks = slow_sync_ticks  # a follower's batch written 0..this ticks late
        self.seed = seed
        self.durability = durability
        self.segment_bytes_max = segment_bytes_max
        self.consumers: dict[int, tuple[SyncObj, StateMachine]] = {}  # id(node) -> both
        self.storage_events: dict[str, int] = {"snapshots_written": 0, "snapshots_installed": 0,
                                               "torn_tails_cut": 0}

    def conf(self, node_id: str, journal: str, dump: str) -> SyncObjConf:
        """The product's conf (sync_conf), with what a simulation changes: ticks, files, fork."""
        config = NodeConfig(
            node_id, "127.0.0.1:1", "127.0.0.1:2", Path(journal).parent, None, raft=self.tuning
        )
        conf = sync_conf(config)
        conf.autoTick, conf.useFork, conf.bindAddress = False, False, None
        conf.journalFile, conf.fullDumpFile = journal, dump
        return conf

    def build(self, spec: NodeSpec) -> SyncObj:
        raftpatch.install()
        consumer = StateMachine()
        storage: RaftStorage | None = None
        if self.durability is not None:
            storage = RaftStorage(DATA_DIR, node_id=spec.node_id, source=consumer,
                                  durability=self.durability, fork=False, disk=spec.disk,
                                  sync_thread=False,
                                  monotonic=sim_monotonic,
                                  segment_bytes_max=self.segment_bytes_max)
            self._count_events(storage)
            if self.slow_sync_ticks:
                rng = random.Random(f"{self.seed}/{spec.node_id}/syncs")
                storage.flight_ticks = lambda: rng.randint(0, self.slow_sync_ticks)
            spec.conf.journalFile = spec.conf.fullDumpFile = storage
        node = SyncObj(
            spec.self_node, spec.other_nodes, conf=spec.conf, consumers=[consumer],
            transport=spec.transport,
        )
        self.consumers[id(node)] = (node, consumer)
        if raftpatch.runs_fix(node):  # an unpatched node's handler would not answer pre-votes
            learner = (lambda: storage.learner) if storage is not None else (lambda: False)
            prevote.attach(node, enabled=lambda: self.prevote, learner=learner)
        return node

    def _count_events(self, storage: RaftStorage) -> None:
        """What the storage did, for the report: a run whose nodes never snapshotted, installed
        a snapshot or cut a torn tail did not exercise them."""
        events = self.storage_events
        events["torn_tails_cut"] += storage.load_report.torn_segment is not None
        store = storage.snapshots
        check, install = store.checkSerializing, store.setTransmissionData

        def checked() -> tuple[int, int | None]:
            state, serialize_id = check()
            events["snapshots_written"] += state == SERIALIZER_STATE.SUCCESS
            return state, serialize_id

        def installed(data: Any) -> bool:
            done = install(data)
            events["snapshots_installed"] += done
            return done

        store.checkSerializing = checked  # type: ignore[method-assign]
        store.setTransmissionData = installed  # type: ignore[method-assign]

    def consumer(self, node: SyncObj) -> StateMachine:
        return self.consumers[id(node)][1]

    def state(self, node: SyncObj) -> SchedulerState:
        return self.consumer(node).state

    def propose(self, node: SyncObj, key: str, payload: bytes, callback: Any) -> None:
        if key.startswith("barrier"):  # settle()'s barrier: a real no-op, as an audit
            # (a Barrier takes no place in the request-id table; an audit is recorded by id)
            payload = encode_batch([codec.encode(Barrier(AUDIT_PREFIX + key))])
        self.consumer(node).apply(payload, callback=callback)

    def applied_keys(self, node: SyncObj) -> list[str]:
        """Request ids the replica answered Ok, in log order (its dedupe table), then the
        barriers (audits) it applied."""
        audits = [key.removeprefix(AUDIT_PREFIX) for key in self.consumer(node).audits]
        return [*self.state(node).requests.results, *audits]

    def state_digest(self, node: SyncObj) -> str:
        return digest(self.state(node))


class ReplicaBug(Exception):
    """`StateMachine.apply` hit an unexpected exception: the product would exit the node."""


@contextmanager
def replica_bugs_raise() -> Iterator[list[str]]:
    """While a simulation runs, a bug in apply raises `ReplicaBug` (with the logged traceback)
    instead of `logging.shutdown(); os._exit(70)`, which would end the whole test process.

    It swaps two names in cluster.replica's module globals (`os`, `logging`: all that its bug
    path calls) for the duration, and puts them back even on error. One simulation runs at a
    time in a process (chaos.sim.clock patches pysyncobj the same way), so nothing else sees
    the swap. The swap goes once StateMachine takes an injectable callback (the signature
    proposed for it: ``on_bug: Callable[[BaseException], NoReturn] | None = None``):
    ``StateMachine(on_bug=raise_replica_bug)``.
    """
    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(logging.Formatter().format(record))

    def exit_node(code: int) -> None:
        raise ReplicaBug(f"exit {code}: " + (logged[-1] if logged else "no log"))

    handler = Keep(level=logging.CRITICAL)
    product_log = logging.getLogger("raftcron.replica")
    stand_ins = {"os": SimpleNamespace(_exit=exit_node),
                 "logging": SimpleNamespace(shutdown=lambda: None)}
    saved = {name: getattr(product_replica, name) for name in stand_ins}
    product_log.addHandler(handler)
    for name, stand_in in stand_ins.items():
        setattr(product_replica, name, stand_in)
    try:
        yield logged
    finally:
        for name, module in saved.items():
            setattr(product_replica, name, module)
        product_log.removeHandler(handler)


class LogRecorder:
    """After every step, reads the entries each node applied since; one entry per index."""

    def __init__(self) -> None:
        self.entries: dict[int, tuple[int, bytes]] = {}  # index -> (term, entry bytes)
        self.problems: list[str] = []
        self._read: dict[str, tuple[SyncObj, int]] = {}  # node id -> (object, last index read)

    def observe(self, nodes: dict[str, SyncObj]) -> None:
        for node_id, node in nodes.items():
            seen_node, read = self._read.get(node_id, (None, 0))
            if seen_node is not node:
                read = 0  # restarted: read again whatever its journal holds
            journal = node._SyncObj__raftLog
            applied = int(node.raftLastApplied)
            if len(journal) and applied > read:
                first = journal[0][1]
                for index in range(max(read + 1, first), applied + 1):
                    command, entry_index, term = journal[index - first]
                    assert entry_index == index
                    self._record(node_id, index, term, command)
            self._read[node_id] = (node, max(read, applied))

    def _record(self, node_id: str, index: int, term: int, command: bytes) -> None:
        known = self.entries.get(index)
        if known is None:
            self.entries[index] = (term, command)
        elif known != (term, command):
            self.problems.append(
                f"fork: {node_id} applied index {index} of term {term}, another node applied "
                f"term {known[0]} there"
            )

    def payloads(self) -> Iterator[tuple[int, bytes]]:
        """(index, payload) of each replicated apply() call, in log order."""
        for index in sorted(self.entries):
            command = self.entries[index][1]
            if command[:1] == b"\x00":  # REGULAR; no-ops and membership carry no payload
                call = pysyncobj_pickle.loads(command[1:])
                yield index, call[1][0]

    def gaps(self) -> list[int]:
        return [i for i in range(1, max(self.entries, default=0) + 1) if i not in self.entries]


class RecordingCluster(SimCluster):
    """A SimCluster whose every step (settle()'s too) feeds the log recorder, then runs the
    nodes' own background work (the tickers: in a node they never stop)."""

    recorder: LogRecorder
    background: Callable[[], None] = staticmethod(lambda: None)

    def step(self) -> None:
        super().step()
        self.recorder.observe(self.nodes)
        self.background()
