"""The dashboard in a real browser (headless Chromium) against a real 3-node cluster.

Each test opens the page of one node, acts as a person would (reads a table, clicks a
button, types a token) and checks the outcome both in the page and through the API. The page
refreshes itself every second here (`?refresh=1`); every wait is Playwright's `expect` or a
polled condition with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any

from playwrightguard import playwright_expect

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

expect = playwright_expect()

TOKENS = {"dash-admin-token-0123": "admin", "dash-read-token-0123": "read"}
ADMIN, READ = "dash-admin-token-0123", "dash-read-token-0123"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def follower(cluster: LocalCluster) -> LocalNode:
    return cluster.followers()[0]


def put_schedule(cluster: LocalCluster, name: str, token: str | None = None) -> None:
    body = {"every": "1s", "overlap": "allow", "job": {"task": "noop", "queue": name}}
    status, answer, _ = cluster.call("PUT", f"/v1/schedules/{name}", body, token=token)
    assert status in (200, 201), answer


def get_schedule(cluster: LocalCluster, name: str) -> dict[str, Any]:
    status, body, _ = cluster.call("GET", f"/v1/schedules/{name}")
    assert status == 200, body
    return dict(body)


def dead_letter_job(cluster: LocalCluster, queue: str, error: str) -> int:
    """A job that failed for good: max_attempts=1, claimed, failed non-retryably."""
    status, job, _ = cluster.call(
        "POST", "/v1/jobs", {"task": "doomed", "queue": queue, "max_attempts": 1}
    )
    assert status == 201, job
    claim = {
        "worker": "test-worker",
        "queues": [queue],
        "max": 1,
        "lease_ms": 30_000,
        "request_id": unique("claim"),
    }
    status, claimed, _ = cluster.call("POST", "/v1/claims", claim)
    assert status == 200 and claimed["jobs"], claimed
    token = claimed["jobs"][0]["token"]
    failure = {"token": token, "error": error, "retryable": False, "request_id": unique("fail")}
    status, failed, _ = cluster.call("POST", f"/v1/jobs/{job['id']}/fail", failure)
    assert status == 200 and failed["status"] == "failed", failed
    return int(job["id"])


# -- what the page serves --------------------------------------------------------------------


def test_the_page_and_its_assets_are_served_with_cache_headers(
    shared_cluster: LocalCluster,
) -> None:
    node = shared_cluster.nodes[1]
    status, html, headers = shared_cluster.request(node, "GET", "/")
    assert status == 200
    assert headers["Cache-Control"] == "no-cache"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert "http://" not in html and "https://" not in html  # nothing from elsewhere
    status, _, again = shared_cluster.request(
        node, "GET", "/", headers={"If-None-Match": headers["ETag"]}
    )
    assert status == 304 and again["ETag"] == headers["ETag"]
    for url in re.findall(r'(?:src|href)="(/ui/[^"]+)"', html):
        status, body, asset_headers = shared_cluster.request(node, "GET", url)
        assert status == 200 and body, url
        assert "immutable" in asset_headers["Cache-Control"], url
    status, _, stale = shared_cluster.request(node, "GET", "/ui/app.js?v=old")
    assert status == 200 and stale["Cache-Control"] == "no-cache"
    status, body, _ = shared_cluster.request(node, "GET", "/ui/secret.py")
    assert status == 404, body


# -- what the page shows ---------------------------------------------------------------------


def test_the_members_table_shows_three_nodes_and_exactly_one_leader(
    shared_cluster: LocalCluster, dashboard: Any
) -> None:
    leader = shared_cluster.leader()
    page = dashboard.open(leader)

    rows = page.locator("#members tbody tr")
    expect(rows).to_have_count(3)
    expect(page.locator('#members tbody tr[data-role="leader"]')).to_have_count(1)
    expect(page.locator('#members tbody tr[data-role="leader"]')).to_have_attribute(
        "data-node", leader.node_id
    )
    expect(page.locator("#members-note")).to_have_text("3 nodes, 1 leader")
    # On the leader, every member's lag is known (the leader's match index), never "?".
    for index in range(3):
        expect(rows.nth(index).locator("td").nth(4)).to_have_text(re.compile(r"^\d+$"))


def test_the_page_says_which_node_it_talks_to_and_who_leads(
    shared_cluster: LocalCluster, dashboard: Any
) -> None:
    leader = shared_cluster.leader()
    other = follower(shared_cluster)
    page = dashboard.open(other)

    expect(page.locator("#this-node")).to_contain_text(other.node_id)
    expect(page.locator("#this-node")).to_contain_text(other.http_address)
    expect(page.locator("#leader-node")).to_have_text(leader.node_id)
    own_row = page.locator(f'#members tbody tr[data-node="{other.node_id}"]')
    expect(own_row).to_contain_text("this page")
    expect(page.locator("#freshness")).to_have_class(re.compile(r"\blive\b"))
    expect(page).to_have_title(re.compile(other.node_id))


def test_a_schedules_fires_appear_in_the_page(
    shared_cluster: LocalCluster, dashboard: Any, screenshot: Any
) -> None:
    name = unique("every-second")
    put_schedule(shared_cluster, name)
    page = dashboard.open(follower(shared_cluster))

    row = page.locator(f'#schedules tr[data-schedule="{name}"]')
    expect(row.locator('[data-testid="recent-fires"] .chip')).not_to_have_count(0)
    expect(row.locator('[data-testid="fires"]')).to_have_text(re.compile(r"^([3-9]|\d\d+)$"))
    fired = get_schedule(shared_cluster, name)["recent_fires"]
    assert len(fired) >= 3, f"the page shows 3 fires or more, the API {fired}"
    expect(page.locator("#events li", has_text=f"{name} fired")).not_to_have_count(0)
    expect(page.locator(f'#queues tr[data-queue="{name}"]')).to_be_visible()

    # The schedule's jobs, through the jobs table's filter.
    page.locator("#filter-schedule").fill(name)
    page.get_by_role("button", name="apply").click()
    jobs = page.locator("#jobs tbody tr[data-job]")
    expect(jobs).not_to_have_count(0)
    expect(jobs.first).to_contain_text(name)
    jobs.first.click()
    expect(page.locator("#job-detail")).to_contain_text(f"{name}@")  # the fired job's key
    path: Path = screenshot(page, "schedules firing")
    assert path.stat().st_size > 10_000, f"the screenshot {path} looks empty"


def busy_schedule_row(cluster: LocalCluster, dashboard: Any, prefix: str) -> tuple[Any, Any, str]:
    """A schedule firing every second, its row shown by a follower's page, which changes the
    row at every refresh: (page, row, the schedule's name)."""
    name = unique(prefix)
    put_schedule(cluster, name)
    page = dashboard.open(follower(cluster))
    row = page.locator(f'#schedules tr[data-schedule="{name}"]')
    expect(row.locator('[data-testid="fires"]')).to_have_text(re.compile(r"^\d+$"))
    return page, row, name


def wait_for_a_redraw(row: Any) -> None:
    """Until a refresh changed the row's data (its fire count), which is a new render of it."""
    fires = row.locator('[data-testid="fires"]')
    seen = int(fires.inner_text())
    expect(fires).to_have_text(re.compile(rf"^(?!{seen}$)\d+$"))


def expect_paused(cluster: LocalCluster, row: Any, name: str) -> None:
    cluster.wait_for(lambda: get_schedule(cluster, name)["paused"], 10, f"{name} paused in the API")
    expect(row).to_have_attribute("data-paused", "true")


def test_pausing_a_schedule_from_the_page_pauses_it(
    shared_cluster: LocalCluster, dashboard: Any
) -> None:
    name = unique("pause-me")
    put_schedule(shared_cluster, name)
    page = dashboard.open(follower(shared_cluster))
    row = page.locator(f'#schedules tr[data-schedule="{name}"]')

    row.get_by_role("button", name="pause").click()

    expect_paused(shared_cluster, row, name)
    expect(row.get_by_role("button", name="resume")).to_be_visible()
    expect(page.locator("#notice")).to_contain_text(f"{name} paused")

    row.get_by_role("button", name="resume").click()

    shared_cluster.wait_for(
        lambda: not get_schedule(shared_cluster, name)["paused"], 10, f"{name} resumed"
    )
    expect(row).to_have_attribute("data-paused", "false")


def test_a_row_whose_data_changes_keeps_its_buttons_across_refreshes(
    shared_cluster: LocalCluster, dashboard: Any
) -> None:
    """A schedule firing every second changes its row at every refresh; its buttons must stay
    the same elements, or a click that lands while the row is rebuilt is lost (a CI run lost
    one: mousedown on the old button, mouseup on its replacement)."""
    _, row, name = busy_schedule_row(shared_cluster, dashboard, "busy-row")
    button = row.get_by_role("button", name="pause").element_handle()
    wait_for_a_redraw(row)
    wait_for_a_redraw(row)
    assert button.evaluate("element => element.isConnected"), "the pause button was replaced"
    button.click()
    expect_paused(shared_cluster, row, name)


def test_a_click_held_across_a_refresh_still_lands(
    shared_cluster: LocalCluster, dashboard: Any
) -> None:
    """A person's click lasts a while between press and release. A browser fires no click when
    the pressed element left the page in between, even to be put back: a refresh that
    re-attached the table's rows lost the click (a CI run lost a pause click this way)."""
    page, row, name = busy_schedule_row(shared_cluster, dashboard, "held-click")
    button = row.get_by_role("button", name="pause")
    button.scroll_into_view_if_needed()

    def pointer_on_button() -> None:
        box = button.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)

    pointer_on_button()
    page.mouse.down()
    wait_for_a_redraw(row)
    pointer_on_button()  # released where the button is after the redraw
    page.mouse.up()
    expect_paused(shared_cluster, row, name)


