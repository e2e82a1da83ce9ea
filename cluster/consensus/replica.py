"""The replicated store: the core's state machine inside a PySyncObj node.

`StateMachine` is a `SyncObjConsumer` with ONE replicated method, `apply(payload)`, where the
payload is a batch of encoded commands (many client requests coalesced into one log entry).
It never raises: a command that does not decode is answered with a rejection like any other,
and an unexpected exception is a bug, so the node logs it and exits rather than let PySyncObj
retry the entry forever (which wedges the cluster) or let replicas diverge.

Snapshots carry the core's msgpack snapshot, never a pickle of our objects. A node keeps its
log and snapshots in raftcron's own storage (`cluster.storage`: checksummed, fsynced, written
by a forked child that never outlives the node), which asks `snapshot_bytes` and
`load_snapshot`. PySyncObj's own files (`_serialize` hands it a placeholder whose pickling
computes the same bytes) remain only for simulations that compare against the library.

The shell reads the state through one seam, `read(query)`: a pure query (`scheduler.views`)
run under `lock`, which the Raft thread holds while applying (PySyncObj mutates the state on
its own thread, and an unlocked reader can see a dict change size mid-walk). Queries return
plain data, so nothing outside this module holds the lock or a live record.

A snapshot install (from the leader, or a restart's load) lets go of the state it replaces
before it builds the new one: two whole states side by side were the install's peak, and the
allocator kept that high-water mark (a follower's memory rose in steps at its installs). In
between there is no state: `read` raises `StateUnavailable` (the API answers 503, retry),
never an empty or half-built state; an install that fails leaves it so (the node stops).

Beside the core's state the replica keeps the member book (`cluster.membership.book`): its
commands travel in the same entries (tags from 1001, which the core does not know), its record
goes into the storage's snapshot under its own key, and once it holds anything the audit
digest covers it too (replicas must agree on their members as on their jobs).
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import logging
import os
import threading
import weakref
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import msgpack
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated

from raftcron.cluster.archive.node import NodeArchive, open_archive
from raftcron.cluster.archive.writer import ArchiveWriter
from raftcron.cluster.config import NodeConfig
from raftcron.cluster.consensus import leaderloss, prevote, raftguard, raftpatch
from raftcron.cluster.membership import book as member_book
from raftcron.cluster.membership import directory
from raftcron.cluster.storage.node import RaftStorage
from raftcron.scheduler import codec
from raftcron.scheduler.commands import Barrier, Command
from raftcron.scheduler.errors import Invalid, Rejected, Result
from raftcron.scheduler.snapshot import digest, restore, snapshot, snapshot_pieces
from raftcron.scheduler.state import SchedulerState

log = logging.getLogger("raftcron.replica")

BATCH_COMMANDS_MAX = 4_096  # a payload with more frames is refused whole (none are applied)
AUDIT_PREFIX = "audit:"  # a Barrier with this request_id prefix is an audit checkpoint
AUDITS_KEPT = 64
EXIT_BUG = 70  # EX_SOFTWARE: a bug in apply; the supervisor restarts, the log says why

T = TypeVar("T")


class StateUnavailable(Exception):
    """No state to read: a snapshot is being installed in place of the one this node had (or
    failed to be, and the node is stopping). Answered 503: retry shortly."""


class _SnapshotOnPickle:
    """Pickles as the msgpack snapshot bytes, computed when (and where) pickling happens."""

    def __init__(self, state: SchedulerState) -> None:
        self.state = state

    def __reduce__(self) -> tuple[type[bytes], tuple[bytes]]:
        with gc_paused():
            return bytes, (snapshot(self.state),)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Build or walk millions of objects without the cyclic GC re-scanning them (3x faster)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim from the process's own C library; None under another one."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Give the C allocator's free pages back to the OS once a snapshot install is done (the
    pages the replaced state and the restore's garbage left free); otherwise a node keeps what
    it ever held. Measured on an 89 MiB state restored after another one's garbage, then
    installed four times: 252 MiB resident with, 325 MiB without."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def encode_batch(frames: list[bytes]) -> bytes:
    packed: bytes = msgpack.packb(frames, use_bin_type=True)
    return packed


def decode_batch(payload: object) -> list[bytes] | Rejected:
    if not isinstance(payload, bytes):
        return Rejected("invalid", "log entry is not bytes", "payload")
    try:
        frames = msgpack.unpackb(payload, raw=False)
    except Exception as error:  # any garbage: msgpack raises several types
        return Rejected("invalid", f"log entry is not msgpack ({type(error).__name__})", "payload")
    if not isinstance(frames, list) or len(frames) > BATCH_COMMANDS_MAX:
        return Rejected("invalid", "log entry is not a list of commands", "payload")
    if not all(isinstance(frame, bytes) for frame in frames):
        return Rejected("invalid", "log entry holds a command that is not bytes", "payload")
    return frames


class StateMachine(SyncObjConsumer):  # type: ignore[misc]
    def __init__(self, on_applied: Callable[[SchedulerState], None] | None = None) -> None:
        # Attributes set before SyncObjConsumer.__init__ are not replicated state.
        self.lock = threading.Lock()
        self.on_applied = on_applied
        # Audit checkpoints: every replica digests its state at the same log position.
        self.audits: dict[str, tuple[int, str]] = {}
        # Commands this node proposed, by their bytes, until applied or given up (`expect`).
        self._proposed: dict[bytes, tuple[Command, int | None]] = {}
        # Takes the jobs each entry removed from the state, to archive them (`attach_archive`).
        self.archive: ArchiveWriter | None = None
        super().__init__()
        # None only while a snapshot install replaces it (`_deserialize`).
        self._state: SchedulerState | None = SchedulerState()
        # The replaced state's tombstones, for `_purged` while there is no state.
        self._tombstones_between: dict[int, int] = {}
        self.members = member_book.MemberBook()  # immutable: replaced whole by each change

    @property
    def state(self) -> SchedulerState:
        """The state, for the Raft thread (which alone replaces it) and under `lock`."""
        state = self._state
        if state is None:
            raise StateUnavailable("this node's state is being replaced by a snapshot")
        return state

    @state.setter
    def state(self, state: SchedulerState) -> None:
        self._state = state

    @replicated  # type: ignore[untyped-decorator]
    def apply(self, payload: bytes) -> list[Result] | Rejected:
        """Apply a batch of encoded commands in order; one result per command."""
        try:
            frames = decode_batch(payload)
            if isinstance(frames, Rejected):
                return frames
            results: list[Result] = []
            with self.lock:
                state = self.state  # none during an install that failed: a bug, below
                for frame in frames:
                    own = self._proposed.pop(frame, None) if self._proposed else None
                    if own is not None:
                        command, fingerprint = own
                    else:
                        try:
                            command, fingerprint = codec.decode_request(frame)
                        except Invalid as error:
                            results.append(self._apply_member_frame(frame, error))
                            continue
                    results.append(state.apply(command, fingerprint))
                    if isinstance(command, Barrier) and (command.request_id or "").startswith(
                        AUDIT_PREFIX
                    ):
                        self._record_audit(command.request_id or "")
                leaving = state.leaving
                ledger = state.archive_ledger
                purging = ledger.purging
                if (leaving or purging) and self.archive is not None:
                    # Under the lock: a reader finds each job in the state or the hand-over.
                    state.leaving = []
                    ledger.purging = []
                    self.archive.put(self._applying_index(), leaving or (), purging or ())
            if self.archive is not None:
                self.archive.set_floor(state.archive_ledger.floor)
                self.archive.set_attributes(state.settings.search_attributes.paths,
                                            self._applying_index())
                if leaving or purging:  # outside the lock: the archive's disk sets the pace
                    self.archive.wait_for_room()
            if self.on_applied is not None:
                self.on_applied(state)
            return results
        except BaseException:
            # Never let PySyncObj see an exception: it would re-apply this entry forever.
            log.critical("bug while applying a log entry; stopping the node", exc_info=True)
            logging.shutdown()
            os._exit(EXIT_BUG)

    def expect(self, frame: bytes, command: Command, fingerprint: int | None) -> None:
        """`frame` is `command` proposed by this node (`codec.encode_request`): its apply here
        takes the command as it is instead of decoding it again. On a leader taking batches of
        1,000 jobs the decode was 15% of its time (the API had parsed every job already); the
        other replicas decode, and reach the same state (the model test holds decode(encode(c))
        equal to c for every command it makes)."""
        self._proposed[frame] = (command, fingerprint)

    def forget(self, frames: list[bytes]) -> None:
        """The proposals of `frames` are answered or given up: not expected any more."""
        for frame in frames:
            self._proposed.pop(frame, None)

    def _apply_member_frame(self, frame: bytes, core_error: Invalid) -> Result:
        """A frame the core does not know: a member book command, or an invalid one."""
        try:
            command = member_book.decode(frame)
        except Invalid as error:
            return Rejected.from_invalid(error)
        if command is None:
            return Rejected.from_invalid(core_error)
        self.members, result = self.members.apply(command)
        return result

    def read(self, query: Callable[[SchedulerState], T]) -> T:
        """The answer of a pure query of the state, run between two applied entries;
        `StateUnavailable` while a snapshot install replaces the state."""
        with self.lock:
            return query(self.state)

    @property
    def clock_started(self) -> bool:
        """Read without the lock: one attribute, for health checks that must not wait out a
        long apply (a stale answer is at most one entry old); False during an install."""
        state = self._state
        return state is not None and bool(state.clock_started)

    def audit(self, audit_id: str) -> tuple[int, str] | None:
        """(log index, digest) of an audit checkpoint applied here, or None."""
        with self.lock:
            return self.audits.get(audit_id)

    def attach_archive(self, archive: ArchiveWriter) -> None:
        """From now on every job an entry removes is handed to `archive` (before any entry is
        applied: the node attaches it before PySyncObj starts)."""
        self.archive = archive
        self.state.leaving = []
        self.state.archive_ledger.purging = []
        # A fill from a peer never writes a purged job's row (cluster/archive/writer.py).
        archive.purged = self._purged

    def _purged(self, job_id: int) -> bool:
        """Read without the lock (the archive's thread). During an install, by the replaced
        state's tombstones, as before it let go of them; the archive deletes the new state's
        rows once it is in place (`ArchiveWriter.restored`)."""
        state = self._state
        tombstones = self._tombstones_between if state is None else state.archive_ledger.tombstones
        return job_id in tombstones

    def _applying_index(self) -> int:
        """The log index of the entry being applied (PySyncObj counts it applied after)."""
        return int(getattr(self._syncObj, "raftLastApplied", 0)) + 1

    def _record_audit(self, audit_id: str) -> None:
        index = self._applying_index()
        self.audits[audit_id] = (index, self.digest())
        while len(self.audits) > AUDITS_KEPT:
            del self.audits[next(iter(self.audits))]

    def digest(self) -> str:
        """The state's digest; once the member book holds anything, of both (call under
        `lock`, or on the Raft thread)."""
        core = digest(self.state)
        if not self.members.recorded and self.members.change is None:
            return core  # as before membership existed: comparable with a backup's digest
        book = msgpack.packb(self.members.to_wire(), use_bin_type=True)
        return hashlib.sha256(core.encode() + book).hexdigest()[:32]

    def snapshot_members(self) -> Any:
        """The member book as the snapshot keeps it (read in the snapshot writer)."""
        return self.members.to_wire()

    def load_members(self, data: Any) -> None:
        self.members = member_book.MemberBook.from_wire(data)

    def snapshot_bytes(self) -> bytes:
        """The core's snapshot (called in the snapshot writer: a fork, or inline)."""
        with gc_paused():
            return snapshot(self.state)

    def snapshot_pieces(self) -> Iterator[bytes | memoryview]:
        """The core's snapshot in pieces, which the writer compresses as they come
        (cluster/storage/compress.py); the cyclic GC paused while they are made."""
        with gc_paused():
            yield from snapshot_pieces(self.state)

    def load_snapshot(self, blob: bytes | bytearray) -> None:
        self._deserialize({"snapshot": blob})

    def _serialize(self) -> dict[str, Any]:
        return {"snapshot": _SnapshotOnPickle(self.state)}

    def _deserialize(self, data: dict[str, Any]) -> None:
        """Replace the state by a snapshot's, on the Raft thread: the old one let go of first
        (readers meanwhile get `StateUnavailable`), then the new one built; if that fails, there
        stays no state to read (the storage stops the node: cluster/storage/hooks.py)."""
        blob = data.get("snapshot")
        if not isinstance(blob, bytes | bytearray):
            raise ValueError("full dump holds no raftcron snapshot")
        self._release_state()
        with gc_paused():
            state = restore(blob)
        state.leaving = [] if self.archive is not None else None
        if self.archive is not None:  # jobs the snapshot's entries removed (or purged) here?
            ledger = state.archive_ledger
            ledger.purging = []
            self.archive.restored(ledger.next_seq, ledger.floor, list(ledger.tombstones))
            self.archive.set_floor(state.archive_ledger.floor)
        with self.lock:
            self._state = state
        self._tombstones_between = {}
        # The restored records are long-lived: keep them out of every future GC pass (taken
        # out again at the next install: `_release_state`). Then the pages the old state and
        # the restore's own garbage left free go back to the OS.
        gc.freeze()
        release_freed_memory()
        log.info("restored snapshot: %d jobs, now_ms=%d", len(state.table), state.now_ms)

    def _release_state(self) -> None:
        """Let go of the state (the Raft thread's and the readers' last references to it), so
        that the new one is built in the memory it held."""
        with self.lock:  # a reader inside a query finishes it first
            old, self._state = self._state, None
        if old is None:
            return  # an earlier install failed here: the storage is stopping the node
        self._tombstones_between = old.archive_ledger.tombstones
        gone = weakref.ref(old)
        del old  # freed by reference counting: the core keeps no cycle (test_core_determinism)
        # What the last install froze and has since become cyclic garbage (a request in
        # flight then, say) would stay frozen for good: unfrozen and collected, while no
        # state is there to be walked.
        gc.unfreeze()
        gc.collect()
        if gone() is not None:
            log.warning("the state replaced by a snapshot is still referenced: it stays in "
                        "memory beside the new one", extra={"action": "state_not_released"})


