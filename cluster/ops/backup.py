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

A backup may carry the archive (DESIGN.md §9.2; `raftcron backup --with-archive`) as a second
file beside it, `FILE.archive`: taken after the snapshot from a node whose archive holds every
job the entries up to the snapshot's index removed, checked (cluster/archive/copies.py) and
marked with the snapshot it belongs to. A restore restores it too when it is there (or as
`--archive PATH` says), after checking it and that it belongs to this backup; without one the
node's archive starts empty. Everything is checked before anything is written, and a restore
that fails while writing leaves the data dir as empty as it found it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raftcron.cluster import config as configuration
from raftcron.cluster.archive.copies import (
    ArchiveFile,
    check_file,
    mark_backup_of,
    restore_file,
)
from raftcron.cluster.archive.store import ArchiveError
from raftcron.cluster.storage import datadir as datadir_module
from raftcron.cluster.storage.disk import OsDisk
from raftcron.cluster.storage.raftlog import LogDamaged, RaftLog, StorageError
from raftcron.cluster.storage.snapshots import SNAPSHOT_NAME, Snapshot, decode, encode
from raftcron.scheduler.snapshot import digest, restore

if TYPE_CHECKING:
    from raftcron.cluster.clients.client import Client

ARCHIVE_SUFFIX = ".archive"  # FILE.archive: the archive of the backup FILE

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
    archive_next_seq: int = 1  # the archive number the next job to leave gets (archiving.py)


def check(data: bytes, source: str) -> tuple[Snapshot, BackupInfo]:
    """The snapshot in a backup file and what it holds; LogDamaged naming the damage."""
    snapshot = decode(data, source)
    try:
        state = restore(snapshot.state)
    except Exception as error:  # the core refuses a snapshot it cannot read: say so here
        raise LogDamaged(source, f"holds a state snapshot that does not load ({error})") from None
    return snapshot, BackupInfo(snapshot.index, snapshot.term, snapshot.cluster,
                                len(state.table), len(state.schedules), digest(state), len(data),
                                snapshot.cluster_name, state.archive_ledger.next_seq)


def fetch_archive(client: Client, path: str, info: BackupInfo,
                  served: dict[str, str]) -> tuple[ArchiveFile, str]:
    """Download into `path` the archive that goes with the snapshot `info` (`served` says
    which node gave it: asked first), check it and mark it as this backup's; with the node
    that gave it. BackupError naming what is wrong."""
    got = client.download_archive(path, min_index=info.index, prefer_url=served.get("url"))
    try:
        archive = check_file(path)
    except ArchiveError as error:
        raise BackupError(f"the archive node {got['node']} sent: {error}") from None
    if not got["index"].isdigit() or int(got["index"]) < info.index:
        raise BackupError(f"the archive node {got['node']} sent covers the log up to index "
                          f"{got['index'] or 'unknown'}, not up to the snapshot's {info.index}")
    if str(archive.size_bytes) != got["bytes"]:
        raise BackupError(f"the archive node {got['node']} sent is {archive.size_bytes} bytes, "
                          f"not the {got['bytes']} it announced")
    try:
        mark_backup_of(path, backup_mark(info))
    except ArchiveError as error:
        raise BackupError(str(error)) from None
    return archive, got["node"]


def backup_mark(info: BackupInfo) -> dict[str, Any]:
    """What a backup's archive names of the snapshot it belongs to."""
    return {"index": info.index, "term": info.term, "digest": info.digest}


def archive_to_restore(path: str | None, explicit: bool, source: str,
                       info: BackupInfo) -> tuple[ArchiveFile | None, str]:
    """The archive at `path` (None: none), checked and found to belong to the backup
    `source`, and a note to print ("" when none); BackupError naming the problem."""
    if path is None:
        return None, ""
    hint = "; or restore without it: --without-archive (the node's archive starts empty)"
    try:
        archive = check_file(path)
    except ArchiveError as error:
        raise BackupError(f"{error}{hint}") from None
    mark = archive.backup_of
    if mark is None and not explicit:
        raise BackupError(f"the archive {path} names no backup (`raftcron backup "
                          "--with-archive` did not write it): to restore it anyway, name it "
                          f"with --archive {path}{hint}")
    if mark is None:
        return archive, (f"note: the archive {path} names no backup; restored as given, but "
                         f"for the jobs that left the state after log index {info.index}")
    if mark != backup_mark(info):
        raise BackupError(f"the archive {path} belongs to another backup (of log index "
                          f"{mark.get('index')}, digest {str(mark.get('digest'))[:16]}), not "
                          f"to {source} (of log index {info.index}, digest {info.digest[:16]})"
                          f"{hint}")
    return archive, ""


