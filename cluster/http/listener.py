"""The node's HTTP listener: the socket, how many connections it holds, how long an idle one
may stay, and TLS (DESIGN.md §8.3).

- At most ``cap`` connections at once: ``[api] max_connections``, and never more than half the
  process's descriptor limit, so HTTP clients alone cannot take the descriptors the Raft port
  and the storage need. A connection over the cap gets a 503 and is closed at once.
- ``[api] idle_timeout_s``: a connection that has not sent a whole request head that long after
  it opened (slowloris), or that sits idle that long between requests, is closed (aiohttp's
  keep-alive timer, which 3.14 also starts when the connection opens).
- TLS from ``tls_cert_file`` / ``tls_key_file``; with ``tls_client_ca_file`` every client must
  present a certificate signed by that CA. ``reload_tls()`` (SIGHUP) re-reads the files into the
  live context, so new connections get the new certificate; files that do not load leave the
  old one in place and the error is logged.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
import time
from typing import Any

from aiohttp import web

from raftcron.cluster.clients import tls
from raftcron.cluster.config import ApiSettings, split_address

log = logging.getLogger("raftcron.http")

_OVER_CAP_BODY = b'{"error":{"code":"unavailable","message":"too many connections; retry"}}'
_OVER_CAP = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
             b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
             % (len(_OVER_CAP_BODY), _OVER_CAP_BODY))


def connection_cap(settings: ApiSettings) -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return settings.max_connections
    return max(1, min(settings.max_connections, soft // 2))


class _OverCap(asyncio.Protocol):
    """Answers 503 and hangs up: the connection is over the cap."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_OVER_CAP)
        transport.close()


class _Counted(asyncio.Protocol):
    """Forwards to aiohttp's handler and keeps the listener's count of open connections.

    Counted from the moment the protocol is made: asyncio accepts a burst of connections and
    makes all their protocols before any of them is connected, so counting connected ones
    alone lets a burst through. One that never connects (a failed TLS handshake calls neither
    connection_made nor connection_lost) stops counting after the handshake timeout."""

    def __init__(self, inner: Any, listener: HttpListener) -> None:
        self.inner, self.listener = inner, listener
        self.created = time.monotonic()
        self.connected = False
        listener.pending.add(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.listener.pending.discard(self)
        self.listener.connected += 1
        self.connected = True
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.pending.discard(self)
        if self.connected:
            self.connected = False
            self.listener.connected -= 1
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[no-any-return]

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class HttpListener:
    def __init__(self, runner: web.AppRunner, address: str, settings: ApiSettings) -> None:
        self.runner = runner
        self.host, self.port = split_address(address)
        self.settings = settings
        self.cap = connection_cap(settings)
        self.refused = 0
        self.tls = tls.server_context(settings)
        self.server: asyncio.Server | None = None
        self.connected = 0
        self.pending: set[_Counted] = set()

    def open_connections(self) -> int:
        stale = time.monotonic() - self.settings.idle_timeout_s - 1.0
        self.pending = {p for p in self.pending if p.created > stale}
        return self.connected + len(self.pending)

    def _protocol(self) -> asyncio.BaseProtocol:
        server = self.runner.server
        assert server is not None
        if self.open_connections() >= self.cap:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("http connections at the cap (%d): refused %d so far", self.cap,
                            self.refused, extra={"action": "http_over_cap"})
            return _OverCap()
        return _Counted(server(), self)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            self._protocol, self.host, self.port, ssl=self.tls, reuse_address=True,
            ssl_handshake_timeout=self.settings.idle_timeout_s if self.tls else None)

    def reload_tls(self) -> bool:
        """Re-read the certificate files (SIGHUP); False when they did not load."""
        if self.tls is None:
            return False
        try:
            tls.server_context(self.settings)  # all or nothing: try on a fresh context first
            tls.load_server_files(self.tls, self.settings)
        except (OSError, ssl.SSLError) as error:
            log.error("TLS files not reloaded (the old ones stay in use): %s", error,
                      extra={"action": "tls_reload_failed"})
            return False
        log.info("TLS files reloaded", extra={"action": "tls_reloaded"})
        return True

    def close(self) -> None:
        """Stop accepting; the runner's cleanup then closes the open connections."""
        if self.server is not None:
            self.server.close()

    async def wait_closed(self) -> None:
        if self.server is not None:
            await self.server.wait_closed()
