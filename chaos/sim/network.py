"""In-memory network for simulated PySyncObj nodes: FIFO links with seeded faults.

Owns message delivery between ``SimTransport`` instances: every directed link is a FIFO queue
(TCP-like) unless a fault says otherwise. Seeded faults per message: random delay, drop,
duplicate (the copy arrives later, out of order) and delay spikes (the message overtakes
nothing but may be overtaken: it is re-ordered behind later ones). Partitions cut links,
one-way or both ways; scripted tests can pause a link, deliver its head, capture and inject
messages. Messages are pickled on send, so nodes never share objects.

Determinism: each link draws from its own RNG seeded by (seed, src, dst), and deliveries are
ordered by (time, src, dst, sequence). The order in which a node sends to different peers
(pysyncobj iterates a set of nodes, which depends on hash randomization) therefore changes
nothing. Must not read a real clock or the global ``random``.
"""

from __future__ import annotations

import bisect
import pickle
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pysyncobj.node import Node
from pysyncobj.transport import Transport

from raftcron.chaos.sim.clock import FakeClock
from raftcron.chaos.sim.disk import PowerCut

Observer = Callable[[str, str, str, Any], None]  # (event, src, dst, message)


@dataclass(frozen=True)
class LinkFaults:
    """Per-message fault probabilities; the default is a perfect TCP-like link."""

    delay_min_s: float = 0.001
    delay_max_s: float = 0.004
    drop_p: float = 0.0
    duplicate_p: float = 0.0
    duplicate_delay_max_s: float = 0.3
    spike_p: float = 0.0
    spike_delay_max_s: float = 0.3


@dataclass(order=True)
class _Envelope:
    deliver_at_s: float
    seq: int
    payload: bytes = field(compare=False)


class _Link:
    def __init__(self, seed: int | str, src: str, dst: str) -> None:
        self.rng = random.Random(f"{seed}:{src}->{dst}")
        self.queue: list[_Envelope] = []
        self.next_seq = 0
        self.fifo_at_s = 0.0  # delivery time of the last in-order message
        self.cut = False
        self.paused = False

    def push(self, deliver_at_s: float, payload: bytes) -> None:
        self.next_seq += 1
        bisect.insort(self.queue, _Envelope(deliver_at_s, self.next_seq, payload))


class SimNetwork:
    """All links between the attached transports, driven by a ``FakeClock``."""

    def __init__(self, clock: FakeClock, seed: int | str, faults: LinkFaults | None = None):
        self.clock = clock
        self.seed = seed
        self.faults = faults or LinkFaults()
        self.link_faults: dict[tuple[str, str], LinkFaults] = {}
        self.transports: dict[str, SimTransport] = {}
        self.observers: list[Observer] = []
        self.on_power_lost: Callable[[str], None] | None = None  # a node's disk cut mid-call
        self._links: dict[tuple[str, str], _Link] = {}

    # --- topology -------------------------------------------------------------------------
    def link(self, src: str, dst: str) -> _Link:
        key = (src, dst)
        if key not in self._links:
            self._links[key] = _Link(self.seed, src, dst)
        return self._links[key]

    def attach(self, node_id: str, transport: SimTransport) -> None:
        """A node (re)starts: it and every live peer see each other connected."""
        self.transports[node_id] = transport
        for peer_id in sorted(self.transports):
            if peer_id != node_id:
                transport.peer_connected(peer_id)
                self.transports[peer_id].peer_connected(node_id)

    def detach(self, node_id: str, *, keep_sent: bool = False) -> None:
        """A node crashes: everything in flight to or from it is lost, peers see it go.
        With ``keep_sent`` what it sent is already on the wire and still arrives (a power
        cut an instant after a send)."""
        self.transports.pop(node_id, None)
        for (src, dst), link in sorted(self._links.items()):
            if dst == node_id or (src == node_id and not keep_sent):
                link.queue.clear()
                link.fifo_at_s = 0.0
        for peer_id in sorted(self.transports):
            self.transports[peer_id].peer_disconnected(node_id)

    def cut(self, src: str, dst: str) -> None:
        """One-way partition: src -> dst loses everything, including what is in flight."""
        self.link(src, dst).cut = True

    def isolate(self, node_id: str, peers: list[str]) -> None:
        for peer in peers:
            if peer != node_id:
                self.cut(node_id, peer)
                self.cut(peer, node_id)

    def heal(self) -> None:
        for link in self._links.values():
            link.cut = False
            link.paused = False

    def pause(self, src: str, dst: str) -> None:
        """Hold messages on a link (a slow link, order kept) until resume or deliver_head."""
        self.link(src, dst).paused = True

    def resume(self, src: str, dst: str) -> None:
        self.link(src, dst).paused = False

    # --- traffic --------------------------------------------------------------------------
    def send(self, src: str, dst: str, message: Any) -> bool:
        link = self.link(src, dst)
        for observer in self.observers:
            observer("send", src, dst, message)
        if dst not in self.transports or link.cut:
            return dst in self.transports
        faults = self.link_faults.get((src, dst), self.faults)
        rng = link.rng
        if faults.drop_p and rng.random() < faults.drop_p:
            return True
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        now = self.clock.now_s
        deliver_at = now + rng.uniform(faults.delay_min_s, faults.delay_max_s)
        if faults.spike_p and rng.random() < faults.spike_p:
            link.push(deliver_at + rng.uniform(0.0, faults.spike_delay_max_s), payload)
        else:
            link.fifo_at_s = max(link.fifo_at_s, deliver_at)
            link.push(link.fifo_at_s, payload)
        if faults.duplicate_p and rng.random() < faults.duplicate_p:
            link.push(deliver_at + rng.uniform(0.0, faults.duplicate_delay_max_s), payload)
        return True

    def inject(self, src: str, dst: str, message: Any, delay_s: float = 0.0) -> None:
        """Put an extra copy of a message on a link, outside its FIFO order."""
        self.link(src, dst).push(self.clock.now_s + delay_s, pickle.dumps(message))

    def deliver_now(self, src: str, dst: str, message: Any) -> None:
        """Deliver a copy of a message immediately, ahead of everything on the link."""
        self._deliver(src, dst, _Envelope(self.clock.now_s, 0, pickle.dumps(message)))

    def capture(self, src: str, dst: str, predicate: Callable[[Any], bool]) -> list[Any]:
        """From now on, keep a copy of every message sent on a link that matches."""
        captured: list[Any] = []

        def observe(event: str, sender: str, receiver: str, message: Any) -> None:
            if event == "send" and (sender, receiver) == (src, dst) and predicate(message):
                captured.append(pickle.loads(pickle.dumps(message)))

        self.observers.append(observe)
        return captured

    def pending(self, src: str, dst: str) -> list[Any]:
        """Messages in flight on a link, in delivery order (copies)."""
        return [pickle.loads(envelope.payload) for envelope in self.link(src, dst).queue]

    def in_flight(self) -> int:
        return sum(len(link.queue) for link in self._links.values())

    def deliver_head(self, src: str, dst: str) -> Any:
        """Deliver the first message of a link now, even if the link is paused."""
        link = self.link(src, dst)
        envelope = link.queue.pop(0)
        return self._deliver(src, dst, envelope)

    def deliver_due(self) -> int:
        """Deliver every message whose time has come, in (time, src, dst, seq) order."""
        delivered = 0
        now = self.clock.now_s
        while True:
            best: tuple[float, str, str, int] | None = None
            for (src, dst), link in self._links.items():
                if link.queue and not link.paused and link.queue[0].deliver_at_s <= now:
                    head = link.queue[0]
                    candidate = (head.deliver_at_s, src, dst, head.seq)
                    if best is None or candidate < best:
                        best = candidate
            if best is None:
                return delivered
            _, src, dst, _ = best
            self._deliver(src, dst, self._links[(src, dst)].queue.pop(0))
            delivered += 1

    def _deliver(self, src: str, dst: str, envelope: _Envelope) -> Any:
        transport = self.transports.get(dst)
        message = pickle.loads(envelope.payload)
        if transport is None or self.link(src, dst).cut:
            return message
        for observer in self.observers:
            observer("deliver", src, dst, message)
        try:
            transport.deliver(src, message)
        except PowerCut:  # the node's power failed inside a disk call made while handling it
            if self.on_power_lost is None:
                raise
            self.on_power_lost(dst)
        return message


