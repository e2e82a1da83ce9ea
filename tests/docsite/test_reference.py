"""The reference pages are what the code says (docs/reference/, written by `make docs`), and the
metrics page misses no metric a node writes to `/metrics`."""

from __future__ import annotations

import re
from types import SimpleNamespace

from metricfakes import ProposerFigures

from raftcron.cluster.clock.clocks import ClockView
from raftcron.cluster.dev import docsgen
from raftcron.cluster.membership.reach import ReachBook
from raftcron.cluster.ops.metrics import NodeStats, render
from raftcron.cluster.ops.notifier import NotifierStats
from raftcron.cluster.telemetry.histogram import Histogram
from raftcron.scheduler.driver import Driver

from .pages import REPO


def test_the_reference_pages_are_what_the_code_writes() -> None:
    stale = docsgen.stale()
    assert not stale, f"docs/reference/{', '.join(stale)} differ from the code: run make docs"


def test_a_page_changed_by_hand_is_found_stale(tmp_path) -> None:
    for name, text in docsgen.pages().items():
        (tmp_path / name).write_text(text)
    assert docsgen.stale(tmp_path) == []
    (tmp_path / "metrics.md").write_text(docsgen.pages()["metrics.md"] + "edited\n")
    assert docsgen.stale(tmp_path) == ["metrics.md"]


def every_branch_rendered() -> str:
    """`/metrics` of a node with every optional part present: a notification's POSTs, the
    peers' clocks, whom it reaches, its storage and its archive."""
    notifier = NotifierStats()
    notifier.of("ops")
    clocks = SimpleNamespace(view=lambda **_: ClockView(
        offsets_ms={"n1": 0, "n2": 5}, quorum_clock_ms=1, skew_ms=3, max_skew_ms=1000))
    reach = ReachBook("n1", bound_s=1.0)
    reach.observe({"n1": True, "n2": True}, 0.0)
    storage = SimpleNamespace(free_bytes=lambda: 1, healthy=True, fsync_failed=None, log=[],
                              snapshots=SimpleNamespace(current=None),
                              sync_latency=Histogram())
    archive = {"rows": 1, "row_bytes": 1, "file_bytes": 1, "oldest_finished_ms": None,
               "missing_jobs": 0, "filled_rows": 0, "pending_jobs": 0, "problem": None}
    stats = NodeStats(notifier=notifier, clocks=clocks, reach=reach)  # type: ignore[arg-type]
    return render(Driver().state, node_id="n1", role=2, term=1, commit_index=1,
                  applied_index=1, stats=stats, proposer=ProposerFigures(),  # type: ignore[arg-type]
                  storage=storage, archive=archive)  # type: ignore[arg-type]


def test_every_metric_a_node_writes_is_on_the_metrics_page() -> None:
    written = set(re.findall(r"^# TYPE (\S+) ", every_branch_rendered(), re.M))
    assert len(written) >= 60, sorted(written)  # every optional part was rendered
    listed = {metric.name for metric in docsgen.metrics()}
    assert written - listed == set(), "metrics the page misses"
    page = (REPO / "docs" / "reference" / "metrics.md").read_text()
    assert [name for name in sorted(written) if f"`{name}`" not in page] == []


def test_every_metric_call_of_the_package_is_read() -> None:
    """The walk reads every call that writes a raftcron_ metric, the f-string ones included
    (the job counters), so a metric written only in a branch no render reaches is listed too."""
    sources = [path for path in (REPO / "cluster").rglob("*.py")
               if "dev" not in path.relative_to(REPO / "cluster").parts]
    textual = sum(len(re.findall(r"\.(?:metric|histogram)\(\s*f?\"raftcron_", path.read_text()))
                  for path in sources)
    calls = docsgen.metric_calls()
    assert len(calls) == textual
    assert all(written for _, _, written in calls)
    counters = {metric.name for _, _, written in calls for metric in written
                if metric.name.startswith("raftcron_jobs_")}
    assert {"raftcron_jobs_submitted_total", "raftcron_jobs_failed_total"} <= counters
