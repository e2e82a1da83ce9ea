"""The dashboard's job search and a job's page, in a real browser against a real cluster
(DESIGN.md §9.2): a search by a payload field finds a job that retention moved to the archive,
and its page says so, with its payload (shown as text, never as markup) and its result; a job's
page shows the schedule that fired it and the workflow (DAG) it belongs to.

The cluster is this module's own (retention here keeps two finished jobs, so most jobs these
tests finish are archived). Every wait is Playwright's `expect` or a polled condition with a
deadline.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwrightguard import playwright_expect

from raftcron.cluster.dev.localcluster import LocalCluster

expect = playwright_expect()

KEPT = 2  # finished jobs retention keeps in the state: the older ones go to the archive
MARKUP = "<img src=x onerror=document.title=1>"  # a payload that must show as text


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def cluster(shared_cluster: LocalCluster) -> LocalCluster:
    status, body, _ = shared_cluster.call("PUT", "/v1/settings/retention",
                                          {"succeeded": {"max_count": KEPT}})
    assert status == 200, body
    return shared_cluster


def finish(cluster: LocalCluster, queue: str, count: int) -> None:
    """Claim and complete `count` jobs of `queue`, each with {"invoice": "INV-<customer>"}."""
    done = 0
    for round_number in range(50):
        claim = {"worker": "w-search", "queues": [queue], "max": 10, "lease_ms": 30_000,
                 "request_id": unique(f"claim-{round_number}")}
        status, claimed, _ = cluster.call("POST", "/v1/claims", claim)
        assert status == 200, claimed
        for job in claimed["jobs"]:
            result = {"invoice": f"INV-{job['payload']['customer']['id']}"}
            body = {"token": job["token"], "result": result, "request_id": unique("ok")}
            status, answer, _ = cluster.call("POST", f"/v1/jobs/{job['id']}/complete", body)
            assert status == 200, answer
            done += 1
        if done >= count:
            return
    raise AssertionError(f"{queue}: {done} of {count} jobs finished")


def test_a_search_by_payload_field_finds_an_archived_job_and_its_page_shows_it(
    cluster: LocalCluster, dashboard: Any, screenshot: Callable[[Any, str], Path]
) -> None:
    queue = unique("invoices")
    jobs = [{"task": "invoice", "queue": queue,
             "payload": {"customer": {"id": n, "note": MARKUP}}} for n in range(6)]
    status, created, _ = cluster.call("POST", "/v1/jobs/batch", {"jobs": jobs})
    assert status == 201, created
    ids = [job["id"] for job in created["jobs"]]
    finish(cluster, queue, len(ids))
    node = cluster.followers()[0]
    wanted = ids[1]  # customer 1: among the oldest, so evicted by retention

    def archived() -> bool:
        _, view, _ = cluster.request(node, "GET", f"/v1/jobs/{wanted}")
        return bool(view.get("archived"))

    cluster.wait_for(archived, 15, f"job {wanted} archived on {node.node_id}")
    page = dashboard.open(node)

    page.locator("#filter-payload").fill("customer.id=1")
    page.locator("#filter-created-from").fill("2000-01-01T00:00")
    page.locator("#filter-where").select_option("true")
    page.locator("#job-filters").get_by_role("button", name="apply").click()

    rows = page.locator("#jobs tbody tr[data-job]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-job", str(wanted))
    expect(rows.first).to_have_attribute("data-archived", "true")
    rows.first.click()

    detail = page.locator("#job-detail")
    expect(detail.locator("header")).to_contain_text(f"job {wanted}")
    expect(detail.locator("header .badge.archived")).to_have_text("archived")
    expect(detail).to_contain_text("in the archive: it left the replicated state")
    payload = detail.locator('[data-testid="job-payload"]')
    expect(payload).to_contain_text('"id": 1')
    expect(payload).to_contain_text(MARKUP)  # as text: the page made no element of it
    assert detail.locator("img").count() == 0 and page.title().startswith("raftcron")
    expect(detail.locator('[data-testid="job-output"]')).to_contain_text('"invoice": "INV-1"')
    attempts = detail.locator('[data-testid="attempts"] tbody tr.attempt')
    expect(attempts).to_have_count(1)
    expect(attempts.first).to_contain_text("w-search")
    expect(detail.get_by_role("button", name="retry")).to_have_count(0)  # 409 for archived
    assert page.evaluate("location.hash") == f"#job={wanted}"
    screenshot(page, "an archived job found by a payload field")

    # The page has an address: opened from it, it shows the same job.
    fresh = dashboard.context.new_page()
    fresh.goto(f"{node.url}/?refresh=1#job={wanted}")
    expect(fresh.locator("#job-detail header .badge.archived")).to_have_text("archived")
    fresh.close()

    # A range: customers 2..4, live and archived alike, newest first.
    page.locator("#filter-payload").fill("customer.id.gte=2\ncustomer.id.lte=4")
    page.locator("#filter-where").select_option("")
    page.locator("#job-filters").get_by_role("button", name="apply").click()
    expect(rows).to_have_count(3)
    assert [int(job) for job in rows.evaluate_all("rows => rows.map(r => r.dataset.job)")] == [
        ids[4], ids[3], ids[2]]

    # What the search refuses is said, naming the field; no stale rows stay under it.
    page.locator("#filter-created-from").fill("")
    page.locator("#job-filters").get_by_role("button", name="apply").click()
    expect(page.locator("#errors")).to_contain_text("created_from_ms")
    expect(page.locator("#jobs tbody")).to_contain_text("this search is refused")
    page.locator("#filter-payload").fill("customer.id")
    page.locator("#job-filters").get_by_role("button", name="apply").click()
    expect(page.locator("#errors")).to_contain_text("“customer.id” is not PATH=VALUE")


def test_a_job_page_shows_the_workflow_it_belongs_to_and_the_schedule_that_fired_it(
    cluster: LocalCluster, dashboard: Any
) -> None:
    queue = unique("etl")
    body = {"jobs": [
        {"name": "extract", "task": "etl", "queue": queue},
        {"name": "transform", "task": "etl", "queue": queue, "after": ["extract"]},
        {"name": "notify", "task": "etl", "queue": queue, "after": ["extract"]},
        {"name": "load", "task": "etl", "queue": queue, "after": ["transform", "notify"]},
    ]}
    status, workflow, _ = cluster.call("POST", "/v1/workflows", body)
    assert status == 201, workflow
    ids = {job["name"]: job["id"] for job in workflow["jobs"]}
    page = dashboard.open(cluster.followers()[0])

    page.evaluate(f"location.hash = '#job={ids['transform']}'")

    detail = page.locator("#job-detail")
    expect(detail.locator("header")).to_contain_text(f"job {ids['transform']}")
    dag = detail.locator('[data-testid="workflow"] tbody tr')
    expect(dag).to_have_count(4)
    steps = [(row[0], row[2], row[4]) for row in (
        [cell.strip() for cell in text.split("\t")] for text in dag.evaluate_all(
            "rows => rows.map(r => [...r.cells].map(c => c.textContent).join('\\t'))"))]
    assert steps == [("0", "extract", "—"), ("1", "transform", "extract"),
                     ("1", "notify", "extract"), ("2", "load", "transform, notify")], steps
    expect(detail.locator('[data-testid="workflow"] tr[aria-current="true"]')).to_contain_text(
        "transform")
    dag.filter(has_text="load").click()
    expect(detail.locator("header")).to_contain_text(f"job {ids['load']}")
    expect(detail.locator('[data-testid="workflow"] tr[aria-current="true"]')).to_contain_text(
        "load")

    name = unique("nightly")
    spec = {"every": "1s", "overlap": "allow", "job": {"task": "report", "queue": name}}
    status, answer, _ = cluster.call("PUT", f"/v1/schedules/{name}", spec)
    assert status in (200, 201), answer
    page.locator("#filter-schedule").fill(name)
    page.locator("#job-filters").get_by_role("button", name="apply").click()
    fired = page.locator("#jobs tbody tr[data-job]")
    expect(fired.first).to_contain_text(name)  # the search's rows, not the ones before it
    fired.first.click()
    schedule = detail.locator('[data-testid="job-schedule"]')
    expect(schedule).to_contain_text(name)
    expect(schedule).to_contain_text("every 1s, active")
    assert cluster.call("DELETE", f"/v1/schedules/{name}")[0] == 200
    expect(schedule).to_contain_text(re.compile("the schedule\\s*deleted since"))
