"""Where raftcron's storage plugs into PySyncObj 0.3.17 (a reviewed patch, as `raftpatch`).

A node opts in by passing a `RaftStorage` as both ``journalFile`` and ``fullDumpFile``; nodes
built with plain file names keep the library's own storage. What the hooks do for such a node:

1. ``createJournal`` and ``Serializer`` (looked up by ``SyncObj.__init__``) return the
   storage's journal and snapshot store.
2. Durability before acting (Raft, Figure 2: "respond to RPCs only after updating stable
   storage"):
   - a follower's success ack (``__sendNextNodeIdx``) waits until the entries it covers are
     durable: acks are held and sent, in order, right after the next sync, which runs at the
     start of the next tick; so one sync covers every append of a poll round (group commit);
   - the leader counts itself toward a majority in ``_onTick``; it syncs right after
     ``_checkCommandsToApply`` appended and sent entries (so its fdatasync runs while the
     followers write theirs), and the sync at the start of every tick covers anything else;
     ``__onBecomeLeader`` syncs its no-op (a single node counts itself in the same tick);
   - term and vote are synced by the journal before PySyncObj acts on them.
3. ``__loadDumpFile`` is replaced, and runs at the first tick when the storage holds a snapshot
   (the library's own test, ``os.path.isfile``, sees only the real filesystem, not the
   storage's `Disk`): the snapshot store has already checked the file; any error loading it is
   fatal for the node (0.3.17 logged and went on with an empty state, and then
   acknowledged a failed install as a success); the log already agrees with the snapshot
   (`journal.reconcile`), so it is never cleared at start.
4. A storage that cannot write (disk full, I/O error) makes the node step down, send no acks
   and no votes, and try again each tick; it logs why (rate-limited) and recovers by itself.
5. The Raft configuration (who votes) is the storage's, not the config file's: at start and
   when a snapshot is installed, the voters are the snapshot's ``cluster`` with every change in
   the log after it (committed or not: a change takes effect when appended). PySyncObj applies
   a change when it is appended (leader and followers, undone if the entry is truncated) and
   AGAIN when it is applied; the second time is skipped here, because applying an old "add"
   after a later "remove" was appended re-adds the node (its restart replays committed entries
   after the log's newer changes were already in force).
6. A configuration change is appended only if the node's gate allows it
   (``_raftcron_config_gate``, set by `cluster.membership`: the change the replicated member
   book holds in progress, and only while the leader is not aborting it), so neither a stale
   or forwarded request nor PySyncObj's admin command can change who votes behind the book.
7. A learner neither votes nor stands for election: a node rejoining empty, and a node that is
   not a member (`RaftStorage.may_vote`: a joining node until it is added, a removed one).
   Either stops being one once its log holds every committed entry (see `_learner_step`).

Guard: `cluster.consensus.raftpatch` checks the library's source against reviewed hashes, which
cover the functions relied on here; `install()` runs with it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import pysyncobj.syncobj as syncobj_module
from pysyncobj import SyncObj
from pysyncobj.poller import POLL_EVENT_TYPE

from raftcron.cluster.storage.journal import LEARNER_VOTE, StorageJournal
from raftcron.cluster.storage.node import RaftStorage
from raftcron.cluster.storage.raftlog import (
    CONFIG_COMMAND,
    LogDamaged,
    StorageUnavailable,
    SyncFailed,
)

log = logging.getLogger("raftcron.storage")

MARKER = "__raftcron_storage_original__"
_FOLLOWER = 0


def storage_of(node: Any) -> RaftStorage | None:
    journal = getattr(node, "_SyncObj__raftLog", None)
    storage = journal.storage if isinstance(journal, StorageJournal) else None
    return storage if isinstance(storage, RaftStorage) else None


def _held_acks(node: Any) -> list[dict[str, Any]]:
    held: list[dict[str, Any]] | None = getattr(node, "_raftcron_held_acks", None)
    if held is None:
        held = []
        node._raftcron_held_acks = held
    return held


def _make_create_journal(library: Callable[..., Any]) -> Callable[..., Any]:
    def create_journal(journal_file: Any = None) -> Any:
        if isinstance(journal_file, RaftStorage):
            return journal_file.journal
        return library(journal_file)
    return create_journal


def _make_serializer(library: Any) -> Callable[..., Any]:
    def serializer(file_name: Any, *args: Any) -> Any:
        if isinstance(file_name, RaftStorage):
            return file_name.snapshots
        return library(file_name, *args)
    return serializer


def _make_send_next_node_idx(library: Callable[..., Any]) -> Callable[..., Any]:
    def send_next_node_idx(self: Any, node: Any, reset: bool = False,
                           nextNodeIdx: int | None = None, success: bool = False) -> None:
        storage = storage_of(self)
        if storage is None:
            library(self, node, reset=reset, nextNodeIdx=nextNodeIdx, success=success)
            return
        if nextNodeIdx is None:
            nextNodeIdx = self._SyncObj__raftLog[-1][1] + 1
        ack = {"node": node, "reset": reset, "nextNodeIdx": nextNodeIdx, "success": success}
        held = _held_acks(self)
        if held or (success and nextNodeIdx - 1 > storage.log.durable_through):
            held.append(ack)  # once its entries are durable, in order with earlier ones
            return
        library(self, **ack)
    return send_next_node_idx


def _make_on_tick(library: Callable[..., Any]) -> Callable[..., Any]:
    def on_tick(self: Any, timeToWait: float = 0.0) -> None:
        storage = storage_of(self)
        if storage is None:
            library(self, timeToWait)
            return
        if self._SyncObj__needLoadDumpFile:
            # The library looks for the snapshot with os.path.isfile, which only answers for
            # files on the real filesystem; the storage knows whether it holds one.
            self._SyncObj__needLoadDumpFile = False
            if storage.snapshots.current is not None:
                self._SyncObj__loadDumpFile(clearJournal=False)
        _watch_sync_worker(self, storage)
        # The leader counts itself toward a majority in this tick: its log must be durable
        # first. Anyone else writes off this thread and acks once its entries are durable.
        if not (storage.sync() if self._isLeader() else storage.sync_async()):
            _stand_down(self)
            syncobj_module.time.sleep(timeToWait)  # PySyncObj's clock: a simulation fakes it
            return
        _release_acks(self, storage)
        if self._isLeader() and storage.slow_syncs.stalling(storage.monotonic()):
            storage.slow_syncs.forget()
            _hand_over(self, "this node's disk stalls (its syncs took over "
                       f"{storage.slow_syncs.bound_s:g} s {storage.slow_syncs.STRIKES} times "
                       f"in {storage.slow_syncs.WINDOW_S:g} s)", level=logging.WARNING)
        if not getattr(self, "_raftcron_voters_restored", False):
            _restore_voters(self, storage)  # no snapshot to load: the log's changes alone
        if storage.snapshots.on_chunk is None:
            storage.snapshots.on_chunk = functools.partial(_report_chunk, self)
        if not storage.may_vote():
            storage.held_back = True
        if storage.learner:
            _learner_step(self, storage)
        elif not storage.may_lead():
            _hand_over(self)
        try:
            library(self, timeToWait)
        except LogDamaged as error:  # a record the disk cannot give back: stop, naming it
            storage.fatal(f"the log is damaged: {error}")
            raise
        except SyncFailed:
            storage.sync()  # latched: says so (rate-limited) and answers False
            _stand_down(self)
            syncobj_module.time.sleep(timeToWait)
        except StorageUnavailable as error:
            storage.failed(str(error))
            _stand_down(self)
            syncobj_module.time.sleep(timeToWait)
    return on_tick


def _release_acks(self: Any, storage: RaftStorage) -> None:
    """Send the held acks, in order, as far as the entries they claim are durable.

    A success that the next released one covers is not sent: the leader keeps only the
    highest index a follower matched (its `next_node_idx` handler raises matchIndex and
    nextIndex to the newest success), so the last of a run says all of it. One sync often
    makes several appends durable at once, and each ack is a framed, compressed and encrypted
    message on both ends."""
    held = _held_acks(self)
    durable = storage.log.durable_through
    ready = 0
    while ready < len(held) and (not held[ready]["success"]
                                 or held[ready]["nextNodeIdx"] - 1 <= durable):
        ready += 1
    if not ready:
        return
    released = held[:ready]
    del held[:ready]
    for ack, following in zip(released, [*released[1:], None], strict=True):
        if following is not None and _covers(following, ack):
            continue
        library_send(self, **ack)


def _covers(later: dict[str, Any], earlier: dict[str, Any]) -> bool:
    """Whether the leader, given `later`, ends as it would after `earlier` then `later`."""
    return (earlier["success"] and not earlier["reset"] and later["success"]
            and not later["reset"] and later["node"] == earlier["node"]
            and later["nextNodeIdx"] >= earlier["nextNodeIdx"])


def _watch_sync_worker(self: Any, storage: RaftStorage) -> None:
    """Once: the Raft thread's poller wakes it when the sync worker finished a batch, so the
    acks it held go out at once, not at the next tick."""
    worker = storage.worker
    if worker is None or getattr(self, "_raftcron_sync_watched", False):
        return
    self._raftcron_sync_watched = True

    def on_sync_done(_descr: int, _event: int) -> None:
        worker.drain()
        if self._isLeader():
            return  # the leader syncs on its own thread; the tick takes what is done
        if storage.sync_async():
            _release_acks(self, storage)
        else:
            _stand_down(self)

    self._poller.subscribe(worker.read_fd, on_sync_done, POLL_EVENT_TYPE.READ)


def _report_chunk(self: Any, received: int) -> None:
    """Tell the leader a snapshot chunk arrived. PySyncObj ignores a message type it does not
    know, but reading it keeps the leader's connection alive: without it a follower said
    nothing for the whole transfer and the leader dropped it after connection_timeout_s."""
    leader = self._SyncObj__raftLeader
    if leader is not None:
        self._SyncObj__transport.send(leader, {"type": "snapshot_progress", "received": received})


def library_send(self: Any, **ack: Any) -> None:
    original(SyncObj, "_SyncObj__sendNextNodeIdx")(self, **ack)


def _stand_down(self: Any) -> None:
    """Storage cannot write: no acks held for it, and a leader stops being one."""
    _held_acks(self).clear()
    if self._isLeader():
        self._SyncObj__setState(_FOLLOWER)
        self._SyncObj__raftLeader = None
    # Wait a whole election timeout before standing for election: a vote needs the disk too.
    self._SyncObj__raftElectionDeadline = syncobj_module.monotonicTime() + self.conf.raftMaxTimeout


def _hand_over(self: Any, why: str = "this node is being removed from the cluster", *,
               level: int = logging.INFO) -> None:
    """Stop leading and stand for no election for a while (its removal is in progress, or
    its disk stalls): the others elect a leader among them. It still votes: a two-node
    cluster removing its leader needs that vote to elect the other. A stalling disk's
    hand-over is a warning: nobody asked for that change of leader, and its log line is
    what says why it came."""
    if self._isLeader():
        log.log(level, "standing down: %s", why, extra={"action": "leader_hand_over"})
        self._SyncObj__setState(_FOLLOWER)
        self._SyncObj__raftLeader = None
    self._SyncObj__raftElectionDeadline = syncobj_module.monotonicTime() + self.conf.raftMaxTimeout


def _learner_step(self: Any, storage: RaftStorage) -> None:
    """A learner (a node that rejoined empty, or one that is not a member) stays one until it
    holds every committed entry: its commit index is an entry of the current leader's term
    (Leader Completeness: all that was committed before is at or below it) and, if it was held
    back for not being a member, it is one now. Until then it never stands for election and
    never grants a vote. Then it records a vote for that leader in this term, so a vote it may
    have cast in this term before it lost its data is never cast a second time."""
    journal: StorageJournal = self._SyncObj__raftLog
    journal.node = self
    log_ = storage.log
    term, commit, leader = self.raftCurrentTerm, self.raftCommitIndex, self._getLeader()
    if leader is not None and leader != self.selfNode and term > 0 and len(log_) and \
            log_.first_index <= commit <= log_.last_index and log_.term_at(commit) == term \
            and storage.may_vote():
        voted = log_.voted_for if log_.term == term else None
        self._SyncObj__votedForNodeId = voted or leader.id
        log_.set_hard_state(term, voted or leader.id)
        if storage.held_back:
            storage.held_back = False
            log.info("a member now, caught up with the leader: a voter",
                     extra={"action": "member_voting"})
        if storage.rejoining:
            storage.finish_rejoin()
        return
    self._SyncObj__raftElectionDeadline = syncobj_module.monotonicTime() + \
        self.conf.raftMaxTimeout
    if self._SyncObj__votedForNodeId is None:
        self._SyncObj__votedForNodeId = LEARNER_VOTE


def _make_check_commands_to_apply(library: Callable[..., Any]) -> Callable[..., Any]:
    def check_commands_to_apply(self: Any) -> None:
        """The leader appends client commands here and sends them at once; syncing right after
        (before the tick waits on the network) overlaps its fdatasync with the followers'."""
        library(self)
        storage = storage_of(self)
        if storage is not None and self._isLeader() and \
                storage.log.last_index > storage.log.durable_through and not storage.sync():
            _stand_down(self)
    return check_commands_to_apply


