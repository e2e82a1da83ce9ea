"""PreVote and leader stickiness for PySyncObj 0.3.17 (Raft thesis §9.6 and §4.2.3).

The problem. A member that stops reading its sockets for a while (its Raft thread in a slow
`fsync`, a long GC, a stalled link) misses heartbeats; when it runs again its election
deadline has passed, so 0.3.17 makes it a candidate with a higher term at once, before it
reads the heartbeats that queued meanwhile. Every member that sees the higher term steps down
or moves to it, so one sick member deposes a healthy leader, again at every stall: one
member's 2 s fsync cost 6-9 leader changes in 20 s (research/wave3.md).

What this module adds (rules, each only withholding an election or a vote, so Raft's safety
is untouched: a vote not given and an election not started can only cost liveness):

1. PreVote. When a member's election deadline passes it first asks the others whether they
   would vote for it (``raftcron_pre_vote`` with the term it would stand at and its log's
   end), without changing its own term, vote or state. Only when a majority (itself
   included) says yes does it stand for election, through 0.3.17's own code on the next
   tick. A member answers yes when the term is above its own, the log is at least as
   up-to-date as its own (the real vote's rule), it is not a learner, and it has no live
   leader (rule 2).
2. Stickiness (the lease). A member that heard from a leader within the minimum election
   timeout, and the leader itself, answer no to a pre-vote and ignore a real vote request of
   a higher term (which would otherwise make it step down). A leader keeps leading only
   while a majority answers it (0.3.17's ``leaderFallbackTimeout``, CheckQuorum), so the
   lease is never held against a majority that lost its leader. A follower whose connection
   to its leader closed (a leader that died closes them all at once) ends its lease
   (`leader_lost`), so a crashed leader's followers elect the next one as quickly as before.
3. A member with a higher term answers an append of a lower term with
   ``raftcron_higher_term`` (Raft's "reply with currentTerm", which 0.3.17's followers do not
   send): the sender steps down and takes the term. Without it a member that reached a
   higher term (it voted in an election another member lost) and is refused by the others'
   leases would ignore the leader forever. At most once per minimum election timeout per
   peer.

PreVote needs every member to answer the new message (an older release ignores it, so a
member that needs its pre-votes would never stand), and the lease needs every member to send
the higher-term reply (an older member that stood while cut off would otherwise be refused
for as long as the leader lives): rules 1 and 2 run only while ``enabled()`` says so, which
`RaftNode` ties to a finalized cluster (DESIGN.md §9.0). Rule 3 always runs.
Installed through `cluster.consensus.raftpatch` (the message handler, and `__connectedToAnyone`,
which
0.3.17 asks only when it would stand); a node opts in with `attach`. PySyncObj's clock
and randomness are its module globals, so the simulation drives them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pysyncobj.syncobj as syncobj_module
from pysyncobj.syncobj import _RAFT_STATE

PRE_VOTE = "raftcron_pre_vote"
PRE_VOTE_REPLY = "raftcron_pre_vote_reply"
HIGHER_TERM = "raftcron_higher_term"
ATTRIBUTE = "_raftcron_prevote"


@dataclass
class PreVote:
    """One node's PreVote state, kept on its SyncObj (`attach`)."""

    enabled: Callable[[], bool]
    learner: Callable[[], bool]
    heard_leader_at: float = float("-inf")
    round_term: int | None = None  # the term a pre-vote round in progress asks for
    granted: set[Any] = field(default_factory=set)
    won_term: int | None = None  # a majority said yes: stand at this term
    told_higher: dict[Any, float] = field(default_factory=dict)
    rounds: int = 0  # counters for metrics and tests
    elections: int = 0
    votes_ignored: int = 0


def attach(sync: Any, *, enabled: Callable[[], bool],
           learner: Callable[[], bool] = lambda: False) -> PreVote:
    state = PreVote(enabled=enabled, learner=learner)
    setattr(sync, ATTRIBUTE, state)
    return state


def state_of(sync: Any) -> PreVote | None:
    state = getattr(sync, ATTRIBUTE, None)
    return state if isinstance(state, PreVote) else None


def _now() -> float:
    return float(syncobj_module.monotonicTime())


def in_lease(sync: Any, state: PreVote) -> bool:
    """Rule 2: the leader, or a follower that heard from its leader recently."""
    if sync._SyncObj__raftState == _RAFT_STATE.LEADER:
        return True
    return sync._SyncObj__raftLeader is not None and \
        _now() - state.heard_leader_at < sync.conf.raftMinTimeout


def _log_ok(sync: Any, last_term: int, last_index: int) -> bool:
    ours_term: int = sync._SyncObj__getCurrentLogTerm()
    ours_index: int = sync._SyncObj__getCurrentLogIndex()
    return last_term > ours_term or (last_term == ours_term and last_index >= ours_index)


