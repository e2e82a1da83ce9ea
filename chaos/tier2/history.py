"""The recorded history of a chaos run: JSON lines, one event per line, in the order recorded.

What it owns: appending events from any thread (one lock, one line per write, flushed so a
crashed run still leaves its history on disk) and reading a history back for the checkers.

Every event is a flat JSON object with `t` (the harness's wall clock in Unix ms), `kind` and
kind-specific fields. The kinds (the checkers and the report read these, nothing else):

- `run` (seed, scenario, settings), `phase` (warmup, faults, heal, drain, final);
- `fault` with `phase` "start" or "end": `fault` (kill, pause, partition, downtime, clock,
  worker_kill, worker_pause, worker_cut...), `targets`, `leader` (who led when it started);
- `submit` with `op` invoke | ok | fail | info: `key`, `job_id`, `status` (HTTP), `retry`;
  `flood` on the budget scenario's large jobs (`queue`); a 507 (state_full) is a `fail`;
- `workflow` with `op`: `key`, `jobs` {name: id}, `fails` (A fails on purpose); a `fail`
  carries `status` and `code`;
- `final`: a job the harness saw in a final status (`job_id`, `status`, `source`: observer,
  ack, cancel, read), once per job: the evidence that a job evicted later had ended;
- `flood` with `op` cancel (the flood's operator cancels an idle job to make room), claimed,
  ack_refused, claim_failed, settle (what its consumer did, for a human);
- `usage`: the state against its budget (`state_bytes`, `budget_bytes`, `evicted` by reason,
  `fires_refused`, `kept` by outcome), every few seconds in the budget scenario;
- `stale` with `op` invoke | ok | fail | info: a completion or heartbeat sent with an old
  token on purpose (`job_id`, `token`, `newest_token`, `action`);
- `sample`: the monitor's view of one node (`node`, `role`, `term`, `commit_index`,
  `has_quorum`, `now_ms`), at most a few per second;
- `downtime` with `phase` "down" or "up": the bounds of a whole-cluster outage (`id`);
- `worker` with `op` "start": a worker process started (`name`, `pid`);
- `note`: anything worth keeping for a human (a node that exited by itself, ...).

It must not interpret anything: that is the checkers' job.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

RecordedEvent = dict[str, Any]  # one line of the history (chaos.model.Event is the model's)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class History:
    """An append-only JSON-lines file plus the events in memory (runs are minutes long)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.events: list[RecordedEvent] = []
        self._lock = threading.Lock()
        self._file = None if path is None else path.open("a", encoding="utf-8")

    def record(self, kind: str, **fields: Any) -> RecordedEvent:
        event: RecordedEvent = {"t": fields.pop("t", None) or now_ms(), "kind": kind, **fields}
        line = json.dumps(event, sort_keys=True, default=str)
        with self._lock:
            self.events.append(event)
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()
        return event

    def of(self, kind: str) -> list[RecordedEvent]:
        with self._lock:
            return [event for event in self.events if event["kind"] == kind]

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def load(path: Path) -> list[RecordedEvent]:
    """Read a history file back (a torn last line of a crashed run is skipped)."""
    return list(parse(path.read_text(encoding="utf-8").splitlines()))


def parse(lines: Iterable[str]) -> Iterator[RecordedEvent]:
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def of(events: Iterable[RecordedEvent], kind: str, **match: Any) -> list[RecordedEvent]:
    """The events of one kind whose fields equal `match`."""
    return [
        event
        for event in events
        if event.get("kind") == kind and all(event.get(k) == v for k, v in match.items())
    ]
