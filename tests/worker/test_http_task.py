"""The built-in http task against a real aiohttp server on loopback: what it sends, what it
keeps of the answer, which failures retry and which do not, and which hosts it may call."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from raftcron.cluster.worker import JobContext, PermanentError
from raftcron.cluster.worker.cli import main as worker_main
from raftcron.cluster.worker.httptask import (
    HTTP_TASK,
    RESPONSE_BYTES_MAX,
    HostAllowList,
    HttpFailed,
    first_text,
    run_http,
)
from raftcron.cluster.worker.runtime import Worker

LOOPBACK = HostAllowList(["127.0.0.1"])


async def _no_heartbeat(lease_ms: int | None) -> bool:
    return True


def context(payload: Any, **job: Any) -> JobContext:
    claimed = {"id": 7, "task": "http", "token": 42, "attempt": 2, "payload": payload, **job}
    return JobContext(claimed, worker="w1", lease_ms=30_000, loop=asyncio.get_running_loop(),
                      heartbeat=_no_heartbeat)


Routes = Callable[[web.Application, list[web.Request], asyncio.Event], None]


def serve(routes: Routes, test: Callable[[str, list[web.Request]], Awaitable[None]]) -> None:
    """Run `test(base_url, requests_seen)` against a server on 127.0.0.1 with `routes`."""

    async def main() -> None:
        seen: list[web.Request] = []
        release = asyncio.Event()
        app = web.Application()
        routes(app, seen, release)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            await test(f"http://127.0.0.1:{port}", seen)
        finally:
            release.set()
            await runner.cleanup()

    asyncio.run(main())


def echo_routes(app: web.Application, seen: list[web.Request], release: asyncio.Event) -> None:
    async def echo(request: web.Request) -> web.Response:
        seen.append(request)
        body = await request.read()
        return web.json_response({"method": request.method, "headers": dict(request.headers),
                                  "body": body.decode(), "query": request.query_string})

    async def status(request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["code"]), text="nope " * 500)

    async def slow(request: web.Request) -> web.Response:
        await release.wait()  # answers only when the test is over
        return web.Response(text="late")

    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b"x" * 65_536
        for _ in range(16 * 10):  # 10 MiB, if anyone read it all
            await response.write(chunk)
        seen.append(request)  # only if the client read (nearly) all of it
        return response

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/status/{code}", status)
    app.router.add_get("/slow", slow)
    app.router.add_get("/huge", huge)
    app.router.add_route("*", "/redirect", redirect)


def test_a_request_carries_method_headers_body_and_the_jobs_own_headers() -> None:
    async def test(base: str, seen: list[web.Request]) -> None:
        payload = {"method": "post", "url": f"{base}/echo?a=1", "headers": {"X-Custom": "yes"},
                   "body": {"hello": ["world"]}}
        result = await run_http(context(payload, key="report@2026-12-01 ü"), LOOPBACK)
        assert result["status"] == 200 and result["content_type"] == "application/json"
        assert result["url"] == f"{base}/echo?a=1" and result["body_truncated"] is False
        echoed = json.loads(result["body"])
        assert echoed["method"] == "POST" and echoed["query"] == "a=1"
        assert json.loads(echoed["body"]) == {"hello": ["world"]}
        headers = echoed["headers"]
        assert headers["X-Custom"] == "yes" and headers["Content-Type"] == "application/json"
        assert (headers["X-Raftcron-Job-Id"], headers["X-Raftcron-Attempt"],
                headers["X-Raftcron-Token"]) == ("7", "2", "42")
        assert headers["X-Raftcron-Job-Key"] == "report@2026-12-01 %C3%BC"

    serve(echo_routes, test)


def test_a_text_body_goes_as_utf8_text() -> None:
    async def test(base: str, seen: list[web.Request]) -> None:
        result = await run_http(context({"method": "PUT", "url": f"{base}/echo",
                                         "body": "grüße"}), LOOPBACK)
        echoed = json.loads(result["body"])
        assert echoed["body"] == "grüße"
        assert echoed["headers"]["Content-Type"] == "text/plain; charset=utf-8"

    serve(echo_routes, test)


@pytest.mark.parametrize(
    ("status", "expect", "kind"),
    [
        (503, None, HttpFailed),  # the server's trouble: retried with the job's backoff
        (500, None, HttpFailed),
        (429, None, HttpFailed),  # asked to slow down: retried
        (404, None, PermanentError),  # asking again will not find it
        (400, None, PermanentError),
        (200, [201, 202], PermanentError),  # answered, but not as the job expected
    ],
)
def test_an_unexpected_status_fails_retryable_only_when_asking_again_can_help(
    status: int, expect: list[int] | None, kind: type[Exception]
) -> None:
    async def test(base: str, seen: list[web.Request]) -> None:
        payload: dict[str, Any] = {"url": f"{base}/status/{status}"}
        if expect is not None:
            payload["expect_status"] = expect
        with pytest.raises(Exception) as raised:
            await run_http(context(payload), LOOPBACK)
        assert type(raised.value) is kind
        message = str(raised.value)
        assert message.startswith(f"http: GET {base}/status/{status} answered {status}")
        assert "nope nope" in message and len(message) < 1_200  # the body's start, bounded

    serve(echo_routes, test)


def test_an_expected_non_2xx_status_succeeds() -> None:
    async def test(base: str, seen: list[web.Request]) -> None:
        result = await run_http(context({"url": f"{base}/status/404", "expect_status": 404}),
                                LOOPBACK)
        assert result["status"] == 404 and result["body"].startswith("nope")

    serve(echo_routes, test)


def test_no_answer_within_the_timeout_is_a_retryable_failure() -> None:
    async def test(base: str, seen: list[web.Request]) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(HttpFailed, match=r"no answer within 300 ms"):
            await run_http(context({"url": f"{base}/slow", "timeout_ms": 300}), LOOPBACK)
        assert loop.time() - started < 10  # the timeout ended it, not the server

    serve(echo_routes, test)


def test_a_huge_answer_keeps_its_first_bytes_and_is_not_read_to_the_end() -> None:
    async def test(base: str, seen: list[web.Request]) -> None:
        result = await run_http(context({"url": f"{base}/huge"}), LOOPBACK)
        assert result["body_truncated"] is True
        assert result["body"] == "x" * RESPONSE_BYTES_MAX
        assert seen == []  # the server was still writing when the task was done

    serve(echo_routes, test)


def test_the_kept_body_is_bounded_as_utf8_whatever_bytes_came() -> None:
    # Invalid bytes become U+FFFD (3 bytes each): the text is cut again to the bound.
    text = first_text(b"\xff" * 100, 50)
    assert len(text.encode()) <= 50 and set(text) == {"\ufffd"}
    assert first_text("é".encode() * 10, 5) == "éé"


def test_a_connection_refused_is_a_retryable_failure() -> None:
    async def main() -> None:
        with socket.socket() as probe:  # a port nobody listens on (bound, never listening)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
            with pytest.raises(HttpFailed, match=r"http: GET http://127.0.0.1:\d+/x: Client"):
                await run_http(context({"url": f"http://127.0.0.1:{port}/x"}), LOOPBACK)

    asyncio.run(main())


def test_redirects_are_answers_unless_the_payload_follows_them_within_the_allowed_hosts() -> None:
    async def test(base: str, seen: list[web.Request]) -> None:
        to_echo = f"{base}/redirect?to={base}/echo"
        with pytest.raises(PermanentError, match="answered 302"):
            await run_http(context({"url": to_echo}), LOOPBACK)
        assert seen == []
        followed = await run_http(context({"url": to_echo, "follow_redirects": True,
                                           "method": "POST", "body": "x"}), LOOPBACK)
        assert followed["status"] == 200 and followed["url"] == f"{base}/echo"
        assert json.loads(followed["body"])["method"] == "GET"  # 302 after a POST: a GET
        away = f"{base}/redirect?to=http://localhost:1/elsewhere"
        with pytest.raises(PermanentError, match="host 'localhost' is not one this worker"):
            await run_http(context({"url": away, "follow_redirects": True}), LOOPBACK)

    serve(echo_routes, test)


@pytest.mark.parametrize(
    ("hosts", "host", "allowed"),
    [
        (["api.example.com"], "api.example.com", True),
        (["api.example.com"], "API.Example.com.", True),
        (["api.example.com"], "evil.example.com", False),
        (["*.example.com"], "a.b.example.com", True),
        (["*.example.com"], "example.com", False),
        (["*.example.com"], "badexample.com", False),
        (["*"], "169.254.169.254", True),
        (["127.0.0.1"], "localhost", False),
        (["[::1]"], "::1", True),
    ],
)
def test_the_allow_list_matches_host_names(hosts: list[str], host: str, allowed: bool) -> None:
    assert HostAllowList(hosts).allows(host) is allowed


def test_a_host_outside_the_allow_list_fails_for_good_before_any_request() -> None:
    async def test(base: str, seen: list[web.Request]) -> None:
        with pytest.raises(PermanentError, match=r"host '127.0.0.1' is not one this worker may"):
            await run_http(context({"url": f"{base}/echo"}), HostAllowList(["api.example.com"]))
        assert seen == []

    serve(echo_routes, test)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("https://x", 'http: the payload must be an object with "url"'),
        ({}, 'http: "url" must be a string'),
        ({"url": "ftp://example.com/x"}, "must be an http:// or https:// URL"),
        ({"url": "http://user:pw@127.0.0.1/"}, '"url" must not hold credentials'),
        ({"url": "http://127.0.0.1/", "method": "BREW"}, '"method" must be one of GET'),
        ({"url": "http://127.0.0.1/", "headers": {"Bad Name": "x"}}, "not a valid HTTP header"),
        ({"url": "http://127.0.0.1/", "headers": {"X": "a\r\nInjected: 1"}}, "without CR, LF"),
        ({"url": "http://127.0.0.1/", "headers": {"X-Raftcron-Token": "1"}}, "the job's own"),
        ({"url": "http://127.0.0.1/", "headers": {"Content-Length": "1"}}, "set by the worker"),
        ({"url": "http://127.0.0.1/", "timeout_ms": 0}, '"timeout_ms" must be an integer'),
        ({"url": "http://127.0.0.1/", "timeout_ms": True}, '"timeout_ms" must be an integer'),
        ({"url": "http://127.0.0.1/", "expect_status": [200, 99]}, '"expect_status" must be'),
        ({"url": "http://127.0.0.1/", "follow_redirects": "yes"}, "must be true or false"),
        ({"url": "http://127.0.0.1/", "body": "x" * 60_000}, '"body" is over'),
        ({"url": "http://127.0.0.1/", "verb": "GET"}, "unknown field 'verb'"),
    ],
)
def test_a_bad_payload_fails_for_good_naming_the_field(payload: Any, message: str) -> None:
    async def main() -> None:
        with pytest.raises(PermanentError) as raised:
            await run_http(context(payload), LOOPBACK)
        assert message in str(raised.value)

    asyncio.run(main())


def test_a_worker_serves_http_only_when_asked_and_only_with_hosts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert HTTP_TASK not in Worker("http://127.0.0.1:1").tasks
    assert HTTP_TASK in Worker("http://127.0.0.1:1", http_hosts=["api.example.com"]).tasks
    with pytest.raises(ValueError, match="--http-task-hosts: name the hosts"):
        Worker("http://127.0.0.1:1", http_hosts=[])
    assert worker_main(["--connect", "http://127.0.0.1:1", "--allow-http-task"]) == 2
    assert "--http-task-hosts: name the hosts" in capsys.readouterr().out
    assert worker_main(["--connect", "http://127.0.0.1:1", "--http-task-hosts", "a.b"]) == 2
    assert "the http task is not allowed" in capsys.readouterr().out
