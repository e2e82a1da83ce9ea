"""Backups: a node's snapshot file, taken live, checked, and restored into an empty data dir.

A backup is exactly a snapshot file of `cluster/storage/snapshots.py` (header with its format
version, log index, term and CRC32s; in the body the name of the cluster it came from and the
core's snapshot): the node serves the one
it just made current, so a backup is checked by the same code that checks a node's own, and a
damaged or foreign file is refused naming what is wrong.

`restore_into` fills an EMPTY data dir for a new cluster: the snapshot becomes the node's
current one (its member list replaced by the new cluster's), the log starts empty after it,
the term is the snapshot's and the commit index its index. Every member of the new cluster is
restored from the same file, so each starts from the same state at the same index. The
restored snapshot names the cluster of the node's config, which may differ from the backup's:
a copy of prod restored into staging is a legitimate clone, and the command says so plainly.
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
    cluster_name: str | None  # the cluster it came from; None: a release before cluster names


def check(data: bytes, source: str) -> tuple[Snapshot, BackupInfo]:
    """The snapshot in a backup file and what it holds; LogDamaged naming the damage."""
    snapshot = decode(data, source)
    try:
        state = restore(snapshot.state)
    except Exception as error:  # the core refuses a snapshot it cannot read: say so here
        raise LogDamaged(source, f"holds a state snapshot that does not load ({error})") from None
    return snapshot, BackupInfo(snapshot.index, snapshot.term, snapshot.cluster,
                                len(state.table), len(state.schedules), digest(state), len(data),
                                snapshot.cluster_name)


def restore_into(directory: str, node_id: str, members: list[str], data: bytes,
                 source: str, cluster_name: str) -> BackupInfo:
    """Fill the empty data dir `directory` for node `node_id` of a new cluster `cluster_name`
    of `members` (their Raft addresses) from the backup `data`."""
    if os.path.isdir(directory) and os.listdir(directory):
        raise BackupError(f"{directory} is not empty: restore fills only a new data dir "
                          "(a node of a new cluster); move it away first")
    snapshot, info = check(data, source)
    data_dir = datadir_module.open_data_dir(directory, node_id)
    try:
        disk = OsDisk()
        body = {"cluster_name": cluster_name,  # first: see snapshots.cluster_name_in
                "prev": list(snapshot.prev), "last": list(snapshot.last),
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
        info = restore_into(str(config.data_dir), config.node_id, members, data, args.source,
                            config.cluster_name)
    except (configuration.ConfigError, StorageError, OSError) as error:
        print(f"raftcron restore: {error}", file=sys.stderr)
        return 1
    print(f"restored {config.node_id} ({config.data_dir}) of cluster {config.cluster_name} "
          f"from a backup of cluster {info.cluster_name or 'unknown'} at log index "
          f"{info.index} (term {info.term}): {info.jobs} jobs, {info.schedules} schedules, "
          f"digest {info.digest[:16]}; restore every member of the new cluster from the same "
          "file, then start them")
    note = other_cluster_note(info.cluster_name, config.cluster_name)
    if note:
        print(note)
    return 0


def other_cluster_note(backup_name: str | None, config_name: str) -> str:
    """What a restore says when the backup is not known to be of the config's cluster."""
    if backup_name is None:
        return ("note: the backup names no cluster (written by a release before cluster "
                f"names); the restored node is of cluster {config_name}, as its config says")
    if backup_name != config_name:
        return (f"note: the backup is of cluster {backup_name}, but this node's config names "
                f"cluster {config_name}: the node starts a copy of {backup_name}'s state as "
                f"cluster {config_name} (a clone; to restore {backup_name} itself, its config "
                f"says [cluster] name = \"{backup_name}\")")
    return ""
