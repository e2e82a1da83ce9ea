"""`raftcron.testing.Inline` runs workflows, and their jobs read their parents' results as on
a cluster (`ctx.upstream`), from plain and coroutine handlers, past the claim's cap too."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster.worker import JobContext, TaskRegistry, default_registry
from raftcron.testing import Inline, InlineError

PAGE = Path(__file__).resolve().parents[1] / "docs" / "getting-started" / "handlers.md"


def test_the_handlers_page_example_is_a_test_that_passes(monkeypatch, capsys):
    text = PAGE.read_text()
    found = re.search(r"<!-- upstream-example -->\n```python\n(.*?)```", text, re.S)
    assert found, "the handlers page lost its upstream-example block"
    monkeypatch.setattr(default_registry, "_tasks", dict(default_registry._tasks))
    namespace: dict[str, Any] = {}
    exec(compile(found.group(1), "handlers.md upstream-example", "exec"), namespace)
    namespace["test_a_child_reads_its_parents_result"]()
    assert capsys.readouterr().out == "extract returned {'rows': 3}\n"


def test_a_child_reads_its_parents_results_by_name():
    tasks = TaskRegistry()

    @tasks.task("extract")
    def extract(ctx: JobContext) -> dict[str, Any]:
        return {"rows": ctx.payload["rows"]}

    @tasks.task("count")
    def count(ctx: JobContext) -> int:
        return 2

    @tasks.task("load")
    def load(ctx: JobContext) -> dict[str, Any]:
        return {"rows": ctx.upstream["extract"]["rows"] * ctx.upstream["count"],
                "parents": sorted(ctx.upstream)}

    @tasks.task("report")
    async def report(ctx: JobContext) -> str:
        return f"loaded {ctx.upstream['load']['rows']} rows"

    inline = Inline(tasks)
    ids = inline.submit_workflow([
        {"name": "extract", "task": "extract", "payload": {"rows": 21}},
        {"name": "count", "task": "count"},
        {"name": "load", "task": "load", "after": ["extract", "count"]},
        {"name": "report", "task": "report", "after": ["load"]},
    ])
    runs = inline.drain()
    assert [run.outcome for run in runs] == ["succeeded"] * 4
    assert inline.job(ids["load"])["result"] == {"rows": 42, "parents": ["count", "extract"]}
    assert inline.job(ids["report"])["result"] == "loaded 42 rows"


def test_results_past_the_claims_cap_are_read_on_demand():
    tasks = TaskRegistry()
    tasks.add("big", lambda ctx: "x" * 60_000)
    tasks.add("sizes", lambda ctx: [len(ctx.upstream[name]) for name in sorted(ctx.upstream)])
    inline = Inline(tasks)
    names = [f"p{i}" for i in range(6)]  # 6 x 60 KB: past 256 KiB
    ids = inline.submit_workflow(
        [*({"name": name, "task": "big"} for name in names),
         {"name": "child", "task": "sizes", "after": names}])
    inline.drain()
    assert inline.job(ids["child"])["result"] == [60_000] * 6


def test_a_plain_job_has_no_upstream_and_a_bad_workflow_is_refused_naming_the_field():
    tasks = TaskRegistry()
    tasks.add("peek", lambda ctx: dict(ctx.upstream))
    inline = Inline(tasks)
    job_id = inline.submit("peek")
    inline.drain()
    assert inline.job(job_id)["result"] == {}
    with pytest.raises(InlineError) as refused:
        inline.submit_workflow([{"name": "a", "task": "peek", "after": ["nope"]}])
    assert refused.value.code == "invalid" and refused.value.field == "jobs[0].after[0]"
