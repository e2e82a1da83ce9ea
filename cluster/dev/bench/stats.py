"""Percentiles, latency figures and a progress line, for the benchmark's measures."""

from __future__ import annotations

import sys
import time


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (fraction in 0..1) of a non-empty list."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def latency(seconds: list[float]) -> dict[str, float]:
    """p50, p99 and max of durations in seconds, in milliseconds."""
    return {
        "p50_ms": percentile(seconds, 0.50) * 1e3,
        "p99_ms": percentile(seconds, 0.99) * 1e3,
        "max_ms": max(seconds) * 1e3,
    }


class ProgressLine:
    """One line on stderr, rewritten in place: `drain  41,000/100,000  12,301/s`."""

    def __init__(self, name: str, total: int | None = None, *, quiet: bool = False) -> None:
        self.name = name
        self.total = total
        self.quiet = quiet or not sys.stderr.isatty()
        self.started = time.monotonic()
        self.last_draw = 0.0

    def update(self, done: int, note: str = "") -> None:
        now = time.monotonic()
        if self.quiet or now - self.last_draw < 0.2:
            return
        self.last_draw = now
        rate = done / max(now - self.started, 1e-9)
        of = f"/{self.total:,}" if self.total else ""
        sys.stderr.write(f"\r{self.name:<16} {done:,}{of}  {rate:,.0f}/s  {note}\033[K")
        sys.stderr.flush()

    def done(self, summary: str) -> None:
        if not sys.stderr.isatty():
            sys.stderr.write(f"{self.name:<16} {summary}\n")
        else:
            sys.stderr.write(f"\r{self.name:<16} {summary}\033[K\n")
        sys.stderr.flush()
