"""Reading the bench's figures out of a node's `/metrics` page (Prometheus text format).

What it owns: finding samples by metric name and label, summing them, and a quantile of a
histogram's bucket counts (as PromQL's `histogram_quantile` computes it). It does no I/O: the
measures fetch the pages and hand their text in.
"""

from __future__ import annotations

import math


def sample(text: str, name: str, label: str = "") -> float:
    """The value of the first sample of metric `name` whose labels hold `label` (0 if none)."""
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def total(text: str, name: str, label: str = "") -> float:
    """The sum of every sample of metric `name` whose labels hold `label` (0 if none)."""
    return sum(value for labels, value in samples(text, name) if label in labels)


def by_label(text: str, name: str, key: str) -> dict[str, float]:
    """The samples of metric `name` keyed by the value of their label `key`."""
    found: dict[str, float] = {}
    needle = f'{key}="'
    for labels, value in samples(text, name):
        if needle in labels:
            found[labels.split(needle, 1)[1].split('"', 1)[0]] = value
    return found


def samples(text: str, name: str) -> list[tuple[str, float]]:
    """(labels as written, value) of every sample of metric `name`."""
    found = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line[len(name) + 1:].rpartition("} ")
            found.append((labels, float(value)))
        elif line.startswith(name + " "):
            found.append(("", float(line.rsplit(" ", 1)[1])))
    return found


def buckets(text: str, name: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound (`+Inf` as math.inf), summed over
    every sample of `<name>_bucket` (several nodes' histograms add up bucket by bucket)."""
    counts: dict[float, float] = {}
    for labels, value in samples(text, name + "_bucket"):
        bound = labels.split('le="', 1)[1].split('"', 1)[0]
        upper = math.inf if bound == "+Inf" else float(bound)
        counts[upper] = counts.get(upper, 0.0) + value
    return counts


def quantile(counts: dict[float, float], fraction: float) -> float | None:
    """The `fraction` quantile of cumulative bucket counts, interpolated linearly within its
    bucket as `histogram_quantile` does; the highest finite bound when it falls in `+Inf`;
    None when there is no observation."""
    bounds = sorted(counts)
    if not bounds or counts[bounds[-1]] <= 0:
        return None
    rank = fraction * counts[bounds[-1]]
    lower, below = 0.0, 0.0
    for upper in bounds:
        if counts[upper] >= rank:
            if math.isinf(upper):
                return lower
            inside = counts[upper] - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = upper, counts[upper]
    return lower
