"""The client's failover and retry rules against the in-process fake, and the worker
command's flags and environment fallbacks (no cluster needed)."""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster.clients.client import ApiError, AsyncClient, Unavailable, normalize_urls
from raftcron.cluster.commandline import main as raftcron_cli
from raftcron.cluster.worker import cli

from .fakeapi import FakeApi


def with_fake(test: Any, ports: int = 2) -> FakeApi:
    async def main() -> FakeApi:
        fake = FakeApi()
        await fake.start(ports)
        try:
            await test(fake)
        finally:
            await fake.stop()
        return fake

    return asyncio.run(main())


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_write_retried_after_a_503_keeps_its_request_id_on_the_next_node() -> None:
    async def test(fake: FakeApi) -> None:
        fake.unavailable_next = 2
        async with AsyncClient(fake.urls) as client:
            job = await client.submit("echo", {"n": 1})
            again = await client.submit("echo", {"n": 2})
        assert job["id"] == 1 and again["id"] == 2
        first, second, third, fourth = fake.calls("/v1/jobs")
        assert first.request_id == second.request_id == third.request_id
        assert fourth.request_id != first.request_id
        assert first.port != second.port

    with_fake(test)


def test_the_api_token_is_sent_as_a_bearer_token() -> None:
    async def test(fake: FakeApi) -> None:
        async with AsyncClient(fake.urls, token="s3cret-worker") as client:
            await client.submit("echo")
        assert [r.authorization for r in fake.requests] == ["Bearer s3cret-worker"]

    with_fake(test)


def test_a_dead_node_is_skipped() -> None:
    async def test(fake: FakeApi) -> None:
        async with AsyncClient([closed_port_url(), *fake.urls]) as client:
            assert (await client.submit("echo"))["id"] == 1
            assert client.failovers == 1 and client.current_url == fake.urls[0]

    with_fake(test)


def test_the_client_sends_to_the_leader_a_node_names_when_it_is_one_of_its_urls() -> None:
    async def test(fake: FakeApi) -> None:
        first, leader = fake.urls
        fake.leader = leader + "/"
        async with AsyncClient([first, leader]) as client:
            await client.submit("echo")
            await client.submit("echo")
            assert client.current_url == leader and client.failovers == 0
            fake.leader = "http://127.0.0.1:1"  # not one of its URLs: never followed
            await client.submit("echo")
            assert client.current_url == leader
        ports = [call.port for call in fake.calls("/v1/jobs")]
        assert [f"http://127.0.0.1:{port}" for port in ports] == [first, leader, leader]

    with_fake(test)


def test_client_errors_are_raised_at_once_with_their_code() -> None:
    async def test(fake: FakeApi) -> None:
        fake.revoked[5] = "stale_token"
        async with AsyncClient(fake.urls) as client:
            with pytest.raises(ApiError) as refused:
                await client.heartbeat(5, 3)
        assert refused.value.status == 409 and refused.value.code == "stale_token"
        assert len(fake.calls("/v1/jobs/5/heartbeat")) == 1

    with_fake(test)


def test_no_answer_before_the_deadline_is_unavailable() -> None:
    async def test() -> None:
        async with AsyncClient([closed_port_url(), closed_port_url()]) as client:
            started = time.monotonic()
            with pytest.raises(Unavailable, match="no node answered"):
                await client.request("GET", "/v1/cluster", deadline_s=0.5)
            assert time.monotonic() - started < 5

    asyncio.run(test())


