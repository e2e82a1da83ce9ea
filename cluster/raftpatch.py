"""Carried fix for PySyncObj 0.3.17: an append never deletes what it merely repeats.

What it fixes (research: /work/shared/research/pysyncobj-truncation.md). In 0.3.17 a follower
that gets an ``append_entries`` whose ``prevLogIdx`` matches deletes *every* entry after it
(``SyncObj.__onMessageReceived``, the ``if len(prevEntries) > 1`` block) instead of deleting
only from the first entry whose term conflicts (Raft, Figure 2, receiver rule 3). A stale,
duplicated or re-sent append therefore deletes entries the follower already acknowledged, and
even applied; if the leader then dies, acknowledged commands vanish and replicas diverge. The
leader makes such re-sends itself: a late success ack moves ``nextIndex`` backwards past
batches that are still in flight.

How. ``install()`` wraps the message handler on the class (it is bound in ``SyncObj.__init__``,
so call ``install()`` before constructing a node). The original handler keeps doing all the
work; the wrapper only rewrites what it is given:

* follower: for an append of the current term whose prev entry matches, entries the log
  already holds with the same term are dropped from the message. A remaining suffix is
  passed on with ``prevLogIdx`` moved up, so the original deletes only from the first real
  conflict. If nothing remains, the original sees a bare heartbeat without a log position
  (nothing is deleted) and the wrapper acks exactly the last index the append verified.
  The commit index is capped at that index too: the old delete-everything made
  ``min(leaderCommit, lastLogIndex)`` safe; a kept, unverified tail must not be committed.
* leader: a success ack never moves ``nextIndex`` backwards (Raft treats it as a hint; the
  follower's prev check keeps it safe, so the max only saves wasteful re-sends).

Guard. The wrapper relies on name-mangled internals, so it is tied to the reviewed source:
``install()`` refuses to run when the installed functions' source hashes differ from
``REVIEWED_SOURCE_SHA256`` (an upgrade forces a new review), and refuses to stack on a handler
that somebody else replaced. Installing twice is a no-op.
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

logger = logging.getLogger(__name__)

PYSYNCOBJ_VERSION = "0.3.17"

_HANDLER = "_SyncObj__onMessageReceived"
_MARKER = "__raftpatch_original__"

# sha256 of inspect.getsource() of every SyncObj function the wrapper patches or relies on
# (the handler's contract, the ack and entry helpers, the attributes set in __init__, and the
# leader's pipelined sends), plus the whole syncobj.py: an edited copy that kept the version
# string still forces a review. The per-function hashes say what to re-read.
REVIEWED_SOURCE_SHA256: dict[str, str] = {
    "__init__": "09df12cd7fd7d7270fee82c1a025acc1f3a68e98dafbad81be467947ab95cbf0",
    _HANDLER: "ddfe34b6c02821795146dc533fb7c0fcf6574a082a68a227b4c885c9e14be206",
    "_SyncObj__sendNextNodeIdx": "68aaeefc267b8896bc1074280ac2aa014c3306d9f207949ed945569cef5d114c",
    "_SyncObj__getEntries": "e29c4b33293b21018d1124c7e5835748c4c8092f7ce4af9e86f24633ccec7e0e",
    "_SyncObj__sendAppendEntries":
        "9cb9073128c392fa9e5efc4691420ba435bfafb4c74e83a34f931fa16aa760c6",
}
REVIEWED_SYNCOBJ_FILE_SHA256 = "e8bdf06797085d734df86e24ab4802fe87893dff77268565ec036f7ad4a1cfe4"


class RaftPatchError(RuntimeError):
    """The installed pysyncobj is not the one this fix was reviewed against."""


_lock = threading.RLock()
_suppress_depth = 0


def source_sha256(function: Callable[..., Any]) -> str:
    """Hash of a function's source text, stable across Python versions (unlike bytecode)."""
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


def original_handler() -> Callable[..., Any]:
    """The library's own message handler, whether or not the patch is installed."""
    current = getattr(SyncObj, _HANDLER)
    return getattr(current, _MARKER, current)


def library_mismatches() -> list[str]:
    """What differs from the reviewed library; empty when the fix applies as written."""
    problems = []
    if pysyncobj.version.VERSION != PYSYNCOBJ_VERSION:
        problems.append(f"pysyncobj {pysyncobj.version.VERSION} != reviewed {PYSYNCOBJ_VERSION}")
    for name, expected in REVIEWED_SOURCE_SHA256.items():
        function = original_handler() if name == _HANDLER else getattr(SyncObj, name, None)
        if function is None:
            problems.append(f"SyncObj.{name} is missing")
            continue
        try:
            actual = source_sha256(function)
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


def is_installed() -> bool:
    return hasattr(getattr(SyncObj, _HANDLER), _MARKER)


