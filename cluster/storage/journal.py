"""PySyncObj's journal interface over `RaftLog`, and the log's agreement with the snapshot.

PySyncObj sees its log as a list of ``(command, index, term)`` tuples (``journal[0]``,
``journal[-1]``, slices) and mutates it with ``add``, ``clear``, ``deleteEntriesFrom`` and
``deleteEntriesTo`` (positions in that list). `StorageJournal` translates those to raft
indexes on the log; slices are `LogView`s that read commands only when asked for (PySyncObj
slices "from here to the end" to take a 64 KiB batch), and pickle as plain lists.

`reconcile` runs once at start, before PySyncObj reads anything, and applies Raft's rule for a
snapshot (InstallSnapshot, step 6): when the log holds the snapshot's last entry with the same
term, the entries after it stay; otherwise the log is exactly the snapshot's two entries. Any
other combination is damage: a log that starts past index 1 with no snapshot, a gap between the
snapshot and the log, a commit index past the log's end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Protocol

from raftcron.cluster.storage.raftlog import LogDamaged, RaftLog
from raftcron.cluster.storage.snapshots import LogEntry, Snapshot


class JournalOwner(Protocol):
    """What the journal needs of the storage that builds it (`storage.node.RaftStorage`),
    written out so that this module does not import it."""

    log: RaftLog

    @property
    def learner(self) -> bool: ...

    def sync(self) -> bool: ...

    def sync_async(self) -> bool: ...

    def close(self) -> None: ...


class LogView:
    """Positions [start, stop) of the journal, read on demand."""

    def __init__(self, log: RaftLog, start: int, stop: int) -> None:
        self.log, self.start, self.stop = log, start, max(start, stop)

    def __len__(self) -> int:
        return self.stop - self.start

    def __bool__(self) -> bool:
        return self.stop > self.start

    def __getitem__(self, item: int | slice) -> Any:
        if isinstance(item, slice):
            start, stop, step = item.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return LogView(self.log, self.start + start, self.start + stop)
        position = item + len(self) if item < 0 else item
        if not 0 <= position < len(self):
            raise IndexError(item)
        return _entry_at(self.log, self.start + position)

    def __iter__(self) -> Iterator[LogEntry]:
        for position in range(self.start, self.stop):
            yield _entry_at(self.log, position)

    def __reversed__(self) -> Iterator[LogEntry]:
        for position in range(self.stop - 1, self.start - 1, -1):
            yield _entry_at(self.log, position)

    def __reduce__(self) -> tuple[type[list[Any]], tuple[list[LogEntry]]]:
        return list, (list(self),)  # an append_entries message carries a plain list

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, LogView | list) else False

    __hash__ = None  # type: ignore[assignment]


def _entry_at(log: RaftLog, position: int) -> LogEntry:
    index = log.first_index + position
    return log.command_at(index), index, log.term_at(index)


LEARNER_VOTE = "(rejoining: no vote until caught up)"


class StorageJournal:
    """What PySyncObj calls its journal (``pysyncobj.journal.Journal``)."""

    def __init__(self, storage: JournalOwner) -> None:
        self.storage = storage
        self.log = storage.log
        self.node: Any = None  # the SyncObj, once it ticks (hooks): for the learner's vote

    def add(self, command: bytes, idx: int, term: int) -> None:
        self.log.append(idx, term, command)

    def clear(self) -> None:
        self.log.reset()

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        self.log.truncate_from(self.log.first_index + entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:
        self.log.compact_to(self.log.first_index + entryTo)

    def __getitem__(self, item: int | slice) -> Any:
        return LogView(self.log, 0, len(self.log))[item]

    def __len__(self) -> int:
        return len(self.log)

    def _destroy(self) -> None:
        self.storage.close()

    def flush(self) -> None:
        self.log.sync()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self.log.set_commit(raftCommitIndex)

    def getRaftCommitIndex(self) -> int:
        return max(1, self.log.commit_index)

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        self.log.set_hard_state(term, votedForNodeId)
        if self.storage.learner and votedForNodeId is None and self.node is not None:
            # PySyncObj grants a vote when votedFor is None right after a new term clears it;
            # a learner's is never None in memory (never written: the disk says None).
            self.node._SyncObj__votedForNodeId = LEARNER_VOTE

    def getCurrentTerm(self) -> int:
        return self.log.term

    def getVotedForNodeId(self) -> str | None:
        return self.log.voted_for

    def onOneSecondTimer(self) -> None:
        # The commit index, when nothing else wrote it; never waiting on the disk here (a
        # follower's Raft thread must keep reading while its disk stalls: storage.syncworker).
        self.storage.sync_async()

    def reset_to(self, prev: LogEntry, last: LogEntry) -> None:
        """The log becomes exactly a snapshot's two entries (one batch: atomic)."""
        self.log.reset()
        self.log.append(prev[1], prev[2], prev[0])
        self.log.append(last[1], last[2], last[0])

    def starts_with(self, prev: LogEntry, last: LogEntry) -> bool:
        return (len(self.log) >= 2 and self.log.first_index == prev[1]
                and self.log.term_at(prev[1]) == prev[2] and self.log.term_at(last[1]) == last[2])


def disagreement(log: RaftLog, snapshot: Snapshot | None, snapshot_path: str) -> LogDamaged | None:
    """What makes this log and this snapshot unusable together, if anything."""
    where = os.path.join(log.directory, "log")
    commit_index = log.commit_index
    if snapshot is None:
        if len(log) and log.first_index > 1:
            return LogDamaged(snapshot_path, f"is missing, and the log starts at index "
                                             f"{log.first_index}: the entries before it are lost")
        last_index = log.last_index
    else:
        if len(log) and log.first_index > snapshot.index + 1:
            return LogDamaged(where, f"starts at index {log.first_index}, after the snapshot's "
                                     f"index {snapshot.index}: the entries between are lost")
        last_index = log.last_index if _holds(log, snapshot) else snapshot.index
        commit_index = max(commit_index, snapshot.index)
    if len(log) and commit_index > last_index:
        return LogDamaged(where, f"says entries up to {commit_index} are committed, but it ends "
                                 f"at {last_index}")
    return None


def _holds(log: RaftLog, snapshot: Snapshot) -> bool:
    """Whether the log holds the snapshot's last entry (same index, same term)."""
    return bool(len(log)) and log.first_index <= snapshot.index <= log.last_index and \
        log.term_at(snapshot.index) == snapshot.term


def reconcile(log: RaftLog, snapshot: Snapshot | None, snapshot_path: str) -> None:
    """Make the log agree with the snapshot, or raise LogDamaged (see the module docstring)."""
    problem = disagreement(log, snapshot, snapshot_path)
    if problem is not None:
        raise problem
    if snapshot is not None:
        index = snapshot.index
        if _holds(log, snapshot) and log.first_index <= index - 1:
            log.compact_to(index - 1)
        else:
            kept = [(i, log.term_at(i), log.command_at(i))
                    for i in range(index + 1, log.last_index + 1)] if _holds(log, snapshot) else []
            log.reset()
            log.append(snapshot.prev[1], snapshot.prev[2], snapshot.prev[0])
            log.append(index, snapshot.term, snapshot.last[0])
            for entry_index, entry_term, command in kept:
                log.append(entry_index, entry_term, command)
        log.set_commit(max(log.commit_index, index))
    log.sync()
