"""Loading the log does not hold a segment in the node's own memory: a node that was sized for
its state budget was OOM-killed at every restart under its cgroup limit, because it read each
whole segment (up to 64 MiB) and kept every frame of it at once (the chaos suite's memory
scenario: 8 of 10 restarts under 128 MiB). Segments are mapped now (their pages are the page
cache's, which the kernel can reclaim) and replayed one batch at a time."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from raftcron.cluster.storage.raftlog import RaftLog

from .logmodel import command

ENTRY_BYTES = 16 << 10
ENTRIES = 1_280  # 20 MiB of commands in one segment


def test_loading_a_20_mib_segment_allocates_a_small_part_of_it(tmp_path: Path) -> None:
    log = RaftLog(str(tmp_path), durable=False, segment_bytes_max=1 << 30,
                  cache_bytes_max=1 << 20)
    log.ensure_segment()
    for index in range(1, ENTRIES + 1):
        log.append(index, 1, command(index, 1, ENTRY_BYTES))
        if index % 64 == 0:
            log.sync()
    log.close(clean=False)
    segment_bytes = sum(p.stat().st_size for p in tmp_path.glob("log-*.seg"))
    assert segment_bytes > ENTRIES * ENTRY_BYTES

    tracemalloc.start()
    try:
        again = RaftLog(str(tmp_path), durable=False, segment_bytes_max=1 << 30,
                        cache_bytes_max=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert again.last_index == ENTRIES
    assert again.command_at(ENTRIES // 2) == command(ENTRIES // 2, 1, ENTRY_BYTES)
    again.close(clean=False)
    # Reading the segment whole and keeping its frames peaked at about twice its size.
    assert peak < segment_bytes // 8, f"load peaked at {peak} bytes for {segment_bytes}"
    print(f"loading {segment_bytes} bytes of log peaked at {peak} bytes allocated")