def _make_on_become_leader(library: Callable[..., Any]) -> Callable[..., Any]:
    def on_become_leader(self: Any) -> None:
        library(self)
        storage = storage_of(self)
        if storage is not None and not storage.sync():
            _stand_down(self)
    return on_become_leader


def _make_load_dump_file(library: Callable[..., Any]) -> Callable[..., Any]:
    def load_dump_file(self: Any, clearJournal: bool) -> None:
        storage = storage_of(self)
        if storage is None:
            library(self, clearJournal)
            return
        try:
            _data, last, prev, _cluster = self._SyncObj__serializer.deserialize()
            journal: StorageJournal = self._SyncObj__raftLog
            if clearJournal or not journal.starts_with(prev, last):
                journal.reset_to(prev, last)
            self._SyncObj__raftLastApplied = last[1]
            if self._SyncObj__raftCommitIndex < last[1]:
                self._SyncObj__raftCommitIndex = last[1]
                journal.setRaftCommitIndex(last[1])
            self._SyncObj__onSetCodeVersion(0)
        except Exception as error:
            storage.fatal(f"cannot load the snapshot {storage.snapshots.path}: "
                          f"{type(error).__name__}: {error}")
            raise
        _restore_voters(self, storage)  # at start, and after an install replaced the log
    return load_dump_file


