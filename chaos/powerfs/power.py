"""What a power cut does to the data that was not made durable, and how much of it there is.

`tear_last_writes` is torn-write mode: for every file with a durable name whose last change
since its last fsync was a write, a prefix of that write reaches the disk before the lights go
out. The prefix length is drawn from a generator seeded by (seed, path), so a run replays from
its seed: 1 to len-1 bytes (a write of one byte cannot tear and keeps nothing). Only the last
FUSE write request of each file tears; the kernel splits an application's write into requests of
at most 1 MiB. `pending_changes` counts what a cut would drop, for `status` and the cut report.
"""

from __future__ import annotations

import os
import random
from typing import Any

from raftcron.chaos.powerfs.disk import BackingDisk
from raftcron.chaos.powerfs.tree import STASH_INO, InodeTable, Kind


def choose_torn_prefix(write_bytes: int, *, seed: int, path: str) -> int:
    """How much of a torn write reaches the disk: 1 to len-1 bytes, the same for a seed."""
    if write_bytes < 2:
        return 0
    return random.Random(f"powerfs-torn:{seed}:{path}").randint(1, write_bytes - 1)


def tear_last_writes(table: InodeTable, disk: BackingDisk, *, seed: int) -> list[dict[str, Any]]:
    """Put a prefix of each file's last unsynced write on disk; returns what was torn."""
    torn = []
    for node in list(table.inodes.values()):
        if node.data is None or node.data.last_write is None:
            continue
        if not any(parent != STASH_INO for parent, _ in node.links):
            continue  # no durable name: the file is gone after the cut anyway
        offset, data = node.data.last_write
        path = os.path.relpath(disk.path_of(node), disk.root)
        kept = choose_torn_prefix(len(data), seed=seed, path=path)
        node.data.tear(disk.fd_of(node), kept)
        torn.append({"path": path, "offset": offset, "bytes": len(data), "kept_bytes": kept})
    return torn


def pending_changes(table: InodeTable) -> dict[str, Any]:
    """Counts of what is not durable yet (what a cut now would drop)."""
    nodes = table.inodes.values()
    files = [n for n in nodes if n.data is not None and n.data.dirty]
    dirs = [n for n in nodes if n.kind is Kind.DIR and n.entries != n.durable_entries]
    return {
        "inodes": len(table),
        "dirty_files": len(files),
        "dirty_bytes": sum(n.file.dirty_bytes for n in files),
        "dirty_dirs": len(dirs),
        # lost by a failed fsync (chaos/powerfs/faults.py): a cut drops these too
        "lost_files": sum(1 for n in nodes if n.data is not None and n.data.lost),
        "lost_bytes": sum(n.data.lost_bytes for n in nodes if n.data is not None),
    }
