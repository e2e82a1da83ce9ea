"""A follower that sees its leader's connection drop calls an election soon, not after a timeout.

A leader that crashes (a kill, the OOM killer, a fault) closes its TCP connections with it: the
kernel tells every follower at once. PySyncObj ignores that and waits for the election timeout
(`raft.election_timeout_min_s`..`max_s` after the last heartbeat, 0.4-1.0 s by default), so a
crash cost up to the whole timeout before anyone stood. Here a follower whose connection to the
leader it follows closes moves its election deadline to `FIRST_S + STEP_S * rank` (+ up to
`JITTER_S`), `rank` being its place among the remaining members by id: the first stands almost
at once, the next only if the first did not win (a log behind, a lost message), so the two do
not split the vote as two random deadlines close together would.

Safety is untouched: an election is always safe in Raft, this only chooses when one starts. A
connection that drops while the leader lives (a network fault) costs one election, as a lost
heartbeat would after a timeout. A deadline is brought forward, never pushed back (but see
the next paragraph); a leadership transfer in progress is left to its own rule.

The same order holds when a member comes to be connected after it was connected to no one:
PySyncObj stands only while connected to someone, so when a leader died while the two others
were not yet connected to each other (one had just restarted, and the other, whose address is
greater, connects to it only at its next `raft.connection_retry_s`), both deadlines passed
while each was alone, and the moment the connection came up both stood in the same instant: a
split vote and a whole election timeout more (failovers of 0.9-1.2 s, 3 in 30 after a
restart). Such a member's deadline is put at least the same `FIRST_S + STEP_S * rank` after
the connection; this is the only case where a deadline moves later, and by under half a second.

Installed by `cluster.consensus.raftpatch.install` after its source review (the wrapped functions'
hashes are in `REVIEWED_SOURCE_SHA256`). Clock and randomness are PySyncObj's module globals, so the
simulation (chaos/sim/clock.py) drives them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pysyncobj.syncobj as syncobj_module
from pysyncobj import SyncObj
from pysyncobj.syncobj import _RAFT_STATE

from raftcron.cluster.consensus import prevote

HANDLER = "_SyncObj__onNodeDisconnected"
CONNECTED = "_SyncObj__onNodeConnected"
MARKER = "__leaderloss_original__"
FIRST_S = 0.05  # the first remaining member stands this long after the leader's connection went
STEP_S = 0.2  # each later one this much after the one before it
JITTER_S = 0.05


def election_delay_s(self_id: str, others: list[str], lost_leader: str | None,
                     draw: float) -> float:
    """When this follower stands after losing `lost_leader`'s connection (`draw` in [0, 1))."""
    remaining = sorted({self_id, *others} - {lost_leader})
    return FIRST_S + STEP_S * remaining.index(self_id) + JITTER_S * draw


def _make_on_node_disconnected(library: Callable[..., Any]) -> Callable[..., Any]:
    def on_node_disconnected(self: Any, node: Any) -> None:
        library(self, node)
        if node == self._SyncObj__raftLeader:
            prevote.leader_lost(self)  # its lease ends with its connection
        self_node = self._SyncObj__selfNode
        if (self_node is None or self._SyncObj__raftState != _RAFT_STATE.FOLLOWER
                or node != self._SyncObj__raftLeader or self._SyncObj__transferInProgress):
            return
        others = [str(other.id) for other in self._SyncObj__otherNodes]
        delay_s = election_delay_s(str(self_node.id), others, str(node.id),
                                   syncobj_module.random.random())
        deadline = syncobj_module.monotonicTime() + delay_s
        if deadline < self._SyncObj__raftElectionDeadline:
            self._SyncObj__raftElectionDeadline = deadline

    return on_node_disconnected


def _make_on_node_connected(library: Callable[..., Any]) -> Callable[..., Any]:
    def on_node_connected(self: Any, node: Any) -> None:
        alone = not self._SyncObj__connectedNodes
        library(self, node)
        self_node = self._SyncObj__selfNode
        if (not alone or self_node is None or self._SyncObj__raftState == _RAFT_STATE.LEADER
                or self._SyncObj__transferInProgress or node not in self._SyncObj__otherNodes):
            return
        leader = self._SyncObj__raftLeader  # kept until the node stands: the one it lost
        others = [str(other.id) for other in self._SyncObj__otherNodes]
        delay_s = election_delay_s(str(self_node.id), others,
                                   None if leader is None else str(leader.id),
                                   syncobj_module.random.random())
        deadline = syncobj_module.monotonicTime() + delay_s
        if self._SyncObj__raftElectionDeadline < deadline:
            self._SyncObj__raftElectionDeadline = deadline

    return on_node_connected


_WRAPPERS = {HANDLER: _make_on_node_disconnected, CONNECTED: _make_on_node_connected}


KEEPALIVE = {"type": "keepalive"}  # a message type PySyncObj ignores: only the read counts


class LinkKeeper:
    """Sends every other member a keepalive every `every_s`, on the Raft thread.

    PySyncObj drops a connection that has read nothing for `raft.connection_timeout_s`, but
    it looks only when the connection has an event or something is sent on it. Two
    followers send each other nothing while a leader lives, so after a stable leader's crash
    the first vote request a follower sent the other found their link timed out: the send
    dropped the link and the message with it, and the election waited for a reconnection
    (failover 0.52-1.09 s, 8 of 8 times, after 5 s of a stable leader; 0.1 s right after
    a restart). Keepalives keep every link read from, both ways.
    """

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.next_s = 0.0

    def tick(self, sync: Any) -> None:
        now = syncobj_module.monotonicTime()
        if now < self.next_s:
            return
        self.next_s = now + self.every_s
        transport = sync._SyncObj__transport
        for node in list(sync._SyncObj__otherNodes):
            transport.send(node, KEEPALIVE)  # a node not connected: a no-op


def is_installed() -> bool:
    return all(hasattr(getattr(SyncObj, name), MARKER) for name in _WRAPPERS)


def install() -> None:
    """Idempotent; before a node is built (SyncObj.__init__ binds the callbacks)."""
    for name, make_wrapper in _WRAPPERS.items():
        current = getattr(SyncObj, name)
        if hasattr(current, MARKER):
            continue
        wrapper = make_wrapper(current)
        setattr(wrapper, MARKER, current)
        setattr(SyncObj, name, wrapper)


def uninstall() -> None:
    for name in _WRAPPERS:
        current = getattr(SyncObj, name)
        setattr(SyncObj, name, getattr(current, MARKER, current))
