"""The archive's figures (DESIGN.md §9.2, issue 26 "Measure"): a node's `ArchiveStore` filled
directly, on a real disk, in `fsync` durability, with the batches its writer makes.

    python -m raftcron.cluster.dev.bench.archivebench [--rows N] [--json] [--dir DIR]
    raftcron bench --only archive [--rows N]

Each row is what the writer writes for a finished job: `Row.of_view` of the API's view of a
job that ran once (a view made by the core, then given each row's id, times and payload), in
batches of `BATCH_JOBS_MAX` rows, one durable commit each.

- `size`: two archives of `--size-rows` rows, one with a no-op payload (`{}`) and one with
  1 KB payloads: disk bytes per archived job (the files, write-ahead log folded in, over the
  rows: the JSON plus SQLite's pages and the archive's own indexes), the JSON's own bytes, and
  the insert rate (rows/s: building the rows and committing them; and the commits alone).
- `search`: one archive of `--rows` rows (default 10,000,000) with a small payload
  (`{"customer": {"id": C}, "invoice": "INV-..."}`, 100,000 customers), finished 86.4 ms
  apart so that one day holds `ROWS_PER_DAY` (1,000,000) of them. Filled, then `customer.id`
  declared a search attribute (its index build timed: what declaring one costs on such an
  archive), then latencies p50/p99/max through a reader's connection, as the API reads:
  a job by id; a search by the indexed `customer.id` (a page of 100, newest first: a
  customer's 100 jobs); a search by the non-indexed `invoice` over one day's
  `finished_ms` range (1,000,000 rows read for the one that matches). Each also once more
  with the file's pages dropped from the page cache before each one (`cold`: the reader's
  connection keeps its own small cache, as the node's does), and with its query plan.

`--quick` is a smoke run (a few thousand rows). The files go to a temporary folder under
`--dir` (default the current directory) and are removed at the end; a tmpfs is refused.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from raftcron.cluster.archive.store import ArchiveStore, Row
from raftcron.cluster.archive.writer import BATCH_JOBS_MAX
from raftcron.cluster.dev.bench.diskinfo import (
    MEMORY_FILESYSTEMS,
    drop_page_cache,
    environment,
    filesystem,
)
from raftcron.cluster.dev.bench.stats import ProgressLine, latency
from raftcron.scheduler import limits
from raftcron.scheduler.commands import Ack
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.search import JobFilter, PayloadFilter
from raftcron.scheduler.views import job_view

ROWS_DEFAULT = 10_000_000
SIZE_ROWS_DEFAULT = 200_000
ROWS_PER_DAY = 1_000_000
CUSTOMERS = 100_000
PAGE = 100  # the API's default page
LOOKUPS = {"by_id": 2_000, "by_indexed_field": 300, "by_day_scan": 10}
LOOKUPS_COLD = {"by_id": 50, "by_indexed_field": 20, "by_day_scan": 1}
QUICK = {"rows": 6_000, "size_rows": 2_000, "rows_per_day": 2_000}
START_MS = 1_767_225_600_000  # 2026-01-01
KB_PAYLOAD_CHARS = 1_024 - len('{"text":""}')


def template() -> dict[str, Any]:
    """The view of a job that ran once and succeeded, as the core makes it."""
    driver = Driver()
    driver.finalize()
    [job_id] = driver.submit_many(1, task="send-invoice", queue="billing", max_attempts=3)
    [(claimed, token)] = driver.claim("worker-7", queues=("billing",))
    driver.claim("worker-7", queues=("billing",), max=0,
                 acks=(Ack(claimed, token, "succeeded"),))
    return job_view(driver.state.job(job_id))


def rows(first: int, count: int, base: dict[str, Any], payload: Callable[[int], Any],
         spacing_ms: float) -> list[Row]:
    """Rows `first`..: ids in order, each finished `spacing_ms` after the one before."""
    made = []
    attempt = base["history"][0]
    for job_id in range(first, first + count):
        finished_ms = START_MS + int(job_id * spacing_ms)
        view = dict(base)
        view.update(id=job_id, payload=payload(job_id), created_ms=finished_ms - 40,
                    run_at_ms=finished_ms - 40, finished_ms=finished_ms, token=1)
        view["history"] = [{**attempt, "start_ms": finished_ms - 25, "end_ms": finished_ms}]
        made.append(Row.of_view(view, job_id, job_id))
    return made


def fill(store: ArchiveStore, count: int, base: dict[str, Any], payload: Callable[[int], Any],
         spacing_ms: float, name: str) -> dict[str, float]:
    """`count` rows in the writer's batches: rows/s overall and of the commits alone."""
    progress = ProgressLine(name, count)
    started = time.perf_counter()
    writing_s = 0.0
    for first in range(1, count + 1, BATCH_JOBS_MAX):
        batch = rows(first, min(BATCH_JOBS_MAX, count + 1 - first), base, payload, spacing_ms)
        began = time.perf_counter()
        store.write(batch, first)
        writing_s += time.perf_counter() - began
        progress.update(first + len(batch) - 1)
    elapsed_s = time.perf_counter() - started
    progress.done(f"{count:,} rows in {elapsed_s:,.1f} s")
    return {"rows_per_s": count / elapsed_s, "commit_rows_per_s": count / writing_s,
            "fill_s": elapsed_s}


