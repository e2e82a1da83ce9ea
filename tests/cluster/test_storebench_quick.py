"""`python -m raftcron.cluster.dev.bench.storebench --quick` runs every measure and reports each
figure.

A smoke test of the store benchmark, not a benchmark: speed is never asserted, only that every
store, workload and figure is there and sane. The two stores it measures are also checked to do
what they claim (a round trip, a truncation, a compaction, a torn tail, a flipped bit), since a
store that cuts corners would make its figures meaningless.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster.dev.bench import storereport
from raftcron.cluster.dev.bench.logstores import Meta, SegmentStore, SqliteStore, StoreDamaged
from raftcron.cluster.dev.bench.storebench import BATCHES, ENTRY_SIZES, STORES
from raftcron.cluster.dev.nodeprocesses import REPO_ROOT


def ordered(figures: dict[str, float]) -> bool:
    return 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]


@pytest.fixture(scope="module")
def quick_figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("storebench")
    command = [sys.executable, "-m", "raftcron.cluster.dev.bench.storebench", "--quick", "--json"]
    finished = subprocess.run(
        [*command, "--dir", str(folder), "--allow-tmpfs"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert list(folder.iterdir()) == [], "the bench left its files behind"
    figures: dict[str, Any] = json.loads(finished.stdout.strip().splitlines()[-1])
    return figures


def test_the_quick_store_bench_reports_every_figure(quick_figures: dict[str, Any]) -> None:
    figures = quick_figures
    assert figures["quick"] is True
    assert figures["environment"]["filesystem"]["type"]

    for probe in ("append", "overwrite"):
        assert ordered(figures["fsync_4k"][probe]), probe

    rows = {(r["store"], r["entry_bytes"], r["batch"]): r for r in figures["append"]}
    assert set(rows) == {(s, e, b) for s in STORES for e in ENTRY_SIZES for b in BATCHES}
    for cell, row in rows.items():
        assert row["batches"] >= 2 and row["entries_per_s"] > 0 and row["mb_per_s"] > 0, cell
        assert ordered(row) and row["cpu_ms_per_batch"] >= 0, cell
        for figure in ("flushes_per_batch", "disk_bytes_per_data_byte"):  # None: no block device
            assert row[figure] is None or row[figure] >= 0, (cell, figure)

    maintenance = {r["store"]: r for r in figures["maintenance"]}
    assert set(maintenance) == set(STORES)
    for name, row in maintenance.items():
        assert (row["entries"], row["truncated"], row["compacted"]) == (2_000, 20, 1_799), name
        assert 0 < row["truncate_ms"] <= row["truncate_max_ms"], name
        for figure in ("build_s", "load_warm_s", "load_cold_s", "load_mb_per_s_cold"):
            assert row[figure] > 0, (name, figure)
        for figure in ("truncate_ms", "compact_ms", "load_after_compact_s"):
            assert row[figure] > 0, (name, figure)
        assert ordered(row["meta"]), name
        assert 0 < row["bytes_after_compact"] <= row["bytes_on_disk"], name
        assert row["entries_read_after_compact"] >= 201, name

    ratios = figures["ratios"]
    assert [(r["entry_bytes"], r["batch"]) for r in ratios["append"]] == [
        (e, b) for e in ENTRY_SIZES for b in BATCHES
    ]
    for row in ratios["append"]:
        for figure in ("entries_per_s", "p50_ms", "p99_ms", "max_ms"):
            assert 0 < row[figure] < math.inf, (row, figure)
    assert set(ratios["maintenance"]) >= {"load_cold_s", "truncate_ms", "compact_ms", "meta_p99_ms"}


def test_the_text_report_has_every_table(quick_figures: dict[str, Any]) -> None:
    text = storereport.render(quick_figures)
    for title in ("fdatasync after a 4 KB write", "append (", "sqlite-full ÷", "maintenance on"):
        assert title in text, title
    assert text.count("| 64 KB | 256 |") == len(STORES) + 1  # + its ratio row


def entries(first: int, last: int, term: int = 1) -> list[tuple[int, int, bytes]]:
    return [(i, term, f"entry {i} term {term}".encode() * 7) for i in range(first, last + 1)]


@pytest.mark.parametrize("kind", ["sqlite", "segment"])
def test_each_store_reads_back_what_it_kept(tmp_path: Path, kind: str) -> None:
    def open_() -> tuple[SqliteStore | SegmentStore, tuple[int, int, int]]:
        if kind == "sqlite":
            store, report = SqliteStore.open(tmp_path)
        else:
            store, report = SegmentStore.open(tmp_path, segment_bytes=4096)  # many segments
        return store, (report.first_index, report.last_index, report.entries)

    store, seen = open_()
    assert seen == (1, 0, 0)
    for start in range(1, 500, 50):
        store.append(entries(start, start + 49))
    store.set_meta(Meta(term=3, vote=2, commit=400))
    store.truncate_from(451)  # a conflict: the new leader's entries replace 451..500
    store.append(entries(451, 480, term=2))
    store.truncate_from(471)  # inside a segment this time
    store.append(entries(471, 480, term=3))
    store.compact_before(300)
    store.close()
    store, seen = open_()
    assert seen == (300, 480, 181)
    store.append(entries(481, 481, term=3))  # a reopened store appends where it ended
    store.close()
    assert open_()[1] == (300, 481, 182)


def test_the_segment_store_cuts_a_torn_tail_and_refuses_a_flipped_bit(tmp_path: Path) -> None:
    store = SegmentStore(tmp_path)
    store.append(entries(1, 10))
    store.close()
    (segment,) = tmp_path.glob("*.seg")
    whole = segment.read_bytes()
    segment.write_bytes(whole + whole[-30:-5])  # half a record after the last sync
    store, report = SegmentStore.open(tmp_path)
    store.close()
    assert (report.last_index, report.torn_bytes) == (10, 25)
    assert segment.read_bytes() == whole

    flipped = bytearray(whole)
    flipped[200] ^= 1  # inside an early record: damage, not a torn write
    segment.write_bytes(bytes(flipped))
    with pytest.raises(StoreDamaged, match="damaged record"):
        SegmentStore.open(tmp_path)


def test_the_sqlite_store_refuses_a_flipped_bit(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)
    store.append(entries(1, 10))
    store.db.execute("UPDATE log SET data = ? WHERE idx = 4", (b"not what was written",))
    store.close()
    with pytest.raises(StoreDamaged, match="entry 4: bad checksum"):
        SqliteStore.open(tmp_path)
