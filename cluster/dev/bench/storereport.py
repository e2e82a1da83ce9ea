"""The store bench's text report: its figures (`storebench.run`) as Markdown tables.

What it owns: the tables' heads and cells and how a number is shown. It measures nothing: the
figures are `storebench`'s, and the same dict is what `--json` prints.
"""

from __future__ import annotations

from typing import Any

APPEND_HEAD = [
    "entry",
    "batch",
    "store",
    "batches",
    "entries/s",
    "MB/s",
    "p50 ms",
    "p99 ms",
    "max ms",
    "CPU ms/batch",
    "flushes/batch",
    "disk B/data B",
]
MAINTENANCE_HEAD = [
    "store",
    "build s",
    "MB on disk",
    "meta p50 ms",
    "meta p99 ms",
    "load warm s",
    "load cold s",
    "truncate ms (median of 5)",
    "truncate max ms",
    "compact ms",
    "MB after compact",
    "entries read after",
    "reload s",
]


def number(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def size_name(entry_bytes: int) -> str:
    return f"{entry_bytes // 1024} KB" if entry_bytes >= 1024 else f"{entry_bytes} B"


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render(figures: dict[str, Any]) -> str:
    env = figures["environment"]
    fs = env["filesystem"]
    out = [
        f"storebench{' --quick' if figures['quick'] else ''}: {env['directory']} on"
        f" {fs.get('type')} ({fs.get('device')} at {fs.get('mount_point')},"
        f" {fs.get('options')}), disk {env['block_device']} write cache {env['write_cache']};"
        f" Linux {env['kernel']}, Python {env['python']}, SQLite {env['sqlite']},"
        f" {env['cpus']} CPUs; {figures['elapsed_s']:.0f} s",
        "",
        f"fdatasync after a 4 KB write, {figures['fsync_4k']['calls']} calls:",
        "",
        table(
            ["write", "p50 ms", "p99 ms", "max ms"],
            [
                [
                    kind,
                    *(number(figures["fsync_4k"][kind][f]) for f in ("p50_ms", "p99_ms", "max_ms")),
                ]
                for kind in ("append", "overwrite")
            ],
        ),
        "",
        "append (one durable commit per batch; MB/s counts data bytes):",
        "",
        table(
            APPEND_HEAD,
            [
                [
                    size_name(r["entry_bytes"]),
                    str(r["batch"]),
                    r["store"],
                    str(r["batches"]),
                    number(r["entries_per_s"]),
                    number(r["mb_per_s"]),
                    number(r["p50_ms"]),
                    number(r["p99_ms"]),
                    number(r["max_ms"]),
                    number(r["cpu_ms_per_batch"]),
                    number(r["flushes_per_batch"]),
                    number(r["disk_bytes_per_data_byte"]),
                ]
                for r in figures["append"]
            ],
        ),
        "",
        "sqlite-full ÷ segment-fdatasync (entries/s below 1: SQLite slower; latency above 1:"
        " SQLite slower):",
        "",
        table(
            ["entry", "batch", "entries/s", "p50", "p99", "max"],
            [
                [size_name(r["entry_bytes"]), str(r["batch"])]
                + [f"{r[f]:.2f}" for f in ("entries_per_s", "p50_ms", "p99_ms", "max_ms")]
                for r in figures["ratios"]["append"]
            ],
        ),
        "",
    ]
    rows = figures["maintenance"]
    n = rows[0]["entries"]
    out += [
        f"maintenance on {n:,} entries of 2 KB (truncate: the last {rows[0]['truncated']:,};"
        f" compact: the {rows[0]['compacted']:,} below {rows[0]['compacted'] + 1:,}):",
        "",
        table(
            MAINTENANCE_HEAD,
            [
                [
                    r["store"],
                    number(r["build_s"]),
                    number(r["bytes_on_disk"] / 1e6),
                    number(r["meta"]["p50_ms"]),
                    number(r["meta"]["p99_ms"]),
                    number(r["load_warm_s"]),
                    number(r["load_cold_s"]),
                    number(r["truncate_ms"]),
                    number(r["truncate_max_ms"]),
                    number(r["compact_ms"]),
                    number(r["bytes_after_compact"] / 1e6),
                    f"{r['entries_read_after_compact']:,}",
                    number(r["load_after_compact_s"]),
                ]
                for r in rows
            ],
        ),
        "",
        "sqlite-full ÷ segment-fdatasync: "
        + ", ".join(f"{k} {v:.2f}" for k, v in figures["ratios"]["maintenance"].items()),
    ]
    return "\n".join(out)