def get_queue(cluster: LocalCluster, name: str) -> dict[str, Any]:
    status, body, _ = cluster.call("GET", f"/v1/queues/{name}?consistent=1")
    assert status == 200, body
    return dict(body)


def test_a_queue_s_limits_and_held_back_jobs_show_and_the_page_pauses_it(
    shared_cluster: LocalCluster, dashboard: Any
) -> None:
    queue = unique("capped")
    limits = {"concurrency_max": 1, "rate_limit": {"max": 50, "per_ms": 1_000}}
    assert shared_cluster.call("PUT", f"/v1/queues/{queue}", limits)[0] == 200
    jobs = [{"task": "t", "queue": queue}] * 3
    assert shared_cluster.call("POST", "/v1/jobs/batch", {"jobs": jobs})[0] == 201
    claim = {"worker": "w", "queues": [queue], "max": 3, "request_id": unique("claim")}
    status, claimed, _ = shared_cluster.call("POST", "/v1/claims", claim)
    assert status == 200 and len(claimed["jobs"]) == 1, claimed  # the cap
    page = dashboard.open(follower(shared_cluster))
    row = page.locator(f'#queues tr[data-queue="{queue}"]')
    expect(row).to_contain_text("≤ 1 running")
    expect(row).to_contain_text("50 per 1 s, window")
    expect(row.locator('[data-testid="held"]')).to_have_text("cap 2")

    row.get_by_role("button", name="pause").click()

    shared_cluster.wait_for(lambda: get_queue(shared_cluster, queue)["paused"], 10, "paused")
    expect(row).to_have_attribute("data-paused", "true")
    expect(row.locator('[data-testid="held"]')).to_have_text("paused 2")
    expect(page.locator("#notice")).to_contain_text(f"queue {queue} paused")
    row.get_by_role("button", name="resume").click()
    shared_cluster.wait_for(lambda: not get_queue(shared_cluster, queue)["paused"], 10, "resumed")
    expect(row).to_have_attribute("data-paused", "false")


