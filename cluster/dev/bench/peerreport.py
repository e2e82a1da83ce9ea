"""The peers' figures beside ours: each peer's ratio to our drain, and the human lines.

Two ratios, because our drain has two clocks (measures.drain): from the workers' start, their
start-up included, and from the moment every worker waits on a claim. The peers' programs start
theirs in between: BullMQ's after its Worker connected, graphile-worker's at its run() call
(its pool's start included), so neither of ours is exactly theirs and both are shown.
A ratio is ours over theirs, as the benchmark tables (docs/proof/benchmarks.md) say "5.2x the
baseline".
"""

from __future__ import annotations

from typing import Any

OURS = (("drain_jobs_per_s", "drain_over_peer"), ("drain_ready_jobs_per_s", "ready_over_peer"))


def compare(peers: dict[str, dict[str, Any]], ours: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`peers` with each measured one's ratios to our drain's figures (none for a peer with no
    figure, or when our drain has none)."""
    compared = {}
    for key, figure in peers.items():
        figure = dict(figure)
        theirs = figure.get("median_per_s")
        for mine, ratio in OURS:
            value = ours.get(mine)
            if theirs and isinstance(value, int | float) and value > 0:
                figure[ratio] = round(value / theirs, 2)
        compared[key] = figure
    return compared


def table(figures: dict[str, Any]) -> str:
    """The peers' lines of `raftcron bench`'s human output."""
    peers: dict[str, dict[str, Any]] = figures.get("peers", {})
    jobs, repeats = figures.get("peers_jobs"), figures.get("peers_repeats")
    lines = [
        f"peers, after our drain in the same sitting: {jobs:,} jobs, median of {repeats} "
        f"(ours: {_rate(figures.get('drain_jobs_per_s'))}, "
        f"{_rate(figures.get('drain_ready_jobs_per_s'))} from ready workers)"
    ]
    for key, figure in peers.items():
        if figure.get("median_per_s") is None:
            lines.append(f"  {key:<28} no figure: {figure.get('why')}")
            continue
        ratios = ", ".join(
            f"{figure[ratio]:.2f}x{'' if ratio == 'drain_over_peer' else ' from ready'}"
            for _, ratio in OURS if ratio in figure
        )
        lines.append(
            f"  {key:<28} {figure['median_per_s']:>9,.0f} jobs/s "
            f"({figure['min_per_s']:,.0f}-{figure['max_per_s']:,.0f})"
            + (f"  ours {ratios}" if ratios else "")
            + (f"  [{figure['version']}]" if figure.get("version") else "")
        )
    for name, what in figures.get("peers_servers", {}).items():
        lines.append(f"  server {name}: {what}")
    return "\n".join(lines)


def _rate(value: Any) -> str:
    return f"{value:,.0f} jobs/s" if isinstance(value, int | float) else "no figure"
