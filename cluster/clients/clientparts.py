"""What the clients and the worker share: the client's error tree, request ids and node URL lists.

`RaftcronError` is the base of every error a client raises: `ApiError` (the cluster answered
with an error: its status, the API's code, message and field; `StateFull`, a 507, is one) and
`Unavailable` (no node answered in time). A request id is fresh per logical call and reused by
each of its retries; a URL list is what `--connect` and `AsyncClient(urls)` take.

What it must not do: any I/O. `AsyncClient` (cluster/clients/asyncclient.py) talks HTTP, `Client`
(cluster/clients/client.py) blocks on it, and the worker runtime imports these without either.
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
            kind = StateFull if error.get("code") == "state_full" else cls
            return kind(
                status,
                str(error.get("code", "error")),
                str(error.get("message", "")),
                error.get("field"),
                body,
            )
        return cls(status, "http_error", str(body)[:500], None, body)


class StateFull(ApiError):
    """507 `state_full`: the cluster's state is at its budget and nothing finished is left to
    evict (DESIGN.md §9.1). Not retried by the client: the request created nothing, and room
    comes back only as workers finish jobs (or an admin raises the budget). `budget_bytes`,
    `state_bytes` and `queues` (the queues holding most, `[{"queue", "bytes"}]`) say why."""

    @property
    def budget_bytes(self) -> int | None:
        return self._figure("budget_bytes")

    @property
    def state_bytes(self) -> int | None:
        return self._figure("state_bytes")

    @property
    def queues(self) -> list[dict[str, Any]]:
        error = self.body.get("error", {}) if isinstance(self.body, dict) else {}
        queues = error.get("queues") if isinstance(error, dict) else None
        return list(queues) if isinstance(queues, list) else []

    def _figure(self, name: str) -> int | None:
        error = self.body.get("error", {}) if isinstance(self.body, dict) else {}
        value = error.get(name) if isinstance(error, dict) else None
        return value if isinstance(value, int) else None


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
