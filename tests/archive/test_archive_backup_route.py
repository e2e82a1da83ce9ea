"""`GET /v1/cluster/backup/archive` (cluster/http/backup.py) on an in-process server over a real
archive: the archive whole with headers naming the node, the index it covers, its rows and
bytes; one at a time per node (409 naming the one running); 507 when the disk has no room for
the copy; 404 on a node without an archive; and a client that leaves mid-stream frees the copy
and the slot."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from archives import make_archive
from routeapps import errors_as_answers

from raftcron.cluster.archive.copies import COPY_NAME, check_file
from raftcron.cluster.archive.node import NodeArchive
from raftcron.cluster.archive.store import ArchiveStore
from raftcron.cluster.archive.writer import ArchiveWriter
from raftcron.cluster.http import backup as backup_route
from raftcron.cluster.http import bounds
from raftcron.cluster.http.common import SERVICES

ROUTE = "/v1/cluster/backup/archive"
PLENTY = 1 << 50


def fake_node(directory: Path, *, free_bytes: int = PLENTY, applied_index: int = 40,
              commit_index: int = 45, archive: bool = True) -> Any:
    node_archive = None
    if archive:
        store = ArchiveStore(str(directory))
        node_archive = NodeArchive(store, ArchiveWriter(store),
                                   ArchiveStore(str(directory), readonly=True))
    return SimpleNamespace(
        config=SimpleNamespace(node_id="n2"), applied_index=applied_index,
        commit_index=commit_index,
        archive=node_archive,
        storage=SimpleNamespace(directory=str(directory), free_bytes=lambda: free_bytes))


def serve(node: Any, test: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    """Run `test` against an app of the backup routes for `node`, then close its archive."""
    app = web.Application(middlewares=[errors_as_answers])
    app[SERVICES] = SimpleNamespace(node=node)  # type: ignore[misc]
    app.add_routes(backup_route.routes())

    async def run() -> None:
        async with TestClient(TestServer(app)) as client:
            await test(client)

    try:
        asyncio.run(run())
    finally:
        if node.archive is not None:
            node.archive.reader.close()
            node.archive.store.close()


def copies_open(directory: Path) -> list[str]:
    """The files of this process open on a copy of the archive (deleted or not)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory / COPY_NAME)):
            found.append(target)
    return found


async def error_of(response: Any) -> tuple[int, dict[str, Any]]:
    return response.status, (await response.json())["error"]


def test_the_archive_comes_whole_with_headers_naming_the_node_index_rows_and_bytes(
        tmp_path: Path) -> None:
    make_archive(tmp_path, {n: n for n in range(1, 101)}, payload_bytes=300)
    out = tmp_path / "got.archive"

    async def test(client: TestClient[Any, Any]) -> None:
        response = await client.get(ROUTE, params={"min_index": "40"})
        assert response.status == 200, await response.text()
        out.write_bytes(await response.read())
        headers = response.headers
        assert headers["X-Raftcron-Node"] == "n2"
        assert headers["X-Raftcron-Archive-Index"] == "40"
        assert headers["X-Raftcron-Archive-Rows"] == "100"
        assert headers["X-Raftcron-Archive-Bytes"] == str(out.stat().st_size)
        status, error = await error_of(await client.get(ROUTE, params={"min_index": "x"}))
        assert (status, error["field"]) == (400, "min_index")

    serve(fake_node(tmp_path), test)
    archive = check_file(str(out))
    assert archive.rows == 100 and archive.through_index == 100
    assert copies_open(tmp_path) == [] and COPY_NAME not in os.listdir(tmp_path)


def test_a_client_that_leaves_mid_stream_frees_the_copy_and_the_next_one_may_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # 24 MB: more than the sockets between client and server buffer, so the server is
    # still sending when the client leaves.
    make_archive(tmp_path, {n: n for n in range(1, 3_001)}, payload_bytes=8_000)
    node = fake_node(tmp_path)

    async def test(client: TestClient[Any, Any]) -> None:
        first = await client.get(ROUTE)
        assert first.status == 200
        await first.content.readexactly(256 * 1024)
        assert node.archive.copying is not None
        # One at a time: a second is refused, naming the one being made.
        status, error = await error_of(await client.get(ROUTE))
        assert (status, error["code"]) == (409, "backup_in_progress"), error
        assert "already being made on node n2 (started " in error["message"], error
        first.close()  # the client goes away mid-stream
        deadline = time.monotonic() + 10
        while node.archive.copying is not None or copies_open(tmp_path):
            assert time.monotonic() < deadline, (node.archive.copying, copies_open(tmp_path))
            await asyncio.sleep(0.02)
        again = await client.get(ROUTE)
        assert again.status == 200, await again.text()
        (tmp_path / "got.archive").write_bytes(await again.read())

    with caplog.at_level("WARNING", logger="raftcron.http"):
        serve(node, test)
    # Said as what it is, not as an error of the node's.
    assert [record.getMessage().split(" after ")[0] for record in caplog.records] == [
        "archive backup abandoned"], caplog.text
    assert check_file(str(tmp_path / "got.archive")).rows == 3_000
    assert copies_open(tmp_path) == [] and COPY_NAME not in os.listdir(tmp_path)


def test_a_node_without_room_for_the_copy_answers_507_and_makes_none(tmp_path: Path) -> None:
    make_archive(tmp_path, {n: n for n in range(1, 11)})
    node = fake_node(tmp_path, free_bytes=bounds.ARCHIVE_COPY_RESERVE_BYTES + 1_000)

    async def test(client: TestClient[Any, Any]) -> None:
        status, error = await error_of(await client.get(ROUTE))
        assert (status, error["code"]) == (507, "no_space"), error
        assert "node n2 has" in error["message"] and "a copy of its archive takes up to" in \
            error["message"], error
        assert node.archive.copying is None

    serve(node, test)
    assert COPY_NAME not in os.listdir(tmp_path)


def test_a_node_without_an_archive_answers_404_saying_so(tmp_path: Path) -> None:
    async def test(client: TestClient[Any, Any]) -> None:
        status, error = await error_of(await client.get(ROUTE))
        assert (status, error["code"]) == (404, "not_found")
        assert "node n2 keeps no archive ([storage] archive = false" in error["message"]

    serve(fake_node(tmp_path, archive=False), test)


def test_a_node_that_has_not_applied_the_snapshot_s_index_answers_503(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_archive(tmp_path, {1: 1})
    monkeypatch.setattr(bounds, "BACKUP_WAIT_S", 0.2)
    node = fake_node(tmp_path, applied_index=40)

    async def test(client: TestClient[Any, Any]) -> None:
        status, error = await error_of(await client.get(ROUTE, params={"min_index": "41"}))
        assert (status, error["code"]) == (503, "unavailable")
        assert "not up to 41" in error["message"] and "lags" in error["message"], error
        assert node.archive.copying is None

    serve(node, test)


def test_an_index_beyond_what_the_node_knows_committed_is_answered_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the API fuzzer: min_index 2**62 held the request for the whole wait (120 s)."""
    make_archive(tmp_path, {1: 1})
    monkeypatch.setattr(bounds, "BACKUP_WAIT_S", 60)
    node = fake_node(tmp_path, applied_index=40, commit_index=45)

    async def test(client: TestClient[Any, Any]) -> None:
        started = time.monotonic()
        status, error = await error_of(await client.get(ROUTE, params={
            "min_index": str(2**62 - 1)}))
        assert (status, error["code"]) == (409, "index_not_committed")
        assert "committed up to index 45" in error["message"], error
        assert time.monotonic() - started < 5
        assert node.archive.copying is None

    serve(node, test)
