"""Snapshot and restore: the whole state as msgpack bytes, and a digest of it.

The snapshot carries records only (jobs, schedules, workflows, tables in their dict order);
every index (ready queues, heaps, status sets) is rebuilt on restore. A job is a row of the
fields its indexes read and its packed record (`scheduler.frozen`): a finished job's record is
written and restored as the bytes it already is, so neither direction decodes a million
retained jobs. Version 1 (every job as a list of fields) is still read. Two replicas that applied
the same commands produce identical bytes, and `restore(snapshot(s))` continues exactly as `s`
would have: the indexes are only ever consulted in total orders, so how a heap was built never
shows.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterator
from typing import Any

import msgpack

from raftcron.scheduler import jobs as j
from raftcron.scheduler.archiving import ArchiveLedger
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.events import EventLog
from raftcron.scheduler.fairness import FairQueue
from raftcron.scheduler.frozen import STATUS, FrozenJob, job_from_list, row
from raftcron.scheduler.jobs import Job, Workflow
from raftcron.scheduler.notifications import Notifications
from raftcron.scheduler.queues import QueueControl
from raftcron.scheduler.requests import RequestLog
from raftcron.scheduler.schedules import schedule_restore, schedule_snapshot
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.settings import Settings
from raftcron.scheduler.sizes import (
    FROZEN_JOB_BYTES,
    WORKFLOW_BYTES,
    WORKFLOW_NODE_BYTES,
    key_bytes,
    schedule_bytes,
)
from raftcron.scheduler.state import SchedulerState

# 2: a job is a row with its packed record (scheduler/frozen.py), and request-id answers are
# kept msgpack-packed (scheduler/requests.py). Version 1 snapshots (raftcron 0.1: jobs as lists
# of fields, the answers themselves) still load; a version-1 node cannot read 2.
# 3: a 15th field, a map of named sections (state added since, each read with its default
# when absent): "queues" (scheduler/queues.py), "held" (the ids of queued jobs waiting for a
# concurrency key, scheduler/store.py), "keyed" (a job was ever given a concurrency key: a
# job record may then end in the fields added since) and "notifications" (the webhooks and
# their outbox, scheduler/notifications.py). Versions 1 and 2 still load; a node of
# version 2 cannot read 3, so a state that has none of these sections is written as version 2
# (byte for byte what the previous release wrote): a rolling upgrade stays possible until the
# new features are used.
# 4: the snapshot of a finalized cluster (DESIGN.md §9.0): its job records may be in the compact
# format (scheduler/frozen.py) and it has the "settings" section. The fields are those of 3; the
# number changes because a release that reads 3 would meet a compact record before the section
# list and fail on it with a bare KeyError, where a version it does not read is named.
SNAPSHOT_VERSION = 4
SNAPSHOT_VERSIONS_READ = (1, 2, 3, 4)


ROWS_PER_PIECE = 10_000  # about 2.5 MB of rows: what a writer compresses at a time


def snapshot(state: SchedulerState) -> bytes:
    return b"".join(snapshot_pieces(state))


def snapshot_pieces(state: SchedulerState) -> Iterator[bytes | memoryview]:
    """The snapshot's bytes in pieces, the jobs `ROWS_PER_PIECE` rows at a time: a writer
    compresses each as it comes and never holds the whole (247 MB at a million retained jobs,
    which a forked writer had to fault in page by page). Joined, they are `snapshot`'s bytes:
    the msgpack of the list of fields below."""
    sections = _sections(state)
    spec_wires: dict[int, Any] = {}  # alive only while the specs it names are
    head = [
        _version(state, sections),
        state.now_ms,
        state.fence,
        state.next_job_id,
        state.next_workflow_id,
    ]
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    packer.pack_array_header(len(head) + 9 + (1 if sections else 0))
    for value in head:
        packer.pack(value)
    jobs = list(state.table.jobs.values())
    compact = state.table.compact_records
    packer.pack_array_header(len(jobs))
    yield packer.bytes()
    for start in range(0, len(jobs), ROWS_PER_PIECE):
        rows = [row(job, compact=compact) for job in jobs[start:start + ROWS_PER_PIECE]]
        packed = msgpack.packb(rows, use_bin_type=True)
        yield memoryview(packed)[_array_header_bytes(len(rows)):]  # the rows, not their list
    tail = [
        [[key, *entry] for key, entry in state.table.keys.items()],
        [[*schedule_snapshot(s, spec_wires), list(s.active)] for s in state.schedules.values()],
        list(state.pending_schedules),
        [_workflow_to_list(w) for w in state.workflows.values()],
        state.requests.to_list(),
        state.events.to_list(),
        state.counters,
        None if state.leader is None else list(state.leader),
    ]
    if sections:
        tail.append(sections)
    yield b"".join(msgpack.packb(value, use_bin_type=True) for value in tail)


def _version(state: SchedulerState, sections: dict[str, Any]) -> int:
    if state.table.compact_records:
        return SNAPSHOT_VERSION
    return 3 if sections else 2


def _array_header_bytes(count: int) -> int:
    """How long msgpack's header of an array of `count` items is (fixarray, array 16, 32)."""
    return 1 if count < 16 else 3 if count < 1 << 16 else 5


