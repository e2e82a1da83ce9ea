"""`GET /v1/cluster/backup` and `GET /v1/cluster/backup/archive`: a consistent copy of this
node's state, and of its archive, streamed.

The state: the node makes a snapshot now (PySyncObj's compaction: a forked child serializes the
state as of one applied entry, so the Raft thread is not held while it is written), waits until
a snapshot covering at least every entry applied when the request came is current, and streams
that file, its headers naming its index, term and the cluster whose node wrote it (the body's
first key, `cluster_name_in`; "unknown" for a snapshot of a release before cluster names,
which a follower may hold until its next compaction). The open file is what is sent: a newer
snapshot made current meanwhile replaces the name, not the bytes being read.

The archive (DESIGN.md §9.2): once the node has applied `min_index` (the snapshot's, for
`raftcron backup --with-archive`) and its archive has made durable every job the entries up to
then removed, a copy of the archive as of one commit (cluster/archive/copies.py) goes to a
temporary file in the data dir and is streamed from there. So the archive covers every eviction
the snapshot does. One at a time per node (a copy may be as large as the archive, and the
disk must keep room for it: the node answers 507 rather than fill the disk its log is on).

Reads happen off the event loop; a client that goes away mid-stream ends the stream, which
frees the copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import BinaryIO

from aiohttp import web

from raftcron.cluster.archive.copies import ArchiveCopier, ArchiveFile
from raftcron.cluster.archive.node import NodeArchive
from raftcron.cluster.archive.store import ArchiveError
from raftcron.cluster.consensus.replica import RaftNode
from raftcron.cluster.http import bounds
from raftcron.cluster.http.common import (
    CALLER,
    HttpError,
    query_int,
    requires,
    services,
    unavailable,
)
from raftcron.cluster.storage.raftlog import LogDamaged
from raftcron.cluster.storage.snapshots import cluster_name_in, read_header

log = logging.getLogger("raftcron.http")
CHUNK_BYTES = 256 * 1024
POLL_S = 0.05  # how often a backup looks whether what it waits for happened
CLIENT_POLL_S = 0.5  # how often an archive copy being made looks whether its client left


@requires("manage")
async def get_backup(request: web.Request) -> web.Response | web.StreamResponse:
    node = services(request).node
    snapshots = node.storage.snapshots
    wanted = node.applied_index
    node.sync.forceLogCompaction()
    deadline = time.monotonic() + bounds.BACKUP_WAIT_S
    while snapshots.current is None or snapshots.current.index < wanted:
        if time.monotonic() >= deadline:
            raise HttpError(503, "unavailable", f"no snapshot covering index {wanted} was made "
                            f"within {bounds.BACKUP_WAIT_S} s; retry (see the node's log)")
        await asyncio.sleep(POLL_S)
    loop = asyncio.get_running_loop()
    handle = await loop.run_in_executor(None, open, snapshots.path, "rb")
    try:
        # The headers name the file being sent: a newer snapshot may have been made current
        # between the wait and the open, and its header is the one that counts.
        chunk = await loop.run_in_executor(None, handle.read, CHUNK_BYTES)
        try:
            index, term, _, _ = read_header(chunk, snapshots.path)
        except LogDamaged as error:  # this node's own snapshot: another node may serve one
            raise HttpError(503, "unavailable", str(error)) from None
        return await _stream(request, handle, chunk, "backup", {
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'attachment; filename="raftcron-{index}.snapshot"',
            "X-Raftcron-Snapshot-Index": str(index),
            "X-Raftcron-Snapshot-Term": str(term),
            "X-Raftcron-Cluster-Name": cluster_name_in(chunk) or "unknown",
        })
    finally:
        handle.close()


@requires("manage")
async def get_archive_backup(request: web.Request) -> web.StreamResponse:
    node = services(request).node
    node_id = node.config.node_id
    archive = node.archive
    if archive is None:
        raise HttpError(404, "not_found", f"node {node_id} keeps no archive ([storage] archive "
                        "= false in its config): ask a node that keeps one")
    min_index = query_int(request, "min_index", default=0, low=0, high=bounds.CURSOR_MAX) or 0
    if not archive.whole:  # it installed a snapshot past evictions: filling from a peer
        raise HttpError(503, "unavailable", f"node {node_id} misses part of its archive and "
                        "fills it from a peer: ask another member")
    if archive.copying is not None:
        raise HttpError(409, "backup_in_progress", f"an archive backup is already being made "
                        f"on node {node_id} ({archive.copying}): one at a time per node; "
                        "retry once it is done, or ask another node")
    caller = request.get(CALLER)
    archive.copying = (f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC by "
                       f"{(caller and (caller.name or caller.role)) or 'a caller'} from "
                       f"{request.remote}")
    try:
        through_index = await _archive_through(node, archive, min_index)
        await _check_room(node, archive)
        copied, handle = await _copy(request, node.storage.directory)
        try:
            return await _stream(request, handle, b"", "archive backup", {
                "Content-Type": "application/vnd.sqlite3",
                "Content-Length": str(copied.size_bytes),
                "Content-Disposition":
                    f'attachment; filename="raftcron-{through_index}.archive"',
                "X-Raftcron-Archive-Index": str(through_index),
                "X-Raftcron-Archive-Rows": str(copied.rows),
                "X-Raftcron-Archive-Bytes": str(copied.size_bytes),
            })
        finally:
            handle.close()
    finally:
        archive.copying = None


async def _archive_through(node: RaftNode, archive: NodeArchive, min_index: int) -> int:
    """Wait (bounded) until the node applied `min_index` and its archive holds every job the
    entries up to what it applied then removed; that index."""
    if min_index > node.commit_index:  # not even known committed here: waiting is no use
        raise HttpError(409, "index_not_committed", f"node {node.config.node_id} knows the log "
                        f"committed up to index {node.commit_index}, not up to {min_index}: "
                        "ask another node, or for a smaller min_index", "min_index")
    deadline = time.monotonic() + bounds.BACKUP_WAIT_S
    while node.applied_index < min_index:
        if time.monotonic() >= deadline:
            raise unavailable(f"node {node.config.node_id} has applied the log up to index "
                              f"{node.applied_index}, not up to {min_index}, within "
                              f"{bounds.BACKUP_WAIT_S} s: it lags; ask another node")
        await asyncio.sleep(POLL_S)
    wanted = node.applied_index
    while not archive.writer.durable_through(wanted):
        if time.monotonic() >= deadline:
            problem = archive.writer.problem
            raise unavailable(f"the archive of node {node.config.node_id} has not written the "
                              f"jobs that left the state up to index {wanted} within "
                              f"{bounds.BACKUP_WAIT_S} s"
                              + (f" ({problem})" if problem else "; retry"))
        await asyncio.sleep(POLL_S)
    return wanted


async def _check_room(node: RaftNode, archive: NodeArchive) -> None:
    """507 unless the data dir's filesystem has room for a copy of the archive (at most its
    size on disk) and the reserve the log and snapshots keep writing into meanwhile."""
    needed = await asyncio.to_thread(archive.store.file_bytes)
    free = await asyncio.to_thread(node.storage.free_bytes)
    reserve = bounds.ARCHIVE_COPY_RESERVE_BYTES
    if free < needed + reserve:
        raise HttpError(507, "no_space", f"node {node.config.node_id} has {free} bytes free on "
                        f"its data dir's filesystem; a copy of its archive takes up to {needed} "
                        f"bytes there, and {reserve} more stay free for its log and snapshots: "
                        "make room, or ask another node")


async def _copy(request: web.Request, directory: str) -> tuple[ArchiveFile, BinaryIO]:
    """The archive copied (off the event loop), stopped if the client leaves meanwhile."""
    try:
        copier = ArchiveCopier(directory)
    except ArchiveError as error:
        raise unavailable(str(error)) from None
    work = asyncio.get_running_loop().run_in_executor(None, copier.copy)
    try:
        while not work.done():
            await asyncio.wait({work}, timeout=CLIENT_POLL_S)
            if not work.done() and _client_left(request):
                copier.interrupt()
        return work.result()
    except asyncio.CancelledError:  # the node stops: the copy stops too, and is freed
        copier.interrupt()
        work.add_done_callback(
            lambda done: done.cancelled() or done.exception() or done.result()[1].close())
        raise
    except ArchiveError as error:
        if _client_left(request):
            log.warning("archive backup abandoned while copying: the client went away",
                        extra={"action": "backup_abandoned"})
        raise unavailable(f"{error}; retry (see the node's log)") from None


def _client_left(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _stream(request: web.Request, handle: BinaryIO, first: bytes, what: str,
                  headers: dict[str, str]) -> web.StreamResponse:
    """Send `first`, then the rest of `handle`, read off the event loop. A client that goes
    away ends it: logged, not an error of the node's. The headers every answer has are set
    here: the middleware's come after the stream's head is sent."""
    loop = asyncio.get_running_loop()
    node = services(request).node
    response = web.StreamResponse(headers={
        **headers, "X-Raftcron-Node": node.config.node_id,
        "X-Raftcron-Applied-Index": str(node.applied_index)})
    sent = 0
    try:
        await response.prepare(request)
        chunk = first or await loop.run_in_executor(None, handle.read, CHUNK_BYTES)
        while chunk:
            await response.write(chunk)
            sent += len(chunk)
            chunk = await loop.run_in_executor(None, handle.read, CHUNK_BYTES)
        await response.write_eof()
    except ConnectionResetError:  # aiohttp's own when the client is gone
        log.warning("%s abandoned after %d bytes: the client went away", what, sent,
                    extra={"action": "backup_abandoned", "sent_bytes": sent})
    except asyncio.CancelledError:  # the node stops (or a server that cancels on a hang-up)
        log.warning("%s abandoned after %d bytes: cancelled", what, sent,
                    extra={"action": "backup_abandoned", "sent_bytes": sent})
        raise
    return response


def routes() -> list[web.RouteDef]:
    return [web.get("/v1/cluster/backup", get_backup),
            web.get("/v1/cluster/backup/archive", get_archive_backup)]
