"""How fast a member fills a missing archive from a peer (DESIGN.md §9.2): the catch-up of a
new member's archive, measured through the real path, the peer's `GET
/v1/cluster/archive/rows` route answering from its SQLite file over loopback HTTP, and this
member's filler and writer thread writing the rows into its own.

`python -m raftcron.cluster.dev.bench.fillbench --rows 1000000 [--payload-bytes 0]`: makes a
peer's archive of that many finished jobs (a real job view each, numbered 1..N) in a temporary
directory, fsync durability on both sides, then times the fill of the gap [1, N] and prints
rows/s and the projection for 10 M rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from raftcron.cluster.archive.fill import ArchiveFiller
from raftcron.cluster.archive.node import NodeArchive
from raftcron.cluster.archive.store import ArchiveStore, Row
from raftcron.cluster.archive.writer import ArchiveWriter
from raftcron.cluster.clients.peerhttp import PeerDialer
from raftcron.cluster.http import archive as archive_routes
from raftcron.cluster.http.common import SERVICES
from raftcron.scheduler.commands import Ack
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.views import job_view

BATCH_ROWS = 5_000  # rows per transaction while making the peer's archive


def template(payload_bytes: int) -> dict[str, Any]:
    """A finished job's view as the archive keeps it (from the core, with its history)."""
    d = Driver()
    payload = {"customer": {"id": 1}, **({"blob": "x" * payload_bytes} if payload_bytes else {})}
    [job_id] = d.submit_many(1, task="invoice", payload=payload, max_attempts=1)
    [(claimed, token)] = d.claim(max=1)
    d.claim(max=0, acks=(Ack(claimed, token, "succeeded", result={"ok": True}),))
    return job_view(d.state.job(job_id))


def fill_peer(store: ArchiveStore, rows: int, view: dict[str, Any]) -> None:
    for first in range(1, rows + 1, BATCH_ROWS):
        batch = []
        for job_id in range(first, min(rows + 1, first + BATCH_ROWS)):
            doc = {**view, "id": job_id, "payload": {**view["payload"],
                                                       "customer": {"id": job_id % 1000}}}
            batch.append(Row.of_view(doc, job_id, job_id))
        store.write(batch, first)


@dataclass
class _Config:
    node_id: str = "peer"


@dataclass
class _Node:
    archive: NodeArchive


@dataclass
class _Services:
    node: _Node
    config: _Config


def serve_peer(peer_dir: str, ports: multiprocessing.Queue[int]) -> None:
    """The peer, in a process of its own as on another member: its archive's rows route."""

    async def serve() -> None:
        peer_store = ArchiveStore(peer_dir)
        peer = NodeArchive(peer_store, ArchiveWriter(peer_store),
                           ArchiveStore(peer_dir, readonly=True))
        app = web.Application()
        # The route reads node.archive and config.node_id only.
        app[SERVICES] = _Services(_Node(peer), _Config())  # type: ignore[misc]
        app.add_routes(archive_routes.routes())
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        ports.put(runner.addresses[0][1])
        await asyncio.Event().wait()  # until the measuring process terminates it

    asyncio.run(serve())


async def measure(directory: Path, rows: int, payload_bytes: int) -> dict[str, Any]:
    peer_dir, member_dir = directory / "peer", directory / "member"
    peer_dir.mkdir()
    member_dir.mkdir()
    started = time.monotonic()
    peer_store = ArchiveStore(str(peer_dir))
    fill_peer(peer_store, rows, template(payload_bytes))
    peer_store.close()
    made_s = time.monotonic() - started
    spawn = multiprocessing.get_context("spawn")
    ports: multiprocessing.Queue[int] = spawn.Queue()
    server = spawn.Process(target=serve_peer, args=(str(peer_dir), ports), daemon=True)
    server.start()
    try:
        address = f"127.0.0.1:{ports.get(timeout=60)}"
        return await _fill(member_dir, address, rows, payload_bytes, made_s)
    finally:
        server.terminate()
        server.join(10)


async def _fill(member_dir: Path, address: str, rows: int, payload_bytes: int,
                made_s: float) -> dict[str, Any]:
    writer = ArchiveWriter(ArchiveStore(str(member_dir)))
    writer.start()
    filler = ArchiveFiller(writer, PeerDialer("http", None), lambda: [("peer", address)])
    try:
        writer.restored(rows + 1, 1)  # a snapshot past every eviction: all of it missing
        deadline = time.monotonic() + 10
        while not writer.gaps and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        filler.start()
        deadline = started + 3_600
        while writer.gaps and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        took_s = time.monotonic() - started
    finally:
        await filler.stop()
        writer.stop()
    member = ArchiveStore(str(member_dir), readonly=True)
    totals = member.totals()
    return {"rows": rows, "payload_bytes": payload_bytes, "filled_rows": totals["rows"],
            "missing": totals["missing_jobs"], "peer_made_s": round(made_s, 1),
            "fill_s": round(took_s, 2), "rows_per_s": round(rows / took_s),
            "projected_10m_min": round(10_000_000 / (rows / took_s) / 60, 1),
            "member_file_mb": round(totals["file_bytes"] / 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--payload-bytes", type=int, default=0)
    parser.add_argument("--dir", help="where to make the two archives (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error("--rows must be at least 1")
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        figures = asyncio.run(measure(Path(directory), args.rows, args.payload_bytes))
    print(json.dumps(figures))
    return 0 if figures["filled_rows"] == args.rows and figures["missing"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