def _sections(state: SchedulerState) -> dict[str, Any]:
    """The state added after version 2, by name; an empty part is left out."""
    sections: dict[str, Any] = {}
    if state.queues:
        sections["queues"] = [[name, *q.to_list()] for name, q in state.queues.items()]
    held = state.table.held_ids()
    if held:
        sections["held"] = held
    if state.table.keyed_seen:
        sections["keyed"] = True
    fair = {name: line.turns() for name, line in sorted(state.table.ready.items())
            if isinstance(line, FairQueue)}
    if fair:  # the turns of queues with fairness keys (scheduler/fairness.py)
        sections["fair"] = fair
    rates = state.table.rates
    if rates.keys:  # keyed rate limits (scheduler/ratekeys.py): a finalized cluster's only
        rate_held = rates.held_ids()
        if rate_held:
            sections["rate_held"] = rate_held
        windows = rates.to_list()
        if windows:
            sections["rate_windows"] = windows
    if state.notifications.in_use:
        sections["notifications"] = state.notifications.to_list()
    if state.finalized:
        # The upgrade gate opened (scheduler/gate.py): a release before it refuses this
        # section, so it cannot join a cluster whose commands it would read otherwise.
        sections["settings"] = {
            "level": state.level,
            "settings": state.settings.to_wire(),
            "keys_forgotten_ms": state.keys_forgotten_ms,
            "retention_pending": state.retention_pending,
            "archive_ledger": state.archive_ledger.to_list(),
        }
    return sections


_SNAPSHOT_FIELDS = {1: 14, 2: 14, 3: 15, 4: 15}
_SECTIONS = frozenset({"queues", "held", "keyed", "notifications", "settings", "rate_held",
                       "rate_windows", "fair"})


def restore(blob: bytes | bytearray) -> SchedulerState:
    """The state a snapshot holds; ValueError if the blob is not a whole snapshot of ours."""
    try:
        return _restore(blob)
    except msgpack.OutOfData:
        raise ValueError("the snapshot ends early (truncated)") from None
    except msgpack.UnpackException as error:
        raise ValueError(f"the snapshot does not decode: {error}") from None
    except Invalid as error:
        raise ValueError(f"the snapshot's settings section is not valid: {error}") from None


