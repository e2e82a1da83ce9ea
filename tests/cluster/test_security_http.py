"""The HTTP port against clients that hold connections, and what nodes send each other
(DESIGN.md §8.3): slow or idle connections are closed, their number is capped, and a node asks
its peers with the nodes' own credential, never a user's token.
"""

from __future__ import annotations

import contextlib
import http.server
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from hangup import closed_within

from raftcron.cluster.clients.peerhttp import peer_token
from raftcron.cluster.config import load
from raftcron.cluster.config import split_address as host_port
from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster

IDLE_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 40
TOKENS = {"admin-token-0123": "admin", "read-token-012345": "read",
          "submit-token-0123": "submit"}


def test_slow_and_idle_connections_are_closed_and_capped(cluster_factory: Any) -> None:
    cluster: LocalCluster = cluster_factory.open(
        nodes=1, api={"idle_timeout_s": IDLE_TIMEOUT_S, "max_connections": MAX_CONNECTIONS})
    [node] = cluster.nodes
    address = host_port(node.http_address)
    slow: list[socket.socket] = []
    try:
        # Slowloris: a request head that never ends, one header byte at a time.
        for _ in range(10):
            sock = socket.create_connection(address, timeout=5)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: ")
            slow.append(sock)
        # Idle: connections that never send anything, up to past the cap.
        for _ in range(MAX_CONNECTIONS + 10):
            slow.append(socket.create_connection(address, timeout=5))
        over_cap = answered_503(slow[10:], at_least=10, timeout_s=10)
        assert len(over_cap) >= 10, f"only {len(over_cap)} connections over the cap refused"
        started = time.monotonic()
        kept = [s for s in slow[:10] if not closed_within(s, IDLE_TIMEOUT_S + 10, b"a")]
        kept += [s for s in slow[10:] if not closed_within(s, IDLE_TIMEOUT_S + 10)]
        assert not kept, f"{len(kept)} slow or idle connections still open"
        assert time.monotonic() - started < IDLE_TIMEOUT_S + 10
    finally:
        for sock in slow:
            sock.close()
    status, _, _ = cluster.request(node, "GET", "/healthz")
    assert status == 200


def answered_503(socks: list[socket.socket], at_least: int, timeout_s: float) -> list[Any]:
    """The connections that got a 503 from the node, waiting until `at_least` did."""
    found: dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        while len(found) < at_least and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                with contextlib.suppress(OSError):
                    if sock.recv(12, socket.MSG_PEEK) == b"HTTP/1.1 503":
                        found[sock.fileno()] = sock
                selector.unregister(sock)
    return list(found.values())


def ready(cluster: LocalCluster, node: Any) -> bool:
    try:
        return cluster.request(node, "GET", "/readyz", timeout_s=2)[0] == 200
    except OSError:
        return False


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str | None]]] = []  # (path, Authorization)

    def do_GET(self) -> None:
        self.seen.append((self.path.partition("?")[0], self.headers.get("Authorization")))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_node_asks_its_peers_with_the_peer_credential_not_a_user_token(
        cluster_factory: Any, tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "peer", nodes=3, tokens=TOKENS, raft=FAST_RAFT)
    cluster_factory.clusters.append(cluster)
    nodes = cluster.configure()
    # n3 never starts: whatever listens on its HTTP address sees what the others send it.
    absent = nodes[2]
    recorder = http.server.ThreadingHTTPServer(host_port(absent.http_address), _Recorder)
    _Recorder.seen = []
    thread = threading.Thread(target=recorder.serve_forever, daemon=True)
    thread.start()
    try:
        for node in nodes[:2]:
            cluster.start_node(node)
        cluster.wait_for(lambda: all(ready(cluster, node) for node in nodes[:2]), 30,
                         "two of three nodes ready")
        status, view, _ = cluster.call("GET", "/v1/cluster?members=1",
                                       token="read-token-012345", nodes=nodes[:1])
        assert status == 200
        assert [m["reachable"] for m in view["members"] if m["node_id"] == absent.node_id] == [
            False]
    finally:
        recorder.shutdown()
        recorder.server_close()
        thread.join(timeout=10)
    expected = peer_token(load(nodes[0].config_path).cluster_password)
    views = {auth for path, auth in _Recorder.seen if path == "/v1/cluster"}
    assert views, f"the node never asked its absent peer's view: {_Recorder.seen}"
    assert views == {f"Bearer {expected}"}
    # The clock poller asks the open /healthz; nothing a node sends carries a user's token.
    assert {path for path, _ in _Recorder.seen} <= {"/v1/cluster", "/healthz"}, _Recorder.seen
    assert not any(token in str(_Recorder.seen) for token in TOKENS)
    # What the peer credential may do: the cluster view, and nothing else.
    peer = str(expected)
    assert cluster.request(nodes[0], "GET", "/v1/cluster", token=peer)[0] == 200
    assert cluster.request(nodes[0], "GET", "/v1/cluster?members=1", token=peer)[0] == 403
    assert cluster.request(nodes[0], "GET", "/v1/jobs", token=peer)[0] == 403
    assert cluster.request(nodes[0], "POST", "/v1/jobs", {"task": "t"}, token=peer)[0] == 403
    with contextlib.suppress(Exception):
        cluster.start_node(absent)  # the end-of-test checks want every node up
    cluster.wait_ready(timeout_s=60)
