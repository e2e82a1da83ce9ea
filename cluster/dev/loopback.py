"""Loopback plumbing for local clusters: free ports to give nodes, and plain HTTP requests to
them (stdlib only, so a harness works before any client library is importable)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Response = tuple[int, Any, dict[str, str]]


class NoFreePorts(RuntimeError):
    """Fewer free loopback ports than a cluster needs."""


def http_request(
    address: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = None,
    timeout_s: float = 10,
    headers: dict[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
) -> Response:
    """A stdlib HTTP request to host:port (HTTPS with `tls`): (status, parsed JSON or
    text, headers)."""
    host, port = address.rsplit(":", 1)
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    data: bytes | Iterator[bytes] | None = None
    if body is not None:
        # bytes as they are, an iterator of bytes chunked, anything else as JSON
        data = body if isinstance(body, bytes | Iterator) else json.dumps(body).encode()
        sent.setdefault("Content-Type", "application/json")
    connection = (
        http.client.HTTPConnection(host, int(port), timeout=timeout_s)
        if tls is None
        else http.client.HTTPSConnection(host, int(port), timeout=timeout_s, context=tls)
    )
    try:
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        raw = response.read()
        answer_headers = dict(response.getheaders())
        return response.status, _decode(raw, answer_headers), answer_headers
    finally:
        connection.close()


class HttpSession:
    """Requests to one node over a connection kept open between them (HTTP/1.1 keep-alive).

    `http_request` opens and closes a connection per request, and the side that closes keeps
    the socket in TIME_WAIT for a minute: a harness reading tens of thousands of jobs one by
    one ran out of ephemeral ports (28,232 here) and every request failed at once with
    EADDRNOTAVAIL (a 2-hour endurance run's 34,219 jobs). One session per thread."""

    def __init__(self, address: str, *, timeout_s: float = 10,
                 tls: ssl.SSLContext | None = None) -> None:
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.timeout_s = timeout_s
        self.tls = tls
        self.opened = 0  # connections opened (a test counts them)
        self._connection: http.client.HTTPConnection | None = None

    def get(self, path: str, *, token: str | None = None) -> Response:
        """A GET (safe to send again): on a connection the node closed meanwhile (its
        keep-alive timeout), once more on a new one."""
        sent = {} if token is None else {"Authorization": f"Bearer {token}"}
        for attempt in range(2):
            connection = self._connection or self._open()
            try:
                connection.request("GET", path, headers=sent)
                response = connection.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise
                continue
            answer_headers = dict(response.getheaders())
            if response.will_close:
                self.close()
            return response.status, _decode(raw, answer_headers), answer_headers
        raise AssertionError("unreachable")

    def _open(self) -> http.client.HTTPConnection:
        self.opened += 1
        self._connection = (
            http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            if self.tls is None
            else http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s,
                                             context=self.tls)
        )
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _decode(raw: bytes, headers: dict[str, str]) -> Any:
    text = raw.decode("utf-8", errors="replace")
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    if "json" in content_type:
        with contextlib.suppress(ValueError):
            return json.loads(text)
    return text


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that are free now, below the kernel's ephemeral range, so that
    no outgoing connection takes one while its node is down between a kill and a restart.

    Each is also reserved for this process (`release_ports` gives it back; a reservation of a
    process that is gone is taken over): two test runs on one machine (CI's xdist workers, or
    several suites) otherwise chose a port of a node the other had killed and would restart,
    and the restart failed with "address already in use"."""
    low, _ = _ephemeral_range()
    chosen: list[int] = []
    sockets: list[socket.socket] = []
    try:
        for port in _candidate_ports(max(1025, low - 12_000), max(2048, low - 1)):
            if len(chosen) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            if not _reserve(port):
                sock.close()
                continue
            sockets.append(sock)
            chosen.append(port)
    finally:
        for sock in sockets:
            sock.close()
    if len(chosen) < count:
        release_ports(chosen)
        raise NoFreePorts(f"found only {len(chosen)} free ports of {count}")
    return chosen


RESERVATIONS = Path("/tmp/raftcron-test-ports")  # one file per reserved port: its owner's pid


def _reserve(port: int) -> bool:
    """Reserve `port` for this process; False when a live process holds it."""
    RESERVATIONS.mkdir(exist_ok=True)
    marker = RESERVATIONS / str(port)
    for _ in range(2):
        try:
            descriptor = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if _holder_alive(marker):
                return False
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()  # its process is gone: take the port over
            continue
        with os.fdopen(descriptor, "w") as out:
            out.write(str(os.getpid()))
        return True
    return False


def _holder_alive(marker: Path) -> bool:
    try:
        pid = int(marker.read_text() or "0")
    except (OSError, ValueError):
        return True  # being written: its creator is alive
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def release_ports(ports: list[int]) -> None:
    """Give back ports this process reserved (`free_ports`)."""
    for port in ports:
        marker = RESERVATIONS / str(port)
        with contextlib.suppress(OSError, ValueError):
            if int(marker.read_text()) == os.getpid():
                marker.unlink()


def _candidate_ports(low: int, high: int) -> Iterator[int]:
    ports = list(range(low, high + 1))
    random.SystemRandom().shuffle(ports)
    yield from ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999
