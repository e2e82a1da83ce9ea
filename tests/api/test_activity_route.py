"""`GET /v1/activity` on a live node: the samples the dashboard's charts draw
(cluster/ops/activity.py) have the documented shape, show the jobs a queue ran and the claims this
node served, and
`since_ms` is validated and answers only what is newer."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from raftcron.cluster.ops import activity

from .apidoc import assert_documented
from .livenode import LiveNode, wait_until

pytestmark = pytest.mark.processes


def get_activity(node: LiveNode, query: str = "") -> dict[str, Any]:
    reply = node.request("GET", f"/v1/activity{query}", role="read")
    assert reply.status == 200, reply
    body: dict[str, Any] = assert_documented("GET", "/v1/activity", reply)
    return body


def run_jobs(node: LiveNode, queue: str, *, succeed: int, fail: int) -> None:
    jobs = [{"task": "t", "queue": queue, "max_attempts": 1}] * (succeed + fail)
    assert node.request("POST", "/v1/jobs/batch", {"jobs": jobs}).status == 201
    claim = {"worker": "w1", "queues": [queue], "max": succeed + fail}
    claimed = node.request("POST", "/v1/claims", claim).json()["jobs"]
    assert len(claimed) == succeed + fail, claimed
    for index, job in enumerate(claimed):
        outcome = "complete" if index < succeed else "fail"
        body = {"token": job["token"]} | ({} if index < succeed else {"error": "boom",
                                                                       "retryable": False})
        assert node.request("POST", f"/v1/jobs/{job['id']}/{outcome}", body).status == 200


def test_a_queue_s_jobs_and_this_node_s_claims_show_in_a_sample(node: LiveNode) -> None:
    first = get_activity(node)
    assert first["node"] and first["sample_ms"] == activity.SAMPLE_S * 1000
    assert first["kept_ms"] == activity.KEPT_S * 1000 and first["started_ms"] is not None
    assert first["samples"] and first["samples"][0]["at_ms"] >= first["started_ms"]
    # A node that just started samples gaps until it is ready (its first interval too).
    wait_until(lambda: not get_activity(node)["samples"][-1]["gap"],
               deadline_s=4 * activity.SAMPLE_S, what="a sample that is not a gap")
    queue = f"charts-{uuid.uuid4().hex[:8]}"
    run_jobs(node, queue, succeed=3, fail=1)

    def sampled() -> dict[str, Any] | None:
        for each in get_activity(node)["samples"]:
            if queue in each["queues"]:
                return dict(each)
        return None

    found = wait_until(sampled, deadline_s=3 * activity.SAMPLE_S, what=f"{queue} sampled")
    seconds = found["interval_ms"] / 1000
    rates = found["queues"][queue]
    assert rates["submitted_per_s"] * seconds == pytest.approx(4, abs=0.01)
    assert rates["succeeded_per_s"] * seconds == pytest.approx(3, abs=0.01)
    assert rates["failed_per_s"] * seconds == pytest.approx(1, abs=0.01)
    assert found["claims"]["count"] >= 1 and found["claims"]["p50_ms"] > 0


def test_since_ms_answers_only_the_newer_samples(node: LiveNode) -> None:
    samples = get_activity(node)["samples"]
    assert get_activity(node, f"?since_ms={samples[-1]['at_ms']}")["samples"] == []
    if len(samples) > 1:
        newer = get_activity(node, f"?since_ms={samples[0]['at_ms']}")["samples"]
        assert newer[0] == samples[1]


@pytest.mark.parametrize("value", ["-1", "soon", "1.5", str(2**62 + 1)])
def test_a_bad_since_ms_is_a_documented_400(node: LiveNode, value: str) -> None:
    reply = node.request("GET", f"/v1/activity?since_ms={value}", role="read")
    body = assert_documented("GET", "/v1/activity", reply)
    assert reply.status == 400 and body["error"]["field"] == "since_ms", body