def install() -> None:
    """Patch SyncObj before any node is constructed. Idempotent; refuses unknown code."""
    with _lock:
        if _suppress_depth or is_installed():
            return
        current = getattr(SyncObj, _HANDLER)
        if getattr(current, "__module__", None) != "pysyncobj.syncobj":
            raise RaftPatchError(f"SyncObj.{_HANDLER} was replaced by {current!r}; not stacking")
        problems = library_mismatches()
        if problems:
            raise RaftPatchError("pysyncobj changed, review cluster/raftpatch.py: "
                                 + "; ".join(problems))
        setattr(SyncObj, _HANDLER, _make_patched_handler(current))
        logger.info("action=raftpatch_installed pysyncobj=%s", PYSYNCOBJ_VERSION)


def uninstall() -> None:
    """Restore the library's handler. Nodes already built keep the handler they bound."""
    with _lock:
        if is_installed():
            setattr(SyncObj, _HANDLER, original_handler())


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


def _make_patched_handler(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_message_received(self: Any, node: Any, message: Any) -> None:
        if isinstance(message, dict):
            kind = message.get("type")
            if kind == "append_entries" and "prevLogIdx" in message:
                _follower_append(original, self, node, message)
                return
            if kind == "next_node_idx" and message.get("success") and not message.get("reset"):
                _leader_success_ack(original, self, node, message)
                return
        original(self, node, message)

    setattr(on_message_received, _MARKER, original)
    on_message_received.__wrapped__ = original  # type: ignore[attr-defined]
    return on_message_received


def _follower_append(original: Callable[..., Any], self: Any, node: Any, message: Any) -> None:
    entries = _entries_of(self, message)
    prev_idx, prev_term = message["prevLogIdx"], message["prevLogTerm"]
    if entries is None or message["term"] < self.raftCurrentTerm or any(
            entry[1] != prev_idx + 1 + offset for offset, entry in enumerate(entries)):
        original(self, node, message)  # chunks, stale terms, malformed: the library's way
        return
    prev = self._SyncObj__getEntries(prev_idx, 1)
    if not prev or prev[0][2] != prev_term:
        _reject(original, self, node, message, prev_idx if prev else _last_index(self) + 1)
        return
    repeated = 0
    for entry in entries:
        held = self._SyncObj__getEntries(entry[1], 1)
        if not held or held[0][2] != entry[2]:
            break
        repeated += 1
    verified_idx = prev_idx + len(entries)
    if repeated < len(entries):
        # Only the new or conflicting suffix goes on, so the original deletes from the first
        # conflict, appends, acks verified_idx + 1 and commits at most to the new log end.
        self._SyncObj__recvTransmission = ""  # a finished chunked entry: consumed here
        original(self, node, {
            "type": "append_entries", "term": message["term"],
            "commit_index": message["commit_index"], "entries": entries[repeated:],
            "prevLogIdx": prev_idx + repeated,
            "prevLogTerm": entries[repeated - 1][2] if repeated else prev_term,
        })
        return
    # Everything is already held; entries beyond verified_idx are unverified by this append,
    # so they are neither deleted nor committed, and the ack claims exactly verified_idx.
    _heartbeat_only(original, self, node, message, min(message["commit_index"], verified_idx))
    self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=verified_idx + 1, success=True)


def _reject(original: Callable[..., Any], self: Any, node: Any, message: Any,
            library_hint: int) -> None:
    """Reject with a next-index hint that cannot point past a possible conflict.

    0.3.17 hints "my last index + 1" when the prev entry is missing, even if its tail holds
    uncommitted entries of an older term, which may conflict. A leader pipelining several
    batches then gets "prev term differs at P" for the first and "last + 1" for the rest,
    sets nextIndex to each in turn and re-sends the same burst forever (until a snapshot).
    Entries of the leader's own term came from it; older uncommitted ones are the doubt.
    """
    commit_idx = self.raftCommitIndex
    uncommitted = self._SyncObj__getEntries(commit_idx + 1, 1)
    if not uncommitted or uncommitted[0][2] >= message["term"] or library_hint <= commit_idx + 1:
        original(self, node, message)
        return
    _heartbeat_only(original, self, node, message, commit_idx)
    self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=commit_idx + 1, success=False, reset=True)


def _heartbeat_only(original: Callable[..., Any], self: Any, node: Any, message: Any,
                    commit_idx: int) -> None:
    """Let the original do only the heartbeat part of an append: leader, term, election
    timer and commit index. Without a log position it neither touches the log nor acks."""
    if message.get("transmission") is not None:
        self._SyncObj__recvTransmission = ""  # the original would have consumed it
    original(self, node, {"type": "append_entries", "term": message["term"],
                          "commit_index": commit_idx})
    self._SyncObj__leaderCommitIndex = message["commit_index"]  # what isReady() waits for


def _last_index(self: Any) -> int:
    return int(self._SyncObj__raftLog[-1][1])


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


def _leader_success_ack(original: Callable[..., Any], self: Any, node: Any, message: Any) -> None:
    next_index = self._SyncObj__raftNextIndex
    before = next_index.get(node)
    original(self, node, message)
    after = next_index.get(node)
    if before is not None and after is not None and after < before and self._isLeader():
        # A late ack for an earlier pipelined batch: later batches are still in flight.
        next_index[node] = before