def restore_into(directory: str, node_id: str, members: list[str], data: bytes,
                 source: str, cluster_name: str, archive_path: str | None = None,
                 archive_explicit: bool = False) -> tuple[BackupInfo, ArchiveFile | None, int, str]:
    """Fill the empty data dir `directory` for node `node_id` of a new cluster `cluster_name`
    of `members` (their Raft addresses) from the backup `data`, and from the archive at
    `archive_path` (None: the node's archive starts empty). What the backup holds, the
    archive, how many of its rows were restored, and a note to print ("": none)."""
    if os.path.isdir(directory) and os.listdir(directory):
        raise BackupError(f"{directory} is not empty: restore fills only a new data dir "
                          "(a node of a new cluster); move it away first")
    snapshot, info = check(data, source)
    archive, note = archive_to_restore(archive_path, archive_explicit, source, info)
    existed = os.path.isdir(directory)
    data_dir = datadir_module.open_data_dir(directory, node_id)
    try:
        rows = 0 if archive is None else restore_file(archive, directory, snapshot.index,
                                                      info.archive_next_seq)
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
    except BaseException:
        _empty(directory, existed)  # nothing half-applied: it was empty, it is again
        raise
    finally:
        data_dir.release()
    return info, archive, rows, note


def _empty(directory: str, existed: bool) -> None:
    """Remove what a failed restore wrote into `directory` (found empty, or made by it)."""
    if not existed:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)


def add_restore_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source", required=True, help="a backup file "
                        "(`raftcron backup --out FILE`)")
    parser.add_argument("--config", type=Path, default=os.environ.get("RAFTCRON_CONFIG"),
                        help="the config of the node of the new cluster whose data dir to fill "
                        "(env RAFTCRON_CONFIG; without one, the node's RAFTCRON_* variables "
                        "alone, as `raftcron node`)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--archive", help="the archive to restore with the backup (default: "
                       "FILE.archive beside it when it is there, as `raftcron backup "
                       "--with-archive` writes it)")
    which.add_argument("--without-archive", action="store_true",
                       help="restore no archive: the node's archive starts empty")


def run_restore(args: argparse.Namespace) -> int:
    """`raftcron restore --from FILE --config node.toml`: 0 restored, 1 refused (said why)."""
    beside = args.source + ARCHIVE_SUFFIX
    archive_path = None if args.without_archive else (
        args.archive or (beside if os.path.exists(beside) else None))
    try:
        config = configuration.load(args.config)
        with open(args.source, "rb") as backup:
            data = backup.read()
        members = [member.raft_address for member in config.members]
        info, archive, rows, note = restore_into(
            str(config.data_dir), config.node_id, members, data, args.source,
            config.cluster_name, archive_path, archive_explicit=args.archive is not None)
    except (configuration.ConfigError, StorageError, ArchiveError, OSError) as error:
        print(f"raftcron restore: {error}", file=sys.stderr)
        return 1
    print(f"restored {config.node_id} ({config.data_dir}) of cluster {config.cluster_name} "
          f"from a backup of cluster {info.cluster_name or 'unknown'} at log index "
          f"{info.index} (term {info.term}): {info.jobs} jobs, {info.schedules} schedules, "
          f"digest {info.digest[:16]}; restore every member of the new cluster from the same "
          "file, then start them")
    if archive is None:
        why = "--without-archive" if args.without_archive else f"no {beside}"
        print(f"archive: none restored ({why}): the node's archive starts empty")
    else:
        later = archive.rows - rows
        print(f"archive: {rows} archived jobs restored from {archive.path}"
              + (f" ({later} that left the state after log index {info.index} left out)"
                 if later else ""))
    for line in (note, other_cluster_note(info.cluster_name, config.cluster_name)):
        if line:
            print(line)
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
