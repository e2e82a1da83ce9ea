"""The leader's side of a membership change: from `BeginMemberChange` to `EndMemberChange`.

Runs on every node (like the ticker) and acts only while this node leads and the member book
holds a change in progress, one step every `STEP_S`; a new leader resumes where the old one
stopped, because everything it decides from is replicated (the book) or its own log (the
configuration). Adding a node:

1. catching up: the new node is registered with this leader as a learner (`raftconfig`): it
   gets the log, by snapshot when the log it lacks is compacted, and counts toward nothing;
2. caught up (its match index has reached the commit index this leader had one election
   timeout ago: what is left takes less than an election to send, Raft thesis §4.2.1), the
   leader proposes the configuration entry that adds it; it votes from that entry on;
3. once that entry is committed: `EndMemberChange(done)`.

Removing a node: the leader proposes the entry that removes it, keeps sending it the log as a
learner (so the removed node gets that entry and knows it is out), and once the entry is
committed, `EndMemberChange(done)`. A leader never removes itself: a node whose removal is in
progress stops leading and stands for no election (`RaftNode.may_lead`), the others elect a
leader among them, and that one removes it. (Raft's TimeoutNow transfer would be faster, but
it forked the log in a tier-1 power-loss run here: commit c37e211.)

Cancelling (`CancelMemberChange`, from DELETE of a node still catching up, or from this driver
when it did not catch up within `catch_up_timeout_s`): once the cancel is applied the storage
hooks' gate refuses the change's configuration entry on any leader, so the driver ends the
change as `aborted` only if the entry is not in force here (else as `done`: it won the race).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

from raftcron.cluster.consensus.proposer import ProposalFailed, Proposer
from raftcron.cluster.consensus.replica import RaftNode
from raftcron.cluster.membership import book as member_book
from raftcron.cluster.membership import raftconfig
from raftcron.cluster.membership.book import Change

log = logging.getLogger("raftcron.membership")

STEP_S = 0.1
PROPOSAL_RETRY_S = 1.0  # a configuration entry not seen in force by then is proposed again
PROGRESS_EVERY_S = 5.0  # a node catching up is logged this often
REMOVED_NOTICE_S = 3.0  # how long a removed node may take to receive its removal


class MembershipDriver:
    def __init__(self, node: RaftNode, proposer: Proposer, *, catch_up_timeout_s: float,
                 election_timeout_s: float) -> None:
        self.node = node
        self.proposer = proposer
        self.catch_up_timeout_s = catch_up_timeout_s
        self.election_timeout_s = election_timeout_s
        self._seen: dict[int, float] = {}  # change id -> when this node first drove it
        self._told: dict[int, float] = {}  # removal id -> when its entry was seen in force
        self._commits: deque[tuple[float, int]] = deque()  # (monotonic s, commit index)
        self._proposed: tuple[int, float] | None = None  # (change id, when) of our entry
        self._learners: set[str] = set()
        self._reported = 0.0
        self._task: asyncio.Task[None] | None = None
        self.catch_up_s: dict[int, float] = {}  # change id -> seconds to catch up (figures)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="membership")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except ProposalFailed as error:
                log.debug("membership step not committed: %s", error)
            except Exception:
                log.exception("membership step failed")
            await asyncio.sleep(STEP_S)

    async def step(self) -> None:
        now = time.monotonic()
        if not self.node.is_voter() and now - self._reported >= PROGRESS_EVERY_S:
            self._reported = now  # a joining node says whom it reaches while it waits
            log.info("not a member (yet): leader %s, connections %s", self.node.leader_id(),
                     raftconfig.connections(self.node.sync),
                     extra={"action": "member_waiting"})
        change = self.node.machine.members.change
        if change is None or not self.node.is_leader():
            self._forget()
            return
        self._seen.setdefault(change.change_id, now)
        self._commits.append((now, self.node.commit_index))
        while len(self._commits) > 1 and self._commits[1][0] <= now - self.election_timeout_s:
            self._commits.popleft()
        if change.action == "add":
            await self._add(change, now)
        else:
            await self._remove(change, now)

    # -- adding ---------------------------------------------------------------------------

    async def _add(self, change: Change, now: float) -> None:
        sync, address = self.node.sync, change.member.raft_address
        if address in raftconfig.voters(sync):
            await self._end_when_settled(change, "done")
            return
        if change.cancel_reason:
            await self._end_when_settled(change, "aborted")
            return
        self._register_learner(address)
        if now - self._seen[change.change_id] > self.catch_up_timeout_s:
            await self._cancel(change, f"{change.member.node_id} did not catch up within "
                                       f"{self.catch_up_timeout_s:g} s")
            return
        if now - self._reported >= PROGRESS_EVERY_S:
            self._reported = now
            log.info("%s catching up: match index %s of commit %d, connected %s",
                     change.member.node_id, raftconfig.match_index(sync, address),
                     self.node.commit_index, raftconfig.is_connected(sync, address),
                     extra={"action": "member_catching_up", "node_id": change.member.node_id,
                            "learners": raftconfig.learners(sync),
                            "transport": raftconfig.transport_view(sync, address)})
        if self._caught_up(address) and self._may_propose(change, now):
            self.catch_up_s.setdefault(change.change_id, now - self._seen[change.change_id])
            log.info("%s caught up (match index %s); adding it as a voter",
                     change.member.node_id, raftconfig.match_index(sync, address),
                     extra={"action": "member_caught_up", "node_id": change.member.node_id})
            self._propose_entry(change, "add", address, now)

    def _caught_up(self, address: str) -> bool:
        """The learner holds what the leader had committed one election timeout ago."""
        match = raftconfig.match_index(self.node.sync, address)
        if match is None or not self._commits:
            return False
        then_s, then_commit = self._commits[0]
        waited = time.monotonic() - then_s >= self.election_timeout_s
        return waited and match >= then_commit and raftconfig.is_connected(self.node.sync,
                                                                            address)

    def _register_learner(self, address: str) -> None:
        """Every step, not once: it is idempotent, and a registration undone meanwhile (an
        entry that was not appended after all) must not leave the node neither learner nor
        voter, catching up with nobody (seen in the chaos suite, before)."""
        self._learners.add(address)
        sync = self.node.sync
        self.node.on_raft_thread(lambda: raftconfig.add_learner(sync, address))

    # -- removing -------------------------------------------------------------------------

    async def _remove(self, change: Change, now: float) -> None:
        sync, address = self.node.sync, change.member.raft_address
        if address == self.node.config.raft_address:
            return  # never removes itself: it stops leading (RaftNode.may_lead)
        in_force = address not in raftconfig.voters(sync)
        if in_force:
            # PySyncObj stopped sending to it when the entry was appended: as a learner it gets
            # that entry, so it knows it is out (no vote, no candidacy, no writes taken). The
            # change ends once it has it, or after REMOVED_NOTICE_S (it may be down for good).
            self._register_learner(address)
            told = self._told.setdefault(change.change_id, now)
            newest = raftconfig.newest_config_index(sync)
            match = raftconfig.match_index(sync, address)
            knows = newest is not None and match is not None and match >= newest
            if knows or now - told >= REMOVED_NOTICE_S:
                await self._end_when_settled(change, "done")
            return
        if change.cancel_reason:
            await self._end_when_settled(change, "aborted")
            return
        if self._may_propose(change, now):
            self._propose_entry(change, "rem", address, now)

    # -- common ---------------------------------------------------------------------------

    def _may_propose(self, change: Change, now: float) -> bool:
        sync = self.node.sync
        if not raftconfig.may_change_configuration(sync):
            return False
        if raftconfig.pending_config_index(sync) is not None:
            return False  # the previous change is not committed yet (Raft: one at a time)
        proposed = self._proposed
        return proposed is None or proposed[0] != change.change_id or \
            now - proposed[1] >= PROPOSAL_RETRY_S

    def _propose_entry(self, change: Change, kind: str, address: str, now: float) -> None:
        self._proposed = (change.change_id, now)
        sync = self.node.sync

        def answered(_result: Any, reason: int) -> None:  # on the Raft thread
            if reason != 0:
                log.info("configuration entry %s %s not applied (PySyncObj reason %s); "
                         "asking again", kind, address, reason,
                         extra={"action": "config_change_retry"})

        self.node.on_raft_thread(lambda: raftconfig.propose(sync, kind, address, answered))

    async def _cancel(self, change: Change, reason: str) -> None:
        log.warning("cancelling %s of %s: %s", change.action, change.member.node_id, reason,
                    extra={"action": "member_change_cancelled"})
        command = member_book.CancelMemberChange(change.change_id, reason)
        await self.proposer.propose_frame(member_book.encode(command))

    async def _end_when_settled(self, change: Change, outcome: str) -> None:
        """End the change once no configuration entry is pending here (the newest one in the
        log is committed): `done` if its entry is in force, `aborted` if it was cancelled."""
        if raftconfig.pending_config_index(self.node.sync) is None:
            await self._end(change, outcome, change.cancel_reason if outcome == "aborted" else "")

    async def _end(self, change: Change, outcome: str, reason: str) -> None:
        command = member_book.EndMemberChange(change.change_id, outcome, reason)
        result = await self.proposer.propose_frame(member_book.encode(command))
        if not result.ok:
            log.warning("ending change %d refused: %s", change.change_id, result,
                        extra={"action": "member_change_end_refused"})
        else:
            log.info("%s of %s: %s%s", change.action, change.member.node_id, outcome,
                     f" ({reason})" if reason else "",
                     extra={"action": "member_change_ended", "node_id": change.member.node_id,
                            "outcome": outcome})

    def _forget(self) -> None:
        """Not leading, or no change: no learner registered here, nothing half-proposed."""
        self._seen.clear()
        self._told.clear()
        self._commits.clear()
        self._proposed = None
        if self._learners:
            sync, addresses = self.node.sync, sorted(self._learners)
            self._learners.clear()

            def drop() -> None:
                for address in addresses:
                    raftconfig.drop_learner(sync, address)

            self.node.on_raft_thread(drop)
