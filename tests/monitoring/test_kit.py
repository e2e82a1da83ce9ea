"""The monitoring kit's shape (no process started): rules an operator can act on, each one
unit-tested with promtool, a dashboard Grafana imports, and the parser that finds the metric
names they use (tests/monitoring/test_live_metrics.py checks those against a live node)."""

from __future__ import annotations

import re
from itertools import combinations

import pytest

from .kit import (
    REPO,
    dashboard,
    declared_families,
    is_exported,
    metric_names,
    panels,
    rule_tests,
    rules,
    used_metric_names,
)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("raftcron_storage_healthy == 0", {"raftcron_storage_healthy"}),
        ('max without (instance, pod, node, role) (raftcron_raft_role{role="leader"}) < 1',
         {"raftcron_raft_role"}),
        ("histogram_quantile(0.99, sum by (node, le) "
         '(rate(raftcron_commit_latency_seconds_bucket{job=~"$job"}[$__rate_interval])))',
         {"raftcron_commit_latency_seconds_bucket"}),
        ("(raftcron_member_reachable == 0) and ignoring (member, role) "
         '(raftcron_raft_role{role="leader"} == 1)', {"raftcron_member_reachable",
                                                     "raftcron_raft_role"}),
        ("raftcron_state_bytes / raftcron_state_budget_bytes >= 0.8",
         {"raftcron_state_bytes", "raftcron_state_budget_bytes"}),
        ("predict_linear(raftcron_storage_free_bytes[6h], 24 * 3600) < 0",
         {"raftcron_storage_free_bytes"}),
        ("raftcron_storage_free_bytes < 1.5e9 unless raftcron_storage_healthy offset 5m",
         {"raftcron_storage_free_bytes", "raftcron_storage_healthy"}),
        ('sum(rate(a_total{x="by (y) rate(b)"}[5m])) by (queue) > bool 0', {"a_total"}),
        ("foo:rate5m + on (node) group_left (member) bar", {"foo:rate5m", "bar"}),
        ("max_over_time(raftcron_raft_term[15m:1m])", {"raftcron_raft_term"}),
    ],
)
def test_metric_names_are_read_out_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


PAGE = """# HELP raftcron_raft_term Current Raft term
# TYPE raftcron_raft_term gauge
raftcron_raft_term{node="n1"} 3
# TYPE raftcron_commit_latency_seconds histogram
raftcron_commit_latency_seconds_bucket{node="n1",le="+Inf"} 0
# TYPE raftcron_jobs_failed_total counter
"""


@pytest.mark.parametrize(
    ("name", "exported"),
    [
        ("raftcron_raft_term", True),
        ("raftcron_jobs_failed_total", True),  # declared, no sample yet: still exported
        ("raftcron_commit_latency_seconds_bucket", True),
        ("raftcron_commit_latency_seconds_count", True),
        ("raftcron_raft_term_count", False),  # a gauge has no _count
        ("raftcron_raft_terms", False),
    ],
)
def test_a_name_is_exported_when_declared_or_a_histograms_series(name: str,
                                                                 exported: bool) -> None:
    assert is_exported(name, declared_families(PAGE)) is exported


def test_every_rule_waits_names_its_severity_and_says_what_to_do() -> None:
    found = rules()
    assert len(found) >= 11
    names = [rule["alert"] for rule in found]
    assert len(set(names)) == len(names), names
    for rule in found:
        assert rule["alert"].startswith("Raftcron"), rule["alert"]
        assert "for" in rule, rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"].strip(), rule["alert"]
        # what to do: a command to run or the section of the docs to read
        assert "docs/" in annotations["description"] or "`raftcron " in \
            annotations["description"], rule["alert"]
        for page in re.findall(r"docs/[\w/.-]+\.md", annotations["description"]):
            assert (REPO / page).is_file(), (rule["alert"], page)


def test_every_alert_the_issue_asks_for_is_there() -> None:
    names = {rule["alert"] for rule in rules()}
    assert {
        "RaftcronNoLeader", "RaftcronLeaderFlapping", "RaftcronMemberDown",
        "RaftcronQuorumAtRisk", "RaftcronSlowFsync", "RaftcronStorageUnhealthy",
        "RaftcronStorageNearlyFull", "RaftcronStateBudgetNearlyFull", "RaftcronClockSkew",
        "RaftcronSchedulesMisfiring", "RaftcronDeadLettersGrowing", "RaftcronNotificationLag",
    } <= names


def test_every_rule_has_a_promtool_test_that_fires_it_and_one_time_it_is_quiet() -> None:
    """promtool checks only the alert names a test names: a rule no test names is untested."""
    fired: set[str] = set()
    quiet: set[str] = set()
    tests = rule_tests()["tests"]
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
        # beside what fires, series that must not: more series than alerts expected
        expected = sum(len(case.get("exp_alerts") or []) for case in test["alert_rule_test"])
        assert len(test["input_series"]) > expected, test["name"]
    names = {rule["alert"] for rule in rules()}
    assert names - fired == set(), "rules no promtool test fires"
    assert fired <= names and quiet <= names


def test_the_dashboard_chooses_its_prometheus_and_cluster_by_variables() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["datasource"]["uid"] == "${datasource}"
    for panel in panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["id"]
        for target in panel["targets"]:
            assert '{job=~"$job"' in target["expr"], (panel["title"], target["expr"])


def test_every_panel_has_targets_a_unique_id_and_its_own_place_on_the_grid() -> None:
    every = panels(dashboard())
    ids = [panel["id"] for panel in every]
    assert len(set(ids)) == len(ids), ids
    boxes = []
    for panel in every:
        place = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= place.keys(), panel["id"]
        assert place["x"] >= 0 and place["w"] > 0 and place["x"] + place["w"] <= 24, panel["id"]
        boxes.append((panel["id"], place))
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel.get("description"), panel["id"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(set(refs)) == len(refs), panel["id"]
        assert all(target["expr"].strip() for target in panel["targets"]), panel["id"]
    for (one, a), (other, b) in combinations(boxes, 2):
        apart = (a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"]
                 or a["y"] + a["h"] <= b["y"] or b["y"] + b["h"] <= a["y"])
        assert apart, f"panels {one} and {other} overlap"


def test_the_dashboard_draws_what_an_operator_looks_for() -> None:
    shown = {name for name, places in used_metric_names().items()
             if any(place.startswith("panel") for place in places)}
    assert {
        "raftcron_jobs_submitted_total", "raftcron_jobs_succeeded_total",
        "raftcron_jobs_failed_total", "raftcron_claim_latency_seconds_bucket",
        "raftcron_commit_latency_seconds_bucket", "raftcron_raft_leader_changes_total",
        "raftcron_raft_term", "raftcron_member_reachable",
        "raftcron_storage_sync_seconds_bucket", "raftcron_state_budget_bytes",
        "raftcron_storage_free_bytes", "raftcron_schedule_misfires_total",
        "raftcron_notification_lag_seconds",
    } <= shown


def test_the_monitoring_page_says_what_every_alert_means() -> None:
    readme = (REPO / "docs" / "operations" / "monitor.md").read_text()
    assert "deploy/monitoring/grafana-dashboard.json" in readme
    missing = [rule["alert"] for rule in rules() if f"`{rule['alert']}`" not in readme]
    assert missing == []