NOTIFICATION = {
    # Nobody listens on port 9 (discard): an event stays pending, retried by the leader.
    "url": "http://127.0.0.1:9/hooks/raftcron?token=receivers-own-token",
    "events": ["schedule_failed", "dead_letter"],
    "secret": "the-signing-secret-0123456789",
}


def notification_reads(cluster: LocalCluster, node: LocalNode, token: str | None = None) -> int:
    """GET /v1/notifications requests in the node's audit trail."""
    status, body, _ = cluster.request(node, "GET", "/v1/audit?limit=1000", token=token)
    assert status == 200, body
    return sum(
        (entry["method"], entry["path"]) == ("GET", "/v1/notifications")
        for entry in body["entries"]
    )


def test_a_notification_shows_with_its_events_and_delivery_state_and_goes_when_deleted(
    shared_cluster: LocalCluster, dashboard: Any, screenshot: Any
) -> None:
    name = unique("ops")
    status, answer, _ = shared_cluster.call("PUT", f"/v1/notifications/{name}", NOTIFICATION)
    assert status == 201, answer
    try:
        node = follower(shared_cluster)
        page = dashboard.open(node)
        row = page.locator(f'#notifications tr[data-notification="{name}"]')
        expect(row.locator('[data-testid="events"] .badge')).to_have_text(
            ["dead_letter", "schedule_failed"]
        )
        # The URL without its query (it may carry the receiver's token); never the secret.
        expect(row.locator('[data-testid="receiver"]')).to_have_text(
            "http://127.0.0.1:9/hooks/raftcron?…"
        )
        expect(row.locator('[data-testid="pending"]')).to_have_text("0")
        dead_letter_job(shared_cluster, unique("doomed"), "for the receiver")
        expect(row.locator('[data-testid="pending"]')).to_have_text("1")
        screenshot(page, "a notification with an event pending")
        html = page.content()
        assert NOTIFICATION["secret"] not in html and "receivers-own-token" not in html
        # Every admin read is audited: the page read the receivers once, not at each refresh.
        assert notification_reads(shared_cluster, node) == 1

        assert shared_cluster.call("DELETE", f"/v1/notifications/{name}")[0] == 200
        expect(row).to_have_count(0)
    finally:  # the shared cluster is left without it, whatever happened
        shared_cluster.call("DELETE", f"/v1/notifications/{name}")


