"""Product bugs the API fuzz (and the work on the document) found, each pinned by a test.

Each test states the contract (DESIGN.md section 4, or the core's own rule where the design
says nothing). An open bug is marked `@bug(...)` (strict xfail, with an entry in
fuzz_hooks.KNOWN_BUGS when the fuzz meets it); the fixed ones' tests stay so they stay fixed.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from typing import Any

import pytest

from .apidoc import assert_documented
from .livenode import LiveNode, Reply, wait_until


def bug(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=f"product bug: {reason}")


def answer_or_none(node: LiveNode, method: str, path: str, body: Any) -> Reply | None:
    """The reply, or None when the node closed the connection without one."""
    try:
        return node.request(method, path, body, timeout_s=10)
    except (ConnectionError, http.client.HTTPException):
        return None


def test_a_backfill_past_year_9999_does_not_kill_the_node(
    fresh_node: Callable[[], LiveNode],
) -> None:
    node = fresh_node()
    schedule = {"cron": "0 0 * * *", "job": {"task": "t"}}
    assert node.request("PUT", "/v1/schedules/daily", schedule).status == 201
    years_ahead = {"from_ms": 300_000_000_000_000, "to_ms": 300_000_100_000_000}
    reply = answer_or_none(node, "POST", "/v1/schedules/daily/backfill", years_ahead)
    assert reply is not None and reply.status == 400, reply
    assert node.is_running() and node.is_ready()


@pytest.mark.parametrize("path", ["/v1/jobs/%C2%B2", "/v1/jobs/%C2%B2/cancel"])
def test_a_path_id_of_non_ascii_digits_is_a_400_not_a_500(node: LiveNode, path: str) -> None:
    method = "GET" if path.count("/") == 3 else "POST"
    reply = node.request(method, path)
    assert reply.status == 400, reply
    assert_documented(method, path, reply)


@pytest.mark.parametrize(
    ("query", "schedule"),
    [
        ("?from_ms=300000000000000", {"cron": "* * * * *"}),
        ("?from_ms=253402300000000&count=1000", {"every": "1s"}),
        ("?from_ms=0&count=1000", {"every": "3650d"}),
    ],
)
def test_a_preview_past_year_9999_is_a_400_not_a_500(
    node: LiveNode, query: str, schedule: dict[str, Any]
) -> None:
    path = f"/v1/schedules/preview{query}"
    reply = node.request("POST", path, {**schedule, "job": {"task": "t"}})
    assert reply.status in (200, 400), reply
    assert_documented("POST", path, reply)


# Fixed in 867733c (a request_id reused for a different request is refused); found as a 500.
def test_a_single_submit_reusing_a_batch_request_id_is_a_409(node: LiveNode) -> None:
    batch = {"jobs": [{"task": "a"}, {"task": "b"}], "request_id": "shared-by-two-routes"}
    assert node.request("POST", "/v1/jobs/batch", batch).status == 201
    single = {"task": "c", "request_id": "shared-by-two-routes"}
    reply = node.request("POST", "/v1/jobs", single)
    assert reply.status == 409 and reply.json()["error"]["code"] == "request_id_reused", reply
    assert_documented("POST", "/v1/jobs", reply)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/jobs", '{"task": "t", "key": "\\ud800"}'),
        ("POST", "/v1/jobs", '{"task": "t", "request_id": "\\ud800"}'),
        (
            "PUT",
            "/v1/schedules/s",
            '{"every": "1h", "job": {"task": "t"}, "description": "\\ud800"}',
        ),
    ],
)
def test_a_lone_surrogate_in_a_text_field_is_a_400_not_a_500(
    node: LiveNode, method: str, path: str, body: str
) -> None:
    reply = node.request(method, path, raw=body.encode())
    assert reply.status == 400, reply
    assert_documented(method, path, reply)


# Fixed in f2711bd (read_json catches RecursionError); found as a 500.
def test_a_deeply_nested_body_is_a_400(node: LiveNode) -> None:
    reply = node.request("POST", "/v1/jobs", raw=b"[" * 100_000)
    assert reply.status == 400 and reply.json()["error"]["field"] == "body", reply
    assert_documented("POST", "/v1/jobs", reply)


@pytest.mark.parametrize("request_id", [0, False, ""])
def test_a_falsy_request_id_is_rejected(node: LiveNode, request_id: Any) -> None:
    reply = node.request("POST", "/v1/jobs", {"task": "t", "request_id": request_id})
    assert reply.status == 400 and reply.json()["error"]["field"] == "request_id", reply


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/jobs", {"task": "t\n"}),
        ("PUT", "/v1/schedules/nightly%0A", {"every": "1h", "job": {"task": "t"}}),
    ],
)
def test_a_name_with_a_trailing_newline_is_rejected(
    node: LiveNode, method: str, path: str, body: Any
) -> None:
    reply = node.request(method, path, body)
    assert reply.status == 400, reply


def test_a_misspelled_claim_field_is_rejected(node: LiveNode) -> None:
    reply = node.request("POST", "/v1/claims", {"worker": "w", "queue": "emails"})
    assert reply.status == 400 and reply.json()["error"]["field"] == "queue", reply


def test_a_405_names_the_allowed_methods(node: LiveNode) -> None:
    reply = node.request("DELETE", "/v1/jobs")
    assert reply.status == 405
    assert set(reply.headers.get("allow", "").replace(" ", "").split(",")) >= {"GET", "POST"}


@pytest.mark.parametrize("body", [{"level": 4}, ["finalize"]])
def test_a_finalize_body_it_does_not_read_is_a_400(node: LiveNode, body: Any) -> None:
    reply = node.request("POST", "/v1/cluster/finalize", body)
    assert reply.status == 400, reply


def test_the_node_still_answers_after_these_requests(node: LiveNode) -> None:
    assert wait_until(node.is_ready, deadline_s=5, what="the shared node is ready")
    assert json.loads(node.request("GET", "/healthz", role=None).body)["ok"] is True