DNS_CACHE_S = 5.0
DNS_FAIL_CACHE_S = 2.0


def sync_conf(
    config: NodeConfig,
    *,
    on_state_changed: Callable[[int, int], None] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> SyncObjConf:
    """PySyncObj's settings; `RaftNode` puts its storage in (journalFile, fullDumpFile)."""
    tuning = config.raft
    return SyncObjConf(
        password=config.cluster_password,
        bindAddress=config.raft_address,
        # PySyncObj's batching waits for the next append period (~100 ms per sync command);
        # we coalesce client commands ourselves and want each entry sent at once.
        appendEntriesUseBatch=tuning.append_entries_batching,
        appendEntriesPeriod=tuning.heartbeat_s,
        raftMinTimeout=tuning.election_timeout_min_s,
        raftMaxTimeout=tuning.election_timeout_max_s,
        leaderFallbackTimeout=tuning.leader_fallback_s,
        connectionTimeout=tuning.connection_timeout_s,
        connectionRetryTime=tuning.connection_retry_s,
        logCompactionMinEntries=tuning.compaction_min_entries,
        logCompactionMinTime=compaction_time_s(config),
        commandsWaitLeader=False,  # fail fast without a leader: the proposer retries
        autoTickPeriod=0.01,
        onStateChanged=on_state_changed,
        onReady=on_ready,
        # PySyncObj's single-server changes, with our guards (cluster/membership/raftconfig).
        dynamicMembershipChange=True,
        # A peer's name is resolved at each connection attempt, through a cache. PySyncObj
        # keeps an answer 600 s and a failure 30 s: a Kubernetes pod deleted and started
        # again has a new address under the same name, and its peers (which dial the lower
        # address) dialled the old one for 10 minutes; at a first start, a name not yet
        # published held the election back 30 s. A lookup is made only while disconnected.
        dnsCacheTime=DNS_CACHE_S,
        dnsFailCacheTime=DNS_FAIL_CACHE_S,
    )


def compaction_time_s(config: NodeConfig) -> float:
    """`[raft] compaction_min_time_s`, stretched by up to 20% by a hash of the node's id: the
    members of a cluster started together otherwise snapshot at the same moment every period,
    and three forked writers at once starve a small machine (a soak's claim p99 went from
    ~80 to 213 ms at the 600 s mark). The stagger persists: each waits from its own last."""
    spread = zlib.crc32(config.node_id.encode()) % 1_000 / 5_000
    return config.raft.compaction_min_time_s * (1 + spread)


EXIT_STORAGE = 65  # EX_DATAERR: the data dir cannot be used as it is; the log says why


def transfer_to_first(sync: SyncObj, targets: Sequence[object]) -> bool:
    """Leadership to the first target PySyncObj accepts (caught up, connected); False: none."""
    answers: list[object] = []  # PySyncObj calls back at once, before it returns
    for target in targets:
        answers.clear()
        sync.transferLeadership(target, callback=lambda _result, error: answers.append(error))
        if answers and answers[0] == FAIL_REASON.SUCCESS:
            return True
    return False


def _exit_on_storage_failure(message: str) -> None:
    """A snapshot that does not load, found on the Raft thread: stop before acting on it."""
    logging.shutdown()
    os._exit(EXIT_STORAGE)


class RaftNode:
    """A PySyncObj node carrying a `StateMachine`, with the read accessors the shell needs."""

    def __init__(
        self,
        config: NodeConfig,
        conf: SyncObjConf,
        on_applied: Callable[[SchedulerState], None] | None = None,
        *,
        rejoin_empty: bool = False,
    ) -> None:
        raftpatch.install()  # must precede SyncObj(): the message handler is bound in __init__
        self.config = config
        self.machine = StateMachine(on_applied)
        self.storage = RaftStorage(
            config.data_dir,
            node_id=config.node_id,
            source=self.machine,
            durability=config.storage.durability,
            on_fatal=_exit_on_storage_failure,
            rejoin_empty=rejoin_empty,
            cluster_name=config.cluster_name,
        )
        # Before the Raft thread starts: a joining node must never vote as if it were a member.
        self.storage.configured_voters = [
            m.raft_address for m in directory.initial_members(config)]
        storage = self.storage
        storage.voters_recorded = lambda: self.machine.members.recorded or bool(
            storage.log.config_indexes)
        self.storage.slow_syncs.bound_s = config.raft.election_timeout_min_s
        self.storage.may_vote = self.is_voter
        self.storage.may_lead = self.may_lead
        self.archive: NodeArchive | None = None
        if config.storage.archive:
            self.archive = open_archive(config, self.storage)
            self.machine.attach_archive(self.archive.writer)
        conf.journalFile = conf.fullDumpFile = self.storage
        others = [peer.raft_address for peer in config.peers]
        try:
            self.sync = SyncObj(
                config.raft_address,
                others,
                conf=conf,
                consumers=[self.machine],
                transportClass=raftguard.GuardedTransport,
            )
        except BaseException:
            if self.archive is not None:
                self.archive.close()
            self.storage.close()
            raise
        self._raft_thread_calls: deque[Callable[[], None]] = deque()
        self._wrap_tick()
        # PreVote only once every member answers it (cluster/consensus/prevote.py; DESIGN.md §9.0).
        self.prevote = prevote.attach(self.sync, enabled=lambda: self.machine.state.finalized,
                                      learner=lambda: storage.learner)
        self.sync._raftcron_config_gate = self._config_gate
        self.storage.compaction_max_bytes = config.raft.compaction_max_bytes
        self.storage.request_compaction = self.sync.forceLogCompaction

    # -- membership (cluster/membership) --------------------------------------------------

    def members(self) -> tuple[member_book.Member, ...]:
        return directory.current_members(self.config, self.machine.members)

    def peer_addresses(self) -> list[tuple[str, str]]:
        """The other members' (node id, HTTP address), as the membership now says."""
        return [(m.node_id, m.http_address) for m in self.members()
                if m.node_id != self.config.node_id]

    def is_member(self) -> bool:
        """A member as the member book says (the configs before the first change)."""
        return directory.is_member(self.config, self.machine.members)

    def is_voter(self) -> bool:
        """In the Raft configuration this node's own snapshot and log hold (committed or not,
        as Raft's single-server changes count): not yet, for a joining node until the entry
        adding it reaches it; not any more, for a removed one that got its removal. A node
        that is not neither votes nor stands for election (the storage hooks)."""
        return self.config.raft_address in self.storage.voters()

    def may_lead(self) -> bool:
        """False while this node's own removal is in progress: it hands leadership over."""
        return not directory.being_removed(self.config, self.machine.members)

    def _config_gate(self, kind: str, address: str) -> bool:
        """On the Raft thread, before a configuration entry is appended: only the change in
        progress, uncancelled (cluster/membership/raftconfig.py says why)."""
        change = self.machine.members.change
        if change is None or change.cancel_reason:
            return False
        wanted = ("add" if change.action == "add" else "rem", change.member.raft_address)
        return (kind, address) == wanted

    def on_raft_thread(self, call: Callable[[], None]) -> None:
        """Run `call` on the Raft thread, before its next tick."""
        self._raft_thread_calls.append(call)

    def _wrap_tick(self) -> None:
        """Run queued calls on the Raft thread, before its next tick: PySyncObj's state and
        transport are not safe to touch from another thread."""
        tick = self.sync._onTick
        calls = self._raft_thread_calls
        links = leaderloss.LinkKeeper(self.config.raft.connection_timeout_s / 4)
        sync = self.sync

        def on_tick(*args: Any, **kwargs: Any) -> Any:
            while calls:
                calls.popleft()()
            links.tick(sync)
            return tick(*args, **kwargs)

        self.sync._onTick = on_tick  # an instance attribute: the tick thread calls self._onTick

    def step_down(self, candidates: list[str]) -> None:
        """Hand leadership to the first of `candidates` (node ids) that is caught up (Raft
        TimeoutNow), on the Raft thread; a no-op when this node no longer leads or none is
        caught up (the ticker asks again at its next step)."""
        addresses = {node_id: address for address, node_id in self.raft_ids.items()}
        targets = [addresses[node_id] for node_id in candidates if node_id in addresses]

        def transfer() -> None:
            transfer_to_first(self.sync, targets)

        self._raft_thread_calls.append(transfer)

    @property
    def raft_ids(self) -> dict[str, str]:
        """Raft address -> node id, following the membership."""
        return directory.raft_ids(self.config, self.machine.members)

    # PySyncObj exposes these as underscore methods; they are its documented API.
    def is_leader(self) -> bool:
        return bool(self.sync._isLeader())

    def leader_id(self) -> str | None:
        leader = self.sync._getLeader()
        return None if leader is None else self.raft_ids.get(leader.id, leader.id)

    @property
    def term(self) -> int:
        return int(self.sync.raftCurrentTerm)

    @property
    def commit_index(self) -> int:
        return int(self.sync.raftCommitIndex)

    @property
    def applied_index(self) -> int:
        return int(self.sync.raftLastApplied)

    def status(self) -> dict[str, Any]:
        return dict(self.sync.getStatus())

    def destroy(self) -> None:
        """Stop the Raft thread and wait for it: it closes the storage (a clean stop's mark,
        which tells later damage from a torn write) before the process exits."""
        self.sync.destroy_synchronous()
        if self.archive is not None:  # after the Raft thread: nothing more is handed over
            self.archive.close()
