"""From asyncio to the Raft log and back: proposals, group commit, and honest failures.

`Proposer.propose(command)` encodes a command, coalesces it with the other commands proposed
in the same event-loop turn into ONE log entry (group commit), hands that entry to PySyncObj,
and resolves each caller's future from the PySyncObj callback (which runs on the Raft thread:
it only schedules the resolution on the loop). A write is answered only after it committed
and was applied on this node.

Failures come in two kinds, and the difference matters:
- definite (`NotApplied`): the command is known not to be in the log (no leader, queue full);
- indeterminate (`Indeterminate`): it may still commit (timeout, leader changed, unknown).
`submit` retries both until its deadline with the SAME request id, which the state machine
answers with the first result, so a retry can never apply a command twice. Commands without a
request id (the leader's Tick) are proposed once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pysyncobj import FAIL_REASON

from raftcron.cluster.consensus.replica import RaftNode, encode_batch
from raftcron.cluster.telemetry.histogram import Histogram
from raftcron.scheduler import codec
from raftcron.scheduler.commands import Command
from raftcron.scheduler.errors import Rejected, Result

log = logging.getLogger("raftcron.proposer")

_DEFINITE = {
    FAIL_REASON.QUEUE_FULL,
    FAIL_REASON.MISSING_LEADER,
    FAIL_REASON.NOT_LEADER,
    FAIL_REASON.REQUEST_DENIED,
}
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
FRAME_BYTES_MAX = 512 * 1024  # one command; PySyncObj slows badly past a few hundred KiB
ENTRY_BYTES_MAX = 1024 * 1024  # one coalesced log entry


class ProposalFailed(Exception):
    """The cluster could not commit in time (no leader, no quorum): HTTP 503, retry later."""

    def __init__(self, message: str, *, indeterminate: bool, reason: str = "") -> None:
        super().__init__(message)
        self.indeterminate = indeterminate
        self.reason = reason  # PySyncObj's failure, lower case ("missing_leader"), if it gave one


class NotApplied(ProposalFailed):
    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message, indeterminate=False, reason=reason)


class Indeterminate(ProposalFailed):
    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message, indeterminate=True, reason=reason)


# Failures that end when a leader is known again: a retry waits for that, not for a backoff.
_LEADERLESS = frozenset({"missing_leader", "not_leader", "leader_changed"})
LEADER_POLL_S = 0.01


class TooLarge(Exception):
    """A command larger than one log entry may carry: HTTP 413."""


@dataclass
class _Pending:
    frame: bytes
    future: asyncio.Future[Result]
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = len(self.frame)


class Proposer:
    def __init__(
        self,
        node: RaftNode,
        loop: asyncio.AbstractEventLoop,
        *,
        commit_timeout_s: float,
        batch_commands_max: int,
        in_flight_max: int = 64,
    ) -> None:
        self.node = node
        self.loop = loop
        self.commit_timeout_s = commit_timeout_s
        self.batch_commands_max = batch_commands_max
        self.in_flight = asyncio.Semaphore(in_flight_max)  # bounded: see research on forwarding
        self.queue: deque[_Pending] = deque()
        self.flush_scheduled = False
        # Results arriving from the Raft thread: one loop wake-up per burst, not per entry
        # (call_soon_threadsafe writes to a pipe each time, and syscalls are dear here).
        self._inbox: deque[tuple[list[_Pending], Any, int, asyncio.Future[None]]] = deque()
        self._inbox_lock = threading.Lock()
        self._inbox_scheduled = False
        # Set when the node stops: a failed proposal is then not retried. The HTTP server's
        # stop waits for the requests in flight, and a write retrying for a leader that will not
        # come (twice the commit timeout) held a node's stop that long.
        self.stopping = False
        self.proposals = 0  # log entries proposed (for metrics)
        self.commands = 0  # commands carried by them
        self.failures: dict[str, int] = {}
        # Entries proposed and not resolved yet, by id(done): `leadership_lost` answers them.
        self._in_flight: dict[int, tuple[list[_Pending], asyncio.Future[None]]] = {}
        self.commit_latency = Histogram()  # one log entry: proposed -> applied on this node
        self.batch_sizes = Histogram(BATCH_BUCKETS)  # commands per log entry

    # -- one attempt --------------------------------------------------------------------------

    async def propose(self, command: Command) -> Result:
        """Propose once; raise NotApplied or Indeterminate when it did not (surely) commit."""
        frame, fingerprint = codec.encode_request(command)
        return await self.propose_frame(frame, (command, fingerprint))

    async def propose_frame(
        self, frame: bytes, decoded: tuple[Command, int | None] | None = None
    ) -> Result:
        """`propose`, for a command already encoded (the member book's: cluster/membership);
        `decoded` is the core command it encodes and its fingerprint, which this node's apply
        then takes as they are (`StateMachine.expect`)."""
        is_voter = getattr(self.node, "is_voter", None)
        if is_voter is not None and not is_voter():
            # A joining node before it is added, a removed one after: nothing it proposes
            # could be its to answer for (a removed node would only wait for a leader).
            self._count("not_member")
            raise NotApplied("this node is not a member of the cluster", reason="not_member")
        if self.stopping:  # a request the HTTP server took just before it closed
            self._count("stopping")
            raise NotApplied("this node is stopping", reason="stopping")
        if len(frame) > FRAME_BYTES_MAX:
            raise TooLarge(
                f"the command is {len(frame)} bytes encoded; the limit is {FRAME_BYTES_MAX}"
            )
        future: asyncio.Future[Result] = self.loop.create_future()
        if decoded is not None:
            self.node.machine.expect(frame, *decoded)
        self.queue.append(_Pending(frame, future))
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.commit_timeout_s)
        except TimeoutError:
            self._count("timeout")
            # Nobody awaits it any more: its late failure is expected, not worth asyncio's
            # "exception was never retrieved" at error level.
            future.add_done_callback(_retrieve)
            raise Indeterminate(f"not committed within {self.commit_timeout_s:g} s") from None

    def _flush(self) -> None:
        self.flush_scheduled = False
        while self.queue:
            batch: list[_Pending] = []
            size = 0
            while self.queue and len(batch) < self.batch_commands_max:
                pending = self.queue[0]
                if batch and size + pending.size > ENTRY_BYTES_MAX:
                    break
                batch.append(self.queue.popleft())
                size += pending.size
            self.loop.create_task(self._send(batch))

    async def _send(self, batch: list[_Pending]) -> None:
        async with self.in_flight:
            done = self.loop.create_future()

            proposed = time.monotonic()

            def callback(results: Any, reason: int) -> None:  # on the Raft thread
                self.commit_latency.observe(time.monotonic() - proposed)
                self._deliver(batch, results, reason, done)

            self.proposals += 1
            self.commands += len(batch)
            self.batch_sizes.observe(len(batch))
            self._in_flight[id(done)] = (batch, done)
            try:
                self.node.machine.apply(encode_batch([p.frame for p in batch]), callback=callback)
            except Exception as error:  # a closed node or a full queue
                self._resolve(batch, None, FAIL_REASON.QUEUE_FULL, done, error)
            # Hold the in-flight slot until the entry resolves or its callers gave up.
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done, self.commit_timeout_s)
            finally:
                self._in_flight.pop(id(done), None)
            self.node.machine.forget([p.frame for p in batch])

    def stop(self) -> None:
        """The node stops: nothing is retried, and each caller waiting for a commit is told now
        that its outcome is unknown (the entry may still commit; a client retries with the
        same request id through another node), so the HTTP server's stop, which waits for the
        requests in flight, does not wait a commit timeout for them."""
        self.stopping = True
        waiting = [p for batch, _ in self._in_flight.values() for p in batch] + list(self.queue)
        for pending in waiting:
            if not pending.future.done():
                pending.future.set_exception(Indeterminate(
                    "this node is stopping: the outcome is unknown", reason="stopping"))

    def leadership_lost(self) -> None:
        """On the Raft thread, when this node stops leading: what it proposed as leader may
        still commit under the next leader, or never; PySyncObj answers it only once the
        index is applied, which on a node that stalled (a slow disk) took past the commit
        timeout. Answer "leader changed" now: `submit` sends it again with the same request
        id through the new leader, and the state machine answers a repeat with the first
        result, so nothing is applied twice. A late real answer finds the futures done."""
        for batch, done in list(self._in_flight.values()):
            self._deliver(batch, None, FAIL_REASON.LEADER_CHANGED, done)

    def _deliver(
        self, batch: list[_Pending], results: Any, reason: int, done: asyncio.Future[None]
    ) -> None:
        """On the Raft thread: queue a result; wake the loop only if it is not already due."""
        self._inbox.append((batch, results, reason, done))
        with self._inbox_lock:
            if self._inbox_scheduled:
                return
            self._inbox_scheduled = True
        self.loop.call_soon_threadsafe(self._drain_inbox)

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            self._inbox_scheduled = False
        while self._inbox:
            self._resolve(*self._inbox.popleft())

    def _resolve(
        self,
        batch: list[_Pending],
        results: Any,
        reason: int,
        done: asyncio.Future[None],
        error: Exception | None = None,
    ) -> None:
        if not done.done():
            done.set_result(None)
        if (
            reason == FAIL_REASON.SUCCESS
            and isinstance(results, list)
            and len(results) == len(batch)
        ):
            for pending, result in zip(batch, results, strict=True):
                if not pending.future.done():
                    pending.future.set_result(result)
            return
        if reason == FAIL_REASON.SUCCESS:
            # The whole entry was refused by the state machine (it did not decode as a batch).
            rejected = (
                results if isinstance(results, Rejected) else Rejected("invalid", "entry refused")
            )
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_result(rejected)
            return
        name = _reason_name(reason)
        self._count(name)
        for pending in batch:
            if pending.future.done():
                continue
            if reason in _DEFINITE:
                pending.future.set_exception(
                    NotApplied(
                        f"not applied: {name}" + (f" ({error})" if error else ""), reason=name
                    )
                )
            else:
                pending.future.set_exception(Indeterminate(f"outcome unknown: {name}", reason=name))

    def _count(self, name: str) -> None:
        self.failures[name] = self.failures.get(name, 0) + 1

    async def propose_together(self, commands: list[Command]) -> list[Result]:
        """Propose several commands as ONE log entry: nothing can be applied between them."""
        frames = [codec.encode(command) for command in commands]
        futures: list[asyncio.Future[Result]] = [self.loop.create_future() for _ in frames]
        batch = [_Pending(frame, future) for frame, future in zip(frames, futures, strict=True)]
        self.loop.create_task(self._send(batch))
        try:
            return list(await asyncio.wait_for(asyncio.gather(*futures), self.commit_timeout_s))
        except TimeoutError:
            self._count("timeout")
            raise Indeterminate(f"not committed within {self.commit_timeout_s:g} s") from None

    # -- until a deadline -------------------------------------------------------------------

    async def submit(
        self,
        command: Command,
        *,
        deadline_s: float | None = None,
        on_retry: Callable[[Exception], None] | None = None,
    ) -> Result:
        """Propose, retrying failures with the same request id until the deadline."""
        retriable = getattr(command, "request_id", None) is not None
        deadline = time.monotonic() + (
            deadline_s if deadline_s is not None else 2 * self.commit_timeout_s
        )
        delay_s = 0.05
        while True:
            try:
                return await self.propose(command)
            except ProposalFailed as error:
                if not retriable or error.reason == "not_member" or self.stopping or \
                        time.monotonic() + delay_s >= deadline:
                    raise  # a node that is not a member stays one for long: answer now
                if on_retry is not None:
                    on_retry(error)
                if error.reason in _LEADERLESS:
                    await self._until_leader(delay_s)
                else:
                    await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 0.5)

    async def _until_leader(self, most_s: float) -> None:
        """Wait until this node knows a leader, for at most `most_s`.

        An election takes tens of milliseconds once it starts; a blind doubling backoff after
        "no leader" (0.05 + 0.1 + 0.2 + 0.4 s) put up to 0.75 s of sleep on top of a failover.
        """
        give_up = time.monotonic() + most_s
        while True:
            await asyncio.sleep(LEADER_POLL_S)
            if self.node.leader_id() is not None or time.monotonic() >= give_up:
                return


def _retrieve(future: asyncio.Future[Result]) -> None:
    if not future.cancelled():
        future.exception()


def _reason_name(reason: int) -> str:
    for name in (
        "QUEUE_FULL",
        "MISSING_LEADER",
        "DISCARDED",
        "NOT_LEADER",
        "LEADER_CHANGED",
        "REQUEST_DENIED",
        "UNKNOWN_OUTCOME",
    ):
        if getattr(FAIL_REASON, name, None) == reason:
            return name.lower()
    return f"reason_{reason}"
