"""Request-id dedupe: a repeated client request is answered with its first result.

A proposal that timed out may still commit, and PySyncObj may report a failure for a command it
applied; the shell therefore retries with the same `request_id`, and this table makes the retry
harmless. Only successes are remembered: a rejection changed nothing, so evaluating the retry
again is as safe as answering from memory, and it keeps "a rejected command changes nothing"
literally true. Entries live `REQUEST_WINDOW_MS` and at most `REQUESTS_KEPT_MAX` of them.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from scheduler import limits


class RequestLog:
    def __init__(self) -> None:
        # id -> (command tag, fingerprint of the command, value, now_ms)
        self.results: dict[str, tuple[int, int, Any, int]] = {}
        self.order: deque[tuple[int, str]] = deque()  # (now_ms, id) in arrival order

    def __len__(self) -> int:
        return len(self.results)

    def get(self, request_id: str) -> tuple[int, int, Any] | None:
        """(tag, fingerprint, first result value) of a request seen in the window, or None."""
        entry = self.results.get(request_id)
        return None if entry is None else (entry[0], entry[1], entry[2])

    def remember(
        self, request_id: str, tag: int, fingerprint: int, value: Any, now_ms: int
    ) -> None:
        self.results[request_id] = (tag, fingerprint, value, now_ms)
        self.order.append((now_ms, request_id))
        while len(self.results) > limits.REQUESTS_KEPT_MAX:
            self._drop_oldest()

    def expire(self, now_ms: int) -> None:
        cutoff_ms = now_ms - limits.REQUEST_WINDOW_MS
        while self.order and self.order[0][0] <= cutoff_ms:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        now_ms, request_id = self.order.popleft()
        entry = self.results.get(request_id)
        if entry is not None and entry[3] == now_ms:
            del self.results[request_id]

    def to_list(self) -> list[Any]:
        return [[rid, *entry] for rid, entry in self.results.items()]

    @classmethod
    def from_list(cls, data: list[Any]) -> RequestLog:
        log = cls()
        for rid, tag, fingerprint, value, now_ms in data:
            log.results[rid] = (tag, fingerprint, value, now_ms)
            log.order.append((now_ms, rid))
        return log
