"""The leader's deliverer of notifications: an HTTP POST per outbox entry, signed, retried.

What is delivered and from where is replicated (scheduler/notifications.py): the outbox, and
each notification's cursor. This module only does the I/O, on the node whose `BeginLeadership`
of its current term committed (the ticker's `led_term`), so one node delivers at a time,
two only for the moments a deposed leader does not know it yet (at least once, not exactly):
- one task per notification, posting its entries in order: a receiver sees its events in
  the order the cluster decided them (a retry of one holds back the later ones);
- a POST carries `X-Raftcron-Delivery` (`<name>/<seq>`, the same on every repeat: receivers
  dedupe by it), `X-Raftcron-Event`, and `X-Raftcron-Signature: sha256=<hex HMAC-SHA256 of
  the body with the notification's secret>`; the body's bytes come from the core, so every
  leader signs the same bytes;
- after a 2xx the entry counts as delivered here, and an `AckNotification` up to it is
  proposed (one in flight per notification: a burst of posts is acked by a few entries); a
  leader that dies before its ack committed leaves the entry to the next one, which posts it
  again (same id);
- anything else (no connection, `TIMEOUT_S` passed, a non-2xx) is retried after a backoff of
  `BACKOFF_FIRST_S` doubling to `BACKOFF_MAX_S` (`retry_delay_s`), with +-20 % jitter, for
  as long as the entry is in the outbox (past its retention the core counts it lost).

A dead or slow receiver never slows the cluster: nothing here runs on the Raft thread, every
POST is bounded (`TIMEOUT_S` for the whole exchange, the answer's body never read), at most
`CONCURRENCY` POSTs are in flight whatever the number of notifications, a backoff holds no
slot, and a receiver holds up only its own notification.

Must not: decide anything the state decides (what is pending, what was delivered), or block
the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import aiohttp

from raftcron.cluster.consensus.proposer import ProposalFailed, Proposer
from raftcron.cluster.consensus.replica import RaftNode, StateUnavailable
from raftcron.scheduler.notifications import (
    AckNotification,
    Entry,
    Target,
    delivery_body,
    delivery_id,
    targets,
    view_all,
)

if TYPE_CHECKING:
    from raftcron.scheduler.state import SchedulerState


class MetricWriter(Protocol):
    """What write_metrics needs of cluster/ops/metrics.py's Writer (which imports this module)."""

    def metric(self, name: str, kind: str, help_text: str,
               samples: Iterable[tuple[dict[str, str], float]]) -> None: ...

log = logging.getLogger("raftcron.notifier")

CONCURRENCY = 16  # POSTs in flight at once, over every notification
TIMEOUT_S = 10.0  # one POST, connection to status line
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
POLL_S = 0.25  # how often the outbox and the notifications are looked at
BATCH = 32  # entries read from the state at a time
USER_AGENT = "raftcron-notifier/1"


def retry_delay_s(failures: int, *, first_s: float = BACKOFF_FIRST_S,
                  max_s: float = BACKOFF_MAX_S) -> float:
    """The wait after one entry's `failures`-th failed POST, before jitter: `first_s`, doubled
    after each failure, never over `max_s`."""
    assert failures >= 1, failures
    # A receiver down for days fails thousands of times: 2.0 ** 1024 would overflow a float,
    # and 64 doublings pass any cap worth setting.
    return min(first_s * 2.0 ** min(failures - 1, 64), max_s)


def signature(secret: str, body: bytes) -> str:
    """The `X-Raftcron-Signature` header's value: `sha256=` and the hex HMAC of the body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass
class Counts:
    """This node's deliveries of one notification (not replicated: /metrics)."""

    posted: int = 0  # answered 2xx
    failed: int = 0  # attempts that did not get a 2xx
    last_error: str | None = None


@dataclass
class NotifierStats:
    by_name: dict[str, Counts] = field(default_factory=dict)

    def of(self, name: str) -> Counts:
        return self.by_name.setdefault(name, Counts())


