"""The Raft port against someone who reaches it without the password (DESIGN.md §8.3), on real
nodes on loopback: nothing they send is unpickled, buffered at length, kept open for long or
able to close the listener (cluster/consensus/raftguard.py).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from hangup import closed_within

from raftcron.cluster.config import split_address as host_port
from raftcron.cluster.consensus import raftguard
from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.dev.nodeprocesses import ClusterError, LocalNode

FLOOD_BYTES = 40 * 1024 * 1024
PROBE_COMMITS_MIN = 20  # commits measured while the flood goes on
CONNECT_TIMEOUT_S = 5.0


class _RunsCommand:
    """What an attacker pickles: unpickling it runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (self.command,)


def pickle_frame(command: str) -> bytes:
    """One frame as PySyncObj frames messages without a password: length, zlib(pickle)."""
    data = zlib.compress(pickle.dumps(_RunsCommand(command)))
    return struct.pack("i", len(data)) + data


def send_pickle(address: str, command: str) -> str:
    """Send the frame; 'refused' when nothing listens, else wait until the node drops it."""
    try:
        sock = socket.create_connection(host_port(address), timeout=CONNECT_TIMEOUT_S)
    except ConnectionRefusedError:
        return "refused"
    with sock:
        with contextlib.suppress(OSError):
            sock.sendall(pickle_frame(command))
        return "closed" if closed_within(sock, 10) else "kept open"


def test_a_single_node_without_password_runs_no_pickle_sent_to_its_raft_port(
        cluster_factory: Any, tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "single", nodes=1, raft=FAST_RAFT)
    cluster.password = None  # a valid single-node config: no peers, no password
    cluster_factory.clusters.append(cluster)  # checked and closed with the test's clusters
    cluster.start()
    node = cluster.wait_ready()
    marker = tmp_path / "PWNED"
    outcome = send_pickle(node.raft_address, f"touch {marker}")
    assert outcome in ("refused", "closed")
    assert not marker.exists(), "the pickled command ran on the node"
    status, _, _ = cluster.request(node, "POST", "/v1/jobs", {"task": "after"})
    assert status == 201


