"""A lean HTTP/1.1 load client for the request-rate measures, in the spirit of wrk.

The bench runs on the same cores as the cluster it measures, so every microsecond the load
generator spends is taken from the nodes. aiohttp's client costs a few hundred microseconds per
request; this client writes one prepared request on a kept-alive connection and reads one
response, a small fraction of that. It still waits for each answer before the next request on
its connection: one job per request, acknowledged after commit, exactly as a user's client.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class LeanConnection:
    """One kept-alive connection to one node; `post` sends a request and reads its answer."""

    def __init__(self, url: str, token: str | None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"the lean client speaks plain http only, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self._head = f"Host: {parts.netloc}\r\n{auth}Content-Type: application/json\r\n"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        data = json.dumps(body, separators=(",", ":")).encode()
        request = (
            f"POST {path} HTTP/1.1\r\n{self._head}Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        try:
            self._writer.write(request)
            status, payload, keep = await _read_response(self._reader)
        except BaseException:
            self.close()
            raise
        if not keep:
            self.close()
        return status, json.loads(payload) if payload else None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, keep-alive) of one HTTP/1.1 response with a length or chunked body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip().lower()
    keep = headers.get("connection") != "close"
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"])), keep
    if headers.get("transfer-encoding") == "chunked":
        body = bytearray()
        for _ in range(1_000_000):  # bounded: one chunk each round
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # the empty trailer
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)  # the chunk's CRLF
        return status, bytes(body), keep
    return status, await reader.read(), False  # the body runs to the end of the connection
