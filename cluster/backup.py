"""Backups: a node's snapshot file, taken live, checked, and restored into an empty data dir.

A backup is exactly a snapshot file of `cluster/storage/snapshots.py` (header with its format
version, log index, term and CRC32s; the core's snapshot in the body): the node serves the one
it just made current, so a backup is checked by the same code that checks a node's own, and a
damaged or foreign file is refused naming what is wrong.

`restore_into` fills an EMPTY data dir for a new cluster: the snapshot becomes the node's
current one (its member list replaced by the new cluster's), the log starts empty after it,
the term is the snapshot's and the commit index its index. Every member of the new cluster is
restored from the same file, so each starts from the same state at the same index.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from raftcron.cluster import config as configuration
from raftcron.cluster.storage import datadir as datadir_module
from raftcron.cluster.storage.disk import OsDisk
from raftcron.cluster.storage.raftlog import LogDamaged, RaftLog, StorageError
from raftcron.cluster.storage.snapshots import SNAPSHOT_NAME, Snapshot, decode, encode
from raftcron.scheduler.snapshot import digest, restore


class BackupError(StorageError):
    pass


@dataclass(frozen=True)
class BackupInfo:
    index: int
    term: int
    members: list[str]
    jobs: int
    schedules: int
    digest: str
    size_bytes: int


def check(data: bytes, source: str) -> tuple[Snapshot, BackupInfo]:
    """The snapshot in a backup file and what it holds; LogDamaged naming the damage."""
    snapshot = decode(data, source)
    try:
        state = restore(snapshot.state)
    except Exception as error:  # the core refuses a snapshot it cannot read: say so here
        raise LogDamaged(source, f"holds a state snapshot that does not load ({error})") from None
    return snapshot, BackupInfo(snapshot.index, snapshot.term, snapshot.cluster,
                                len(state.table), len(state.schedules), digest(state), len(data))


def restore_into(directory: str, node_id: str, members: list[str], data: bytes,
                 source: str) -> BackupInfo:
    """Fill the empty data dir `directory` for node `node_id` of a new cluster of `members`
    (their Raft addresses) from the backup `data`."""
    if os.path.isdir(directory) and os.listdir(directory):
        raise BackupError(f"{directory} is not empty: restore fills only a new data dir "
                          "(a node of a new cluster); move it away first")
    snapshot, info = check(data, source)
    data_dir = datadir_module.open_data_dir(directory, node_id)
    try:
        disk = OsDisk()
        body = {"prev": list(snapshot.prev), "last": list(snapshot.last),
                "state": snapshot.state, "cluster": sorted(members)}
        disk.write_file(os.path.join(directory, SNAPSHOT_NAME),
                        encode(snapshot.index, snapshot.term, body), sync=True)
        log = RaftLog(directory)
        log.set_hard_state(snapshot.term, None)
        log.set_commit(snapshot.index)
        log.ensure_segment()
        log.sync()
        log.close(clean=True)
        data_dir.mark_initialised(disk)
        disk.sync_dir(directory)
    finally:
        data_dir.release()
    return info


def add_restore_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source", required=True, help="a backup file "
                        "(`raftcron backup --out FILE`)")
    parser.add_argument("--config", required=True, type=Path,
                        help="the config of the node of the new cluster whose data dir to fill")


def run_restore(args: argparse.Namespace) -> int:
    """`raftcron restore --from FILE --config node.toml`: 0 restored, 1 refused (said why)."""
    try:
        config = configuration.load(args.config)
        with open(args.source, "rb") as backup:
            data = backup.read()
        members = [member.raft_address for member in config.members]
        info = restore_into(str(config.data_dir), config.node_id, members, data, args.source)
    except (configuration.ConfigError, StorageError, OSError) as error:
        print(f"raftcron restore: {error}", file=sys.stderr)
        return 1
    print(f"restored {config.node_id} ({config.data_dir}) at log index {info.index} "
          f"(term {info.term}): {info.jobs} jobs, {info.schedules} schedules, digest "
          f"{info.digest[:16]}; restore every member of the new cluster from the same file, "
          "then start them")
    return 0
