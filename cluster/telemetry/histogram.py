"""`Histogram`: a Prometheus histogram in seconds, kept by the parts of a node that time things
(the proposer's commits, the storage's syncs, the ticker's fire lateness) and written out by
`cluster.ops.metrics`. Its own module so that those parts need not import the metrics page, which
reads them.
"""

from __future__ import annotations

import bisect


class Histogram:
    """A Prometheus histogram in seconds: cumulative buckets, sum and count."""

    SECONDS: tuple[float, ...] = (
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1.0,
        2.5,
        5.0,
        10.0,
        30.0,
    )

    def __init__(self, buckets: tuple[float, ...] = SECONDS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum_s = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        index = bisect.bisect_left(self.buckets, seconds)
        self.counts[index] += 1
        self.sum_s += seconds
        self.count += 1

    def samples(self, labels: dict[str, str]) -> list[tuple[str, dict[str, str], float]]:
        out: list[tuple[str, dict[str, str], float]] = []
        running = 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(("_bucket", {**labels, "le": le}, running))
        out.append(("_sum", labels, self.sum_s))
        out.append(("_count", labels, self.count))
        return out
