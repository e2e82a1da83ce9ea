"""A sick network for tier 2 (CHAOS.md "Wave 3"): links that are slow, stall, lose and reset,
where today's cuts only make them dead.

What it owns:

- `SickRelay`, a `Relay` whose every directed pair (sender, receiver) may carry a `Sickness`:
  added latency with jitter (each chunk delivered after its own delay, but never before the
  chunk read before it: TCP does not reorder), a stall (bytes held, nothing delivered, the
  connection left open), and loss as TCP experiences it (a lost segment is retransmitted
  after a retransmission timeout, so the chunk and every chunk behind it arrive RTO later,
  doubled for each further loss of the same chunk). A reset closes a pair's connections with
  RST (SO_LINGER 0). Each direction of a connection has its own queue, delivered by the
  selector loop when due: a slow or stalled pair never holds up another. A queue holds at most
  `held_bytes_max`; past that its source is no longer read, so TCP's backpressure reaches the
  sender as it would behind a real stalled path.
- `SickCluster`, a `ChaosCluster` whose Raft links all go through a `SickRelay`: on loopback
  the relay is the cluster's network; with namespaces it lives in the harness's namespace on
  its own address (`RELAY_ADDRESS`), so iptables can drop real packets of one sender's links
  there (`iptables -m statistic`: real loss, real TCP retransmissions).
- the nemesis functions (`sicken`, `stall`, `lose`, `reset`, `cure`, `cure_all`), which take
  a `Nemesis` as storage_faults.py does and record each fault's start and end.

A stall, once healed, delivers what it held: that is what TCP does when a path that dropped
everything comes back within the retransmission window (the stream resumes whole, late). A
connection that breaks instead is the separate `reset` fault. Rules: nothing here sleeps on the
relay's thread; every queue is bounded; sockets are closed by the relay that opened them.
"""

from __future__ import annotations

import contextlib
import random
import selectors
import socket
import struct
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raftcron.chaos.tier2.checkers.network import SICK_FAULTS
from raftcron.chaos.tier2.nemesis import ChaosCluster, Nemesis
from raftcron.chaos.tier2.netns import Namespaces, Relay, _Pipe, run
from raftcron.cluster.dev.nodeprocesses import LocalNode

HELD_BYTES_MAX = 256 * 1024  # per direction of a connection: then the sender is pushed back
RTO_MS = 200.0  # Linux's minimum retransmission timeout: what a loss costs on a short path
RETRANSMITS_MAX = 6  # a chunk lost again each time is delivered after at most 6 backoffs
CHUNK_BYTES = 65536
LOOP_WAIT_S = 0.1
# With namespaces the relay listens in the harness's namespace on this address, lower than
# every node's (198.18.0.11-19): PySyncObj dials from the higher address string to the lower,
# so the node given the relay's address dials, as on loopback.
RELAY_ADDRESS = "198.18.0.10"
RELAY_PORT_BASE = 7100


