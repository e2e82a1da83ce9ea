"""`ClaimWaiters`: the long-polling claims of this node, woken per queue from the Raft thread.

The replica calls `on_applied` after every applied entry (on the Raft thread, so it must be
cheap and never block); the HTTP claim route waits on `wait` (on the event loop). It lives
here, beside the replica that drives it, rather than in the HTTP module: the Raft thread
calls nothing of the API.
"""

from __future__ import annotations

import asyncio
import threading

from raftcron.scheduler.state import SchedulerState
from raftcron.scheduler.views import queues_with_work


class ClaimWaiters:
    """Wakes the long-polling claims of a queue when jobs in that queue may have become
    claimable. Per queue: a job queued in one queue wakes no claim waiting on others (500
    waiters on an idle queue cost a tenth of a core when every entry woke them all)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.events: dict[str, asyncio.Event] = {}  # queue -> the event its waiters wait on
        self.counts: dict[str, int] = {}  # queue -> waiters (on the loop thread)
        # The queues with waiters, replaced whole on the loop thread and read by the Raft
        # thread: a tuple is never seen half-changed.
        self.watched: tuple[str, ...] = ()
        self.lock = threading.Lock()  # guards `due` between the Raft thread and the loop
        self.due: set[str] = set()  # queues to wake, collected on the Raft thread
        self.closed = False  # the node is stopping: no claim waits any more

    def close(self) -> None:
        """The node is stopping: wake every waiting claim, and let none wait again (a long
        poll of up to 30 s must not hold a node's stop; its worker claims elsewhere)."""
        self.closed = True
        for event in self.events.values():
            event.set()
        self.events.clear()

    @property
    def waiting(self) -> int:
        return sum(self.counts.values())

    def on_applied(self, state: SchedulerState) -> None:
        """On the Raft thread, after every applied entry: cheap, and at most one wake queued."""
        watched = self.watched
        if not watched:
            return
        due = queues_with_work(state, watched)
        if not due:
            return
        with self.lock:
            first = not self.due
            self.due.update(due)
        if first:
            self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self.lock:
            due, self.due = self.due, set()
        for queue in sorted(due):
            event = self.events.pop(queue, None)
            if event is not None:
                event.set()

    async def wait(self, queues: tuple[str, ...], timeout_s: float) -> None:
        if self.closed:
            return
        events = []
        for queue in queues:
            event = self.events.get(queue)
            if event is None:
                event = self.events[queue] = asyncio.Event()
            events.append(event)
            self.counts[queue] = self.counts.get(queue, 0) + 1
        self.watched = tuple(sorted(self.counts))
        waits = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            for queue in queues:
                self.counts[queue] -= 1
                if not self.counts[queue]:
                    del self.counts[queue]
                    if queue in self.events and not self.events[queue].is_set():
                        del self.events[queue]
            self.watched = tuple(sorted(self.counts))
