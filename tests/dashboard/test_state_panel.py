"""The dashboard's state panel in a real browser: the replicated state against its budget
(DESIGN.md §9.1), the finished jobs kept by outcome and the evictions by reason, as
`GET /v1/settings` says, on a 3-node cluster whose budget is 4 MiB (`budget_cluster`).

The tests share that cluster and fill it: the gauge's test leaves it over its budget and
lowers the budget for a while (restored in a `finally`). Every wait is Playwright's `expect` or
a polled condition with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from playwrightguard import playwright_expect

from raftcron.cluster.dev.localcluster import LocalCluster

expect = playwright_expect()

pytestmark = pytest.mark.processes

MiB = 1024**2
BIG_PAYLOAD = {"blob": "x" * 60_000}  # about 60 KB: each such job is ~1.5% of 4 MiB
BATCH = 8  # big jobs per POST /v1/jobs/batch (a command is at most 512 KiB encoded)
BUDGET_WARN_PCT = 80  # app.js's BUDGET_WARN_PCT, the doctor's --budget-warn-pct default


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def settings(cluster: LocalCluster) -> dict[str, Any]:
    status, body, _ = cluster.call("GET", "/v1/settings?consistent=1")
    assert status == 200, body
    return dict(body)


def put_settings(cluster: LocalCluster, section: str, body: dict[str, Any]) -> None:
    status, answer, _ = cluster.call("PUT", f"/v1/settings/{section}",
                                     {**body, "request_id": unique("settings")})
    assert status == 200, answer


def fill(cluster: LocalCluster, queue: str, *, until_pct: float) -> None:
    """Submit big jobs (never run: nobody claims them) until the state is at `until_pct` of
    its budget or more."""
    for _ in range(100):
        usage = settings(cluster)["usage"]
        if 100 * usage["state_bytes"] >= until_pct * usage["budget_bytes"]:
            return
        jobs = [{"task": "big", "queue": queue, "payload": BIG_PAYLOAD}] * BATCH
        body = {"jobs": jobs, "request_id": unique("fill")}
        status, answer, _ = cluster.call("POST", "/v1/jobs/batch", body)
        assert status == 201, (status, str(answer)[:500])
    raise AssertionError(f"the state did not reach {until_pct}% of its budget")


def shown_percent(page: Any) -> float:
    return float(page.locator('[data-testid="budget-percent"]').inner_text().rstrip("%"))


def api_percent(cluster: LocalCluster) -> float:
    usage = settings(cluster)["usage"]
    return 100 * usage["state_bytes"] / usage["budget_bytes"]


def test_finished_jobs_kept_by_outcome_and_evictions_by_reason_show(
    budget_cluster: LocalCluster, dashboard: Any
) -> None:
    queue = unique("finished")
    later = {"task": "t", "queue": queue, "delay_ms": 3_600_000}
    status, created, _ = budget_cluster.call("POST", "/v1/jobs/batch", {"jobs": [later] * 3})
    assert status == 201, created
    for job in created["jobs"]:
        status, answer, _ = budget_cluster.call("POST", f"/v1/jobs/{job['id']}/cancel", {})
        assert status == 200, answer
    page = dashboard.open(budget_cluster.followers()[0])
    kept = page.locator('[data-testid="kept"]')
    before = settings(budget_cluster)["usage"]
    assert before["kept"]["cancelled"] >= 3, before
    expect(kept.locator('tr[data-outcome="cancelled"] td.num')).to_have_text(
        str(before["kept"]["cancelled"]))
    expect(kept.locator('tr[data-outcome="succeeded"] td.num')).to_have_text(
        str(before["kept"]["succeeded"]))
    expect(kept.locator('tr[data-outcome="failed"] td.num')).to_have_text(
        str(before["kept"]["failed"]))

    # Retention keeps one cancelled job: the others leave the state, evicted "by count".
    put_settings(budget_cluster, "retention", {"cancelled": {"max_count": 1}})
    try:
        budget_cluster.wait_for(
            lambda: settings(budget_cluster)["usage"]["kept"]["cancelled"] == 1, 15,
            "the cancelled jobs past max_count evicted")
        evicted = settings(budget_cluster)["usage"]["evicted"]
        assert evicted.get("count", 0) >= before["kept"]["cancelled"] - 1, evicted
        expect(kept.locator('tr[data-outcome="cancelled"] td.num')).to_have_text("1")
        row = page.locator('[data-testid="evicted"] tr[data-reason="count"]')
        expect(row.locator("td.num")).to_have_text(str(evicted["count"]))
        expect(row.locator("td").first).to_have_attribute("title", re.compile("max_count"))
    finally:
        put_settings(budget_cluster, "retention", {})  # every rule back to its default


def test_the_gauge_shows_the_state_against_its_budget_and_colours_at_80_and_100_percent(
    budget_cluster: LocalCluster, dashboard: Any, screenshot: Any
) -> None:
    budget_bytes = settings(budget_cluster)["budget"]["bytes"]
    assert budget_bytes == 4 * MiB, "budget_cluster's budget is its config's [settings]"
    queue = unique("big")
    fill(budget_cluster, queue, until_pct=25)
    page = dashboard.open(budget_cluster.followers()[0])
    gauge = page.locator('[data-testid="budget-gauge"]')
    percent = page.locator('[data-testid="budget-percent"]')
    figures = page.locator('[data-testid="budget-figures"]')

    expect(percent).to_have_text(re.compile(r"^[1-9]\d*%$"))  # a whole, non-zero percentage
    expect(figures).to_contain_text("of a 4.0 MiB budget")
    expect(gauge).to_have_attribute("data-level", "ok")
    # A follower's read may trail the leader's by a refresh or two: the page catches up.
    budget_cluster.wait_for(
        lambda: abs(shown_percent(page) - api_percent(budget_cluster)) <= 1, 10,
        "the page's percentage to be the API's")
    fill_width = page.locator("#budget-fill").evaluate("e => e.getBoundingClientRect().width")
    gauge_width = gauge.evaluate("e => e.getBoundingClientRect().width")
    assert 0.2 * gauge_width < fill_width < 0.5 * gauge_width, (fill_width, gauge_width)
    state_queues = page.locator('[data-testid="state-queues"]')
    expect(state_queues.locator(f'tr[data-queue="{queue}"]')).to_be_visible()

    fill(budget_cluster, queue, until_pct=BUDGET_WARN_PCT)
    expect(gauge).to_have_attribute("data-level", "warn")
    expect(percent).to_have_class(re.compile(r"\bwarn\b"))
    expect(figures).to_contain_text("new jobs are refused once they no longer fit")
    assert shown_percent(page) >= BUDGET_WARN_PCT
    screenshot(page, "the state at 80 percent of its budget")

    # A budget lowered under what the unfinished jobs take: full, and submits are refused.
    put_settings(budget_cluster, "budget", {"bytes": 1 * MiB})
    try:
        expect(gauge).to_have_attribute("data-level", "full")
        expect(figures).to_contain_text("of a 1.0 MiB budget")
        expect(figures).to_contain_text("new jobs are refused (507 state_full)")
        assert shown_percent(page) >= 300
        fill_width = page.locator("#budget-fill").evaluate("e => e.getBoundingClientRect().width")
        assert fill_width == pytest.approx(gauge.evaluate(
            "e => e.getBoundingClientRect().width"), abs=1), "the bar stops at 100%"
        status, answer, _ = budget_cluster.call(
            "POST", "/v1/jobs", {"task": "big", "queue": queue, "payload": BIG_PAYLOAD})
        assert status == 507 and answer["error"]["code"] == "state_full", answer
        screenshot(page, "the state over a lowered budget")
    finally:
        put_settings(budget_cluster, "budget", {"bytes": budget_bytes})
    expect(gauge).to_have_attribute("data-level", "warn")


def test_before_the_cluster_is_finalized_the_page_says_there_is_no_budget(
    budget_cluster: LocalCluster, dashboard: Any, screenshot: Any
) -> None:
    """A cluster before `raftcron cluster finalize` (one that was upgraded from the previous
    release): its `GET /v1/settings` is what the product's own view gives a state that was
    never finalized, served in place of this finalized cluster's answer."""
    from raftcron.scheduler import views
    from raftcron.scheduler.state import SchedulerState

    before = {**views.settings_view(SchedulerState()), "node": "n1", "applied_index": 1}
    assert before["finalized"] is False and before["usage"]["budget_bytes"] is None
    served: list[str] = []

    def unfinalized(route: Any) -> None:
        served.append(route.request.url)
        route.fulfill(json=before)

    dashboard.page.route(re.compile(r"/v1/settings$"), unfinalized)
    page = dashboard.open(budget_cluster.nodes[0])

    expect(page.locator('[data-testid="not-finalized"]')).to_have_text(
        "not finalized: no budget (previous release's behaviour)")
    expect(page.locator('[data-testid="budget-gauge"]')).to_be_hidden()
    expect(page.locator('[data-testid="budget-percent"]')).to_have_text("")
    expect(page.locator('[data-testid="state-note"]')).to_contain_text("not finalized")
    expect(page.locator("#state-hint")).to_contain_text("raftcron cluster finalize")
    assert served, "the page did not ask GET /v1/settings"
    screenshot(page, "the state of a cluster not finalized")
