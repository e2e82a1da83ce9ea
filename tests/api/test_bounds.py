"""One validation path per field: the routes check a command's fields only through the core's
parsing, and the few bounds the API has of its own are named in cluster/http/bounds.py.

A number written into a route's bound (`chars_max=1_000`, `high=2**62`, `len(raw) > 18`) is how
the API and the core came to judge the same field differently (a cancel reason: 1,000
characters at the route, 4,096 in the core)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from raftcron.cluster.http import bounds
from raftcron.scheduler import limits

HTTP = Path(__file__).resolve().parents[2] / "cluster" / "http"
BOUND_KEYWORDS = {"chars_max", "bytes_max", "items_max", "high", "low_max"}


def literal_bounds(source: str) -> list[int]:
    """Lines where a bound is a number written in place rather than a named constant."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg in BOUND_KEYWORDS:
            if _is_number(node.value):
                lines.append(node.value.lineno)
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
            called = node.left.func
            if isinstance(called, ast.Name) and called.id == "len":
                lines += [c.lineno for c in node.comparators if _is_number(c)]
    return lines


def _is_number(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    return False


def test_no_route_writes_a_bound_in_place():
    routes = [path for path in sorted(HTTP.glob("*.py")) if path.name != "bounds.py"]
    assert len(routes) > 5
    problems = [
        f"{path.name}:{line}" for path in routes for line in literal_bounds(path.read_text())
    ]
    assert problems == []


@pytest.mark.parametrize(
    "source",
    [
        'parse.optional_text(x, "reason", chars_max=1_000)\n',
        'query_int(r, "cursor", default=None, low=1, high=2**62)\n',
        "ok = len(raw) > 18\n",
    ],
)
def test_the_check_finds_a_bound_written_in_place(source):
    assert literal_bounds(source) == [1]


def test_a_named_bound_passes_the_check():
    assert literal_bounds('query_int(r, "limit", default=100, low=1, high=bounds.PAGE_MAX)\n') == []


def test_request_ids_the_shell_derives_stay_within_the_core_s_bound():
    # A claim's later rounds go out as "<request_id>/<n>"; the core refuses ids over its bound.
    longest_round = "r" * bounds.REQUEST_ID_CHARS_MAX + f"/{bounds.CLAIM_ROUNDS_MAX - 1}"
    assert len(longest_round) <= limits.KEY_CHARS_MAX
