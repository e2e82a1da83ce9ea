"""The archive fill benchmark (cluster/dev/bench/fillbench.py) at a tiny size: a member's whole
gap is filled from a peer's archive over HTTP, every row of it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from raftcron.cluster.dev.bench.fillbench import measure

pytestmark = pytest.mark.processes  # the peer serves from a process of its own


def test_the_fill_benchmark_fills_every_row_and_says_how_fast(tmp_path: Path) -> None:
    figures = asyncio.run(measure(tmp_path, 2_500, 100))
    assert figures["filled_rows"] == 2_500 and figures["missing"] == 0
    assert figures["rows_per_s"] > 0 and figures["member_file_mb"] > 0
