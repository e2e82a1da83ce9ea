"""The candidate stores for the Raft log and its metadata, measured with fsync really on.

    python -m raftcron.cluster.dev.bench.storebench [--quick] [--json] [--dir DIR]

Measures the two stores of `cluster.bench.logstores` (DESIGN.md §8.1, issue 11) side by side in
one sitting, each in several durability settings:

- `sqlite-full`, `sqlite-normal`, `sqlite-off`: SQLite in WAL mode, one transaction per batch,
  `PRAGMA synchronous` FULL (the WAL synced at each commit: the candidate), NORMAL (synced at
  checkpoints only) and OFF;
- `segment-fdatasync` (the candidate), `segment-fsync`, `segment-os`: the segment log, one
  `os.write` per batch then `os.fdatasync`, `os.fsync` or nothing (durability "os").

Figures:

- `append`: entries of 200 B, 2 KB and 64 KB in batches of 1, 16 and 256 (one durable commit per
  batch; the six stores take turns, ten rounds per workload, so that noise falls on all alike):
  entries/s and MB/s (data bytes over the time spent inside `append`, batches back to back),
  per-batch commit latency p50/p99/max, CPU per batch, the disk's flush requests per batch (from
  /proc/diskstats: device-wide, so other processes on the disk count too; a synced store shows
  >= 1, an unsynced one ~0, which is how we know fsync reached the device), and the bytes the
  device wrote per data byte (the WAL's checkpoint and the page cache's write-back after each
  share included: SQLite writes each page twice, ext4's journal adds its own);
- `maintenance`, per store, on a log of 100,000 entries of 2 KB: building it, a term/vote/commit
  update (p50/p99/max), open + read every entry with its CRC checked (page cache warm, then cold
  after `posix_fadvise(DONTNEED)`), truncating the last 1,000 entries, compacting every entry
  below 90,000, the bytes on disk before and after, and a reopen after both (the truncation is
  timed 5 times, the entries appended back after each: median and max);
- `fsync_4k`: the bare cost of `os.fdatasync` after a 4 KB append (and after a 4 KB overwrite in
  place), p50/p99/max, for reference;
- `ratios`: sqlite-full ÷ segment-fdatasync for each figure (compare ratios within one run: the
  machine is shared and noisy).

The files go to a temporary folder under --dir (default: the current directory), removed at the
end. A tmpfs or ramfs is refused (fsync means nothing there) unless --allow-tmpfs. `--quick` runs
every measure with tiny sizes (a smoke run of a few seconds, for the test suite).

What the disk under --dir is (mount, device, write cache, counters) is `diskinfo`'s; the text
report is `storereport`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raftcron.cluster.dev.bench.diskinfo import (
    MEMORY_FILESYSTEMS,
    bytes_on_disk,
    disk_counters,
    drop_page_cache,
    environment,
    filesystem,
)
from raftcron.cluster.dev.bench.logstores import (
    SEGMENT_BYTES,
    LogStore,
    Meta,
    OpenReport,
    SegmentStore,
    SqliteStore,
)
from raftcron.cluster.dev.bench.stats import latency, percentile
from raftcron.cluster.dev.bench.storereport import render

STORES = (
    "sqlite-full",
    "sqlite-normal",
    "sqlite-off",
    "segment-fdatasync",
    "segment-fsync",
    "segment-os",
)
CANDIDATES = ("sqlite-full", "segment-fdatasync")
ENTRY_SIZES = (200, 2 * 1024, 64 * 1024)
BATCHES = (1, 16, 256)
TRUNCATIONS = 5  # the truncation is timed this many times (the entries appended back each time)
@dataclass(frozen=True)
class Sizes:
    max_batches: int  # timed batches per append cell, at most...
    min_batches: int  # ...and at least, whatever the byte budget says
    byte_budget: int  # data bytes per append cell
    warmup: int  # batches before the timed ones
    log_entries: int  # the maintenance log (2 KB entries)
    truncated: int  # entries cut from its end
    compact_below: int  # entries below this index compacted away
    meta_writes: int
    fsync_calls: int
    segment_bytes: int
    rounds: int  # the stores take turns this many times in each append cell


FULL = Sizes(1_000, 30, 512 * 1024 * 1024, 3, 100_000, 1_000, 90_000, 500, 500, SEGMENT_BYTES, 10)
QUICK = Sizes(6, 2, 1024 * 1024, 1, 2_000, 20, 1_800, 10, 20, 1024 * 1024, 2)


def make_store(name: str, directory: Path, sizes: Sizes) -> LogStore:
    kind, mode = name.split("-")
    if kind == "sqlite":
        return SqliteStore(directory, mode.upper())
    return SegmentStore(directory, _segment_sync(mode), segment_bytes=sizes.segment_bytes)


def open_store(name: str, directory: Path, sizes: Sizes) -> tuple[LogStore, OpenReport]:
    kind, mode = name.split("-")
    if kind == "sqlite":
        return SqliteStore.open(directory, mode.upper())
    return SegmentStore.open(directory, _segment_sync(mode), segment_bytes=sizes.segment_bytes)


def _segment_sync(mode: str) -> str:
    return "none" if mode == "os" else mode


# --- measures -------------------------------------------------------------------------------


def payload_pool(entry_bytes: int, count: int = 64) -> list[bytes]:
    rng = random.Random(entry_bytes)
    return [rng.randbytes(entry_bytes) for _ in range(count)]


def batches_of(first: int, count: int, size: int, pool: list[bytes]) -> Iterator[list[Any]]:
    """Entries first.., count of them, in batches of size, term 1, data from pool."""
    index = first
    end = first + count
    while index < end:
        top = min(end, index + size)
        yield [(i, 1, pool[i % len(pool)]) for i in range(index, top)]
        index = top


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


@dataclass
class _Runner:
    """One store's side of an append cell: its batches still to come and what they took."""

    name: str
    store: LogStore
    work: Iterator[list[Any]]
    seconds: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    flushes: int = 0
    written: int = 0