def disk_bytes(store: ArchiveStore) -> int:
    """The archive's files, its write-ahead log folded into the database first."""
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return int(store.totals()["file_bytes"])


def measure_size(root: Path, size_rows: int, base: dict[str, Any]) -> dict[str, Any]:
    filler = random.Random(1)
    text = "".join(filler.choice("abcdefghijklmnopqrstuvwxyz0123456789 ")
                   for _ in range(KB_PAYLOAD_CHARS))
    payloads: dict[str, Callable[[int], Any]] = {"noop": lambda _: {},
                                                 "1kb": lambda _: {"text": text}}
    figures = {}
    for name, payload in payloads.items():
        folder = root / f"size-{name}"
        folder.mkdir()
        store = ArchiveStore(str(folder), durable=True)
        rates = fill(store, size_rows, base, payload, 1.0, f"size {name}")
        totals = store.totals()
        file_bytes = disk_bytes(store)
        figures[name] = {
            "rows": size_rows, **rates, "file_bytes": file_bytes,
            "bytes_per_job": file_bytes / size_rows,
            "json_bytes_per_job": totals["row_bytes"] / size_rows,
        }
        store.close()
        shutil.rmtree(folder)
    return figures


def timed_each(action: Callable[[Any], object], arguments: list[Any]) -> dict[str, float]:
    seconds = []
    for argument in arguments:
        began = time.perf_counter()
        action(argument)
        seconds.append(time.perf_counter() - began)
    return {**latency(seconds), "count": len(seconds)}