def test_a_node_with_peers_runs_no_pickle_from_someone_without_the_password(
        cluster: LocalCluster, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    for node in cluster.nodes:
        assert send_pickle(node.raft_address, f"touch {marker}") == "closed"
    assert not marker.exists()


class CommitProbe(threading.Thread):
    """Submits jobs one after another to one node and keeps the worst latency."""

    def __init__(self, cluster: LocalCluster, node: LocalNode) -> None:
        super().__init__(daemon=True)
        self.cluster, self.node = cluster, node
        self.stop = threading.Event()
        self.worst_s = 0.0
        self.count = 0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set() and self.count < 100_000:
            started = time.monotonic()
            try:
                status, body, _ = self.cluster.request(
                    self.node, "POST", "/v1/jobs", {"task": "probe"}, timeout_s=15)
            except OSError as error:
                self.failures.append(repr(error))
                status, body = 0, None
            elapsed = time.monotonic() - started
            self.worst_s = max(self.worst_s, elapsed)
            self.count += 1
            if status != 201:
                self.failures.append(f"{status} {body}")


def flood(address: str, total_bytes: int, deadline: float, probe: CommitProbe) -> int:
    """Announce a 2 GiB frame and stream bytes, reconnecting when dropped, until total_bytes
    are sent and the probe has seen PROBE_COMMITS_MIN commits meanwhile; bytes sent."""
    chunk = os.urandom(1024 * 1024)
    sent = 0

    def more() -> bool:
        wanted = sent < total_bytes or probe.count < PROBE_COMMITS_MIN
        return wanted and time.monotonic() < deadline

    for _ in range(50_000):
        if not more():
            break
        try:
            with socket.create_connection(host_port(address), timeout=CONNECT_TIMEOUT_S) as sock:
                sock.sendall(struct.pack("i", 2**31 - 1))
                while more():
                    sock.sendall(chunk)
                    sent += len(chunk)
        except OSError:
            continue
    return sent


def garbage(address: str) -> None:
    """Frames that are not what they say: random bytes, negative and zero lengths."""
    frames = [struct.pack("i", 64) + os.urandom(64), struct.pack("i", -1) + b"x" * 8,
              struct.pack("i", 0), os.urandom(4096), struct.pack("i", 16) + b"\x00" * 16]
    for frame in frames * 20:
        with contextlib.suppress(OSError), socket.create_connection(
                host_port(address), timeout=CONNECT_TIMEOUT_S) as sock:
            sock.sendall(frame)


def test_garbage_oversized_and_truncated_frames_neither_crash_nor_stall_commits(
        cluster: LocalCluster) -> None:
    leader = cluster.leader()
    # Truncated frames: a length, a few bytes, then silence. Opened first, checked last.
    truncated = []
    for node in cluster.nodes:
        for _ in range(5):
            sock = socket.create_connection(host_port(node.raft_address), timeout=5)
            sock.sendall(struct.pack("i", 1000) + b"0123456789")
            truncated.append(sock)
    probe = CommitProbe(cluster, leader)
    probe.start()
    try:
        deadline = time.monotonic() + 90
        for node in cluster.nodes:
            garbage(node.raft_address)
        sent = flood(leader.raft_address, FLOOD_BYTES, deadline, probe)
    finally:
        probe.stop.set()
        probe.join(timeout=30)
    assert sent >= FLOOD_BYTES, f"the flood stopped early ({sent} bytes sent)"
    assert probe.count >= PROBE_COMMITS_MIN and not probe.failures, probe.failures[:5]
    print(f"flood: {sent} bytes, {probe.count} commits, worst {probe.worst_s:.3f} s")
    assert probe.worst_s < 1.0, f"worst commit latency {probe.worst_s:.2f} s during the flood"
    # Each truncated connection is closed by the node within connection_timeout_s (1 s here).
    timeout_s = float(str(FAST_RAFT["connection_timeout_s"]))
    try:
        kept = [s for s in truncated if not closed_within(s, timeout_s + 10)]
        assert not kept, f"{len(kept)} of {len(truncated)} idle truncated connections kept open"
    finally:
        for sock in truncated:
            sock.close()
    assert all(node.running for node in cluster.nodes)


FD_LIMIT = 256
ATTACK_ROUNDS = 3
_LIMITED_NODE = (
    "import resource, sys\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))\n"
    "from raftcron.cluster.commandline.main import main\n"
    "sys.exit(main())\n"
)


class FdLimitedCluster(LocalCluster):
    """A cluster whose one node runs under a small descriptor limit."""

    limited: str = ""

    def command(self, node: LocalNode) -> list[str]:
        if node.node_id != self.limited:
            return super().command(node)
        return [self.python, "-c", _LIMITED_NODE.format(limit=FD_LIMIT), "node", "--config",
                str(node.config_path)]


def test_a_node_out_of_descriptors_keeps_its_raft_listener(
        cluster_factory: Any, tmp_path: Path) -> None:
    cluster = FdLimitedCluster(tmp_path / "fd", nodes=3, raft=FAST_RAFT)
    cluster_factory.clusters.append(cluster)
    nodes = cluster.configure()
    # PySyncObj dials from the higher address to the lower: the lowest is reached only
    # through its listener, so losing that listener partitions it.
    limited = min(nodes, key=lambda n: n.raft_address)
    cluster.limited = limited.node_id
    cluster.start()
    cluster.wait_ready()
    idle: list[socket.socket] = []
    try:
        for _ in range(300):
            try:
                idle.append(socket.create_connection(host_port(limited.http_address), timeout=5))
            except OSError:
                continue  # refused or timed out: the node's business
        descriptors = Path(f"/proc/{limited.pid}/fd")
        with contextlib.suppress(ClusterError):  # a node that caps connections never gets there
            cluster.wait_for(lambda: len(os.listdir(descriptors)) >= FD_LIMIT - 4, 10,
                             "the node out of descriptors")
        # Peers' reconnects while the node has no descriptor left: the attack lasts a few
        # connection timeouts, long enough for PySyncObj to try accepting each of them.
        for _ in range(ATTACK_ROUNDS):
            with contextlib.suppress(OSError):
                idle.append(socket.create_connection(host_port(limited.raft_address), timeout=5))
            time.sleep(float(str(FAST_RAFT["connection_timeout_s"])))
    finally:
        for sock in idle:
            sock.close()
    assert limited.running, "the node died"
    # Every peer must dial the limited node again: restart them both.
    for node in nodes:
        if node is not limited:
            cluster.restart(node)
    cluster.wait_ready(timeout_s=60)
    status, job, _ = cluster.call("POST", "/v1/jobs", {"task": "after", "request_id": "fd-1"})
    assert status == 201

    def applied_on_limited() -> bool:
        answer = cluster.request(limited, "GET", f"/v1/jobs/{job['id']}")
        return answer[0] == 200

    cluster.wait_for(applied_on_limited, 30, "the job replicated to the limited node")
    with socket.create_connection(host_port(limited.raft_address), timeout=5):
        pass


def test_unidentified_raft_connections_are_capped(cluster_factory: Any) -> None:
    """Beyond the cap, a new connection evicts the oldest at once, long before the timeout."""
    timeout_s = 20.0
    cluster = cluster_factory.open(raft={**FAST_RAFT, "connection_timeout_s": timeout_s})
    node = cluster.nodes[0]
    idle: list[socket.socket] = []
    try:
        started = time.monotonic()
        for _ in range(100):
            idle.append(socket.create_connection(host_port(node.raft_address), timeout=5))

        def evicted() -> int | None:
            closed = sum(1 for sock in idle if _closed_now(sock))
            return closed if closed >= 100 - raftguard.UNKNOWN_CONNECTIONS_MAX else None

        cluster.wait_for(evicted, 10, "connections over the cap evicted")
        assert time.monotonic() - started < timeout_s
    finally:
        for sock in idle:
            sock.close()


def _closed_now(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
