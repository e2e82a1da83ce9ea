"""Archives and backups on disk for the tests of this folder: an `ArchiveStore` with rows of
known ids, the entries that removed them and payloads of a chosen size; a backup file and a
node's config to restore it with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raftcron.cluster.archive.store import ArchiveStore, Row
from raftcron.cluster.storage import snapshots
from raftcron.scheduler import snapshot as core_snapshot
from raftcron.scheduler.state import SchedulerState


def job(job_id: int, payload: Any = None) -> dict[str, Any]:
    """A finished job as the API shows it (what an archive row keeps)."""
    return {"id": job_id, "task": "invoice", "queue": "billing", "status": "succeeded",
            "schedule": None, "key": None, "error": None, "created_ms": 1_000 + job_id,
            "finished_ms": 2_000 + job_id, "payload": payload, "history": []}


def make_archive(directory: Path, left_at: dict[int, int], payload_bytes: int = 10) -> None:
    """An archive in `directory` holding the jobs of `left_at` (id -> the index of the entry
    that removed it), written as the node's writer writes them."""
    directory.mkdir(parents=True, exist_ok=True)
    store = ArchiveStore(str(directory))
    try:
        rows = [Row.of_view(job(job_id, {"customer": {"id": job_id}, "pad": "x" * payload_bytes}),
                            index, seq=n + 1)
                for n, (job_id, index) in enumerate(sorted(left_at.items()))]
        for start in range(0, len(rows), 1_000):
            batch = rows[start:start + 1_000]
            store.write(batch, max(row.left_index for row in batch))
    finally:
        store.close()


def backup_file(index: int = 10, term: int = 2) -> bytes:
    """A backup (a snapshot file) at log `index` of an empty state, as a node serves it."""
    body: dict[str, object] = {"cluster_name": "prod", "prev": [b"\x01", index - 1, term],
                               "last": [b"\x01", index, term], "cluster": ["127.0.0.1:7001"],
                               "state": core_snapshot.snapshot(SchedulerState())}
    return b"".join(snapshots.encode(index, term, body))


def node_config(folder: Path) -> Path:
    """A node's config whose data dir is `folder`/data."""
    path = folder / "n1.toml"
    path.write_text('node_id = "n1"\nraft_address = "127.0.0.1:7001"\n'
                    'http_address = "127.0.0.1:8001"\ndata_dir = "data"\n')
    return path
