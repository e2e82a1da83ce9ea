"""Which members this node reaches over Raft: `raftcron_member_reachable` (cluster/ops/metrics.py),
what the "member down" and "quorum at risk" alerts read (deploy/monitoring/alerts.yml).

The rule it owns: a member is reachable while PySyncObj's transport holds a connection to it,
and for `bound_s` after it was last seen holding one, so a link dropped and dialled again
within a connection retry, or a scrape that lands between the two, is no member down. A member
never seen connected counts from when this node first listed it (the node's start, or the
change that made it a member). This node always reaches itself. The node sets `bound_s` to
`raft.connection_timeout_s`: the silence after which PySyncObj gives up a connection itself.

`ReachBook` takes time in (monotonic seconds) and decides nothing else; `ReachWatch` samples
the transport every `SAMPLE_S` on the event loop (a set lookup per member, not the Raft
thread's work), so a member's last connection is known to a sample whatever the scrape interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from raftcron.cluster.membership.book import Member

SAMPLE_S = 0.25


@dataclass
class ReachBook:
    """Each member's last moment seen connected (monotonic seconds), as this node samples it."""

    node_id: str
    bound_s: float
    seen_s: dict[str, float] = field(default_factory=dict)

    def observe(self, connected: dict[str, bool], now_s: float) -> None:
        """One sample: member id -> whether the transport holds a connection to it now. The
        members not in it are no longer members and are forgotten."""
        self.seen_s = {
            member: now_s if up or member == self.node_id else self.seen_s.get(member, now_s)
            for member, up in connected.items()
        }

    def reachable(self, now_s: float) -> dict[str, bool]:
        """Member id -> reachable: seen connected at most `bound_s` ago."""
        return {member: member == self.node_id or now_s - seen <= self.bound_s
                for member, seen in sorted(self.seen_s.items())}


class ReachWatch:
    """Samples whom the Raft transport is connected to into a `ReachBook`, until stopped."""

    def __init__(self, book: ReachBook, members: Callable[[], Iterable[Member]],
                 connected: Callable[[str], bool]) -> None:
        self.book = book
        self.members = members  # the members now (cluster/membership/directory.py)
        self.connected = connected  # raft address -> the transport holds a connection to it
        self._task: asyncio.Task[None] | None = None

    def sample(self, now_s: float) -> None:
        self.book.observe(
            {member.node_id: member.node_id == self.book.node_id
             or self.connected(member.raft_address) for member in self.members()},
            now_s,
        )

    def start(self) -> None:
        self.sample(time.monotonic())  # the first scrape finds every member listed
        self._task = asyncio.get_running_loop().create_task(self.run(), name="reach-watch")

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            self.sample(time.monotonic())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
