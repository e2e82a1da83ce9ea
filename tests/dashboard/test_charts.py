"""The dashboard's activity charts in a real browser (headless Chromium) against a real 3-node
cluster: jobs run through the API, and the page draws them as jobs per second (all queues, and
one chart per busy queue) and claim latency, from `GET /v1/activity` (cluster/ops/activity.py).

The node samples every few seconds: the tests wait for the samples they need through the API,
and for the drawing through Playwright's `expect`, each with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

from playwrightguard import playwright_expect

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode
from raftcron.cluster.ops import activity

expect = playwright_expect()

SAMPLE_WAIT_S = 4 * activity.SAMPLE_S  # a sample is due within SAMPLE_S; a margin for a busy CI
POSITIVE = re.compile(r"^(?!0$)\d+(\.\d+)?$")  # a number above 0
THREE_OR_MORE = re.compile(r"^([3-9]|\d\d+)$")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def samples(cluster: LocalCluster, node: LocalNode) -> list[dict[str, Any]]:
    status, body, _ = cluster.request(node, "GET", "/v1/activity")
    assert status == 200, body
    return list(body["samples"])


def run_jobs(cluster: LocalCluster, node: LocalNode, queue: str, *, succeed: int,
             fail: int = 0) -> None:
    """Submit jobs to `queue` and run them by hand through `node`: claimed there, so its claim
    latency has them; `fail` of them fail for good."""
    jobs = [{"task": "chart", "queue": queue, "max_attempts": 1}] * (succeed + fail)
    status, answer, _ = cluster.request(node, "POST", "/v1/jobs/batch", {"jobs": jobs})
    assert status == 201, answer
    claim = {"worker": "chart-worker", "queues": [queue], "max": succeed + fail,
             "request_id": unique("claim")}
    status, claimed, _ = cluster.request(node, "POST", "/v1/claims", claim)
    assert status == 200 and len(claimed["jobs"]) == succeed + fail, claimed
    for index, job in enumerate(claimed["jobs"]):
        body: dict[str, Any] = {"token": job["token"], "request_id": unique("done")}
        outcome = "complete" if index < succeed else "fail"
        if outcome == "fail":
            body |= {"error": "the chart wants a red line", "retryable": False}
        status, answer, _ = cluster.request(node, "POST", f"/v1/jobs/{job['id']}/{outcome}", body)
        assert status == 200, answer


def run_over_samples(cluster: LocalCluster, node: LocalNode, rounds: int,
                     work: dict[str, tuple[int, int]]) -> None:
    """`rounds` times: run the jobs of `work` (queue -> (succeed, fail)), then wait until the
    node has sampled them, so each round is a point of its own on the charts."""
    cluster.wait_for(lambda: samples(cluster, node)[-1]["gap"] is False, SAMPLE_WAIT_S * 2,
                     f"{node.node_id} measuring (its first samples are gaps)")
    for growth in range(1, rounds + 1):
        last_ms = samples(cluster, node)[-1]["at_ms"]
        for queue, (succeed, fail) in work.items():
            run_jobs(cluster, node, queue, succeed=succeed * growth, fail=fail)

        def sampled(queue: str = next(iter(work)), after: int = last_ms) -> bool:
            return any(queue in s["queues"] for s in samples(cluster, node) if s["at_ms"] > after)

        cluster.wait_for(sampled, SAMPLE_WAIT_S, f"round {growth} sampled")


def line(chart: Any, series: str) -> Any:
    return chart.locator(f'path[data-series="{series}"]')


def test_the_charts_draw_jobs_per_second_by_queue_and_claim_latency(
    shared_cluster: LocalCluster, dashboard: Any, screenshot: Any, screenshot_dir: Path,
) -> None:
    leader = shared_cluster.leader()
    busy, flaky = unique("emails"), unique("reports")
    run_over_samples(shared_cluster, leader, 3, {busy: (4, 0), flaky: (2, 1)})
    page = dashboard.open(leader)

    throughput = page.locator("#chart-throughput")
    expect(throughput).to_have_attribute("data-state", "drawn")
    for series in ("submitted", "succeeded", "failed"):
        expect(line(throughput, series)).to_have_attribute("data-max", POSITIVE)
    expect(throughput.locator("figcaption")).to_contain_text("submitted")
    expect(throughput.locator("text.tick").first).to_be_visible()  # axis labels
    latency = page.locator("#chart-latency")
    expect(latency).to_have_attribute("data-state", "drawn")
    expect(line(latency, "p50")).to_have_attribute("data-max", POSITIVE)
    expect(line(latency, "p99")).to_have_attribute("data-max", POSITIVE)
    busy_chart = page.locator(f'#queue-charts figure[data-queue="{busy}"]')
    expect(busy_chart).to_have_attribute("data-state", "drawn")
    expect(line(busy_chart, "submitted")).to_have_attribute("data-points", THREE_OR_MORE)
    expect(line(busy_chart, "failed")).to_have_attribute("data-max", "0")  # none failed
    flaky_chart = page.locator(f'#queue-charts figure[data-queue="{flaky}"]')
    expect(line(flaky_chart, "failed")).to_have_attribute("data-max", POSITIVE)

    expect(page.locator("#errors")).to_have_text("")  # every panel drew its data too
    path: Path = screenshot(page, "activity charts")
    assert path.stat().st_size > 10_000, f"the screenshot {path} looks empty"
    panel = screenshot_dir / "activity-panel.png"
    page.locator("#activity-panel").screenshot(path=str(panel))
    print(f"dashboard screenshot (the activity panel): {panel}")

    # New work while the page is open: its queue's chart appears without a reload.
    late = unique("late")
    run_over_samples(shared_cluster, leader, 1, {late: (3, 0)})
    expect(page.locator(f'#queue-charts figure[data-queue="{late}"]')).to_have_attribute(
        "data-state", "drawn", timeout=SAMPLE_WAIT_S * 1000)


def test_a_follower_draws_the_cluster_s_throughput_but_only_its_own_claims(
    shared_cluster: LocalCluster, dashboard: Any,
) -> None:
    """Job counters are replicated (the same on every node); claim latency is the claims this
    node served, and these were all served by the leader."""
    leader, follower = shared_cluster.leader(), shared_cluster.followers()[0]
    queue = unique("seen-everywhere")
    run_over_samples(shared_cluster, leader, 1, {queue: (3, 0)})
    shared_cluster.wait_for(
        lambda: any(queue in s["queues"] for s in samples(shared_cluster, follower)),
        SAMPLE_WAIT_S, f"{follower.node_id} sampled {queue}")
    page = dashboard.open(follower)

    expect(page.locator(f'#queue-charts figure[data-queue="{queue}"]')).to_have_attribute(
        "data-state", "drawn")
    latency = page.locator("#chart-latency")
    expect(latency).to_have_attribute("data-state", "empty")
    expect(latency).to_contain_text("no claims served by this node")
    expect(page.locator("#activity-note")).to_contain_text(follower.node_id)
