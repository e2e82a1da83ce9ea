"""The reviewed glue between a membership change and PySyncObj's configuration.

Why PySyncObj's own dynamic membership (``dynamicMembershipChange``) and not a scheme of our
own: its change is Raft's single-server change done right where it matters most — a change is
in force on a node from the moment its entry is appended there (leader and followers), and is
undone when that entry is truncated — and it already carries the transport (connections to a
new member, none to a removed one) and the leader's bookkeeping (next/match index). A scheme
that moved voters when a change is *applied* (as etcd does) needs the same care twice. What
PySyncObj does not do, we add: one change at a time (`book`, and the gate in the storage hooks
that refuses any configuration entry the book does not hold in progress), catch-up before a new
node counts (the leader replicates to it as a learner first, below), no removal of the leader by
itself (`driver` hands leadership over first), the configuration read back from the node's own
snapshot and log at start (storage hooks, rule 5), and a snapshot's voters as of its own index.

Everything here touches PySyncObj's name-mangled internals; `cluster.consensus.raftpatch` refuses to
run on any source other than the reviewed one (its hashes list what this module relies on). The
calls that change something run on the Raft thread (`RaftNode.on_raft_thread`); the reads are
single dict or set reads, safe from another thread under the GIL.

A learner, here: a node the leader sends the log (and snapshots) to, whose acknowledgements
move its match index, but who is not in the configuration: it counts toward nothing. PySyncObj
has this for its read-only nodes; a joining node is registered with the leader the same way,
under its Raft address, so that its connection is accepted (or made) like a member's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.node import TCPNode

# How PySyncObj answers a replicated call: `callback(result, error)`, error a FAIL_REASON
# (SUCCESS is 0). The simulation (chaos/sim) proposes through the same signature.
Callback = Callable[[Any, int], None]


def voters(sync: SyncObj) -> list[str]:
    """This node's configuration: Raft addresses of every voter, itself included."""
    me = sync.selfNode
    others = [node.id for node in sync.otherNodes]
    return sorted([*others, me.id] if me is not None else others)


def other_voters(sync: SyncObj) -> list[str]:
    return sorted(node.id for node in sync.otherNodes)


def pending_config_index(sync: SyncObj) -> int | None:
    """The index of the newest configuration entry in this node's log if it is not committed
    yet (it is in force, but may still be truncated), else None."""
    log = _storage_log(sync)
    if log is None or not log.config_indexes:
        return None
    newest = log.config_indexes[-1]
    return newest if newest > sync.raftCommitIndex else None


def newest_config_index(sync: SyncObj) -> int | None:
    """The index of the newest configuration entry this node's log holds (None: none held,
    or compacted into the snapshot)."""
    log = _storage_log(sync)
    return log.config_indexes[-1] if log is not None and log.config_indexes else None


def may_change_configuration(sync: SyncObj) -> bool:
    """A leader appends a configuration entry only once its term's first entry is applied
    (PySyncObj refuses earlier, with REQUEST_DENIED: Raft's rule after a leader change)."""
    noop = sync._SyncObj__noopIDx
    return bool(sync._isLeader()) and noop is not None and sync.raftLastApplied >= noop


def listens(sync: SyncObj) -> bool:
    """Whether this node has a Raft listener: a node started without peers binds none
    (cluster/consensus/raftguard.py, rule 1), so no other node can ever reach it."""
    return getattr(sync._SyncObj__transport, "_server", None) is not None


def match_index(sync: SyncObj, address: str) -> int | None:
    """How far the leader knows `address` holds its log (a voter or a learner)."""
    value = sync._SyncObj__raftMatchIndex.get(TCPNode(address))
    return None if value is None else int(value)


def is_connected(sync: SyncObj, address: str) -> bool:
    return bool(sync.isNodeConnected(TCPNode(address)))


# -- on the Raft thread ---------------------------------------------------------------------


def add_learner(sync: SyncObj, address: str) -> None:
    """Replicate to `address` without counting it (idempotent; a voter is left alone)."""
    node = TCPNode(address)
    if node in sync.otherNodes or node == sync.selfNode:
        return
    sync._SyncObj__transport.addNode(node)
    sync._SyncObj__readonlyNodes.add(node)
    last_index = sync._SyncObj__raftLog[-1][1]
    sync._SyncObj__raftNextIndex.setdefault(node, last_index + 1)
    sync._SyncObj__raftMatchIndex.setdefault(node, 0)


def drop_learner(sync: SyncObj, address: str) -> None:
    """Stop replicating to a learner (a voter is left alone)."""
    node = TCPNode(address)
    if node not in sync._SyncObj__readonlyNodes:
        return
    sync._SyncObj__readonlyNodes.discard(node)
    if node in sync.otherNodes:
        return  # a voter now: PySyncObj's own from here on
    sync._SyncObj__transport.dropNode(node)
    sync._SyncObj__raftNextIndex.pop(node, None)
    sync._SyncObj__raftMatchIndex.pop(node, None)
    # Not struck from the connected nodes: the transport keeps its connection (raftguard,
    # rule 4), and only the transport's callbacks, which run when that connection closes or
    # comes up, keep that set true. Struck here, a learner registered again (this node leads
    # again) or made a voter over the same connection was never sent an entry.
    sync._SyncObj__serializer.cancelTransmisstion(node)


def transport_view(sync: SyncObj, address: str) -> dict[str, Any]:
    """What the transport knows of `address` (for the logs of a node catching up)."""
    transport = sync._SyncObj__transport
    node = TCPNode(address)
    conn = transport._connections.get(node)
    return {"known": address in transport._nodeAddrToNode,
            "connection": None if conn is None else int(conn.state),
            "unknown_connections": len(transport._unknownConnections)}


def connections(sync: SyncObj) -> dict[str, int | None]:
    """Raft address -> the state of this node's connection to it (None: no connection kept)."""
    transport = sync._SyncObj__transport
    return {node.id: None if transport._connections.get(node) is None else
            int(transport._connections[node].state) for node in list(transport._nodes)}


def learners(sync: SyncObj) -> list[str]:
    return sorted(node.id for node in list(sync._SyncObj__readonlyNodes)
                  if isinstance(node, TCPNode))


def propose(sync: SyncObj, kind: str, address: str, callback: Callback) -> None:
    """Propose the configuration entry adding (``add``) or removing (``rem``) `address`;
    `callback(result, reason)` once it is applied or refused. The storage hooks' gate appends
    it only if it is the member book's change in progress."""
    node = TCPNode(address)
    if kind == "add":
        # It stays a learner too until the change ends (PySyncObj sends to the union of both
        # sets once): if this entry is not appended after all, it is still being caught up.
        sync.addNodeToCluster(node, callback=callback)
    else:
        sync.removeNodeFromCluster(node, callback=callback)


def _storage_log(sync: SyncObj) -> Any:
    journal = getattr(sync, "_SyncObj__raftLog", None)
    storage = getattr(journal, "storage", None)
    return getattr(storage, "log", None)
