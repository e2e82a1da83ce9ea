"""Carried fix for PySyncObj 0.3.17: a follower never loses or commits what it cannot verify.

The bug (research: /work/shared/research/pysyncobj-truncation.md). A follower that gets an
``append_entries`` whose ``prevLogIdx`` matches deletes *every* entry after it
(``SyncObj.__onMessageReceived``, the ``if len(prevEntries) > 1`` block) instead of deleting
only from the first entry whose term conflicts (Raft, Figure 2, receiver rule 3). A stale,
duplicated or re-sent append therefore deletes entries the follower acknowledged and even
applied; if the leader then dies, acknowledged commands vanish and replicas diverge. The
leader makes such re-sends itself: a late success ack moves ``nextIndex`` backwards while later
batches are still in flight.

The rules this module adds (tests/raft shows each failing on 0.3.17 and passing here):

1. Follower, an append of the current term whose prev entry matches: entries the log already
   holds with the same term are dropped from the message, so the library deletes only from
   the first real conflict; if nothing is left, nothing is deleted and the ack claims exactly
   the last index the append verified. The commit index never passes that index: the old
   delete-everything made ``min(leaderCommit, lastLogIndex)`` safe, a kept tail is unverified.
2. Follower, an append without a log position (snapshot chunk, or ``serialized: None`` while
   the leader's serializer is busy): it verifies nothing, so it commits nothing unless it
   completes a snapshot install. 0.3.17 committed ``min(leaderCommit, lastLogIndex)`` here,
   and a deposed leader applied and acknowledged its own uncommitted entries (found by the
   simulation: chaos/sim, seeds 268 and 496).
3. Follower, a rejected append: the next-index hint never points past an uncommitted entry of
   an older term (it may conflict). 0.3.17 hinted "last + 1", so a leader pipelining batches
   got "conflict at P" then "last + 1" and re-sent the same burst forever (liveness only).
4. Leader: a success ack never moves ``nextIndex`` backwards (it is a hint; rule 1 makes the
   re-sends harmless, this makes them rarer).
5. Compaction: a compaction that completes after a snapshot install replaced the log would
   delete the whole new log (``__deleteEntriesTo(serializeID)``), wedging the node; skipped.
   Outside the reported issue, but the simulation hits it as soon as snapshots are involved.
6. Vote requests from a node that is not in this node's configuration are ignored (Raft
   thesis §4.2.3: a removed server must not disrupt the cluster). The transport keeps talking
   to nodes a configuration entry removed (cluster/consensus/raftguard.py, rule 4), so a removed
   node that never heard of its removal reaches the members: with rule 6 its ever higher terms
   depose nobody. Only ever a vote not given: safe; a new member whose entry has not reached
   this node yet is heard once it has.
7. PreVote, the leader's lease and the higher-term reply (cluster/consensus/prevote.py): a member
that
   missed heartbeats (a stalled disk, a pause) asks before it stands, and a member that
   hears a live leader ignores a vote request of a higher term.

8. Leader: an answer to an append (``next_node_idx``) from a node it replicates to no more (a
   member a configuration entry removed, a learner it dropped) is ignored. 0.3.17 read that
   node's match index and raised KeyError out of the tick (the chaos suite's members
   scenario: a tick lost on a leader now and then), or, for a reset, tracked a next index
   for it again.

How: the original functions keep doing all the work; the wrappers only rewrite their input.
The handler is bound in ``SyncObj.__init__``, so ``install()`` must run before a node is built;
that binding decides whether a node runs the fix (``runs_fix``), and rule 5 asks it too.
Guard: the wrappers rely on name-mangled internals, so ``install()`` refuses to run when the
relied-on source differs from ``REVIEWED_SOURCE_SHA256`` (an upgrade forces a new review) or
when somebody else replaced a patched function; installing twice is a no-op.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
import pysyncobj.version
from pysyncobj import SyncObj

from raftcron.cluster.consensus import leaderloss, prevote
from raftcron.cluster.storage import hooks as storage_hooks

logger = logging.getLogger(__name__)

PYSYNCOBJ_VERSION = "0.3.17"
# What PySyncObj logs (CRITICAL) when a follower drops entries it already applied: the defect
# above happening. Tests, the simulation and the chaos suite fail any run whose logs hold it.
TRUNCATION_ALARM = "truncating already-applied"

_HANDLER = "_SyncObj__onMessageReceived"
_DELETE_TO = "_SyncObj__deleteEntriesTo"
_MARKER = "__raftpatch_original__"

# sha256 of inspect.getsource() of every SyncObj function that is patched or relied on, plus
# the whole syncobj.py: an edited copy that kept the version string still forces a review.
# The per-function hashes say what to re-read.
REVIEWED_SOURCE_SHA256: dict[str, str] = {
    "__init__": "09df12cd7fd7d7270fee82c1a025acc1f3a68e98dafbad81be467947ab95cbf0",
    _HANDLER: "ddfe34b6c02821795146dc533fb7c0fcf6574a082a68a227b4c885c9e14be206",
    _DELETE_TO: "b7b29988856a66b359c875b708f9dd8a056d29436507013592f5ec307e624faa",
    "_SyncObj__sendNextNodeIdx": "68aaeefc267b8896bc1074280ac2aa014c3306d9f207949ed945569cef5d114c",
    "_SyncObj__getEntries": "e29c4b33293b21018d1124c7e5835748c4c8092f7ce4af9e86f24633ccec7e0e",
    "_SyncObj__sendAppendEntries":
        "9cb9073128c392fa9e5efc4691420ba435bfafb4c74e83a34f931fa16aa760c6",
    "_SyncObj__tryLogCompaction":
        "c2f8a0ec14cc7312e3ff41a16cde9be71ff0f908bd66aec9e2673d97a775be2c",
    "_SyncObj__loadDumpFile": "ec66e83905de703bcead2735be875e71870a6bbe271c854867611e555a90bbba",
    # Wrapped by cluster/storage/hooks.py (sync before acting, stand down when disk fails).
    "_onTick": "cc9eb08232d005ba4e21a33ec453e5d02fe3537dadebda8571406c57f65a3c37",
    "_SyncObj__onBecomeLeader":
        "5a3fd97bc17dc1cf3070b007538b6a8d46adb71f0b6523f3922dc953420645e8",
    "_checkCommandsToApply": "a386a8079361d204f2c11f895416548c432a254671a9114258921c25108a966e",
    # Wrapped by cluster/consensus/leaderloss.py (an election soon after the leader's connection
    # drops, in the same order after a connection comes back to a member connected to no one).
    leaderloss.HANDLER: "a81c0475ba2218cc4732ab756b39e64ec22e8d9f3ff5987bc34649f9a2536c95",
    leaderloss.CONNECTED: "2655afb481b4c69b9b33d827d3ea1299c54785997d0762ced03e324a7754cf70",
    # Dynamic membership (cluster/membership/raftconfig.py, storage hooks rules 5 and 6): what
    # a configuration change does when appended, applied, loaded, and the leader's gate.
    "_SyncObj__changeCluster": "66b42884f9d2dbd1d27daaf1e1aa93d97c8969705b782b4837b7741d94746da6",
    "_SyncObj__doChangeCluster":
        "247d4d4101b8cd3ce82232ec9cf69d3556c78df7e6d0002a277d38676e630350",
    "_SyncObj__updateClusterConfiguration":
        "e2de42f3d1a46c962435731d2f0de4bc899aae7d3611163a205df4ef926c7ae4",
    "_SyncObj__doApplyCommand": "1ea7aa506e950d0aecc7aa7ea750a6fc1164cbff9b208784fe4724dfe1ec91dc",
    "_SyncObj__parseChangeClusterRequest":
        "b2d5d695b12e592fd32dc956415884096f7d13cd8f7b2cf69d4b8d3c2bb0178f",
    "addNodeToCluster": "409209c3165ec2dc83dca52c2a7399084299dc5842ddc12e2a5f72581cca63b6",
    "removeNodeFromCluster": "a655f3c1f147299823a8152d7ed9e15b5812af2d264fca8dc8c667faf9566877",
    # Relied on by cluster/consensus/prevote.py (PreVote, the lease, the higher-term reply).
    "_SyncObj__generateRaftTimeout":
        "92ed37d3620e781a15680bc5af8a1983a2c265c42aef4322d403001319bbb1a7",
    "_SyncObj__connectedToAnyone":
        "acd40e9e3ac6c4cc1f4428e725fb008e06ee9bfce0240dc104fc04fa5eb1b4e5",
    "_SyncObj__setCurrentTerm": "0ad5bf456ac06bd314d2dbc8991c6b6240e63bf33aaa975620aa84a7079d5f39",
    "_SyncObj__setState": "2c1f239f7bd79b3945b63418b4f564c40c07893d3cf747af2ddd5c6a045093a8",
    "_SyncObj__getCurrentLogTerm":
        "1cb8867e6a13d3976c07506c31d71681bc4921334dda8c5958da5d91f2e939ac",
    "_SyncObj__getCurrentLogIndex":
        "e5af22ca246686bdc5fd2bd9c5e34eac491a571ca9ed3dae493a232cacbacb7a",
}
REVIEWED_SYNCOBJ_FILE_SHA256 = "e8bdf06797085d734df86e24ab4802fe87893dff77268565ec036f7ad4a1cfe4"


class RaftPatchError(RuntimeError):
    """The installed pysyncobj is not the one this fix was reviewed against."""


_lock = threading.RLock()
_suppress_depth = 0


def source_sha256(function: Callable[..., Any]) -> str:
    """Hash of a function's source text, stable across Python versions (unlike bytecode)."""
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