@dataclass(frozen=True)
class Sickness:
    """What one directed pair suffers. Zero everything: healthy."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0  # each chunk's delay is uniform in delay_ms +- jitter_ms
    loss: float = 0.0  # probability that a chunk is lost (and retransmitted after RTO)
    stalled: bool = False


class _Lane:
    """One direction of one connection: chunks waiting for their time, in order."""

    def __init__(self, sender: str, receiver: str) -> None:
        self.sender = sender
        self.receiver = receiver
        self.queue: deque[tuple[float, bytes]] = deque()  # (due on the monotonic clock, bytes)
        self.held_bytes = 0
        self.last_due = 0.0
        self.blocked = False  # the receiving socket's buffer was full: wait until writable
        self.ended = False  # the source closed: close the pipe once the queue is delivered


class SickRelay(Relay):
    """A `Relay` with per-pair sickness and a non-blocking, scheduled forwarding path."""

    def __init__(self, *, seed: int = 0, held_bytes_max: int = HELD_BYTES_MAX,
                 rto_ms: float = RTO_MS) -> None:
        super().__init__()
        self.sickness: dict[tuple[str, str], Sickness] = {}
        self.held_bytes_max = held_bytes_max
        self.rto_ms = rto_ms
        self.rng = random.Random(seed)
        self.lanes: dict[int, dict[str, _Lane]] = {}  # id(pipe) -> {"up": ..., "down": ...}
        self.retransmits = 0  # chunks delayed by a modelled loss (what a test counts)
        self.resets = 0
        self.host = self.source_host = "127.0.0.1"  # where it listens; upstreams leave from it
        self.pairs_of: dict[str, list[tuple[str, str]]] = {}  # fault id -> the pairs it sickened

    def add(self, initiator: str, acceptor: str, target: tuple[str, int], port: int,
            host: str = "127.0.0.1") -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(16)
        sock.setblocking(False)
        self.host = self.source_host = host  # upstreams leave from it (iptables matches on it)
        self.listeners.append(sock)
        self.targets[port] = ((initiator, acceptor), target)
        self.selector.register(sock, selectors.EVENT_READ, ("listen", port))

    # -- the faults -------------------------------------------------------------------------

    def sicken(self, sender: str, receiver: str, sickness: Sickness) -> None:
        with self.lock:
            self.sickness[(sender, receiver)] = sickness

    def cure(self, pairs: Sequence[tuple[str, str]] | None = None) -> None:
        """Healthy again (all pairs, or these): held bytes go out at once, in order."""
        with self.lock:
            for pair in list(self.sickness) if pairs is None else pairs:
                self.sickness.pop(tuple(pair), None)  # type: ignore[arg-type]
            for lanes in self.lanes.values():
                for lane in lanes.values():
                    if (lane.sender, lane.receiver) not in self.sickness:
                        lane.queue = deque((0.0, data) for _, data in lane.queue)
                        lane.last_due = 0.0

    def reset(self, host: str, peer: str | None = None) -> int:
        """Close every connection of `host` (with `peer`, or with anyone) with RST on both
        sides; how many. New connections are relayed as usual."""
        with self.lock:
            hit = [p for p in self.pipes if host in p.pair and (peer is None or peer in p.pair)]
            for pipe in hit:
                for sock in (pipe.client, pipe.upstream):
                    if sock is not None:
                        with contextlib.suppress(OSError):
                            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                            struct.pack("ii", 1, 0))
                self._close(pipe)
            self.resets += len(hit)
            return len(hit)

    def heal(self) -> None:
        super().heal()
        self.cure()

    # -- the forwarding path ----------------------------------------------------------------

    def _close(self, pipe: _Pipe) -> None:
        self.lanes.pop(id(pipe), None)
        super()._close(pipe)  # a socket left off the selector is closed all the same

    def _loop(self) -> None:
        while not self.stopping.is_set():
            events = self.selector.select(timeout=self._wait_s())
            with self.lock:
                for key, mask in events:
                    role, item = key.data
                    if role == "listen":
                        with contextlib.suppress(OSError):
                            self._accept(key.fileobj, item)  # type: ignore[arg-type]
                        continue
                    pipe, side = item
                    try:
                        self._on_event(key.fileobj, pipe, side, mask)  # type: ignore[arg-type]
                    except OSError:
                        self._close(pipe)
                self._connect_held()
                self._deliver_due()

    def _on_event(self, sock: socket.socket, pipe: _Pipe, side: str, mask: int) -> None:
        if id(pipe) not in self.lanes:
            return  # closed by an earlier event of this round
        if mask & selectors.EVENT_WRITE:
            self._lane_into(pipe, side).blocked = False
        if mask & selectors.EVENT_READ:
            self._read(sock, pipe, side)

    def _wait_s(self) -> float:
        with self.lock:
            dues = [lane.queue[0][0] for lanes in self.lanes.values() for lane in lanes.values()
                    if lane.queue and not lane.blocked and not self._stalled(lane)]
        if not dues:
            return LOOP_WAIT_S
        return min(LOOP_WAIT_S, max(0.0, min(dues) - time.monotonic()))

    def _stalled(self, lane: _Lane) -> bool:
        sickness = self.sickness.get((lane.sender, lane.receiver))
        return sickness is not None and sickness.stalled

    def _connected(self, pipe: _Pipe, upstream: socket.socket) -> None:
        a, b = pipe.pair
        self.lanes[id(pipe)] = {"up": _Lane(a, b), "down": _Lane(b, a)}
        self.selector.register(pipe.client, selectors.EVENT_READ, ("data", (pipe, "client")))
        self.selector.register(upstream, selectors.EVENT_READ, ("data", (pipe, "upstream")))

    def _lane_from(self, pipe: _Pipe, side: str) -> _Lane:
        """The lane a socket feeds: the client feeds "up", the upstream "down"."""
        return self.lanes[id(pipe)]["up" if side == "client" else "down"]

    def _lane_into(self, pipe: _Pipe, side: str) -> _Lane:
        """The lane a socket drains into its peer: the opposite one."""
        return self.lanes[id(pipe)]["down" if side == "client" else "up"]

    def _read(self, sock: socket.socket, pipe: _Pipe, side: str) -> None:
        lane = self._lane_from(pipe, side)
        data = sock.recv(CHUNK_BYTES)
        if not data:
            lane.ended = True
            if not lane.queue:
                self._close(pipe)
            return
        if (lane.sender, lane.receiver) in self.cut:
            pipe.discarded = True
            return
        lane.queue.append((self._due(lane), data))
        lane.held_bytes += len(data)

    def _due(self, lane: _Lane) -> float:
        """When a chunk read now may be delivered: its own delay, a retransmission timeout per
        modelled loss, and never before the chunk ahead of it (head-of-line blocking)."""
        sickness = self.sickness.get((lane.sender, lane.receiver))
        due = time.monotonic()
        if sickness is not None:
            delay_ms = sickness.delay_ms + self.rng.uniform(-sickness.jitter_ms,
                                                            sickness.jitter_ms)
            rto_ms = self.rto_ms
            for _ in range(RETRANSMITS_MAX):
                if self.rng.random() >= sickness.loss:
                    break
                self.retransmits += 1
                delay_ms += rto_ms
                rto_ms *= 2
            due += max(0.0, delay_ms) / 1000
        lane.last_due = max(due, lane.last_due)
        return lane.last_due

    def _deliver_due(self) -> None:
        now = time.monotonic()
        for pipe in list(self.pipes):
            lanes = self.lanes.get(id(pipe))
            if lanes is None:
                continue
            try:
                for direction, lane in lanes.items():
                    out = pipe.upstream if direction == "up" else pipe.client
                    if not lane.blocked and not self._stalled(lane):
                        self._send_due(lane, out, now)  # type: ignore[arg-type]
            except OSError:
                self._close(pipe)
                continue
            if any(lane.ended and not lane.queue for lane in lanes.values()):
                self._close(pipe)  # the source closed and everything it sent is delivered
                continue
            self._watch(pipe, lanes)

    def _send_due(self, lane: _Lane, out: socket.socket, now: float) -> None:
        while lane.queue and lane.queue[0][0] <= now:
            due, data = lane.queue[0]
            try:
                sent = out.send(data)
            except BlockingIOError:
                sent = 0
            lane.held_bytes -= sent
            if sent < len(data):
                lane.queue[0] = (due, data[sent:])
                lane.blocked = True  # until the selector says the receiver can take more
                return
            lane.queue.popleft()

    def _watch(self, pipe: _Pipe, lanes: dict[str, _Lane]) -> None:
        """Read a socket while the lane it feeds has room (else TCP pushes its sender back);
        watch it for writing while the lane it drains is blocked."""
        for sock, side in ((pipe.client, "client"), (pipe.upstream, "upstream")):
            if sock is None:
                continue
            feeds, drains = self._lane_from(pipe, side), self._lane_into(pipe, side)
            events = 0
            if feeds.held_bytes < self.held_bytes_max and not feeds.ended:
                events |= selectors.EVENT_READ
            if drains.blocked:
                events |= selectors.EVENT_WRITE
            key = self.selector.get_map().get(sock)
            if key is not None and key.events == events:
                continue
            if key is not None:
                self.selector.unregister(sock)
            if events:  # an empty mask cannot be registered: such a socket is left off
                self.selector.register(sock, events, ("data", (pipe, side)))


class SickCluster(ChaosCluster):
    """A `ChaosCluster` whose Raft links all pass through a `SickRelay` (`self.sick`); see the
    module docstring. Real packet loss is added with iptables where namespaces are used."""

    def __init__(self, base_dir: Path, net: Namespaces | Relay, **settings: Any) -> None:
        super().__init__(base_dir, net, **settings)
        self.sick = SickRelay()
        if isinstance(net, Relay):
            self.net = self.sick  # on loopback the Raft links' relay is the whole network
        self.loss_rules: list[list[str]] = []  # iptables rules to delete at the cure

    def configure(self) -> list[LocalNode]:
        if self.nodes or not isinstance(self.net, Namespaces):
            return super().configure()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        net = self.net
        ids = [f"n{index + 1}" for index in range(self.size)]
        add_relay_address(net)
        for a_index, a in enumerate(ids):
            for b_index, b in enumerate(ids[:a_index]):
                port = RELAY_PORT_BASE + a_index * self.size + b_index
                self.sick.add(a, b, (net.address(b), 7000), port, host=RELAY_ADDRESS)
                self.relay_peers[(a, b)] = f"{RELAY_ADDRESS}:{port}"
        self.sick.start()  # on this (the harness's namespace's) thread's namespace
        return self.add_nodes({i: (f"{net.address(i)}:7000", f"{net.address(i)}:8000")
                               for i in ids})

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.sick.close()


# -- the nemesis ---------------------------------------------------------------------------


def _sick(nemesis: Nemesis) -> SickRelay:
    cluster = nemesis.cluster
    if not isinstance(cluster, SickCluster):
        raise TypeError("network sickness needs a SickCluster (Scenario.cluster_class)")
    return cluster.sick


def sicken(nemesis: Nemesis, pairs: Sequence[tuple[str, str]], sickness: Sickness, *,
           fault: str = "latency", **fields: Any) -> str:
    """Each (sender, receiver) pair suffers `sickness` until `cure`."""
    fault_id = nemesis._start(
        fault, sorted({h for pair in pairs for h in pair}), pairs=[list(p) for p in pairs],
        delay_ms=sickness.delay_ms, jitter_ms=sickness.jitter_ms, loss=sickness.loss,
        stalled=sickness.stalled, **fields)
    relay = _sick(nemesis)
    relay.pairs_of[fault_id] = [(sender, receiver) for sender, receiver in pairs]
    for sender, receiver in pairs:
        relay.sicken(sender, receiver, sickness)
    return fault_id


def stall(nemesis: Nemesis, pairs: Sequence[tuple[str, str]], **fields: Any) -> str:
    """Nothing each sender sends reaches its receiver, and no connection closes."""
    return sicken(nemesis, pairs, Sickness(stalled=True), fault="stall", **fields)


def lose(nemesis: Nemesis, sender: str, loss: float, **fields: Any) -> str:
    """One-way loss on every link out of `sender`: real packets dropped in the relay's
    namespace where there is one (TCP retransmits them), else modelled in the relay."""
    cluster = nemesis.cluster
    peers = [n.node_id for n in cluster.nodes if n.node_id != sender]
    if isinstance(cluster, SickCluster) and isinstance(cluster.net, Namespaces):
        fault_id = nemesis._start("loss", [sender, *peers], loss=loss, how="iptables",
                                  pairs=[[sender, p] for p in peers], **fields)
        cluster.loss_rules.append(drop_at_random(cluster.net, sender, loss))
        return fault_id
    return sicken(nemesis, [(sender, p) for p in peers], Sickness(loss=loss), fault="loss",
                  how="relay", **fields)


def add_relay_address(net: Namespaces) -> None:
    """Give the harness's namespace the relay's own address (see `RELAY_ADDRESS`)."""
    run(["ip", "-n", net.namespace("ctl"), "addr", "add", f"{RELAY_ADDRESS}/24", "dev", "eth0"])


def drop_at_random(net: Namespaces, sender: str, loss: float) -> list[str]:
    """Drop each packet from `sender` to the relay with probability `loss`, in the harness's
    namespace (where the relay is): real loss, which TCP retransmits. The rule, with `{op}`
    for -A/-D, to delete it later (`undo_drop`)."""
    rule = [*net.exec_prefix("ctl"), "iptables", "{op}", "INPUT", "-s", net.address(sender),
            "-d", RELAY_ADDRESS, "-m", "statistic", "--mode", "random", "--probability",
            f"{loss:.4f}", "-j", "DROP"]
    run([part.format(op="-A") for part in rule])
    return rule


def undo_drop(rule: list[str]) -> None:
    run([part.format(op="-D") for part in rule], check=False)


def reset(nemesis: Nemesis, host: str, **fields: Any) -> str:
    """Every Raft connection of `host` closed with RST on both sides (an instant fault)."""
    fault_id = nemesis._start("reset", [host], **fields)
    closed = _sick(nemesis).reset(host)
    nemesis._end(fault_id, connections=closed)
    return fault_id


def cure(nemesis: Nemesis, fault_id: str) -> None:
    """End one sickness: its pairs healthy again (held bytes delivered), its rules gone."""
    start = nemesis.active.get(fault_id, {})
    pairs = _sick(nemesis).pairs_of.pop(fault_id, None)
    if pairs:
        _sick(nemesis).cure(pairs)
    if start.get("how") == "iptables":
        _delete_loss_rules(nemesis)
    nemesis._end(fault_id)


def cure_all(nemesis: Nemesis) -> None:
    """Every sickness ended (the plan's way out, even when it fails midway)."""
    with contextlib.suppress(TypeError):
        _sick(nemesis).cure()
    _delete_loss_rules(nemesis)
    for fault_id, start in list(nemesis.active.items()):
        if start.get("fault") in SICK_FAULTS:
            nemesis._end(fault_id, healed_by="cure_all")


def _delete_loss_rules(nemesis: Nemesis) -> None:
    cluster = nemesis.cluster
    if not isinstance(cluster, SickCluster):
        return
    for rule in cluster.loss_rules:
        undo_drop(rule)
    cluster.loss_rules.clear()

