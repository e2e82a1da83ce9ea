"""The event log: what the cluster decided, in order, bounded.

Fires, overlap skips, misfires, expired leases, dead letters and leader changes are recorded
with a sequence number, so `GET /v1/events?cursor=N` can page through them from any node. The
log is part of the replicated state (every node holds the same events with the same numbers)
and keeps the newest `EVENTS_KEPT` entries.
"""

from __future__ import annotations

from collections import deque
from typing import Any

EVENTS_KEPT = 10_000

FIRED = "fired"
OVERLAP_SKIPPED = "overlap_skipped"
MISFIRED = "misfired"
LEASE_EXPIRED = "lease_expired"
DEAD_LETTERED = "dead_lettered"
LEADER_CHANGED = "leader_changed"


class EventLog:
    def __init__(self) -> None:
        self.entries: deque[list[Any]] = deque(maxlen=EVENTS_KEPT)  # [seq, now_ms, kind, fields]
        self.last_seq = 0

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, now_ms: int, kind: str, fields: dict[str, Any]) -> None:
        self.last_seq += 1
        self.entries.append([self.last_seq, now_ms, kind, fields])

    def since(self, after_seq: int, limit: int) -> list[list[Any]]:
        """Events with seq > after_seq, oldest first, at most `limit`."""
        if not self.entries or after_seq >= self.last_seq:
            return []
        first_seq = self.entries[0][0]
        start = max(0, after_seq + 1 - first_seq)
        out = []
        for index in range(start, min(len(self.entries), start + limit)):
            out.append(self.entries[index])
        return out

    def to_list(self) -> list[Any]:
        return [self.last_seq, list(self.entries)]

    @classmethod
    def from_list(cls, data: list[Any]) -> EventLog:
        log = cls()
        log.last_seq = data[0]
        log.entries.extend(data[1])
        return log
