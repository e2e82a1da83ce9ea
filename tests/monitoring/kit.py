"""The monitoring kit's files (deploy/monitoring/) as the tests read them, and the metric names
a PromQL expression uses.

Names are read by elimination, not by guessing where they stand: strings, label matchers
(`{...}`), ranges (`[5m]`), grouping lists (`by (...)`, `on (...)`, ...) and Grafana variables
are blanked, then every identifier left that is not a PromQL function (followed by `(`),
keyword or aggregation is a metric name. A name the parser should not have found is then a
failure naming it, never a name silently skipped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "deploy" / "monitoring"
RULES = KIT / "alerts.yml"
RULE_TESTS = KIT / "alerts_test.yml"
DASHBOARD = KIT / "grafana-dashboard.json"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# Words that stand in PromQL where a metric name could, without a `(` after them.
KEYWORDS = frozenset({
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
    "group_right", "inf", "nan",
})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_IDENTIFIER = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """Every metric name the PromQL expression selects."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    return {name for name in _IDENTIFIER.findall(text) if name.lower() not in KEYWORDS}


def declared_families(metrics_text: str) -> dict[str, str]:
    """Metric family -> type, from the `# TYPE` lines of a /metrics page."""
    found = {}
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            found[name] = kind
    return found


def is_exported(name: str, families: dict[str, str]) -> bool:
    """`name` is a declared family, or a histogram's `_bucket`, `_sum` or `_count` series."""
    if name in families:
        return True
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and families.get(name.removesuffix(suffix)) == "histogram":
            return True
    return False


def rules() -> list[dict[str, Any]]:
    """Every rule of every group of alerts.yml."""
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def rule_tests() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULE_TESTS.read_text())
    return loaded


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included; rows too."""
    found = []
    for panel in board["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every rule and every panel target."""
    found = [(f"rule {rule['alert']}", rule["expr"]) for rule in rules()]
    for panel in panels(dashboard()):
        for target in panel.get("targets", []):
            found.append((f"panel {panel['id']} {panel['title']!r} {target['refId']}",
                          target["expr"]))
    return found


def used_metric_names() -> dict[str, list[str]]:
    """Metric name -> where it is used (rules and panels)."""
    used: dict[str, list[str]] = {}
    for where, expr in expressions():
        for name in metric_names(expr):
            used.setdefault(name, []).append(where)
    return used