def may_stand(sync: Any) -> bool:
    """Rule 1, asked by 0.3.17 at the very moment it would stand (its election deadline
    passed and it is connected to someone: `make_connected_to_anyone`), so no stall before
    that moment can skip it. Without a round won for the next term, a pre-vote round starts
    instead (and the deadline moves on); a round won lets the library stand now."""
    state = state_of(sync)
    if state is None or sync._SyncObj__selfNode is None or not state.enabled():
        return True
    term = sync.raftCurrentTerm
    if state.won_term == term + 1:
        state.won_term = state.round_term = None
        state.elections += 1
        return True
    state.won_term = None
    state.round_term = term + 1
    state.granted = {sync._SyncObj__selfNode}
    state.rounds += 1
    sync._SyncObj__raftElectionDeadline = _now() + sync._SyncObj__generateRaftTimeout()
    message = {"type": PRE_VOTE, "term": term + 1,
               "last_log_index": sync._SyncObj__getCurrentLogIndex(),
               "last_log_term": sync._SyncObj__getCurrentLogTerm()}
    for node in sync._SyncObj__otherNodes:
        sync._SyncObj__transport.send(node, message)
    _count(sync, state)
    return False


def make_connected_to_anyone(library: Callable[..., Any]) -> Callable[..., Any]:
    """`SyncObj.__connectedToAnyone`, which 0.3.17 asks only to decide to stand for
    election (syncobj.py, `_onTick`), answers also whether PreVote lets it (`may_stand`)."""
    def connected_to_anyone(self: Any) -> bool:
        return bool(library(self)) and may_stand(self)
    return connected_to_anyone


def _count(sync: Any, state: PreVote) -> None:
    if len(state.granted) > (len(sync._SyncObj__otherNodes) + 1) / 2:
        state.won_term = state.round_term
        state.round_term = None
        sync._SyncObj__raftElectionDeadline = 0  # stand at the next tick


def on_message(sync: Any, node: Any, message: dict[str, Any]) -> bool:
    """Handle this module's messages and rules 2-3 on others'; True when the message was
    consumed (the library must not see it)."""
    state = state_of(sync)
    kind = message.get("type")
    if kind == PRE_VOTE:
        if state is not None:
            _answer_pre_vote(sync, state, node, message)
        return True
    if kind == PRE_VOTE_REPLY:
        if state is not None and message.get("granted") and \
                message.get("term") == state.round_term and \
                sync.raftCurrentTerm + 1 == state.round_term and \
                node in sync._SyncObj__otherNodes:
            state.granted.add(node)
            _count(sync, state)
        return True
    if kind == HIGHER_TERM:
        _on_higher_term(sync, message)
        return True
    if state is None:
        return False
    term = message.get("term")
    if not isinstance(term, int):
        return False
    if kind == "request_vote" and term > sync.raftCurrentTerm and state.enabled() and \
            in_lease(sync, state):
        state.votes_ignored += 1
        return True  # rule 2: a live leader is not deposed by a member that missed it
    if kind == "append_entries":
        if term >= sync.raftCurrentTerm:
            state.heard_leader_at = _now()
        else:
            _tell_higher_term(sync, state, node)
    return False


def _answer_pre_vote(sync: Any, state: PreVote, node: Any, message: dict[str, Any]) -> None:
    term, last_index, last_term = (message.get("term"), message.get("last_log_index"),
                                   message.get("last_log_term"))
    if not (isinstance(term, int) and isinstance(last_index, int)
            and isinstance(last_term, int)):
        return
    granted = (sync._SyncObj__selfNode is not None and node in sync._SyncObj__otherNodes
               and term > sync.raftCurrentTerm and not state.learner()
               and not in_lease(sync, state) and _log_ok(sync, last_term, last_index))
    sync._SyncObj__transport.send(node, {"type": PRE_VOTE_REPLY, "term": term,
                                         "granted": granted})


def _tell_higher_term(sync: Any, state: PreVote, node: Any) -> None:
    now = _now()
    if now - state.told_higher.get(node, float("-inf")) < sync.conf.raftMinTimeout:
        return
    state.told_higher[node] = now
    sync._SyncObj__transport.send(node, {"type": HIGHER_TERM, "term": sync.raftCurrentTerm})


def _on_higher_term(sync: Any, message: dict[str, Any]) -> None:
    """Rule 3, as any Raft reply carrying a higher term: step down and take the term."""
    term = message.get("term")
    if not isinstance(term, int) or term <= sync.raftCurrentTerm:
        return
    sync._SyncObj__setCurrentTerm(term, None)
    sync._SyncObj__setState(_RAFT_STATE.FOLLOWER)
    sync._SyncObj__raftLeader = None


def leader_lost(sync: Any) -> None:
    """The connection to the leader closed: the lease ends now (rule 2)."""
    state = state_of(sync)
    if state is not None:
        state.heard_leader_at = float("-inf")