class Notifier:
    def __init__(
        self,
        node: RaftNode,
        proposer: Proposer,
        leading: Callable[[], bool],
        *,
        stats: NotifierStats | None = None,
        timeout_s: float = TIMEOUT_S,
        backoff_first_s: float = BACKOFF_FIRST_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        poll_s: float = POLL_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.node = node
        self.proposer = proposer
        self.leading = leading
        self.stats = stats or NotifierStats()
        self.timeout_s = timeout_s
        self.backoff_first_s = backoff_first_s
        self.backoff_max_s = backoff_max_s
        self.poll_s = poll_s
        self.sleep = sleep  # the wait between retries (a test's own records the delays)
        self.slots = asyncio.Semaphore(CONCURRENCY)
        self.changed = asyncio.Event()  # set when the outbox grew; replaced after each set
        self.workers: dict[str, tuple[int, asyncio.Task[None]]] = {}  # name -> (revision, task)
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="notifier")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._stop_workers(list(self.workers))
        if self._session is not None:
            await self._session.close()

    # -- the supervisor: which notifications this node delivers now -------------------------

    async def run(self) -> None:
        last_seq = -1
        while True:
            try:
                last_seq = await self._step(last_seq)
            except asyncio.CancelledError:
                raise
            except StateUnavailable:  # a snapshot install is replacing the state: next round
                pass
            except Exception:
                log.exception("notifier step failed")
            await asyncio.sleep(self.poll_s)

    async def _step(self, last_seq: int) -> int:
        if not self.leading():
            await self._stop_workers(list(self.workers))
            return -1
        seq, found = self.node.machine.read(lambda state: targets(state.notifications))
        wanted = {target.name: target for target in found}
        await self._stop_workers(
            [name for name, (revision, _) in self.workers.items()
             if name not in wanted or wanted[name].revision != revision]
        )
        for name, target in wanted.items():
            if name not in self.workers:
                task = asyncio.get_running_loop().create_task(
                    self._deliver_all(target), name=f"notify-{name}")
                self.workers[name] = (target.revision, task)
        if seq != last_seq:
            self.changed.set()
            self.changed = asyncio.Event()
        return seq

    async def _stop_workers(self, names: list[str]) -> None:
        tasks = [self.workers.pop(name)[1] for name in names]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- one notification ---------------------------------------------------------------------

    async def _deliver_all(self, target: Target) -> None:
        progress = _Progress(target)
        try:
            while True:
                changed = self.changed
                try:
                    batch: list[Entry] = self.node.machine.read(
                        lambda state: state.notifications.pending(target.name, progress.posted,
                                                                  BATCH))
                except StateUnavailable:  # a snapshot install: as if nothing were pending
                    batch = []
                if not batch:
                    progress.ack_soon(self.proposer)  # an ack that did not commit: again
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), self.poll_s * 4)
                    continue
                for entry in batch:
                    await self._post_until_answered(target, entry)
                    progress.posted = entry[0]
                    progress.ack_soon(self.proposer)
        finally:
            progress.cancel()

    async def _post_until_answered(self, target: Target, entry: Entry) -> None:
        body = delivery_body(target.name, entry)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Raftcron-Delivery": delivery_id(target.name, entry[0]),
            "X-Raftcron-Event": entry[3],
            "X-Raftcron-Signature": signature(target.secret, body),
        }
        counts = self.stats.of(target.name)
        failures = 0
        while True:
            async with self.slots:
                error = await self._post(target.url, body, headers)
            if error is None:
                counts.posted += 1
                return
            counts.failed += 1
            counts.last_error = error
            failures += 1
            delay_s = retry_delay_s(failures, first_s=self.backoff_first_s,
                                    max_s=self.backoff_max_s)
            log.warning(
                "notification %s: delivery %s failed (%s); again in %.1f s",
                target.name, headers["X-Raftcron-Delivery"], error, delay_s,
                extra={"action": "notification_failed", "notification": target.name,
                       "delivery": headers["X-Raftcron-Delivery"], "error": error},
            )
            await self.sleep(delay_s * random.uniform(0.8, 1.2))

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> str | None:
        """One POST: None on a 2xx, else what went wrong. The answer's body is never read."""
        try:
            async with self.session.post(url, data=body, headers=headers,
                                         allow_redirects=False) as response:
                status = response.status
                response.close()  # a receiver's body could be endless: not read, not kept
        except TimeoutError:
            return f"no answer within {self.timeout_s:g} s"
        except (aiohttp.ClientError, OSError, ValueError) as error:
            return f"{type(error).__name__}: {error}"
        return None if 200 <= status < 300 else f"answered {status}"

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=CONCURRENCY),
            )
        return self._session


class _Progress:
    """A notification's progress on this leader: posted (2xx) up to `posted`; an ack up to it
    proposed when none is in flight, and again when it moved on meanwhile."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.posted = target.cursor
        self.acked = target.cursor
        self.task: asyncio.Task[None] | None = None

    def ack_soon(self, proposer: Proposer) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._ack(proposer))

    async def _ack(self, proposer: Proposer) -> None:
        while self.acked < self.posted:
            upto = self.posted
            try:
                await proposer.propose(AckNotification(self.target.name, self.target.revision,
                                                       upto))
            except ProposalFailed as error:
                # Not leading any more, or slow: the next leader posts these again (same ids).
                log.debug("ack of notification %s not committed: %s", self.target.name, error)
                return
            self.acked = upto

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()


def write_metrics(
    out: MetricWriter, state: SchedulerState, stats: NotifierStats | None, node_id: str
) -> None:
    """The notifications' lines of `GET /metrics`: the replicated figures (the same on every
    node) and this node's own POSTs."""
    shown = view_all(state.notifications, state.now_ms)
    if not shown and (stats is None or not stats.by_name):
        return
    out.metric("raftcron_notification_pending", "gauge",
               "Events a notification's receiver has not acknowledged yet (lag in events)",
               [({"notification": n["name"]}, n["pending"]) for n in shown])
    out.metric("raftcron_notification_lag_seconds", "gauge",
               "Age of the oldest event a notification's receiver has not acknowledged",
               [({"notification": n["name"]}, n["lag_ms"] / 1000) for n in shown])
    out.metric("raftcron_notification_delivered_total", "counter",
               "Events delivered (answered 2xx, acknowledged through the log)",
               [({"notification": n["name"]}, n["delivered"]) for n in shown])
    out.metric("raftcron_notification_lost_total", "counter",
               "Events dropped undelivered past the outbox's retention",
               [({"notification": n["name"]}, n["lost"]) for n in shown])
    counts = sorted((stats.by_name if stats is not None else {}).items())
    out.metric("raftcron_notification_posts_total", "counter",
               "POSTs this node made to receivers, by outcome (failed ones are retried)",
               [({"node": node_id, "notification": name, "outcome": outcome}, value)
                for name, c in counts for outcome, value in (("ok", c.posted),
                                                             ("failed", c.failed))])
