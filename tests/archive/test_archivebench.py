"""The archive's benchmark (cluster/dev/bench/archivebench.py) at a tiny size: every figure is
there and sane, the searches it times are the ones it says (the indexed one through the search
attribute's index, the day's scan through the finish times, which finds its one row), and it
leaves no file behind. A smoke test, not a benchmark: no speed is asserted."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from raftcron.cluster.dev.bench import archivebench, run


def test_the_archive_bench_reports_every_figure_at_a_tiny_size(tmp_path: Path) -> None:
    figures = archivebench.measure(rows=3_000, size_rows=600, rows_per_day=1_000,
                                   directory=tmp_path)
    assert list(tmp_path.iterdir()) == [], "the bench left its files behind"

    size = figures["size"]
    assert set(size) == {"noop", "1kb"}
    for row in size.values():
        assert row["rows"] == 600 and row["rows_per_s"] > 0
        assert row["commit_rows_per_s"] >= row["rows_per_s"]
        assert row["bytes_per_job"] > row["json_bytes_per_job"] > 0  # pages and indexes too
    assert 1_000 < size["1kb"]["json_bytes_per_job"] - size["noop"]["json_bytes_per_job"] < 1_100

    search = figures["search"]
    assert (search["rows"], search["rows_per_day"]) == (3_000, 1_000)
    assert search["index_build_s"] > 0 and search["file_bytes"] > 0
    for name, count in archivebench.LOOKUPS.items():
        row = search[name]
        assert row["count"] == count and 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
        assert row["cold"]["count"] == archivebench.LOOKUPS_COLD[name]
    assert any("USING INDEX jobs_attribute_" in step
               for step in search["by_indexed_field"]["plan"])
    assert any("USING INDEX jobs_finished" in step for step in search["by_day_scan"]["plan"])
    assert search["by_day_scan"]["rows_in_range"] == 1_000

    text = archivebench.render(figures)
    for line in ("noop payload", "1kb payload", "by_id", "by_indexed_field", "by_day_scan"):
        assert line in text, line


def test_raftcron_bench_only_archive_runs_it_without_a_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    monkeypatch.chdir(tmp_path)  # its folder goes under the current one
    assert run.run(parser.parse_args(["--only", "archive", "--quick", "--rows", "2000"])) == 0
    assert "2,000 rows (2,000 a day)" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