class SimTransport(Transport):  # type: ignore[misc]  # pysyncobj is untyped
    """A pysyncobj Transport over a ``SimNetwork``; always ready, never binds a socket."""

    def __init__(self, network: SimNetwork, self_node: Node, other_nodes: list[Node]) -> None:
        super().__init__(None, self_node, other_nodes)
        self.network = network
        self.self_id: str = self_node.id
        self.peers: dict[str, Node] = {node.id: node for node in other_nodes}

    def send(self, node: Node, message: Any) -> bool:
        return self.network.send(self.self_id, node.id, message)

    def deliver(self, src_id: str, message: Any) -> None:
        node = self.peers.get(src_id)
        if node is not None:
            self._onMessageReceived(node, message)

    def peer_connected(self, peer_id: str) -> None:
        node = self.peers.get(peer_id)
        if node is not None:
            self._onNodeConnected(node)

    def peer_disconnected(self, peer_id: str) -> None:
        node = self.peers.get(peer_id)
        if node is not None:
            self._onNodeDisconnected(node)

    def addNode(self, node: Node) -> None:
        self.peers[node.id] = node
        if node.id in self.network.transports:
            self._onNodeConnected(node)

    def dropNode(self, node: Node) -> None:
        self.peers.pop(node.id, None)

    def destroy(self) -> None:
        if self.network.transports.get(self.self_id) is self:
            self.network.detach(self.self_id)


NETWORK_FAULTS = ("isolate", "isolate-leader", "one-way", "slow-link", "duplicates")


def strike_network(
    network: SimNetwork,
    action: str,
    *,
    node: str,
    other: str,
    leader: str | None,
    ids: list[str],
    rng: random.Random,
    later: Callable[[float, Callable[[], None]], None],
    isolate_s: tuple[float, float] = (0.3, 1.5),
) -> bool:
    """One of the network faults both simulations draw (NETWORK_FAULTS), undone `later`;
    False if `action` is not one. A seed's meaning rests on the order of `rng` draws here."""
    if action in ("isolate", "isolate-leader"):
        network.isolate(leader if action == "isolate-leader" and leader else node, ids)
        later(rng.uniform(*isolate_s), network.heal)
    elif action == "one-way":
        network.cut(node, other)
        later(rng.uniform(0.3, 1.5), network.heal)
    elif action == "slow-link":  # late acks: what makes the leader roll back and re-send
        network.pause(node, other)
        later(rng.uniform(0.02, 0.3), lambda: network.resume(node, other))
    elif action == "duplicates":
        link = (leader or node, other if other != leader else node)
        network.link_faults[link] = LinkFaults(duplicate_p=0.3, spike_p=0.1)

        def calm_down() -> None:
            network.link_faults.pop(link, None)

        later(rng.uniform(0.3, 1.0), calm_down)
    else:
        return False
    return True
