"""Jobs through the HTTP API of a real 3-node cluster: replication, idempotency keys, fencing
tokens, and the answers to bad input (400 with the field, 404, 413). One cluster serves the
whole module; every test uses its own queue and keys."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

BODY_BYTES_MAX = 8 * 1024 * 1024


def wait_for_job(cluster: LocalCluster, node: LocalNode, job_id: int) -> dict[str, Any]:
    """The job as `node` holds it, once that node applied it (followers apply a bit later)."""

    def read() -> dict[str, Any] | None:
        status, body, _ = cluster.request(node, "GET", f"/v1/jobs/{job_id}")
        return body if status == 200 else None

    return cluster.wait_for(read, 10, f"job {job_id} on {node.node_id}")


def test_a_job_submitted_to_a_follower_is_committed_and_readable_on_every_node(
    shared_cluster: LocalCluster, unique: Callable[[str], str]
) -> None:
    follower = shared_cluster.followers()[0]
    body = {"task": "report", "payload": {"day": "2026-11-30"}, "queue": unique("q")}

    status, job, headers = shared_cluster.request(follower, "POST", "/v1/jobs", body)

    assert status == 201, job
    assert headers["X-Raftcron-Node"] == follower.node_id
    assert int(headers["X-Raftcron-Applied-Index"]) > 0
    assert headers["X-Raftcron-Leader"] == shared_cluster.leader().url  # clients go there
    assert job["status"] == "queued" and job["payload"] == body["payload"]
    for node in shared_cluster.nodes:
        seen = wait_for_job(shared_cluster, node, job["id"])
        assert (seen["task"], seen["payload"], seen["queue"], seen["created_ms"]) == (
            job["task"],
            job["payload"],
            job["queue"],
            job["created_ms"],
        )
        consistent = shared_cluster.request(node, "GET", f"/v1/jobs/{job['id']}?consistent=1")
        assert consistent[0] == 200, consistent[1]


def test_a_repeated_key_returns_the_first_job_with_200_instead_of_201(
    shared_cluster: LocalCluster, unique: Callable[[str], str]
) -> None:
    key = unique("report-2026-11-30")
    first_node, second_node = shared_cluster.nodes[0], shared_cluster.nodes[1]

    first = shared_cluster.request(first_node, "POST", "/v1/jobs", {"task": "a", "key": key})
    again = shared_cluster.request(
        second_node, "POST", "/v1/jobs", {"task": "b", "key": key, "payload": {"other": 1}}
    )

    assert first[0] == 201, first[1]
    assert again[0] == 200, again[1]
    assert again[1]["id"] == first[1]["id"]
    assert (again[1]["task"], again[1]["payload"]) == ("a", None)
    assert again[1]["created"] is False


def claim_one(cluster: LocalCluster, queue: str, *, lease_ms: int) -> dict[str, Any]:
    # A request_id: `call` sends a claim again to another node when an answer does not come
    # (a slow machine), and only the id makes that second claim the first one's repeat.
    body = {"worker": "w1", "queues": [queue], "max": 1, "lease_ms": lease_ms, "wait_ms": 5_000,
            "request_id": f"claim-{queue}-{lease_ms}"}
    status, answer, _ = cluster.call("POST", "/v1/claims", body)
    assert status == 200, answer
    assert len(answer["jobs"]) == 1, answer
    claimed: dict[str, Any] = answer["jobs"][0]
    return claimed


def test_a_stale_token_cannot_complete_a_job_and_the_current_token_can(
    shared_cluster: LocalCluster, unique: Callable[[str], str]
) -> None:
    queue = unique("fenced")
    job_spec = {"task": "t", "queue": queue, "backoff": {"initial_ms": 0, "max_ms": 0}}
    status, job, _ = shared_cluster.call("POST", "/v1/jobs", job_spec)
    assert status == 201, job
    first = claim_one(shared_cluster, queue, lease_ms=100)  # expires at the next ticks
    second = claim_one(shared_cluster, queue, lease_ms=30_000)
    assert second["id"] == first["id"] == job["id"]
    assert second["token"] > first["token"]
    path = f"/v1/jobs/{job['id']}/complete"

    stale = shared_cluster.call("POST", path, {"token": first["token"], "result": "late"})
    current = shared_cluster.call("POST", path, {"token": second["token"], "result": "ok"})
    stale_again = shared_cluster.call("POST", path, {"token": first["token"], "result": "late"})

    assert stale[0] == 409 and stale[1]["error"]["code"] == "stale_token", stale[1]
    assert current[0] == 200, current[1]
    assert stale_again[0] == 409 and stale_again[1]["error"]["code"] == "stale_token"
    final = shared_cluster.call("GET", f"/v1/jobs/{job['id']}?consistent=1")[1]
    assert (final["status"], final["result"], final["attempts"]) == ("succeeded", "ok", 2)


BAD_REQUESTS: list[tuple[str, str, Any, str]] = [
    # method, path, body, the field the error must name
    ("POST", "/v1/jobs", {"task": 5}, "task"),
    ("POST", "/v1/jobs", {"payload": {}}, "task"),
    ("POST", "/v1/jobs", {"task": "t", "max_attempts": 0}, "max_attempts"),
    ("POST", "/v1/jobs", {"task": "t", "priority": 10**12}, "priority"),
    ("POST", "/v1/jobs", {"task": "t", "delay_ms": -1}, "delay_ms"),
    ("POST", "/v1/jobs", {"task": "t", "backoff": {"factor": "x"}}, "backoff.factor"),
    ("POST", "/v1/jobs", {"task": "t", "surprise": True}, "surprise"),
    ("POST", "/v1/jobs", [{"task": "t"}], "body"),
    ("POST", "/v1/jobs", b"{not json", "body"),
    ("POST", "/v1/jobs", b"", "body"),
    ("POST", "/v1/jobs/batch", {"jobs": [{"task": "t"}, {"task": 1}]}, "jobs[1].task"),
    ("GET", "/v1/jobs/not-a-number", None, "id"),
    ("GET", "/v1/jobs?status=sleeping", None, "status"),
    ("GET", "/v1/jobs?limit=0", None, "limit"),
    ("PUT", "/v1/schedules/s1", {"cron": "61 * * * *", "job": {"task": "t"}}, "cron"),
    ("PUT", "/v1/schedules/s1", {"every": "1s", "job": {"task": "t"}, "misfire": "x"}, "misfire"),
    ("PUT", "/v1/schedules/s1", {"every": "1s"}, "job"),
    ("PUT", "/v1/schedules/s1", {"every": "0s", "job": {"task": "t"}}, "every"),
    (
        "PUT",
        "/v1/schedules/s1",
        {"cron": "* * * * *", "tz": "Mars/Base", "job": {"task": "t"}},
        "tz",
    ),
    ("POST", "/v1/claims", {"worker": "w", "queues": ["q"], "lease_ms": 5}, "lease_ms"),
    ("POST", "/v1/claims", {"worker": "w", "queues": ["q"], "wait_ms": -1}, "wait_ms"),
    ("POST", "/v1/jobs/1/complete", {"token": "abc"}, "token"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), BAD_REQUESTS)
def test_bad_input_gets_400_naming_the_field(
    shared_cluster: LocalCluster, method: str, path: str, body: Any, field: str
) -> None:
    status, answer, _ = shared_cluster.request(shared_cluster.nodes[0], method, path, body)

    assert status == 400, answer
    error = answer["error"]
    assert error["code"] == "invalid"
    assert error["field"] == field, error
    assert error["message"].startswith(f"{field}: ") or field in ("body", "id", "status", "limit")
    assert not error["message"].startswith(f"{field}: {field}:"), "the field is named twice"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/jobs/987654321", None),
        ("POST", "/v1/jobs/987654321/cancel", None),
        ("POST", "/v1/jobs/987654321/retry", None),
        ("POST", "/v1/jobs/987654321/complete", {"token": 1}),
        ("POST", "/v1/jobs/987654321/heartbeat", {"token": 1}),
        ("GET", "/v1/schedules/no-such-schedule", None),
        ("GET", "/v1/no-such-route", None),
    ],
)
def test_an_unknown_job_or_route_gets_404(
    shared_cluster: LocalCluster, method: str, path: str, body: Any
) -> None:
    status, answer, _ = shared_cluster.call(method, path, body)

    assert status == 404, answer
    assert answer["error"]["code"] == "not_found"
    assert answer["error"]["message"]


def test_a_body_over_8_mib_gets_413_with_the_limit_in_the_message(
    shared_cluster: LocalCluster,
) -> None:
    body = json.dumps({"task": "t", "payload": {"blob": "x" * BODY_BYTES_MAX}}).encode()

    status, answer, _ = shared_cluster.request(shared_cluster.nodes[0], "POST", "/v1/jobs", body)

    assert status == 413, answer
    assert answer["error"]["code"] == "too_large"
    assert str(BODY_BYTES_MAX) in answer["error"]["message"]


def test_a_chunked_body_over_8_mib_gets_413_too(shared_cluster: LocalCluster) -> None:
    chunks = (b"x" * 1024 * 1024 for _ in range(9))

    status, answer, _ = shared_cluster.request(shared_cluster.nodes[0], "POST", "/v1/jobs", chunks)

    assert status == 413, answer
    assert answer["error"]["code"] == "too_large"


def test_a_payload_over_its_limit_gets_413_naming_the_payload(
    shared_cluster: LocalCluster,
) -> None:
    body = {"task": "t", "payload": {"blob": "x" * 100_000}}

    status, answer, _ = shared_cluster.request(shared_cluster.nodes[0], "POST", "/v1/jobs", body)

    assert status == 413, answer
    assert answer["error"]["code"] == "too_large"
    assert answer["error"]["field"] == "payload"


def test_a_missing_dependency_is_reported_under_the_field_the_client_sent(
    shared_cluster: LocalCluster,
) -> None:
    body = {"task": "t", "depends_on": [987654321]}

    status, answer, _ = shared_cluster.call("POST", "/v1/jobs", body)

    assert status in (400, 404), answer
    assert answer["error"]["field"] == "depends_on", "a single submit has no jobs[0]"


def test_a_body_nested_deeper_than_the_json_parser_goes_gets_400_not_500(
    cluster: LocalCluster,
) -> None:
    """Its own cluster: the node logs a traceback for this one, which fails the teardown too."""
    depth = 100_000
    body = b'{"task": "t", "payload": ' + b"[" * depth + b"]" * depth + b"}"

    status, answer, _ = cluster.request(cluster.nodes[0], "POST", "/v1/jobs", body)

    assert status == 400, answer
    assert answer["error"]["field"] in ("body", "payload")


def test_a_claim_retried_after_a_later_round_leased_a_job_gets_that_job_and_only_while_leased(
    shared_cluster: LocalCluster, unique: Callable[[str], str]
) -> None:
    """E14 and S7 of the wave-2 audit. A long-poll claim R commits an empty first round (it
    carries an ack, so it does not wait first), then leases a job in round R/1; its answer is
    lost. The worker re-sends R: it gets the job and token R/1 leased at once (before: it waited
    out wait_ms and answered nothing, and the job sat leased to nobody until its lease ended).
    Once that lease ended and another worker holds the job, a replay of R no longer hands it."""
    cluster = shared_cluster
    leader = cluster.leader()
    queue, done_queue = unique("retried"), unique("acked")
    status, acked, _ = cluster.call("POST", "/v1/jobs", {"task": "t", "queue": done_queue})
    assert status == 201, acked
    held = claim_one(cluster, done_queue, lease_ms=30_000)
    body = {"request_id": unique("claim"), "worker": "w1", "queues": [queue], "max": 1,
            "lease_ms": 6_000, "wait_ms": 15_000,
            "acks": [{"id": held["id"], "token": held["token"], "outcome": "succeeded"}]}
    answers: list[Any] = []
    import threading  # one long-poll in flight while the test goes on

    first = threading.Thread(target=lambda: answers.append(
        cluster.request(leader, "POST", "/v1/claims", body, timeout_s=20)))
    first.start()
    try:
        # Round 0 committed (its ack finished the held job); then the job round 1 will lease.
        cluster.wait_for(lambda: cluster.request(leader, "GET", f"/v1/jobs/{held['id']}")[1]
                         ["status"] == "succeeded", 10, "the first round's ack")
        status, job, _ = cluster.call("POST", "/v1/jobs", {
            "task": "t", "queue": queue, "max_attempts": 5,
            "backoff": {"initial_ms": 0, "max_ms": 0}})
        assert status == 201, job
    finally:
        first.join(timeout=20)
    [(status, lost, _)] = answers
    assert status == 200 and [j["id"] for j in lost["jobs"]] == [job["id"]], lost
    token = lost["jobs"][0]["token"]

    started = time.monotonic()
    status, replayed, _ = cluster.request(leader, "POST", "/v1/claims", body, timeout_s=20)
    assert status == 200, replayed
    assert [(j["id"], j["token"]) for j in replayed["jobs"]] == [(job["id"], token)], replayed
    assert time.monotonic() - started < 3.0, "the replay waited for work instead of answering"
    assert replayed["jobs"][0]["lease_until_ms"] is not None, replayed  # still leased to it

    # The 6 s lease ends; another worker holds the job: the replay must not hand it out again.
    status, taken, _ = cluster.call("POST", "/v1/claims", {
        "worker": "w2", "queues": [queue], "max": 1, "lease_ms": 30_000, "wait_ms": 15_000})
    assert status == 200 and len(taken["jobs"]) == 1, taken
    other = taken["jobs"][0]
    assert other["id"] == job["id"] and other["token"] > token
    status, late, _ = cluster.request(leader, "POST", "/v1/claims",
                                      {**body, "wait_ms": 0}, timeout_s=20)
    assert status == 200 and late["jobs"] == [], late
