"""The alert rules and the dashboard's queries through Prometheus' own tool: `promtool check
rules` (the rules load), `promtool test rules` (deploy/monitoring/alerts_test.yml: each rule
fires on the series that should fire it, and not on healthy ones), and every panel's
expression parsed as PromQL. Without promtool these tests fail naming the Debian package, on a
developer's machine as in CI: a skip would hide that the rules went untested."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .kit import DASHBOARD, KIT, RULE_TESTS, RULES, dashboard, panels

pytestmark = pytest.mark.processes
PROMTOOL_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("the alert rules are checked with promtool, which is not installed: "
                    "apt-get install prometheus (.ci/run installs it)", pytrace=False)
    return found


def run(promtool: str, *args: str, cwd: Path = KIT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=PROMTOOL_TIMEOUT_S, check=False)


def test_the_alert_rules_load_in_prometheus(promtool: str) -> None:
    result = run(promtool, "check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_rule_passes_its_promtool_unit_tests(promtool: str) -> None:
    result = run(promtool, "test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_failing_rule_test_fails(promtool: str, tmp_path: Path) -> None:
    """The harness is not blind: alerts_test.yml against rules whose threshold moved fails."""
    (tmp_path / RULES.name).write_text(
        RULES.read_text().replace("raftcron_storage_free_bytes < 1073741824",
                                  "raftcron_storage_free_bytes < 1024"))
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    result = run(promtool, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0
    assert "RaftcronStorageNearlyFull" in result.stdout + result.stderr


def test_every_dashboard_query_is_promql(promtool: str, tmp_path: Path) -> None:
    """Each target as a recording rule, with Grafana's variables given values, so promtool
    parses it (`check rules` parses every expression)."""
    rules = []
    for panel in panels(dashboard()):
        for target in panel.get("targets", []):
            expr = (target["expr"].replace("$__rate_interval", "1m")
                    .replace("$job", "raftcron"))
            rules.append({"record": f"dashboard:panel_{panel['id']}_{target['refId']}",
                          "expr": expr})
    assert len(rules) > 20, DASHBOARD
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run(promtool, "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