def _restore(blob: bytes | bytearray) -> SchedulerState:
    # Streamed: the jobs array is read one job at a time, so a million jobs never exist twice
    # over (as msgpack lists and as Jobs). Unpacking it whole doubled a restoring node's RSS.
    unpacker = msgpack.Unpacker(
        _Chunks(blob),
        read_size=1 << 20,
        raw=False,
        strict_map_key=False,
        max_buffer_size=max(len(blob), 1 << 20),
    )
    fields = unpacker.read_array_header()
    version = unpacker.unpack()
    if version not in SNAPSHOT_VERSIONS_READ:
        raise ValueError(
            f"snapshot version {version} is not one this release reads ({SNAPSHOT_VERSIONS_READ})"
        )
    if fields != _SNAPSHOT_FIELDS[version]:
        raise ValueError(f"a snapshot of version {version} holds {_SNAPSHOT_FIELDS[version]} "
                         f"fields, not {fields}")
    state = SchedulerState()
    state.now_ms = unpacker.unpack()
    state.fence = unpacker.unpack()
    state.next_job_id = unpacker.unpack()
    state.next_workflow_id = unpacker.unpack()
    table = state.table
    active: list[Job] = []
    # (status, queue) -> [its finished jobs' (finished_ms, id), their bytes in the memory model]
    finished: dict[tuple[str, str], list[Any]] = {}
    jobs, count_by_status = table.jobs, table.count_by_status
    names: dict[str, str] = {}  # one string object per queue or schedule name
    # The hot loop of a restore (a million retained jobs): fields are read from the row, never
    # from the records, and a finished job's record is kept as the bytes it is.
    for _ in range(unpacker.read_array_header()):
        row = unpacker.unpack()
        if version == 1:
            row = _row_from_v1(row)
        job_id, status, finished_ms, queue, schedule, record = row
        status = STATUS[status]  # also rejects an unknown status (KeyError)
        if status in j.FINAL:
            queue = names.setdefault(queue, queue)
            schedule = None if schedule is None else names.setdefault(schedule, schedule)
            jobs[job_id] = FrozenJob(job_id, status, finished_ms, queue, schedule, record)
            group = finished.get((status, queue))
            if group is None:
                group = finished[(status, queue)] = [[], 0]
            group[0].append((finished_ms, job_id))
            group[1] += FROZEN_JOB_BYTES + len(record)
        else:
            job = jobs[job_id] = job_from_list(msgpack.unpackb(record, raw=False))
            active.append(job)
        count_by_status[status] += 1
    # Keys and request ids (most of a busy state) are streamed too, one entry at a time: the
    # entry's strings and bytes become the table's own, and no list of lists of all of them
    # exists beside the tables (an install on a running follower already holds two states).
    for _ in range(unpacker.read_array_header()):
        key, job_id, created_ms, long = unpacker.unpack()
        table.keys[key] = (job_id, created_ms, long)
        table.key_bytes += key_bytes(key)
    schedules, pending, workflows = (unpacker.unpack() for _ in range(3))
    state.requests = RequestLog.from_list(
        (unpacker.unpack() for _ in range(unpacker.read_array_header())), packed=version >= 2)
    event_log, counters, leader = (unpacker.unpack() for _ in range(3))
    sections = unpacker.unpack() if version >= 3 else {}
    if unpacker.tell() != len(blob):
        raise ValueError("a snapshot has bytes after its last field")
    unknown = sorted(set(sections) - _SECTIONS)
    if unknown:
        raise ValueError(f"the snapshot has sections this release does not know: {unknown}")
    # Rebuild the indexes in canonical orders: active jobs by id, then finished ones in finish
    # order (retention's order); creation order for keys. Held jobs go back where they were.
    held = set(sections.get("held", ()))
    rate_held = set(sections.get("rate_held", ()))
    table.now_ms = state.now_ms
    fair = sections.get("fair", {})
    for name in fair:
        table.ready[name] = FairQueue()
    for job in active:
        table.place_restored(job, held=job.id in held, rate_held=job.id in rate_held)
    for name, turns in fair.items():
        line = table.ready[name]
        assert isinstance(line, FairQueue)
        line.restore_turns(turns)
    table.rates.restore_windows(sections.get("rate_windows", ()))
    frozen_by_queue: dict[str, int] = {}
    for (status, queue), (places, size) in finished.items():
        places.sort()
        frozen_by_queue[queue] = frozen_by_queue.get(queue, 0) + size
        status_index = table.by_status.get(status)  # succeeded has none
        if status_index is not None:
            status_index.update(dict.fromkeys(job_id for _, job_id in places))
    table.recount_restored(active, frozen_by_queue)
    table.finished.restored({where: group[0] for where, group in finished.items()})
    for created_ms, key in sorted((entry[1], key) for key, entry in table.keys.items()):
        (table.fire_key_order if table.keys[key][2] else table.key_order).append((created_ms, key))
    specs: dict[bytes, ScheduleSpec] = {}
    for item in schedules:
        schedule = schedule_restore(item[:-1], specs)
        schedule.active.update(dict.fromkeys(item[-1]))
        state.schedules[schedule.name] = schedule
        state.schedules_bytes += schedule_bytes(schedule.spec_bytes)
        if schedule.next_fire_ms is not None and not schedule.paused:
            state.schedule_heap.append((schedule.next_fire_ms, schedule.name))
    heapq.heapify(state.schedule_heap)
    state.pending_schedules.update(dict.fromkeys(pending))
    for item in workflows:
        workflow = _workflow_from_list(item)
        state.workflows[workflow.id] = workflow
        for job_id in workflow.job_ids.values():
            if job_id in jobs:
                state.workflow_of[job_id] = workflow.id
        state.workflows_bytes += WORKFLOW_BYTES + WORKFLOW_NODE_BYTES * len(workflow.job_ids)
    for job in active:  # each workflow's unfinished jobs, counted (scheduler/upstream.py)
        running = None if job.workflow_id is None else state.workflows.get(job.workflow_id)
        if running is not None:
            running.unfinished += 1
    state.events = EventLog.from_list(event_log)
    state.counters = counters
    state.leader = None if leader is None else (leader[0], leader[1])
    for name, *control in sections.get("queues", ()):
        state.queues[name] = QueueControl.from_list(control)
    table.keyed_seen = bool(sections.get("keyed", False))
    if "notifications" in sections:
        state.notifications = Notifications.from_list(sections["notifications"])
    gate_section = sections.get("settings")
    if (gate_section is not None) != (version >= 4):
        raise ValueError(f"a snapshot of version {version} "
                         + ("has no" if version >= 4 else "has a") + " settings section")
    if gate_section is not None:
        state.level = gate_section["level"]
        table.compact_records = True
        state.settings = Settings.parse(gate_section["settings"])
        state.keys_forgotten_ms = gate_section["keys_forgotten_ms"]
        state.retention_pending = gate_section["retention_pending"]
        state.archive_ledger = ArchiveLedger.from_list(gate_section["archive_ledger"])
    return state


