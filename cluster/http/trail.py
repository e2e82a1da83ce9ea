"""The audit trail of admin actions (DESIGN.md §8.3): who did what, through this node.

Audited: every route whose grant is ``manage`` (schedules put, delete, pause, resume, trigger,
backfill; audits; compaction) and the job actions cancel and retry, whatever the answer
(a refused 401/403 attempt is recorded too). Each record: ``seq``, wall-clock ``time_ms``,
``node``, the caller's token ``name`` and ``role`` (None when auth is off), ``remote``,
``method``, ``path`` (with its query), ``status`` and the ``request_id`` if one was sent.
``GET /v1/audit`` (admin) serves the newest first.

Node-local, not replicated state, and why:
- not every audited action is a replicated command: compaction acts on one node, refused
  attempts never reach the log, and backups will stream from one node;
- who called and from where is not state the core may depend on (it must stay deterministic
  and its commands and snapshots versioned), and adding it to every command would change them;
- a record is written before the answer is sent, on the node that received the request.
So the whole trail is the union of the members' trails: ask each node (each record names it).

Storage: JSON lines in ``<data_dir>/audit.jsonl``, appended and flushed per record; over
``FILE_BYTES_MAX`` it is rotated to ``audit.jsonl.1`` (one old file kept). The last
``RECENT_MAX`` records are kept in memory for the route. A write that fails is logged and the
record stays in memory: the trail never makes an admin action fail.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("raftcron.audit")

FILE_NAME = "audit.jsonl"
FILE_BYTES_MAX = 16 * 1024 * 1024
RECENT_MAX = 10_000
AUDITED_ACTIONS = frozenset({"manage"})  # grants whose every route is audited


class AuditTrail:
    def __init__(self, data_dir: Path, node_id: str) -> None:
        self.path = Path(data_dir) / FILE_NAME
        self.node_id = node_id
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_MAX)
        self.seq = 0
        self._load()

    def _load(self) -> None:
        for path in (self.path.with_name(FILE_NAME + ".1"), self.path):
            with contextlib.suppress(FileNotFoundError):
                for line in path.read_text(errors="replace").splitlines():
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue  # a torn last line after a crash
                    if isinstance(entry, dict) and isinstance(entry.get("seq"), int):
                        self.recent.append(entry)
                        self.seq = max(self.seq, entry["seq"])

    def record(self, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        entry = {"seq": self.seq, "time_ms": time.time_ns() // 1_000_000,
                 "node": self.node_id, **fields}
        self.recent.append(entry)
        try:
            self._append(json.dumps(entry, separators=(",", ":")) + "\n")
        except OSError as error:
            log.error("audit record not written to %s: %s (kept in memory)", self.path, error,
                      extra={"action": "audit_write_failed"})
        return entry

    def _append(self, line: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            if self.path.stat().st_size + len(line) > FILE_BYTES_MAX:
                os.replace(self.path, self.path.with_name(FILE_NAME + ".1"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as file:
            file.write(line)
            file.flush()

    def newest(self, limit: int, before_seq: int | None = None) -> list[dict[str, Any]]:
        found = []
        for entry in reversed(self.recent):
            if before_seq is not None and entry["seq"] >= before_seq:
                continue
            found.append(entry)
            if len(found) >= limit:
                break
        return found