def original(name: str = _HANDLER) -> Callable[..., Any]:
    """The library's own function, whether or not this patch or the storage's is installed."""
    current: Callable[..., Any] = getattr(SyncObj, name)
    for marker in (_MARKER, storage_hooks.MARKER, leaderloss.MARKER):
        current = getattr(current, marker, current)
    return current


def library_mismatches() -> list[str]:
    """What differs from the reviewed library; empty when the fix applies as written."""
    problems = []
    if pysyncobj.version.VERSION != PYSYNCOBJ_VERSION:
        problems.append(f"pysyncobj {pysyncobj.version.VERSION} != reviewed {PYSYNCOBJ_VERSION}")
    for name, expected in REVIEWED_SOURCE_SHA256.items():
        if getattr(SyncObj, name, None) is None:
            problems.append(f"SyncObj.{name} is missing")
            continue
        try:
            actual = source_sha256(original(name))
        except (OSError, TypeError):
            problems.append(f"SyncObj.{name} has no readable source")
            continue
        if actual != expected:
            problems.append(f"SyncObj.{name} source sha256 {actual} != reviewed {expected}")
    with open(inspect.getfile(SyncObj), "rb") as source_file:
        file_sha256 = hashlib.sha256(source_file.read()).hexdigest()
    if file_sha256 != REVIEWED_SYNCOBJ_FILE_SHA256:
        problems.append(f"pysyncobj/syncobj.py sha256 {file_sha256} != reviewed")
    return problems