def test_a_bulk_cancel_from_the_page_counts_first_then_acts_on_exactly_those_jobs(
    shared_cluster: LocalCluster, dashboard: Any
) -> None:
    queue, other = unique("bulk"), unique("kept")
    later = {"task": "t", "delay_ms": 3_600_000}
    for name, count in ((queue, 5), (other, 2)):
        body = {"jobs": [{**later, "queue": name}] * count}
        assert shared_cluster.call("POST", "/v1/jobs/batch", body)[0] == 201
    page = dashboard.open(follower(shared_cluster))
    page.locator("#filter-queue").fill(queue)
    page.locator("#job-filters").get_by_role("button", name="apply").click()
    page.locator("#bulk-action").select_option("cancel")

    page.locator("#bulk-count").click()

    expect(page.locator("#bulk-summary")).to_have_text(f"5 jobs match (queue {queue})")
    confirm = page.locator("#bulk-confirm")
    expect(confirm).to_have_text("cancel 5 jobs")
    confirm.click()
    expect(page.locator("#notice")).to_contain_text("cancelled 5 of 5 matching jobs")
    expect(confirm).to_be_hidden()

    def statuses(name: str) -> set[str]:
        return {job["status"] for job in shared_cluster.list_jobs(
            shared_cluster.nodes[0], queue=name, consistent=1)}

    assert statuses(queue) == {"cancelled"} and statuses(other) == {"scheduled"}
    expect(page.locator("#jobs tbody tr[data-status='cancelled']")).to_have_count(5)