def test_urls_may_be_a_comma_separated_string_or_bare_addresses() -> None:
    assert normalize_urls(" http://a:1/, b:2 ,") == ["http://a:1", "http://b:2"]
    with pytest.raises(ValueError):
        normalize_urls(" , ")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_every_worker_flag_falls_back_to_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {
        "RAFTCRON_CONNECT": "http://a:1,http://b:2",
        "RAFTCRON_QUEUES": "mail,reports",
        "RAFTCRON_CONCURRENCY": "9",
        "RAFTCRON_IMPORT": "myapp.tasks",
        "RAFTCRON_PATH": "/srv/app",
        "RAFTCRON_WORKER_NAME": "w-env",
        "RAFTCRON_LEASE_MS": "6000",
        "RAFTCRON_WAIT_MS": "1000",
        "RAFTCRON_TIMEOUT_MS": "120000",
        "RAFTCRON_DRAIN_TIMEOUT_MS": "5000",
        "RAFTCRON_API_TOKEN": "s3cret-worker",
        "RAFTCRON_NO_SHELL": "1",
        "RAFTCRON_LOG_LEVEL": "debug",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = parse([])
    assert args.connect == "http://a:1,http://b:2"
    assert args.queues == ["mail", "reports"] and args.concurrency == 9
    assert args.path == "/srv/app" and args.name == "w-env"
    assert (args.lease_ms, args.wait_ms, args.timeout_ms) == (6000, 1000, 120000)
    assert args.drain_timeout_ms == 5000 and args.api_token == "s3cret-worker"
    assert args.no_shell is True and args.log_level == "debug"
    worker = cli.build_worker(args)
    assert worker.urls == ["http://a:1", "http://b:2"] and "shell" not in worker.tasks
    # A flag wins over its variable.
    assert parse(["--concurrency", "2", "--queues", "x"]).concurrency == 2
    assert parse(["--queues", "x"]).queues == ["x"]


def test_worker_defaults_and_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAFTCRON_QUEUES", "RAFTCRON_CONCURRENCY", "RAFTCRON_LEASE_MS"):
        monkeypatch.delenv(name, raising=False)
    args = parse(["--connect", "http://a:1"])
    assert args.queues == ["default"] and args.concurrency == 4 and args.lease_ms == 30000
    assert "shell" not in cli.build_worker(args).tasks  # opt-in: --allow-shell
    assert "shell" in cli.build_worker(parse(["--connect", "http://a:1", "--allow-shell"])).tasks
    monkeypatch.setenv("RAFTCRON_ALLOW_SHELL", "1")
    assert "shell" in cli.build_worker(parse(["--connect", "http://a:1"])).tasks
    assert "shell" not in cli.build_worker(parse(["--connect", "http://a:1", "--no-shell"])).tasks
    with pytest.raises(ValueError, match="RAFTCRON_API_TOKEN"):
        cli.build_worker(parse(["--connect", "http://a:1", "--shell-env", "RAFTCRON_API_TOKEN"]))
    monkeypatch.delenv("RAFTCRON_ALLOW_SHELL")
    with pytest.raises(ValueError, match="not allowed"):
        cli.build_worker(parse(["--connect", "http://a:1", "--shell-env", "DB_URL"]))
    with pytest.raises(SystemExit):
        parse(["--lease-ms", "10"])
    monkeypatch.setenv("RAFTCRON_CONCURRENCY", "zero")
    with pytest.raises(SystemExit):
        parse([])


@pytest.mark.usefixtures("restore_logging")
def test_the_worker_command_refuses_to_start_without_nodes_or_with_a_bad_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAFTCRON_CONNECT", raising=False)
    assert cli.main([]) == 2
    assert cli.main(["--connect", "http://a:1", "--import", "no_such_module_here"]) == 2


def test_tls_files_that_do_not_load_are_refused_naming_the_flag(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="--ca-file"):
        cli.build_worker(parse(["--connect", "https://a:1", "--ca-file", missing]))
    with pytest.raises(ValueError, match="go together"):
        cli.build_worker(parse(["--connect", "https://a:1", "--cert-file", missing]))


def test_the_cli_reads_see_the_command_before_them_the_client_reads_locally_by_default() -> None:
    """A node answers reads from its own state, a round trip behind the leader's: `raftcron
    jobs delete` then `jobs show` on a follower showed the deleted job (a CI run of
    test_jobs_retry_and_delete_by_filter). Each CLI command is a new client, so its reads of
    the replicated state are consistent ones; the client's reads stay local unless asked."""
    from aiohttp import web

    seen: list[tuple[str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append((request.path, request.query.get("consistent", "")))
        if request.path == "/v1/jobs":
            return web.json_response({"jobs": [], "next_cursor": None})
        if request.path == "/v1/schedules":
            return web.json_response({"schedules": []})
        return web.json_response({"id": 7, "task": "noop", "status": "queued", "queue": "q"})

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}"
        try:
            for words in (["jobs", "show", "--connect", url, "7"],
                          ["jobs", "list", "--connect", url],
                          ["schedules", "list", "--connect", url]):
                assert await asyncio.to_thread(raftcron_cli.main, words) == 0
            async with AsyncClient([url]) as client:
                await client.job(7)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert seen == [("/v1/jobs/7", "1"), ("/v1/jobs", "1"), ("/v1/schedules", "1"),
                    ("/v1/jobs/7", "")]


def test_a_users_payload_is_sent_as_json_writes_it_and_a_claim_by_orjson() -> None:
    """orjson writes NaN as null; a user's payload goes as json writes it (NaN, which the API
    refuses naming the field), so it never changes on the way. A claim's body (acks whose
    results were checked) goes by orjson, falling back to json for what orjson refuses."""
    from raftcron.cluster.clients.asyncclient import _decode, _encode

    assert _encode({"x": float("nan")}, plain=False) == b'{"x":NaN}'
    assert _encode({"acks": [{"id": 1, "result": [1.5, "é"]}]}, plain=True) == \
        b'{"acks":[{"id":1,"result":[1.5,"\xc3\xa9"]}]}'
    assert _encode({1: 2**70}, plain=True) == b'{"1":1180591620717411303424}'
    assert _decode(b'{"a":[1,2.5,null]}') == {"a": [1, 2.5, None]}
    assert _decode(b'{"a":NaN}')["a"] != 0  # json reads what orjson refuses