def runs_fix(node: SyncObj) -> bool:
    """Whether a node runs this fix: it bound the patched handler when it was built. Nodes
    built inside ``uninstalled()`` stay unpatched, for every rule, for their lifetime."""
    transport = getattr(node, "_SyncObj__transport", None)
    callback = getattr(transport, "_onMessageReceivedCallback", None)
    if callback is None:
        return True  # a transport that keeps its callback elsewhere: nothing says otherwise
    return hasattr(getattr(callback, "__func__", None), _MARKER)


def is_installed() -> bool:
    return all(hasattr(getattr(SyncObj, name), _MARKER) for name in _PATCHES)


def install() -> None:
    """Patch SyncObj before any node is constructed. Idempotent; refuses unknown code."""
    with _lock:
        if _suppress_depth or is_installed():
            if not _suppress_depth:
                storage_hooks.install()
                leaderloss.install()
            return
        for name in _PATCHES:
            current = getattr(SyncObj, name)
            if not hasattr(current, _MARKER) and current.__module__ != "pysyncobj.syncobj":
                raise RaftPatchError(f"SyncObj.{name} was replaced by {current!r}; not stacking")
        problems = library_mismatches()
        if problems:
            raise RaftPatchError("pysyncobj changed, review cluster/consensus/raftpatch.py: "
                                 + "; ".join(problems))
        for name, make_wrapper in _PATCHES.items():
            if not hasattr(getattr(SyncObj, name), _MARKER):
                wrapper = make_wrapper(getattr(SyncObj, name))
                setattr(wrapper, _MARKER, getattr(SyncObj, name))
                setattr(SyncObj, name, wrapper)
        storage_hooks.install()
        leaderloss.install()
        logger.info("action=raftpatch_installed pysyncobj=%s", PYSYNCOBJ_VERSION)