def test_retrying_a_dead_letter_job_from_the_page_brings_it_back(
    shared_cluster: LocalCluster, dashboard: Any
) -> None:
    queue = unique("doomed")
    job_id = dead_letter_job(shared_cluster, queue, "disk full\nwhile writing the report")
    page = dashboard.open(follower(shared_cluster))
    row = page.locator(f'#dead tbody tr[data-job="{job_id}"]')
    expect(row).to_contain_text("disk full")
    row.get_by_role("link", name=str(job_id)).click()
    attempt_error = page.locator('#job-detail [data-testid="attempts"] .attempt-error')
    expect(attempt_error).to_contain_text("while writing the report")

    row.get_by_role("button", name="retry").click()

    def revived() -> bool:
        _, job, _ = shared_cluster.call("GET", f"/v1/jobs/{job_id}")
        return job["status"] in ("queued", "scheduled")

    shared_cluster.wait_for(revived, 10, f"job {job_id} queued again")
    expect(row).to_have_count(0)
    expect(page.locator("#notice")).to_contain_text(f"job {job_id} is queued again")


def test_one_jobs_attempts_and_output_show_in_its_detail(
    shared_cluster: LocalCluster, dashboard: Any
) -> None:
    queue = unique("output")
    flow = {"rate": {"key": "cust-42", "max": 10, "per_ms": 60_000},
            "fairness": {"key": "cust-42", "weight": 2}}
    status, job, _ = shared_cluster.call("POST", "/v1/jobs",
                                         {"task": "shell", "queue": queue, **flow})
    assert status == 201, job
    claim = {"worker": "w-out", "queues": [queue], "max": 1, "request_id": unique("claim")}
    _, claimed, _ = shared_cluster.call("POST", "/v1/claims", claim)
    result = {"exit_code": 0, "stdout": "hello from the dashboard test\n", "stderr": ""}
    done = {"token": claimed["jobs"][0]["token"], "result": result, "request_id": unique("ok")}
    status, answer, _ = shared_cluster.call("POST", f"/v1/jobs/{job['id']}/complete", done)
    assert status == 200, answer
    page = dashboard.open(follower(shared_cluster))

    page.locator("#filter-queue").fill(queue)
    page.get_by_role("button", name="apply").click()
    page.locator(f'#jobs tbody tr[data-job="{job["id"]}"]').click()

    detail = page.locator("#job-detail")
    expect(detail).to_contain_text(f"job {job['id']}")
    expect(detail.locator('[data-testid="job-output"]')).to_have_text(
        "hello from the dashboard test\n"
    )
    attempts = detail.locator('[data-testid="attempts"] tbody tr.attempt')
    expect(attempts).to_have_count(1)
    expect(attempts.first).to_contain_text("w-out")
    expect(attempts.first).to_contain_text("succeeded")
    expect(detail).to_contain_text("key cust-42, at most 10 starts per 60 s")
    expect(detail).to_contain_text("key cust-42, 2 a turn")


def test_a_running_jobs_progress_shows_as_a_bar_that_follows_its_reports(
    shared_cluster: LocalCluster, dashboard: Any
) -> None:
    queue = unique("progress")
    status, job, _ = shared_cluster.call("POST", "/v1/jobs", {"task": "export", "queue": queue})
    assert status == 201, job
    claim = {"worker": "w-progress", "queues": [queue], "max": 1, "request_id": unique("claim")}
    _, claimed, _ = shared_cluster.call("POST", "/v1/claims", claim)
    token = claimed["jobs"][0]["token"]

    def report(progress: dict[str, Any]) -> None:
        beat = {"token": token, "progress": progress, "request_id": unique("beat")}
        status, answer, _ = shared_cluster.call("POST", f"/v1/jobs/{job['id']}/heartbeat", beat)
        assert status == 200, answer

    report({"value": {"done": 40, "total": 100}, "message": "exporting rows",
            "data": {"table": "orders"}})
    page = dashboard.open(follower(shared_cluster))
    page.locator("#filter-queue").fill(queue)
    page.get_by_role("button", name="apply").click()
    page.locator(f'#jobs tbody tr[data-job="{job["id"]}"]').click()

    detail = page.locator("#job-detail")
    bar = detail.locator('[data-testid="job-progress"] progress')
    caption = detail.locator('[data-testid="job-progress-caption"]')
    expect(caption).to_have_text("40% (40 of 100) — exporting rows")
    expect(bar).to_have_attribute("value", "0.4")
    expect(detail.locator('[data-testid="job-progress-data"]')).to_contain_text('"orders"')
    cancel = detail.get_by_role("button", name="cancel").element_handle()
    report({"value": 0.75})  # the page refreshes every second: the bar follows
    expect(caption).to_have_text("75%")
    expect(bar).to_have_attribute("value", "0.75")
    # The redraw kept the buttons: a click pressed on one across a report still lands.
    assert cancel.evaluate("element => element.isConnected"), "the cancel button was replaced"
    done = {"token": token, "request_id": unique("ok")}
    status, answer, _ = shared_cluster.call("POST", f"/v1/jobs/{job['id']}/complete", done)
    assert status == 200, answer
    expect(detail).to_contain_text("progress (the last of attempt 1)")