def _restore_voters(self: Any, storage: RaftStorage) -> None:
    """Make PySyncObj's voters the ones this node's storage names (rule 5)."""
    self._raftcron_voters_restored = True
    me = self.selfNode.id if self.selfNode is not None else None
    configured = [node.id for node in self.otherNodes] + ([me] if me else [])
    if storage.configured_voters:
        configured = list(storage.configured_voters)  # the node's (without itself if joining)
    voters = storage.voters_at_start(configured)
    others = [address for address in voters if address != me]
    if sorted(others) != sorted(node.id for node in self.otherNodes):
        log.info("voters from this node's snapshot and log: %s (the config file names %s)",
                 ", ".join(voters), ", ".join(sorted(configured)),
                 extra={"action": "voters_restored", "voters": voters})
        self._SyncObj__updateClusterConfiguration(others)


def _make_change_cluster(library: Callable[..., Any]) -> Callable[..., Any]:
    def change_cluster(self: Any, request: Any) -> bool:
        gate = getattr(self, "_raftcron_config_gate", None)
        if gate is not None and not gate(str(request[0]), str(request[1])):
            log.warning("configuration change %s %s refused: not the change in progress",
                        request[0], request[1], extra={"action": "config_change_refused"})
            return False
        return bool(library(self, request))
    return change_cluster