def uninstall() -> None:
    """Restore the library. Nodes already built keep the handler they bound (rules 1-4);
    rule 5 is looked up at call time, so it applies while installed, to nodes that run the fix."""
    with _lock:
        for name in _PATCHES:
            setattr(SyncObj, name, original(name))
        leaderloss.uninstall()  # an unpatched node waits out its election timeout, as 0.3.17


@contextmanager
def uninstalled() -> Iterator[None]:
    """Tests only: nodes built inside run unpatched 0.3.17, and install() is a no-op here."""
    global _suppress_depth
    with _lock:
        was_installed = is_installed()
        uninstall()
        _suppress_depth += 1
    try:
        yield
    finally:
        with _lock:
            _suppress_depth -= 1
            if was_installed and not _suppress_depth:
                install()


# --- the wrappers ----------------------------------------------------------------------------

def _make_handler(library: Callable[..., Any]) -> Callable[..., Any]:
    def on_message_received(self: Any, node: Any, message: Any) -> None:
        if isinstance(message, dict):
            kind = message.get("type")
            if kind == "request_vote" and node not in self.otherNodes:
                return  # rule 6
            if prevote.on_message(self, node, message):
                return  # rule 7
            if kind == "append_entries" and message.get("term", -1) >= self.raftCurrentTerm:
                if "prevLogIdx" in message:
                    _follower_append(library, self, node, message)
                else:
                    _follower_snapshot(library, self, node, message)
                return
            if kind == "next_node_idx":
                if node not in self._SyncObj__raftNextIndex:
                    return  # rule 8
                if message.get("success") and not message.get("reset"):
                    _leader_success_ack(library, self, node, message)
                    return
        library(self, node, message)

    on_message_received.__wrapped__ = library  # type: ignore[attr-defined]
    return on_message_received


def _follower_append(library: Callable[..., Any], self: Any, node: Any, message: Any) -> None:
    """Rules 1 and 3."""
    entries = _entries_of(self, message)
    prev_idx, prev_term = message["prevLogIdx"], message["prevLogTerm"]
    if entries is None or any(
            entry[1] != prev_idx + 1 + offset for offset, entry in enumerate(entries)):
        library(self, node, message)  # chunks in progress, malformed: the library's way
        return
    prev = self._SyncObj__getEntries(prev_idx, 1)
    if not prev or prev[0][2] != prev_term:
        _reject(library, self, node, message, prev_idx if prev else _last_index(self) + 1)
        return
    repeated = 0
    for entry in entries:
        held = self._SyncObj__getEntries(entry[1], 1)
        if not held or held[0][2] != entry[2]:
            break
        repeated += 1
    verified_idx = prev_idx + len(entries)
    if repeated < len(entries):
        # Only the new or conflicting suffix goes on, so the library deletes from the first
        # conflict, appends, acks verified_idx + 1 and commits at most to the new log end.
        self._SyncObj__recvTransmission = ""  # a finished chunked entry: consumed here
        library(self, node, {
            "type": "append_entries", "term": message["term"],
            "commit_index": message["commit_index"], "entries": entries[repeated:],
            "prevLogIdx": prev_idx + repeated,
            "prevLogTerm": entries[repeated - 1][2] if repeated else prev_term,
        })
        return
    # Everything is already held; entries beyond verified_idx are unverified by this append,
    # so they are neither deleted nor committed, and the ack claims exactly verified_idx.
    _heartbeat_only(library, self, node, message, min(message["commit_index"], verified_idx))
    self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=verified_idx + 1, success=True)


