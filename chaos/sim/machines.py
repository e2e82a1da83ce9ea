"""Pluggable replicated state machines for the simulation, and the simple one its tests use.

Owns the ``SimMachine`` protocol: how the harness builds a node, proposes a keyed command and
reads back which keys a replica applied and a digest of its whole state. A later chaos tier
plugs the scheduler in by implementing these four methods; ``KeyLog`` is the minimal
implementation (an append-only list of keys, the payload only fattens the log), on PySyncObj's
own files; ``StoredKeyLog`` is the same list on raftcron's storage (cluster/storage) on each
node's ``SimDisk``, so that power cuts and damage reach it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Protocol

import pysyncobj.syncobj as syncobj_module
from pysyncobj import SyncObj, SyncObjConsumer, replicated

from raftcron.chaos.sim.cluster import NodeSpec
from raftcron.cluster.consensus import raftpatch
from raftcron.cluster.membership.raftconfig import Callback
from raftcron.cluster.storage.node import RaftStorage

DATA_DIR = "/data"  # every node's data dir, on its own SimDisk



def sim_monotonic() -> float:
    """The simulation's clock (chaos/sim/clock.py patches PySyncObj's), read when called."""
    return float(syncobj_module.monotonicTime())


class SimMachine(Protocol):
    def build(self, spec: NodeSpec) -> SyncObj:
        """Construct one node (call raftpatch.install() before SyncObj.__init__)."""

    def propose(self, node: SyncObj, key: str, payload: bytes, callback: Callback) -> None:
        """Submit the command identified by ``key``; ``callback(result, FAIL_REASON)``."""

    def applied_keys(self, node: SyncObj) -> list[str]:
        """Keys of the commands this replica has applied, in apply order."""

    def state_digest(self, node: SyncObj) -> str:
        """A digest of the replica's whole state: equal states, equal digests."""


class KeyLogNode(SyncObj):  # type: ignore[misc]  # pysyncobj is untyped
    """Replicated list of keys; what a test reads to see which commands were applied."""

    def __init__(self, spec: NodeSpec) -> None:
        raftpatch.install()  # before SyncObj.__init__ binds the message handler
        super().__init__(spec.self_node, spec.other_nodes, spec.conf, transport=spec.transport)
        self.keys: list[str] = []  # state: assigned after the base __init__, so it is dumped

    @replicated  # type: ignore[untyped-decorator]  # pysyncobj is untyped
    def put(self, key: str, payload: bytes) -> int:
        self.keys.append(key)
        return len(self.keys)


class KeyLog:
    """The ``SimMachine`` for ``KeyLogNode``."""

    def build(self, spec: NodeSpec) -> SyncObj:
        return KeyLogNode(spec)

    def propose(self, node: SyncObj, key: str, payload: bytes, callback: Callback) -> None:
        node.put(key, payload, callback=callback)

    def applied_keys(self, node: SyncObj) -> list[str]:
        keys: list[str] = node.keys
        return keys

    def state_digest(self, node: SyncObj) -> str:
        return hashlib.sha256(repr(node.keys).encode()).hexdigest()[:16]


class Keys(SyncObjConsumer):  # type: ignore[misc]  # pysyncobj is untyped
    """The replicated list of keys as a consumer, with the snapshot a `RaftStorage` asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []

    @replicated  # type: ignore[untyped-decorator]  # pysyncobj is untyped
    def put(self, key: str, payload: bytes) -> int:
        self.keys.append(key)
        return len(self.keys)

    def snapshot_bytes(self) -> bytes:
        return json.dumps(self.keys).encode()

    def load_snapshot(self, blob: bytes | bytearray) -> None:
        self.keys = json.loads(blob)


class StoredKeyLog:
    """The ``SimMachine`` of a key list on raftcron's storage, one `SimDisk` per node."""

    def __init__(self, *, durability: str = "fsync", segment_bytes_max: int = 16 << 10) -> None:
        self.durability = durability
        self.segment_bytes_max = segment_bytes_max
        self.consumers: dict[int, Keys] = {}
        self.storages: dict[str, RaftStorage] = {}  # node id -> the latest storage built

    def build(self, spec: NodeSpec) -> SyncObj:
        raftpatch.install()
        consumer = Keys()
        storage = RaftStorage(DATA_DIR, node_id=spec.node_id, source=consumer,
                              durability=self.durability, fork=False, disk=spec.disk,
                              sync_thread=False,
                              monotonic=sim_monotonic,
                              segment_bytes_max=self.segment_bytes_max)
        spec.conf.journalFile = spec.conf.fullDumpFile = storage
        node = SyncObj(spec.self_node, spec.other_nodes, spec.conf, consumers=[consumer],
                       transport=spec.transport)
        self.consumers[id(node)] = consumer
        self.storages[spec.node_id] = storage
        return node

    def propose(self, node: SyncObj, key: str, payload: bytes, callback: Callback) -> None:
        self.consumers[id(node)].put(key, payload, callback=callback)

    def applied_keys(self, node: SyncObj) -> list[str]:
        return list(self.consumers[id(node)].keys)

    def state_digest(self, node: SyncObj) -> str:
        return hashlib.sha256(repr(self.consumers[id(node)].keys).encode()).hexdigest()[:16]


def payload_of(size_bytes: int, key: str) -> bytes:
    """Deterministic filler so that commands have a realistic size (30 KB in the fuzz)."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size_bytes // len(seed) + 1))[:size_bytes]

