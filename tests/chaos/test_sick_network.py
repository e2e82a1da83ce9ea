"""The sick relay bites (chaos/tier2/sick_network.py): a delayed pair is slow and keeps the
order, a stalled pair delivers nothing while others flow and pushes its sender back, loss
costs head-of-line retransmission timeouts at about the given rate, a reset closes both sides;
and the sick-network checker fails a run whose leader changed under the guarded latency.

Loopback sockets and threads only (no process): each test waits on sockets with deadlines.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from raftcron.chaos.tier2 import checkers
from raftcron.chaos.tier2.checkers import RunData
from raftcron.chaos.tier2.netns import pick_ports
from raftcron.chaos.tier2.sick_network import CHUNK_BYTES, Sickness, SickRelay


class Echo:
    """An echo server on loopback that remembers how each of its connections ended."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.endings: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(4096):
                    conn.sendall(data)
                self.endings.append("closed")
            except ConnectionResetError:
                self.endings.append("reset")
            except OSError as error:
                self.endings.append(type(error).__name__)


@pytest.fixture
def relayed() -> Iterator[tuple[SickRelay, dict[str, int], Echo]]:
    """A relay with two pairs into one echo server: n2 -> n1 and n3 -> n1 (ports by name)."""
    echo = Echo()
    relay = SickRelay(seed=7, held_bytes_max=64 * 1024, rto_ms=100)
    ports = dict(zip(["n2", "n3"], pick_ports(2, 10_000, 19_999, set()), strict=True))
    for initiator, port in ports.items():
        relay.add(initiator, "n1", ("127.0.0.1", echo.port), port)
    relay.start()
    try:
        yield relay, ports, echo
    finally:
        relay.close()
        echo.server.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def round_trip_s(sock: socket.socket, message: bytes, timeout_s: float = 5.0) -> float | None:
    """Seconds until `message` comes back whole, or None if it did not within timeout_s."""
    started = time.monotonic()
    sock.settimeout(timeout_s)
    sock.sendall(message)
    got = b""
    try:
        while len(got) < len(message):
            chunk = sock.recv(len(message) - len(got))
            if not chunk:
                return None
            got += chunk
    except TimeoutError:
        return None
    assert got == message
    return time.monotonic() - started


def test_a_delayed_pair_takes_at_least_its_delay_and_keeps_the_order(relayed) -> None:
    relay, ports, _ = relayed
    relay.sicken("n2", "n1", Sickness(delay_ms=100, jitter_ms=50))  # one way: requests only
    with connect(ports["n2"]) as sock:
        assert round_trip_s(sock, b"warm") is not None
        times = [round_trip_s(sock, b"m%03d" % i) for i in range(10)]
        assert all(t is not None and t >= 0.05 for t in times), times  # 100 - 50 ms at least
        # a burst of chunks, each with its own jittered delay, comes back in the order sent
        burst = [b"b%03d;" % i for i in range(40)]
        for part in burst:
            sock.sendall(part)
        expected = b"".join(burst)
        got = b""
        deadline = time.monotonic() + 5
        while len(got) < len(expected) and time.monotonic() < deadline:
            got += sock.recv(4096)
        assert got == expected
    with connect(ports["n3"]) as other:  # the other pair is not delayed
        fast = [round_trip_s(other, b"fast") for _ in range(5)]
        assert min(t for t in fast if t is not None) < 0.05, fast


def test_a_stalled_pair_delivers_nothing_while_others_flow_and_delivers_at_the_cure(
    relayed,
) -> None:
    relay, ports, echo = relayed
    with connect(ports["n2"]) as stalled, connect(ports["n3"]) as healthy:
        assert round_trip_s(stalled, b"before") is not None
        relay.sicken("n2", "n1", Sickness(stalled=True))
        stalled.settimeout(0.5)
        stalled.sendall(b"held")
        with pytest.raises(TimeoutError):
            stalled.recv(4)
        flowing = [round_trip_s(healthy, b"flows") for _ in range(5)]
        assert None not in flowing and min(t for t in flowing if t is not None) < 0.05, flowing
        assert echo.endings == []  # nobody was closed: the stall is silent
        relay.cure([("n2", "n1")])
        stalled.settimeout(5)
        assert stalled.recv(4) == b"held"


