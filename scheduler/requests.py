"""Request-id dedupe: a repeated client request is answered with its first result.

A proposal that timed out may still commit, and PySyncObj may report a failure for a command it
applied; the shell therefore retries with the same `request_id`, and this table makes the retry
harmless. Only successes are remembered: a rejection changed nothing, so evaluating the retry
again is as safe as answering from memory, and it keeps "a rejected command changes nothing"
literally true. Barriers (consistent reads, audits) are never remembered: repeating a no-op is
harmless, and a read must not push a write's answer out.

One rejection is remembered too: `state_full` (507, finalized clusters only: DESIGN.md §9.1).
Such entries exist because the state is full, so they are kept out of what the budget counts
(`bytes_counted`) and bounded on their own (`limits.REFUSALS_BYTES_MAX`: past it a refusal
for space is answered `busy`, 503, which promises nothing and is not remembered).
It is a definite answer that depends on the moment (room may free a moment later), and a
client that was told 507 takes it that nothing was created; a repeat of the same request (the
shell's retry, or the node's own still in flight) must then never create it. The chaos suite's
budget scenario found it: a submit answered 507 through one node, its first attempt re-proposed
by another after a leader change, applied after room was freed, created the job.

Bounds (DESIGN.md §8.2), in state time, which follows the majority's clocks:
* an entry lives `REQUEST_WINDOW_MS`;
* past `bytes_max` (the answers' msgpack bytes plus a per-entry overhead) the oldest entries
  go first, but never one younger than `REQUEST_RETRY_MS`, the longest retry deadline of a
  client (a retry after its eviction would be applied twice);
* past `hard_bytes_max` of such young entries the table is `full()`: the state refuses new
  requests (`busy`, a 503 to retry) until time frees room; retries are still answered.

Answers are kept msgpack-packed: compact, and their size is what the budget counts.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgpack

from raftcron.scheduler import limits
from raftcron.scheduler.commands import Barrier, Command, Heartbeat
from raftcron.scheduler.errors import Ok, Rejected, Result
from raftcron.scheduler.packing import to_msgpack

# The dict slot, the id string's header, the entry's bytes header and fixed fields, its order
# slot (measured: ~110 bytes beside the id's and the answer's, tests/test_core_requests.py).
ENTRY_OVERHEAD_BYTES = 160


def _pack(value: Any) -> bytes:
    packed: bytes = to_msgpack(value)
    return packed


def _unpack(packed: bytes | memoryview) -> Any:
    return msgpack.unpackb(packed, raw=False, strict_map_key=False)


REFUSED = "\x00refused"  # the key of a remembered refusal (no Ok value has it)
# A remembered refusal's packed value, {REFUSED: code, "message": ...}, is a small map whose
# first key is REFUSED: one byte of map header, then this.
_REFUSED_KEY = msgpack.packb(REFUSED, use_bin_type=True)
REMEMBERED_REFUSALS = frozenset({"state_full"})


def dedupe_id(command: Command, *, finalized: bool) -> str | None:
    """The request id whose entry in the table answers this command's repeats (and that the
    command adds there); None for a command that is applied again when repeated:

    * a Barrier, a no-op: a consistent read or an audit must not take a write's place in the
      table (DESIGN.md §8.2);
    * in a `finalized` cluster (scheduler/gate.py: the previous release remembers them), a
      heartbeat without a progress report. Applied again it moves the lease's end to now +
      lease at the latest, or is refused (409) when the lease has gone since, which is the
      truth its worker needs, where the first answer would say the lease holds. Remembered,
      each took ~200 bytes of the table for an hour: 20,000 running jobs beating every 10 s (a
      30 s lease's third) kept 244 MiB of it, of a 512 MiB default budget, and 24,000 filled
      its 256 MiB of young entries in 8.8 minutes, after which every new request, heartbeats
      and submits alike, was refused busy. A heartbeat with a report stays remembered:
      applied again late, an older report would replace a newer one.
    """
    if isinstance(command, Barrier):
        return None
    if finalized and plain_heartbeat(command):
        return None
    request_id: str | None = getattr(command, "request_id", None)
    return request_id


def plain_heartbeat(command: object) -> bool:
    """A heartbeat without a progress report: what a finalized cluster applies again when it
    is repeated (`dedupe_id`)."""
    return type(command) is Heartbeat and command.progress is None


def remembered(result: Result) -> bool:
    """Whether a request's first result is kept for its repeats."""
    return isinstance(result, Ok) or (isinstance(result, Rejected)
                                      and result.code in REMEMBERED_REFUSALS)


def value_of(result: Result) -> Any:
    if isinstance(result, Ok):
        return result.value
    return {REFUSED: result.code, "message": result.message}


def answer(value: Any) -> Result:
    """A repeat's answer: the first result, as `value_of` kept it."""
    if isinstance(value, dict) and REFUSED in value:
        return Rejected(value[REFUSED], str(value.get("message", "")))
    return Ok(value)


# An entry's fixed fields ahead of its packed answer, in one bytes object per request id:
# (command tag, fingerprint, now_ms). One object rather than a tuple of four and its ints,
# and the arrival order a deque of the ids alone: an entry takes about the bytes the budget
# counts for it (ENTRY_OVERHEAD_BYTES + the id + the answer), where the tuples took 1.8 times
# as much (RSS grew twice as fast as the counted state under a steady load).
_HEAD = struct.Struct("<HQq")


class RequestLog:
    def __init__(self, *, bytes_max: int = limits.REQUESTS_BYTES_MAX,
                 hard_bytes_max: int = limits.REQUESTS_HARD_BYTES_MAX) -> None:
        self.results: dict[str, bytes] = {}  # id -> _HEAD + the packed answer
        self.order: deque[str] = deque()  # the ids in arrival order (so, by now_ms)
        self.bytes = 0
        self.refusal_bytes = 0  # of `bytes`: remembered refusals for space (not budgeted)
        self.bytes_max = bytes_max
        self.hard_bytes_max = hard_bytes_max

    def __len__(self) -> int:
        return len(self.results)

    def get(self, request_id: str) -> tuple[int, int, Any] | None:
        """(tag, fingerprint, first result value) of a request seen in the window, or None."""
        entry = self.results.get(request_id)
        if entry is None:
            return None
        tag, fingerprint, _ = _HEAD.unpack_from(entry)
        return tag, fingerprint, _unpack(memoryview(entry)[_HEAD.size:])

    def full(self) -> bool:
        """No room for a new request until entries age past the retry window."""
        return self.bytes >= self.hard_bytes_max

    def remember(
        self, request_id: str, tag: int, fingerprint: int, value: Any, now_ms: int
    ) -> None:
        self._add(request_id, tag, fingerprint, _pack(value), now_ms)
        self._drop_past_bytes_max(now_ms)

    def _add(self, request_id: str, tag: int, fingerprint: int, packed: bytes,
             now_ms: int) -> None:
        old = self.results.pop(request_id, None)
        if old is not None:  # never for a state's own use (it answers repeats)
            self._count(request_id, old, -1)
            self.order.remove(request_id)
        entry = _HEAD.pack(tag, fingerprint, now_ms) + packed
        self.results[request_id] = entry
        self.order.append(request_id)
        self._count(request_id, entry, 1)

    def _count(self, request_id: str, entry: bytes, sign: int) -> None:
        size = _entry_bytes(request_id, len(entry) - _HEAD.size)
        self.bytes += sign * size
        if entry[_HEAD.size + 1:_HEAD.size + 1 + len(_REFUSED_KEY)] == _REFUSED_KEY:
            self.refusal_bytes += sign * size

    @property
    def bytes_counted(self) -> int:
        """What the state budget counts: every entry but the remembered refusals."""
        return self.bytes - self.refusal_bytes

    def _oldest_ms(self) -> int:
        return int(_HEAD.unpack_from(self.results[self.order[0]])[2])

    def expire(self, now_ms: int) -> None:
        cutoff_ms = now_ms - limits.REQUEST_WINDOW_MS
        while self.order and self._oldest_ms() <= cutoff_ms:
            self._drop_oldest()
        self._drop_past_bytes_max(now_ms)

    def _drop_past_bytes_max(self, now_ms: int) -> None:
        young_ms = now_ms - limits.REQUEST_RETRY_MS
        while self.bytes > self.bytes_max and self.order and self._oldest_ms() <= young_ms:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        request_id = self.order.popleft()
        self._count(request_id, self.results.pop(request_id), -1)

    def to_list(self) -> list[Any]:
        found = []
        for rid, entry in self.results.items():
            tag, fingerprint, now_ms = _HEAD.unpack_from(entry)
            found.append([rid, tag, fingerprint, entry[_HEAD.size:], now_ms])
        return found

    @classmethod
    def from_list(cls, data: Iterable[list[Any]], *, packed: bool = True) -> RequestLog:
        """From `to_list`; `packed=False`: snapshot format 1, which held the values."""
        log = cls()
        for rid, tag, fingerprint, value, now_ms in data:
            log._add(rid, tag, fingerprint, value if packed else _pack(value), now_ms)
        return log


def _entry_bytes(request_id: str, packed_bytes: int) -> int:
    return ENTRY_OVERHEAD_BYTES + len(request_id) + packed_bytes


def answer_bytes(request_id: str | None, items: int, names_chars: int = 0) -> int:
    """What remembering a creating command's answer will count, at most: `items` ids and
    flags (jobs, fires), or names: so the budget's check of the command includes it."""
    if request_id is None:
        return 0
    return ENTRY_OVERHEAD_BYTES + len(request_id) + 64 + 32 * items + names_chars