class _Chunks:
    """The blob as a file-like object for msgpack's Unpacker, which then holds one chunk of it
    at a time rather than a copy of all of it."""

    def __init__(self, blob: bytes | bytearray) -> None:
        self._view = memoryview(blob)
        self._at = 0

    def read(self, size: int) -> bytes:
        chunk = self._view[self._at : self._at + size]
        self._at += len(chunk)
        return bytes(chunk)


def digest(state: SchedulerState) -> str:
    """A short fingerprint of the whole state: equal on replicas that agree."""
    return hashlib.sha256(snapshot(state)).hexdigest()[:32]


def _row_from_v1(fields: list[Any]) -> list[Any]:
    """Version 1 wrote a job as its list of fields: the record a version 2 row packs."""
    return row(job_from_list(fields))


def _workflow_to_list(workflow: Workflow) -> list[Any]:
    return [
        workflow.id,
        workflow.created_ms,
        workflow.key,
        workflow.schedule,
        workflow.fire_time_ms,
        list(workflow.job_ids.items()),
        workflow.remaining,
    ]


def _workflow_from_list(item: list[Any]) -> Workflow:
    workflow_id, created_ms, key, schedule, fire_time_ms, job_ids, remaining = item
    workflow = Workflow(workflow_id, created_ms)
    workflow.key = key
    workflow.schedule = schedule
    workflow.fire_time_ms = fire_time_ms
    workflow.job_ids = {name: job_id for name, job_id in job_ids}
    workflow.remaining = remaining
    return workflow