def test_a_stalled_pair_holds_at_most_its_bound_and_pushes_the_sender_back(relayed) -> None:
    relay, ports, _ = relayed
    relay.sicken("n2", "n1", Sickness(stalled=True))
    block = b"x" * 65536
    with connect(ports["n2"]) as sock:
        sock.settimeout(0.3)
        sent = 0
        with pytest.raises(TimeoutError):
            for _ in range(2_000):  # 128 MiB: far more than any buffer on the way
                sock.sendall(block)
                sent += len(block)
        with relay.lock:
            held = [lane.held_bytes for lanes in relay.lanes.values() for lane in lanes.values()]
        assert max(held) <= relay.held_bytes_max + CHUNK_BYTES
        assert sent < 2_000 * len(block)  # the sender was blocked: backpressure reached it


def test_loss_costs_a_retransmission_timeout_at_about_the_given_rate(relayed) -> None:
    relay, ports, _ = relayed
    with connect(ports["n2"]) as sock:
        assert round_trip_s(sock, b"warm") is not None
        relay.sicken("n2", "n1", Sickness(loss=0.2))
        times = [round_trip_s(sock, b"l%03d" % i) for i in range(60)]
    assert all(t is not None for t in times)
    slow = [t for t in times if t is not None and t >= 0.1]  # rto_ms=100: a loss costs >= it
    assert 4 <= relay.retransmits <= 25, relay.retransmits  # 0.2 of 60, with backoffs
    assert 4 <= len(slow) <= 20, times
    assert sum(t for t in times if t is not None) >= 0.1 * len(slow)


def test_a_reset_closes_both_sides_with_rst_and_new_connections_flow(relayed) -> None:
    relay, ports, echo = relayed
    with connect(ports["n2"]) as sock:
        assert round_trip_s(sock, b"before") is not None
        assert relay.reset("n1") == 1
        with pytest.raises(ConnectionResetError):
            sock.settimeout(5)
            sock.recv(1)
    deadline = time.monotonic() + 5
    while not echo.endings and time.monotonic() < deadline:
        threading.Event().wait(0.02)  # the echo thread records the ending on its own time
    assert echo.endings == ["reset"]
    with connect(ports["n2"]) as again:
        assert round_trip_s(again, b"after") is not None


def _run(leaders_at_ms: list[int]) -> RunData:
    history = [
        {"t": 1_000, "kind": "fault", "phase": "start", "id": "f1", "fault": "latency",
         "targets": ["n1", "n2"], "delay_ms": 50, "jitter_ms": 25, "leader_changes_max": 0},
        {"t": 21_000, "kind": "fault", "phase": "end", "id": "f1"},
        {"t": 22_000, "kind": "fault", "phase": "start", "id": "f2", "fault": "stall",
         "targets": ["n1", "n2"]},
        {"t": 26_000, "kind": "fault", "phase": "end", "id": "f2"},
    ]
    leaders = [{"node": "n2", "term": 3 + i, "t": t} for i, t in enumerate(leaders_at_ms)]
    return RunData(history=history, jobs={}, schedules=[], cluster_events=[], digests={},
                   sink=[], settings={"leaders": leaders})


def test_the_checker_fails_a_leader_change_under_the_guarded_latency() -> None:
    result = checkers.check_sick_network(_run([5_000]))
    assert not result.ok and "f1 latency 50 +- 25 ms: 1 leader changes" in result.violations[0]


def test_the_checker_only_counts_leader_changes_under_a_stall() -> None:
    result = checkers.check_sick_network(_run([500, 23_000]))
    assert result.ok
    assert result.counts["leader_changes"] == {"latency": 0, "stall": 1}


def test_worst_failover_leaves_out_a_latency_that_must_not_move_the_leader() -> None:
    run = _run([])
    run.history[0].update(leader="n1", failover_expected=False)
    run.history.append({"t": 60_000, "kind": "sample", "node": "n2", "role": "leader",
                        "has_quorum": True, "term": 9})  # an election a minute later
    assert checkers.check_liveness(run).counts["worst_failover_ms"] is None
    del run.history[0]["failover_expected"]  # counted, it would be timed to that election
    assert checkers.check_liveness(run).counts["worst_failover_ms"] == 59_000
