"""`GET /v1/cluster/backup`: a consistent snapshot of this node's state, streamed.

The node makes a snapshot now (PySyncObj's compaction: a forked child serializes the state as
of one applied entry, so the Raft thread is not held while it is written), waits until a
snapshot covering at least every entry applied when the request came is current, and streams
that file, its headers naming its index, term and the cluster whose node wrote it (the body's
first key, `cluster_name_in`; "unknown" for a snapshot of a release before cluster names,
which a follower may hold until its next compaction). The open file is what is sent: a newer
snapshot made current meanwhile replaces the name, not the bytes being read. Reads happen off
the event loop.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from raftcron.cluster.http import bounds
from raftcron.cluster.http.common import HttpError, requires, services
from raftcron.cluster.storage.raftlog import LogDamaged
from raftcron.cluster.storage.snapshots import cluster_name_in, read_header

CHUNK_BYTES = 256 * 1024


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
        await asyncio.sleep(0.05)
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
        response = web.StreamResponse(headers={
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'attachment; filename="raftcron-{index}.snapshot"',
            "X-Raftcron-Snapshot-Index": str(index),
            "X-Raftcron-Snapshot-Term": str(term),
            "X-Raftcron-Cluster-Name": cluster_name_in(chunk) or "unknown",
            "X-Raftcron-Node": node.config.node_id,
        })
        await response.prepare(request)
        while chunk:
            await response.write(chunk)
            chunk = await loop.run_in_executor(None, handle.read, CHUNK_BYTES)
        await response.write_eof()
        return response
    finally:
        handle.close()


def routes() -> list[web.RouteDef]:
    return [web.get("/v1/cluster/backup", get_backup)]
