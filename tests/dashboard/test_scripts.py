"""The dashboard's scripts read as plain files, no browser: what a browser would not complain
about but would get wrong."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from raftcron.cluster.http.dashboard import ASSETS

SCRIPTS = sorted(name for name in ASSETS if name.endswith(".js"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_two_functions_of_a_script_share_a_name(name: str) -> None:
    """In one scope a later `function f` silently replaces an earlier one: the charts' rate
    formatter once replaced the queues table's, and that table stopped drawing."""
    text = ASSETS[name].body.decode()
    names = Counter(re.findall(r"^\s*(?:async\s+)?function\s+(\w+)", text, re.MULTILINE))
    assert [found for found, count in names.items() if count > 1] == []


def test_the_page_loads_the_charts_before_the_script_that_draws_with_them() -> None:
    from raftcron.cluster.http.dashboard import PAGE

    page = PAGE.body.decode()
    assert 0 < page.index("/ui/charts.js?v=") < page.index("/ui/app.js?v=")
    assert page.count(" defer>") >= 2  # deferred scripts run in the page's order