def _follower_snapshot(library: Callable[..., Any], self: Any, node: Any, message: Any) -> None:
    """Rule 2: only an installed snapshot moves the commit index."""
    journal = self._SyncObj__raftLog
    before = (len(journal), journal[-1][1], journal[-1][2])
    _heartbeat_only(library, self, node, message, self.raftCommitIndex, {
        key: value for key, value in message.items() if key != "commit_index"})
    if (len(journal), journal[-1][1], journal[-1][2]) != before:
        # The snapshot was installed: the log is now its two committed entries.
        _heartbeat_only(library, self, node, message,
                        min(message["commit_index"], _last_index(self)))


def _reject(library: Callable[..., Any], self: Any, node: Any, message: Any,
            library_hint: int) -> None:
    """Rule 3: reject with a next-index hint that cannot point past a possible conflict.
    Entries of the leader's own term came from it; older uncommitted ones are the doubt."""
    # Applied entries are committed too; after a restart from the dump the commit index read
    # from the meta file can lag behind the dump's last applied index.
    commit_idx = self.raftCommitIndex
    agreed_idx = max(commit_idx, self.raftLastApplied)
    uncommitted = self._SyncObj__getEntries(agreed_idx + 1, 1)
    if not uncommitted or uncommitted[0][2] >= message["term"] or library_hint <= agreed_idx + 1:
        library(self, node, message)
        return
    _heartbeat_only(library, self, node, message, commit_idx)
    self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=agreed_idx + 1, success=False, reset=True)


def _heartbeat_only(library: Callable[..., Any], self: Any, node: Any, message: Any,
                    commit_idx: int, extra: dict[str, Any] | None = None) -> None:
    """Let the library do only the heartbeat part of an append: leader, term, election
    timer and commit index (at most ``commit_idx``). Without a log position it neither
    touches the log nor acks; ``extra`` passes a snapshot chunk through."""
    if message.get("transmission") is not None:
        self._SyncObj__recvTransmission = ""  # the library would have consumed it
    library(self, node, {**(extra or {}), "type": "append_entries", "term": message["term"],
                         "commit_index": commit_idx})
    self._SyncObj__leaderCommitIndex = message["commit_index"]  # what isReady() waits for


def _entries_of(self: Any, message: Any) -> list[Any] | None:
    """The append's entries; a finished chunked transfer is reassembled, not consumed."""
    transmission = message.get("transmission")
    if transmission is None:
        return list(message.get("entries", []))
    if transmission != "finish":
        return None
    try:
        return [pysyncobj_pickle.loads(self._SyncObj__recvTransmission + message["data"])]
    except Exception:
        return None  # let the library fail on it exactly as it would unpatched


def _leader_success_ack(library: Callable[..., Any], self: Any, node: Any, message: Any) -> None:
    """Rule 4."""
    next_index = self._SyncObj__raftNextIndex
    before = next_index.get(node)
    library(self, node, message)
    after = next_index.get(node)
    if before is not None and after is not None and after < before and self._isLeader():
        # A late ack for an earlier pipelined batch: later batches are still in flight.
        next_index[node] = before


def _last_index(self: Any) -> int:
    return int(self._SyncObj__raftLog[-1][1])


def _make_delete_entries_to(library: Callable[..., Any]) -> Callable[..., Any]:
    def delete_entries_to(self: Any, to_idx: int) -> None:
        """Rule 5. A compaction point is always below the last index (it is the entry
        before the last applied one) unless a snapshot install replaced the log meanwhile;
        deleting up to it would empty the new log."""
        if to_idx >= _last_index(self) and runs_fix(self):
            logger.warning("action=raftpatch_stale_compaction_skipped to_idx=%d last_idx=%d",
                           to_idx, _last_index(self))
            return
        library(self, to_idx)

    delete_entries_to.__wrapped__ = library  # type: ignore[attr-defined]
    return delete_entries_to


_PATCHES: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    _HANDLER: _make_handler,
    _DELETE_TO: _make_delete_entries_to,
    "_SyncObj__connectedToAnyone": prevote.make_connected_to_anyone,  # rule 7
}