def measure_append(
    root: Path, entry_bytes: int, batch: int, sizes: Sizes, device: str | None, first: int = 0
) -> list[dict[str, Any]]:
    """Every store on one workload, interleaved: the timed batches go in rounds, a share of each
    store's batches per round (the order rotating), so that the machine's noise, which drifts
    over seconds, falls on every store alike. Between two shares the page cache is written back
    (untimed): a store never pays for another's dirty pages."""
    by_budget = sizes.byte_budget // (entry_bytes * batch)
    batches = max(sizes.min_batches, min(sizes.max_batches, by_budget))
    pool = payload_pool(entry_bytes)
    runners: list[_Runner] = []
    try:
        for name in STORES:
            directory = root / f"{name}-{entry_bytes}-{batch}"
            directory.mkdir()
            work = batches_of(1, (sizes.warmup + batches) * batch, batch, pool)
            runners.append(_Runner(name, make_store(name, directory, sizes), work))
        for runner in runners:
            for _ in range(sizes.warmup):
                runner.store.append(next(runner.work))
        os.sync()  # the warmup's writes are not the measured ones
        share = -(-batches // sizes.rounds)
        for round_number in range(sizes.rounds):
            turn = (first + round_number) % len(runners)
            for runner in runners[turn:] + runners[:turn]:
                count = min(share, batches - len(runner.seconds))
                todo = [next(runner.work) for _ in range(count)]
                before = disk_counters(device)
                cpu = time.process_time()
                for entries in todo:
                    started = time.perf_counter()
                    runner.store.append(entries)
                    runner.seconds.append(time.perf_counter() - started)
                runner.cpu_s += time.process_time() - cpu
                flushed = disk_counters(device)
                os.sync()  # what an unsynced store left in the page cache is part of its cost
                written = disk_counters(device)
                if before and flushed and written:
                    runner.flushes += flushed[0] - before[0]
                    runner.written += written[1] - before[1]
        for runner in runners:
            before = disk_counters(device)
            runner.store.close()  # SQLite checkpoints its WAL here: those writes count too
            os.sync()
            written = disk_counters(device)
            if before and written:
                runner.written += written[1] - before[1]
    finally:
        for runner in runners:
            runner.store.close()
            shutil.rmtree(runner.store.directory)
    rows = []
    data_bytes = batches * batch * entry_bytes
    for runner in runners:
        total = sum(runner.seconds)
        rows.append(
            {
                "store": runner.name,
                "entry_bytes": entry_bytes,
                "batch": batch,
                "batches": batches,
                "entries_per_s": batches * batch / total,
                "mb_per_s": data_bytes / total / 1e6,
                **latency(runner.seconds),
                "cpu_ms_per_batch": runner.cpu_s / batches * 1e3,
                "flushes_per_batch": None if device is None else runner.flushes / batches,
                "disk_bytes_per_data_byte": None if device is None else runner.written / data_bytes,
            }
        )
    return rows


def measure_maintenance(name: str, root: Path, sizes: Sizes) -> dict[str, Any]:
    """Build a log of 2 KB entries, then: metadata writes, loads, a truncation, a compaction."""
    n = sizes.log_entries
    pool = payload_pool(2 * 1024)
    directory = root / f"{name}-log"
    directory.mkdir()
    figures: dict[str, Any] = {"store": name, "entries": n}
    try:
        store = make_store(name, directory, sizes)
        try:
            started = time.perf_counter()
            for entries in batches_of(1, n, 256, pool):
                store.append(entries)
            figures["build_s"] = time.perf_counter() - started
            seconds = []
            for i in range(sizes.meta_writes):
                meta = Meta(term=i + 2, vote=i % 3, commit=min(n, i * 100))
                started = time.perf_counter()
                store.set_meta(meta)
                seconds.append(time.perf_counter() - started)
            figures["meta"] = latency(seconds)
        finally:
            store.close()
        figures["bytes_on_disk"] = bytes_on_disk(directory)

        def load(expect: tuple[int, int]) -> tuple[LogStore, OpenReport, float]:
            started = time.perf_counter()
            store, report = open_store(name, directory, sizes)
            took = time.perf_counter() - started
            if (report.first_index, report.last_index) != expect or report.torn_bytes:
                store.close()
                raise AssertionError(f"{name}: read back {report}, expected entries {expect}")
            return store, report, took

        store, report, figures["load_warm_s"] = load((1, n))
        store.close()
        drop_page_cache(directory)
        store, report, figures["load_cold_s"] = load((1, n))
        figures["load_mb_per_s_cold"] = report.bytes_read / figures["load_cold_s"] / 1e6
        try:
            cut = n - sizes.truncated + 1
            seconds = []
            for _ in range(TRUNCATIONS):
                seconds.append(timed(lambda: store.truncate_from(cut)))
                for entries in batches_of(cut, sizes.truncated, 256, pool):
                    store.append(entries)  # the new leader's entries, as after a real conflict
            figures["truncate_ms"] = percentile(seconds, 0.5) * 1e3
            figures["truncate_max_ms"] = max(seconds) * 1e3
            figures["truncated"] = sizes.truncated
            below = sizes.compact_below
            figures["compact_ms"] = timed(lambda: store.compact_before(below)) * 1e3
            figures["compacted"] = below - 1
        finally:
            store.close()
        figures["bytes_after_compact"] = bytes_on_disk(directory)
        store, report, figures["load_after_compact_s"] = load((sizes.compact_below, n))
        store.close()
        figures["entries_read_after_compact"] = report.entries + report.skipped
    finally:
        shutil.rmtree(directory)
    os.sync()
    return figures


def measure_fsync(root: Path, calls: int) -> dict[str, Any]:
    """The bare cost of os.fdatasync after a 4 KB append, and after a 4 KB overwrite in place."""
    block = os.urandom(4096)
    path = root / "fsync-probe"
    figures: dict[str, Any] = {"calls": calls}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        seconds = []
        for _ in range(calls):
            os.write(fd, block)
            started = time.perf_counter()
            os.fdatasync(fd)
            seconds.append(time.perf_counter() - started)
        figures["append"] = latency(seconds)
    finally:
        os.close(fd)
    fd = os.open(path, os.O_WRONLY)
    try:
        seconds = []
        for _ in range(calls):
            os.pwrite(fd, block, 0)
            started = time.perf_counter()
            os.fdatasync(fd)
            seconds.append(time.perf_counter() - started)
        figures["overwrite"] = latency(seconds)
    finally:
        os.close(fd)
        path.unlink()
    return figures


def ratios(append: list[dict[str, Any]], maintenance: list[dict[str, Any]]) -> dict[str, Any]:
    """sqlite-full ÷ segment-fdatasync, figure by figure (above 1: SQLite is more)."""
    sqlite, segment = CANDIDATES
    cells = {(row["store"], row["entry_bytes"], row["batch"]): row for row in append}
    rows = []
    for entry_bytes in ENTRY_SIZES:
        for batch in BATCHES:
            a, b = cells[(sqlite, entry_bytes, batch)], cells[(segment, entry_bytes, batch)]
            rows.append(
                {
                    "entry_bytes": entry_bytes,
                    "batch": batch,
                    **{
                        figure: a[figure] / b[figure]
                        for figure in ("entries_per_s", "p50_ms", "p99_ms", "max_ms")
                    },
                }
            )
    by_store = {row["store"]: row for row in maintenance}
    a, b = by_store[sqlite], by_store[segment]
    once = {
        figure: a[figure] / b[figure]
        for figure in (
            "build_s",
            "load_warm_s",
            "load_cold_s",
            "truncate_ms",
            "compact_ms",
            "bytes_on_disk",
            "load_after_compact_s",
        )
    }
    once["meta_p50_ms"] = a["meta"]["p50_ms"] / b["meta"]["p50_ms"]
    once["meta_p99_ms"] = a["meta"]["p99_ms"] / b["meta"]["p99_ms"]
    return {"append": rows, "maintenance": once}


def run(root: Path, sizes: Sizes, *, quiet: bool = False) -> dict[str, Any]:
    def say(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    started = time.monotonic()
    env = environment(root)
    device = env["block_device"]
    say(f"storebench in {root}: {env['filesystem']}, device {device} ({env['write_cache']})")
    fsync_4k = measure_fsync(root, sizes.fsync_calls)
    say(f"fsync_4k          append {fsync_4k['append']}")
    append = []
    cell = 0
    for entry_bytes in ENTRY_SIZES:
        for batch in BATCHES:
            rows = measure_append(root, entry_bytes, batch, sizes, device, first=cell)
            cell += 1
            append += rows
            for row in rows:
                say(
                    f"append {row['store']:<18} {entry_bytes:>6} B x {batch:<3}"
                    f" {row['entries_per_s']:>10,.0f}/s  p50 {row['p50_ms']:.3f}"
                    f"  p99 {row['p99_ms']:.3f} ms"
                )
    maintenance = []
    for name in STORES:
        row = measure_maintenance(name, root, sizes)
        maintenance.append(row)
        say(
            f"maintenance {name:<18} load {row['load_cold_s']:.2f} s"
            f"  truncate {row['truncate_ms']:.1f} ms  compact {row['compact_ms']:.1f} ms"
        )
    return {
        "quick": sizes == QUICK,
        "environment": env,
        "sizes": asdict(sizes),
        "fsync_4k": fsync_4k,
        "append": append,
        "maintenance": maintenance,
        "ratios": ratios(append, maintenance),
        "elapsed_s": time.monotonic() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m raftcron.cluster.dev.bench.storebench",
        description="Measure the candidate Raft log stores with fsync really on.",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--dir", type=Path, default=Path.cwd(), help="where the temporary folder goes (a disk)"
    )
    parser.add_argument(
        "--allow-tmpfs", action="store_true", help="run on a tmpfs too (fsync then means nothing)"
    )
    args = parser.parse_args(argv)
    kind = filesystem(args.dir).get("type", "?")
    if kind in MEMORY_FILESYSTEMS and not args.allow_tmpfs:
        print(
            f"storebench: {args.dir} is on {kind}, where fsync reaches no disk;"
            " pass --dir on a real disk (or --allow-tmpfs)",
            file=sys.stderr,
        )
        return 2
    root = Path(tempfile.mkdtemp(prefix="storebench-", dir=args.dir))
    try:
        figures = run(root, QUICK if args.quick else FULL)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures) if args.json else render(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