# -- auth ------------------------------------------------------------------------------------


def test_the_token_is_asked_once_and_kept_for_the_session(
    fresh_clusters: Any, dashboard: Any
) -> None:
    cluster = fresh_clusters.open(tokens=TOKENS)
    name = unique("guarded")
    put_schedule(cluster, name, token=ADMIN)
    page = dashboard.open(cluster.nodes[0], wait=False)
    dialog = page.locator("#token-dialog")

    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")  # closed without a token: the page says what it waits for
    expect(page.locator("#errors")).to_contain_text("needs an API token")
    page.get_by_role("button", name="enter token").click()
    expect(dialog).to_be_visible()
    page.locator("#token-input").fill("not-a-token")
    page.locator("#token-input").press("Enter")
    expect(dialog).to_be_visible()
    expect(page.locator("#token-error")).to_contain_text("refused")

    page.locator("#token-input").fill(ADMIN)
    page.get_by_role("button", name="use token").click()

    expect(dialog).to_be_hidden()
    expect(page.locator("#members tbody tr")).to_have_count(3)
    expect(page.locator(f'#schedules tr[data-schedule="{name}"]')).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('raftcron.token')") == ADMIN

    # A reload keeps the token: the page works without asking again.
    page.reload()
    expect(page.locator("#this-node")).to_contain_text(cluster.nodes[0].node_id)
    expect(page.locator("#members tbody tr")).to_have_count(3)
    expect(dialog).to_be_hidden()

    # A token whose role may not manage schedules: the page says why the click did nothing.
    page.get_by_role("button", name="change token").click()
    page.locator("#token-input").fill(READ)
    page.locator("#token-input").press("Enter")
    page.locator(f'#schedules tr[data-schedule="{name}"]').get_by_role(
        "button", name="pause"
    ).click()
    expect(page.locator("#errors")).to_contain_text("403 forbidden")
    status, schedule, _ = cluster.call("GET", f"/v1/schedules/{name}", token=ADMIN)
    assert status == 200 and schedule["paused"] is False


def test_a_refusal_of_a_request_sent_before_the_token_does_not_undo_the_token(
    fresh_clusters: Any, dashboard: Any
) -> None:
    # One refresh asks several things at once. The first 401 opens the dialog; the others come
    # back after the token was given, and they were refused for having no token, not for this one.
    cluster = fresh_clusters.open(tokens=TOKENS)
    held: list[Any] = []

    def hold_first_unauthorized_events(route: Any) -> None:
        if not held and "authorization" not in route.request.headers:
            held.append(route)  # answered below, after the token is given
        else:
            route.continue_()

    page = dashboard.page
    page.route(re.compile(r"/v1/events\?"), hold_first_unauthorized_events)
    page = dashboard.open(cluster.nodes[0], wait=False)
    dialog = page.locator("#token-dialog")
    expect(dialog).to_be_visible()
    deadline = time.monotonic() + 15
    while not held and time.monotonic() < deadline:  # route handlers run while Playwright waits
        page.wait_for_timeout(50)
    assert held, "the page never asked for /v1/events without a token"
    page.locator("#token-input").fill(READ)
    page.locator("#token-input").press("Enter")
    expect(dialog).to_be_hidden()
    held[0].continue_()  # the server answers it 401: no token was sent with it

    expect(page.locator("#members tbody tr")).to_have_count(3)
    expect(page.locator("#this-node")).to_contain_text(cluster.nodes[0].node_id)
    expect(dialog).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('raftcron.token')") == READ


