"""Checker 12: resources level off (CHAOS.md "Wave 3", soak; chaos/tier2/endurance.py).

The endurance run samples each node's main process (`resource` events: resident memory, open
descriptors, threads, the Raft log's live entries and its bytes on disk) every `every_s`. A
process that leaks grows without bound; one that does not levels off once the replicated
state stops growing (its `state_size` events: request ids live an hour, idempotency keys a
day, so under a sustained load the state itself grows until then or until its budget).

The criterion, per node and per series (a node's restart by the nemesis starts a new one: a
new PID), for each of the five figures:

1. warm-up: the samples of the series' first `max(WARMUP_FRACTION of its span, warmup_min_s)`
   are dropped (the `sampler` event gives `warmup_min_s`: 120 s in a full run);
2. a series with fewer than `JUDGED_SAMPLES_MIN` samples left, or spanning less than
   `JUDGED_SPAN_FRACTION` of the sampled run, is listed but not judged ("short");
3. the least-squares slope `s` (per second) of the later half of what is left, and its
   standard error `se`, are fitted; `growth = s * duration_s`, where `duration_s` is the whole
   sampled run: how much the figure would grow over a run as long at that rate;
4. the memory judged is the resident size less the replicated state's bytes
   (`rss_beyond_state_bytes`: the state is bounded by its own rules and budget, and the
   docs/operations/size.md sizes a node as its state plus what it needs of its own); the
   resident size, its anonymous and file-backed parts and the state's bytes are shown beside
   it, not judged;
5. the series fails when `growth > max(RELATIVE_TOLERANCE * median, FLOOR[figure])` and the
   slope is not noise (`s > SIGNIFICANCE * se`): it has not levelled off.

Every judged and short series is in the table (`slopes_table`), printed with the report.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raftcron.chaos.tier2.checkers.data import CheckResult, RunData
from raftcron.cluster.storage.raftlog import SEGMENT_BYTES_MAX

FIGURES = ("rss_beyond_state_bytes", "fds", "threads", "log_entries", "log_bytes")
# In the table, not judged: what the first one is made of (the resident size by kind of page,
# and the state's bytes).
SHOWN = ("rss_bytes", "rss_anon_bytes", "rss_file_bytes", "state_bytes")
# The floors of what growth over a run is let pass. The log on disk only shrinks by whole
# segments (cluster/storage/raftlog.py), so it legitimately grows up to two of them between
# drops, for hours at a modest rate; its live entries are what compaction bounds (a snapshot
# every minute in the endurance run), judged on their own.
FLOOR: dict[str, float] = {"rss_beyond_state_bytes": 8 << 20, "rss_bytes": 8 << 20,
                           "rss_anon_bytes": 8 << 20, "rss_file_bytes": 8 << 20,
                           "state_bytes": 8 << 20, "fds": 8, "threads": 4,
                           "log_entries": 5_000, "log_bytes": 2 * SEGMENT_BYTES_MAX}
RELATIVE_TOLERANCE = 0.10
SIGNIFICANCE = 3.0  # standard errors: a false alarm from noise alone is about 1 in 700
WARMUP_FRACTION = 0.25
WARMUP_MIN_S_DEFAULT = 120.0
JUDGED_SAMPLES_MIN = 6
JUDGED_SPAN_FRACTION = 0.2


@dataclass(frozen=True)
class Slope:
    node: str
    pid: int
    figure: str
    samples: int  # judged (the later half after warm-up), or left after warm-up when short
    slope_per_s: float
    stderr_per_s: float
    median: float
    growth: float  # slope_per_s * the run's sampled duration
    tolerance: float
    verdict: str  # ok | GROWS | short (not judged) | info (shown, never judged)

    @property
    def judged(self) -> bool:
        return self.verdict in ("ok", "GROWS")

    @property
    def ok(self) -> bool:
        return self.verdict != "GROWS"


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of (x, y) points and its standard error (0 when exact or too few)."""
    count = len(points)
    if count < 2:
        return 0.0, 0.0
    mean_x = sum(x for x, _ in points) / count
    mean_y = sum(y for _, y in points) / count
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0, 0.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    if count < 3:
        return slope, 0.0
    residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in points)
    return slope, math.sqrt(residual / (count - 2) / sxx)


