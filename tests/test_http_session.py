"""cluster/dev/loopback.HttpSession: many GETs over one kept-open connection (the chaos
harness reads every job of a run one by one; a connection per request left a TIME_WAIT socket
each and ran out of ephemeral ports past ~28,000), and a connection the server closed is
opened again once, transparently for a GET."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from raftcron.cluster.dev.loopback import HttpSession


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    connections = 0
    close_every = 0  # answer with Connection: close every N requests (0: never)
    served = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: without this, Nagle holds the body until
        # the client's delayed ACK (40 ms a request). aiohttp sets it for the real node.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections += 1  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        server.served += 1
        body = json.dumps({"path": self.path,
                           "auth": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        closing = server.close_every and server.served % server.close_every == 0
        if closing:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        if closing:
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def test_many_gets_use_one_connection(server: _Server) -> None:
    session = HttpSession(f"127.0.0.1:{server.server_address[1]}", timeout_s=5)
    try:
        for n in range(300):
            status, body, _ = session.get(f"/v1/jobs/{n}", token="t")
            assert status == 200 and body == {"path": f"/v1/jobs/{n}", "auth": "Bearer t"}
    finally:
        session.close()
    assert server.connections == 1 and session.opened == 1


def test_a_connection_the_server_closes_is_opened_again(server: _Server) -> None:
    server.close_every = 10
    session = HttpSession(f"127.0.0.1:{server.server_address[1]}", timeout_s=5)
    try:
        answers = [session.get(f"/x/{n}")[1]["path"] for n in range(45)]
    finally:
        session.close()
    assert answers == [f"/x/{n}" for n in range(45)]
    assert session.opened == 5 and server.connections == 5
