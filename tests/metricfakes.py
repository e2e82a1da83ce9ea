"""What tests that render a node's `/metrics` page in process share."""

from __future__ import annotations

from dataclasses import dataclass, field

from raftcron.cluster.telemetry.histogram import Histogram


@dataclass
class ProposerFigures:
    """What `render` reads of a node's Proposer (its counters and histograms)."""

    proposals: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    commit_latency: Histogram = field(default_factory=Histogram)
    batch_sizes: Histogram = field(default_factory=Histogram)
