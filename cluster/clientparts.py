"""What the clients and the worker share: the client's error tree, request ids and node URL lists.

`RaftcronError` is the base of every error a client raises: `ApiError` (the cluster answered
with an error: its status, the API's code, message and field) and `Unavailable` (no node
answered in time). A request id is fresh per logical call and reused by each of its retries;
a URL list is what `--connect` and `AsyncClient(urls)` take.

What it must not do: any I/O. `AsyncClient` (cluster/asyncclient.py) talks HTTP, `Client`
(cluster/client.py) blocks on it, and the worker runtime imports these without either.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any


class RaftcronError(Exception):
    """Base of the client's errors."""


class ApiError(RaftcronError):
    """The cluster answered with an error (4xx, or a 5xx that is not retried)."""

    def __init__(
        self, status: int, code: str, message: str, field: str | None = None, body: Any = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" ({field})" if field else ""))
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.body = body

    @classmethod
    def from_answer(cls, status: int, body: Any) -> ApiError:
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            return cls(
                status,
                str(error.get("code", "error")),
                str(error.get("message", "")),
                error.get("field"),
                body,
            )
        return cls(status, "http_error", str(body)[:500], None, body)


class Unavailable(RaftcronError):
    """No node gave an answer before the deadline (down, no leader, or commit timeouts)."""


def new_request_id() -> str:
    """A fresh request id: unique per logical call, reused by every retry of that call."""
    return uuid.uuid4().hex


def normalize_urls(urls: str | Sequence[str]) -> list[str]:
    """`"http://a:1,http://b:2"` or a list -> a clean list; `host:port` gets `http://`."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    cleaned = []
    for item in items:
        url = item.strip().rstrip("/")
        if not url:
            continue
        cleaned.append(url if "://" in url else f"http://{url}")
    if not cleaned:
        raise ValueError("at least one node URL is required")
    return cleaned
