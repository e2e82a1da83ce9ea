"""Archive retention, decided in the replicated state so every member drops the same rows of
its archive (DESIGN.md §9.2).

Each member writes the jobs that leave the state to an archive of its own (cluster/archive).
What it keeps there is bounded by a setting, `archive {max_age_ms, max_bytes}`; for every
member to keep the same rows, the state counts them: once the cluster is finalized, each job
that leaves gets the next archive sequence number (`seq`) and adds its size in the memory model
(scheduler/sizes.py, what it was counted for in the state) to the bucket of the minute it left
in. A Tick drops whole buckets from the front while the buckets' total is over `max_bytes` or
the oldest is older than `max_age_ms`; the archive keeps the rows from `floor` (a sequence
number) on, and each member deletes the rows below it.

A minute's bucket is the unit: a row stays at most a minute past its age, and the byte bound
is met to a minute's worth of jobs. Thirty days of buckets are 43,200 small records.

Tombstones (scheduler/purging.py): job ids purged from every archive, each with the number the
next job to leave had then (every row of the job is numbered below it); one goes when the
floor passes its number. They count toward the state budget (`sizes.TOMBSTONE_BYTES` each).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from raftcron.scheduler import limits, sizes
from raftcron.scheduler.frozen import FrozenJob
from raftcron.scheduler.jobs import Job
from raftcron.scheduler.settings import ArchiveRetention

BUCKET_MS = limits.MINUTE_MS
BUCKETS_DROPPED_PER_TICK_MAX = 10_000  # a lowered setting drops the rest over the next Ticks
TOMBSTONES_DROPPED_PER_TICK_MAX = 100_000


class ArchiveLedger:
    def __init__(self) -> None:
        self.next_seq = 1  # the sequence number the next job that leaves gets
        self.floor = 1  # rows below this sequence number are dropped on every member
        # [minute start (state ms), the last seq in it, its bytes], oldest first
        self.buckets: deque[list[int]] = deque()
        self.bytes = 0
        self.tombstones: dict[int, int] = {}  # purged job id -> next_seq when purged, in order
        # The ids purged since the shell last took them (None: no shell asks, as `leaving`).
        self.purging: list[int] | None = None

    def tombstone(self, job_id: int) -> None:
        """`job_id` is purged: every member deletes its row, and keeps it deleted."""
        self.tombstones.pop(job_id, None)  # purged again: the later number, at the end
        self.tombstones[job_id] = self.next_seq
        if self.purging is not None:
            self.purging.append(job_id)

    @property
    def tombstone_bytes(self) -> int:
        return sizes.TOMBSTONE_BYTES * len(self.tombstones)

    def record(self, now_ms: int, size: int) -> int:
        """A job left the state at `now_ms`, counting `size`: its sequence number."""
        seq = self.next_seq
        self.next_seq += 1
        minute = now_ms - now_ms % BUCKET_MS
        buckets = self.buckets
        if buckets and buckets[-1][0] >= minute:  # time never goes back: the same minute
            bucket = buckets[-1]
            bucket[1] = seq
            bucket[2] += size
        else:
            buckets.append([minute, seq, size])
        self.bytes += size
        return seq

    def trim(self, now_ms: int, rule: ArchiveRetention) -> bool:
        """Drop buckets past the rule (oldest first), then the tombstones the floor passed,
        each a bounded number; whether more are left to drop (the next Tick goes on)."""
        more = self._trim_buckets(now_ms, rule)
        tombstones = self.tombstones
        for _ in range(TOMBSTONES_DROPPED_PER_TICK_MAX):
            if not tombstones:
                return more
            job_id = next(iter(tombstones))
            if tombstones[job_id] > self.floor:
                return more
            del tombstones[job_id]
        return True

    def _trim_buckets(self, now_ms: int, rule: ArchiveRetention) -> bool:
        buckets = self.buckets
        cutoff_ms = now_ms - rule.max_age_ms
        for _ in range(BUCKETS_DROPPED_PER_TICK_MAX):
            if not buckets:
                return False
            minute, last_seq, size = buckets[0]
            if minute + BUCKET_MS > cutoff_ms and self.bytes <= rule.max_bytes:
                return False
            buckets.popleft()
            self.bytes -= size
            self.floor = last_seq + 1
        return bool(buckets) and (buckets[0][0] + BUCKET_MS <= cutoff_ms
                                  or self.bytes > rule.max_bytes)

    def to_list(self) -> list[Any]:
        data = [self.next_seq, self.floor, [list(bucket) for bucket in self.buckets]]
        if self.tombstones:
            data.append([value for pair in self.tombstones.items() for value in pair])
        return data

    @classmethod
    def from_list(cls, data: list[Any]) -> ArchiveLedger:
        ledger = cls()
        ledger.next_seq, ledger.floor, buckets = data[:3]
        if len(data) > 3:
            flat = data[3]
            ledger.tombstones = dict(zip(flat[::2], flat[1::2], strict=True))
        ledger.buckets = deque([int(minute), int(seq), int(size)]
                               for minute, seq, size in buckets)
        ledger.bytes = sum(bucket[2] for bucket in ledger.buckets)
        return ledger


class LeavingState(Protocol):
    now_ms: int
    archive_ledger: ArchiveLedger
    leaving: list[tuple[int, Job | FrozenJob]] | None

    @property
    def finalized(self) -> bool: ...


def leave(state: LeavingState, job: Job | FrozenJob, counted: int) -> None:
    """`job` left the state, counted for `counted` bytes: numbered for archive retention once
    the cluster is finalized (0 before: the previous release counts nothing), and handed to
    the shell's archive when it asks (`state.leaving`)."""
    seq = state.archive_ledger.record(state.now_ms, counted) if state.finalized else 0
    if state.leaving is not None:
        state.leaving.append((seq, job))
