"""`/metrics`' archive figures (cluster/ops/metrics.py) from a real archive's summary: its rows,
bytes, file, oldest row, the hand-over, its health, and what a member still fills from a peer.
In process, as a node renders them."""

from __future__ import annotations

from pathlib import Path

from test_flow_metrics import ProposerFigures, samples

from raftcron.cluster.archive.node import NodeArchive
from raftcron.cluster.archive.store import ArchiveStore, Row
from raftcron.cluster.archive.writer import ArchiveWriter
from raftcron.cluster.ops.metrics import NodeStats, render
from raftcron.scheduler.driver import Driver


def test_the_archive_and_what_it_misses_are_in_the_metrics(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    view = {"id": 7, "task": "t", "queue": "q", "status": "succeeded", "schedule": None,
            "key": None, "error": None, "created_ms": 1_000, "finished_ms": 2_000,
            "payload": None, "history": []}
    store.write([Row.of_view(view, 3, 1)], 3)
    store.record_gap(2, 12)
    archive = NodeArchive(store, ArchiveWriter(store), ArchiveStore(str(tmp_path),
                                                                    readonly=True))
    proposer = ProposerFigures()
    text = render(Driver().state, node_id="n1", role=2, term=1, commit_index=1,
                  applied_index=1, stats=NodeStats(), proposer=proposer,  # type: ignore[arg-type]
                  archive=archive.summary())
    node = (("node", "n1"),)
    assert samples(text, "raftcron_archive_rows") == {node: 1}
    assert samples(text, "raftcron_archive_bytes")[node] == Row.of_view(view, 3, 1).bytes
    assert samples(text, "raftcron_archive_file_bytes")[node] > 0
    assert samples(text, "raftcron_archive_oldest_finished_seconds") == {node: 2.0}
    assert samples(text, "raftcron_archive_missing_jobs") == {node: 10}
    assert samples(text, "raftcron_archive_pending_jobs") == {node: 0}
    assert samples(text, "raftcron_archive_healthy") == {node: 1}