def test_without_the_manage_grant_a_notification_shows_its_figures_and_says_why_not_more(
    fresh_clusters: Any, dashboard: Any
) -> None:
    cluster = fresh_clusters.open(tokens=TOKENS)
    name = unique("ops")
    status, answer, _ = cluster.call(
        "PUT", f"/v1/notifications/{name}", NOTIFICATION, token=ADMIN
    )
    assert status == 201, answer
    page = dashboard.open(cluster.nodes[0], wait=False)
    reads: list[str] = []
    page.on("request", lambda request: reads.append(request.url)
            if request.url.endswith("/v1/notifications") else None)
    page.locator("#token-input").fill(READ)
    page.locator("#token-input").press("Enter")
    row = page.locator(f'#notifications tr[data-notification="{name}"]')
    expect(row.locator('[data-testid="pending"]')).to_have_text("0")  # /metrics: read grant
    expect(row.locator('[data-testid="receiver"]')).to_have_text("?")
    expect(page.locator("#notifications-hint")).to_contain_text("403 forbidden")
    expect(page.locator("#notifications-hint")).to_contain_text("manage grant")
    for _ in range(3):  # three more refreshes: the refused read is not asked again
        page.wait_for_event("request", lambda request: request.url.endswith("/metrics"))
    assert len(reads) == 1, reads

    page.get_by_role("button", name="change token").click()
    page.locator("#token-input").fill(ADMIN)
    page.locator("#token-input").press("Enter")
    expect(row.locator('[data-testid="receiver"]')).to_have_text(
        "http://127.0.0.1:9/hooks/raftcron?…"
    )
    expect(page.locator("#notifications-hint")).not_to_contain_text("403")
    assert len(reads) == 2, reads


# -- a member down ---------------------------------------------------------------------------


def test_a_member_down_is_shown_and_the_page_keeps_working(
    fresh_clusters: Any, dashboard: Any
) -> None:
    cluster = fresh_clusters.open()
    leader = cluster.leader()
    down, other = cluster.followers()
    page = dashboard.open(leader)
    expect(page.locator("#members tbody tr")).to_have_count(3)

    cluster.kill(down)

    row = page.locator(f'#members tbody tr[data-node="{down.node_id}"]')
    expect(row.locator(".badge.no")).to_be_visible()
    expect(page.locator("#freshness")).to_contain_text("updated")
    expect(page.locator('#members tbody tr[data-role="leader"]')).to_have_count(1)

    # The node the page talks to goes down: the last data stays, marked stale, with the error
    # and a link to a member that still serves the dashboard.
    cluster.kill(leader)

    expect(page.locator("#freshness")).to_have_class(re.compile(r"\bstale\b"))
    expect(page.locator("#errors")).to_contain_text(f"cannot reach {leader.http_address}")
    expect(page.locator("#errors a", has_text=other.node_id)).to_have_attribute(
        "href", f"{other.url}/"
    )
    expect(page.locator("#members tbody tr")).to_have_count(3)


def test_a_membership_change_in_progress_is_shown_with_the_node_catching_up(
    shared_cluster: LocalCluster, dashboard: Any
) -> None:
    """A node being added (here never started: it stays catching up) is in the members table
    with its state, and the change is named above the hint; cancelled, both go."""
    from raftcron.cluster.dev import joining

    newcomer = joining.join_node(shared_cluster, "n9", peers=list(shared_cluster.nodes))
    shared_cluster.nodes.remove(newcomer)  # never started: not one of the cluster's nodes
    status, answer, _ = shared_cluster.call(
        "POST", "/v1/cluster/members?wait_s=0", joining.body(newcomer))
    assert status == 202, answer
    try:
        page = dashboard.open(shared_cluster.leader())
        row = page.locator('#members tbody tr[data-node="n9"]')
        expect(row).to_contain_text("catching up")
        expect(page.locator("#members-change")).to_contain_text("add n9 (catching up)")
    finally:
        status, answer, _ = shared_cluster.call("DELETE", "/v1/cluster/members/n9")
        assert status == 200 and answer["cancelled"], answer