def series(history: Sequence[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The `resource` samples by (node, pid), in time order."""
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for event in history:
        if event.get("kind") == "resource" and event.get("pid") is not None:
            found.setdefault((str(event["node"]), int(event["pid"])), []).append(event)
    for samples in found.values():
        samples.sort(key=lambda e: int(e["t"]))
    return found


def slopes(history: Sequence[dict[str, Any]]) -> list[Slope]:
    """Every series' slope per figure, judged or short (see the module docstring)."""
    sampler = next((e for e in history if e.get("kind") == "sampler"), {})
    warmup_min_s = float(sampler.get("warmup_min_s", WARMUP_MIN_S_DEFAULT))
    by_series = series(history)
    times = [int(e["t"]) for samples in by_series.values() for e in samples]
    if not times:
        return []
    duration_s = (max(times) - min(times)) / 1000
    found = []
    for (node, pid), samples in sorted(by_series.items()):
        first_ms, last_ms = int(samples[0]["t"]), int(samples[-1]["t"])
        warmup_ms = max(WARMUP_FRACTION * (last_ms - first_ms), warmup_min_s * 1000)
        kept = [e for e in samples if int(e["t"]) >= first_ms + warmup_ms]
        span_s = (int(kept[-1]["t"]) - int(kept[0]["t"])) / 1000 if kept else 0.0
        judged = (len(kept) >= JUDGED_SAMPLES_MIN
                  and span_s >= JUDGED_SPAN_FRACTION * duration_s)
        if judged:
            middle_ms = int(kept[0]["t"]) + span_s * 500
            kept = [e for e in kept if int(e["t"]) >= middle_ms]
        for figure in FIGURES + SHOWN:
            points = [((int(e["t"]) - first_ms) / 1000, value) for e in kept
                      if (value := _value(e, figure)) is not None]
            slope, stderr = fit(points)
            median = statistics.median(y for _, y in points) if points else 0.0
            growth = slope * duration_s
            tolerance = max(RELATIVE_TOLERANCE * median, FLOOR[figure])
            grows = growth > tolerance and slope > SIGNIFICANCE * stderr
            verdict = ("info" if figure in SHOWN else "short" if not judged or len(points) < 2
                       else "GROWS" if grows else "ok")
            found.append(Slope(node, pid, figure, len(points), slope, stderr, median, growth,
                               tolerance, verdict))
    return found


def _value(event: dict[str, Any], figure: str) -> float | None:
    """One figure of a sample; the memory beyond the state is the resident size less the
    replicated state's bytes read in the same round."""
    if figure == "rss_beyond_state_bytes":
        rss, state = event.get("rss_bytes"), event.get("state_bytes")
        return None if rss is None or state is None else float(rss) - float(state)
    value = event.get(figure)
    return None if value is None else float(value)


def check_slopes(run: RunData) -> CheckResult:
    """Each node's resident memory, descriptors, threads and log size level off."""
    result = CheckResult("resources level off", safety=False)
    found = slopes(run.history)
    judged = [s for s in found if s.judged]
    result.counts = {"samples": sum(1 for e in run.history if e.get("kind") == "resource"),
                     "series": len({(s.node, s.pid) for s in found}),
                     "judged": len(judged),
                     "short": sum(1 for s in found if s.verdict == "short")}
    for item in judged:
        if not item.ok:
            result.violate(
                f"{item.node} (pid {item.pid}) {item.figure} does not level off: "
                f"{_amount(item.figure, item.slope_per_s * 60)}/min "
                f"(+-{_amount(item.figure, item.stderr_per_s * 60)}), "
                f"{_amount(item.figure, item.growth)} over the run against a tolerance of "
                f"{_amount(item.figure, item.tolerance)} "
                f"(median {_amount(item.figure, item.median)})")
    return result


def slopes_table(history: Sequence[dict[str, Any]]) -> str:
    """The table printed with the report: one row per node, series and figure."""
    found = slopes(history)
    if not found:
        return ""
    lines = ["node  pid      figure                  samples        slope/min   growth/run"
             "    tolerance       median  verdict"]
    for item in found:
        verdict = item.verdict
        lines.append(
            f"{item.node:5} {item.pid:<8} {item.figure:22} {item.samples:>7}  "
            f"{_amount(item.figure, item.slope_per_s * 60):>15}  "
            f"{_amount(item.figure, item.growth):>11}  {_amount(item.figure, item.tolerance):>11}  "
            f"{_amount(item.figure, item.median):>11}  {verdict}")
    return "\n".join(lines)


def _amount(figure: str, value: float) -> str:
    if figure.endswith("_bytes"):
        return f"{value / (1 << 20):.2f} MiB"
    return f"{value:.2f}"