def measure_search(root: Path, count: int, rows_per_day: int,
                   base: dict[str, Any]) -> dict[str, Any]:
    folder = root / "search"
    folder.mkdir()
    store = ArchiveStore(str(folder), durable=True)

    def payload(job_id: int) -> dict[str, Any]:
        return {"customer": {"id": job_id % CUSTOMERS}, "invoice": f"INV-{job_id:010d}"}

    figures: dict[str, Any] = {"rows": count, "rows_per_day": rows_per_day}
    figures["fill"] = fill(store, count, base, payload, limits.DAY_MS / rows_per_day, "search")
    began = time.perf_counter()
    store.add_attribute("customer.id", through_index=count)
    figures["index_build_s"] = time.perf_counter() - began
    figures["file_bytes"] = disk_bytes(store)
    store.close()

    reader = ArchiveStore(str(folder), readonly=True)
    picks = random.Random(2)
    # The day in the middle of the archive (all of it when it holds less than a day).
    day = max(0, count // rows_per_day // 2)
    day_ids = (day * rows_per_day + 1, min(count, (day + 1) * rows_per_day))
    day_range = (START_MS + int(day_ids[0] * limits.DAY_MS / rows_per_day),
                 START_MS + int(day_ids[1] * limits.DAY_MS / rows_per_day))

    def by_customer(customer: int) -> JobFilter:
        return JobFilter(payload=(PayloadFilter(("customer", "id"), "eq", customer),))

    def by_invoice(job_id: int) -> JobFilter:
        return JobFilter(finished_from_ms=day_range[0], finished_to_ms=day_range[1],
                         payload=(PayloadFilter(("invoice",), "eq", f"INV-{job_id:010d}"),))

    def search(query: JobFilter) -> list[dict[str, Any]]:
        return reader.search(query, before_id=None, limit=PAGE)

    kinds: dict[str, tuple[Callable[[Any], object], Callable[[], Any]]] = {
        "by_id": (reader.get, lambda: picks.randint(1, count)),
        "by_indexed_field": (search, lambda: by_customer(picks.randrange(CUSTOMERS))),
        "by_day_scan": (search, lambda: by_invoice(picks.randint(*day_ids))),
    }
    found = [view["id"] for view in search(by_invoice(day_ids[0]))]
    if found != [day_ids[0]]:  # the figures would be of a search that finds nothing
        raise RuntimeError(f"the day's scan for job {day_ids[0]} found {found}")
    for name, (action, argument) in kinds.items():
        warm = timed_each(action, [argument() for _ in range(LOOKUPS[name])])
        cold = []
        for _ in range(LOOKUPS_COLD[name]):
            drop_page_cache(folder)
            cold.append(timed_each(action, [argument()])["p50_ms"] / 1e3)
        figures[name] = {**warm, "cold": {**latency(cold), "count": len(cold)}}
    figures["by_indexed_field"]["plan"] = reader.plan(by_customer(1), limit=PAGE)
    figures["by_day_scan"]["plan"] = reader.plan(by_invoice(day_ids[0]), limit=PAGE)
    figures["by_day_scan"]["rows_in_range"] = day_ids[1] - day_ids[0] + 1
    reader.close()
    shutil.rmtree(folder)
    return figures


def run(root: Path, *, rows: int, size_rows: int,
        rows_per_day: int = ROWS_PER_DAY) -> dict[str, Any]:
    """Every figure, the archives made under `root` (and removed)."""
    base = template()
    return {
        "environment": environment(root),
        "batch_rows": BATCH_JOBS_MAX,
        "size": measure_size(root, size_rows, base),
        "search": measure_search(root, rows, min(rows_per_day, rows), base),
    }


def render(figures: dict[str, Any]) -> str:
    size, search = figures["size"], figures["search"]
    out = [f"archive bench: batches of {figures['batch_rows']:,} rows, fsync durability, "
           f"sqlite {figures['environment']['sqlite']}", ""]
    for name, row in size.items():
        out.append(f"{name:>5} payload: {row['bytes_per_job']:,.0f} disk bytes/job "
                   f"({row['json_bytes_per_job']:,.0f} of JSON), {row['rows_per_s']:,.0f} "
                   f"rows/s ({row['commit_rows_per_s']:,.0f}/s committing), "
                   f"{row['rows']:,} rows")
    fill_rates = search["fill"]
    out += ["", f"{search['rows']:,} rows ({search['rows_per_day']:,} a day): filled at "
            f"{fill_rates['rows_per_s']:,.0f} rows/s in {fill_rates['fill_s']:,.0f} s, "
            f"{search['file_bytes'] / search['rows']:,.0f} disk bytes/job; "
            f"index of a search attribute built in {search['index_build_s']:,.1f} s"]
    for name in LOOKUPS:
        for kind, row in (("", search[name]), ("cold", search[name]["cold"])):
            out.append(f"  {name:<17} {kind:<5} p50 {row['p50_ms']:9,.2f} ms  p99 "
                       f"{row['p99_ms']:9,.2f} ms  max {row['max_ms']:9,.2f} ms  "
                       f"({row['count']:,} searches)")
    for name in ("by_indexed_field", "by_day_scan"):
        out.append(f"  plan {name}: {'; '.join(search[name]['plan'])}")
    return "\n".join(out)


def measure(*, rows: int, size_rows: int, rows_per_day: int = ROWS_PER_DAY,
            directory: Path | None = None) -> dict[str, Any]:
    """`run` in a temporary folder under `directory` (default: the current one)."""
    root = Path(tempfile.mkdtemp(prefix="archivebench-", dir=directory or Path.cwd()))
    try:
        return run(root, rows=rows, size_rows=size_rows, rows_per_day=rows_per_day)
    finally:
        shutil.rmtree(root, ignore_errors=True)


class ArchiveSizes(TypedDict):
    rows: int
    size_rows: int
    rows_per_day: int


def sizes(*, quick: bool, rows: int | None = None, size_rows: int | None = None) -> ArchiveSizes:
    """`measure`'s sizes: the defaults, or `--quick`'s, or what was given."""
    return {"rows": rows or (QUICK["rows"] if quick else ROWS_DEFAULT),
            "size_rows": size_rows or (QUICK["size_rows"] if quick else SIZE_ROWS_DEFAULT),
            "rows_per_day": QUICK["rows_per_day"] if quick else ROWS_PER_DAY}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m raftcron.cluster.dev.bench.archivebench",
        description="Measure a node's archive: bytes per job, insert rate, search latency.")
    parser.add_argument("--rows", type=int, help=f"rows searched (default {ROWS_DEFAULT:,})")
    parser.add_argument("--size-rows", type=int,
                        help=f"rows of each size archive (default {SIZE_ROWS_DEFAULT:,})")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dir", type=Path, default=Path.cwd(),
                        help="where the temporary folder goes (a disk)")
    args = parser.parse_args(argv)
    kind = filesystem(args.dir).get("type", "?")
    if kind in MEMORY_FILESYSTEMS:
        print(f"archivebench: {args.dir} is on {kind}, where fsync reaches no disk",
              file=sys.stderr)
        return 2
    figures = measure(**sizes(quick=args.quick, rows=args.rows, size_rows=args.size_rows),
                      directory=args.dir)
    print(json.dumps(figures) if args.json else render(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