def _make_do_apply_command(library: Callable[..., Any]) -> Callable[..., Any]:
    def do_apply_command(self: Any, command: bytes) -> Any:
        if command[:1] == CONFIG_COMMAND and storage_of(self) is not None:
            return None  # in force since it was appended (rule 5)
        return library(self, command)
    return do_apply_command


_PATCHES_OF_SYNCOBJ: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "_SyncObj__sendNextNodeIdx": _make_send_next_node_idx,
    "_onTick": _make_on_tick,
    "_SyncObj__onBecomeLeader": _make_on_become_leader,
    "_checkCommandsToApply": _make_check_commands_to_apply,
    "_SyncObj__loadDumpFile": _make_load_dump_file,
    "_SyncObj__doApplyCommand": _make_do_apply_command,
    "_SyncObj__changeCluster": _make_change_cluster,
}
_PATCHES_OF_MODULE: dict[str, Callable[[Any], Callable[..., Any]]] = {
    "createJournal": _make_create_journal,
    "Serializer": _make_serializer,
}


def original(owner: Any, name: str) -> Any:
    current = getattr(owner, name)
    return getattr(current, MARKER, current)


def is_installed() -> bool:
    return all(hasattr(getattr(SyncObj, name), MARKER) for name in _PATCHES_OF_SYNCOBJ) and \
        all(hasattr(getattr(syncobj_module, name), MARKER) for name in _PATCHES_OF_MODULE)


def install() -> None:
    """Idempotent. Called by `cluster.consensus.raftpatch.install`, after its source review."""
    targets: list[tuple[Any, dict[str, Callable[..., Any]]]] = [
        (SyncObj, _PATCHES_OF_SYNCOBJ), (syncobj_module, _PATCHES_OF_MODULE)]
    for owner, patches in targets:
        for name, make in patches.items():
            current = getattr(owner, name)
            if hasattr(current, MARKER):
                continue
            wrapper = make(current)
            setattr(wrapper, MARKER, current)
            setattr(owner, name, wrapper)


def uninstall() -> None:
    for name in _PATCHES_OF_SYNCOBJ:
        setattr(SyncObj, name, original(SyncObj, name))
    for name in _PATCHES_OF_MODULE:
        setattr(syncobj_module, name, original(syncobj_module, name))
