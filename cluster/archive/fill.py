"""Filling a member's archive from its peers (DESIGN.md §9.2): the same answers on every member.

A member that installed a snapshot past evictions it never wrote (a new member, one rejoined
empty, one far behind) records the missing archive numbers as gaps (store.py, writer.py). The
filler asks the other members in turn for the rows of its lowest gap (`GET
/v1/cluster/archive/rows`, with the nodes' own peer credential): each answers with the rows it
holds and how far its answer covers (never past a gap of its own, nor past what it has
written), and the writer thread writes them; a gap no member can answer yet is asked again
later, backing off. Meanwhile reads this member cannot answer are asked of a peer
(`forward_read`): a job by id not found here, and searches of the archive, go to a member
whose archive is whole, which answers from its own (`LOCAL_HEADER`: never passed on again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from raftcron.cluster.archive.store import ArchiveError, Row
from raftcron.cluster.archive.writer import ArchiveWriter
from raftcron.cluster.clients.peerhttp import PeerDialer

log = logging.getLogger("raftcron.archive")

ASK_TIMEOUT_S = 30.0  # one answer of at most 4 MB of rows
IDLE_S = 1.0  # how often a member without gaps looks again
RETRY_S_MIN, RETRY_S_MAX = 1.0, 30.0  # a gap no member could answer is asked again, backing off
FORWARD_TIMEOUT_S = 10.0
LOCAL_HEADER = "X-Raftcron-Archive-Local"  # a forwarded read: answer from this member only
COMPLETE_HEADER = "X-Raftcron-Archive-Complete"  # "1": the answering member misses nothing

# The other members, as (node id, HTTP address): the membership's current view.
Peers = Callable[[], Sequence[tuple[str, str]]]


class ArchiveFiller:
    def __init__(self, writer: ArchiveWriter, dialer: PeerDialer, peers: Peers) -> None:
        self.writer = writer
        self.dialer = dialer
        self.peers = peers
        self.filled_rows = 0
        self.unanswered: tuple[int, int] | None = None  # the gap no member could answer, yet
        self._task: asyncio.Task[None] | None = None
        self._next_peer = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="archive-filler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        retry_s = RETRY_S_MIN
        timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                gaps = self.writer.gaps
                if not gaps:
                    self.unanswered = None
                    await asyncio.sleep(IDLE_S)
                    continue
                lo, hi = gaps[0]
                try:
                    if await self._fill_from_a_peer(session, lo, hi):
                        retry_s = RETRY_S_MIN
                        continue
                except Exception:  # a bug must not end the filling for good: said, retried
                    log.exception("filling the archive failed; retrying",
                                  extra={"action": "archive_fill_failed"})
                if self.unanswered != (lo, hi):
                    log.warning("no member can give the archive's jobs numbered %d to %d yet; "
                                "asking again", lo, hi - 1,
                                extra={"action": "archive_fill_waiting"})
                self.unanswered = (lo, hi)
                await asyncio.sleep(retry_s)
                retry_s = min(RETRY_S_MAX, retry_s * 2)

    async def _fill_from_a_peer(self, session: aiohttp.ClientSession, lo: int, hi: int) -> bool:
        """Ask the peers in turn (from the one after the last that answered) for the rows of
        [lo, hi); the first answer that covers anything is written. Whether one did."""
        peers = list(self.peers())
        for turn in range(len(peers)):
            node_id, address = peers[(self._next_peer + turn) % len(peers)]
            answer = await self._ask(session, node_id, address, lo, hi)
            if answer is None:
                continue
            rows, to = answer
            if to <= lo:
                continue
            try:
                added = await asyncio.wrap_future(self.writer.fill(rows, lo, to))
            except ArchiveError as error:
                log.error("%s", error, extra={"action": "archive_fill_failed"})
                return False
            self.filled_rows += added
            self._next_peer = (self._next_peer + turn) % len(peers)
            log.info("archive filled from %s: jobs numbered %d to %d (%d rows)", node_id, lo,
                     to - 1, added, extra={"action": "archive_filled"})
            return True
        return False

    async def _ask(self, session: aiohttp.ClientSession, node_id: str, address: str, lo: int,
                   hi: int) -> tuple[list[Row], int] | None:
        url = self.dialer.url(address, f"/v1/cluster/archive/rows?from_seq={lo}&to_seq={hi}")
        try:
            async with session.get(url, ssl=self.dialer.ssl,
                                   headers=self.dialer.headers) as answer:
                body = await answer.json() if answer.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.debug("archive rows from %s: %s", node_id, error)
            return None
        try:
            return parse_rows_answer(body, lo, hi)
        except ValueError as error:
            log.error("%s answered the archive's rows with %s; not written", node_id, error,
                      extra={"action": "archive_fill_refused"})
            return None


def parse_rows_answer(body: Any, lo: int, hi: int) -> tuple[list[Row], int]:
    """A peer's answer for [lo, hi): its rows and where it covers to; ValueError naming what is
    wrong (a row out of the range asked, a coverage outside it)."""
    if not isinstance(body, dict) or not isinstance(body.get("rows"), list):
        raise ValueError("an answer that is not {rows, to_seq}")
    to = body.get("to_seq")
    if type(to) is not int or not lo <= to <= hi:
        raise ValueError(f"to_seq {to!r} outside [{lo}, {hi}]")
    rows = [Row.of_wire(data) for data in body["rows"]]
    for row in rows:
        if not lo <= row.seq < to:
            raise ValueError(f"row {row.id} numbered {row.seq}, outside [{lo}, {to})")
    return rows, to


async def forward_read(dialer: PeerDialer, peers: Sequence[tuple[str, str]], path_qs: str,
                       authorization: str | None, *,
                       whole: bool) -> tuple[int, dict[str, Any]] | None:
    """Ask the peers in turn for `path_qs` (a GET this member cannot fully answer), answered
    from their own state and archive: the first 200 (`whole`: from a member that misses
    nothing). None when no member did."""
    headers = {LOCAL_HEADER: "1"}
    if authorization:
        headers["Authorization"] = authorization
    timeout = aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for node_id, address in peers:
            try:
                async with session.get(dialer.url(address, path_qs), ssl=dialer.ssl,
                                       headers=headers) as answer:
                    if answer.status != 200:
                        continue
                    if whole and answer.headers.get(COMPLETE_HEADER) != "1":
                        continue
                    body = await answer.json()
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                log.debug("forwarded read to %s: %s", node_id, error)
                continue
            if isinstance(body, dict):
                return 200, body
    return None
